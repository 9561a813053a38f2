"""A grid of cells, predicted: the default paper grid or a suite's cells, one trace per series.

Series (cells that differ only in batch size) are traced once each, largest models first, in up to
`jobs` processes; every batch size and every budget (card) is a replay of that trace.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ditbench.plan.predict import Budget, Prediction, normalize, predict_budgets

DEFAULT_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
DEFAULT_GRAD_CKPT = ("none", "full", "every_2")
DEFAULT_BATCHES = (8, 16, 32, 64, 128, 256, 512)


@dataclass
class Series:
    config: dict[str, Any]  # a cell config without its batch size
    batch_sizes: list[int]


def paper_models() -> list[str]:
    from ditbench.models.dit import PAPER_MODEL_NAMES

    return list(PAPER_MODEL_NAMES)


def grid(
    models: Iterable[str],
    precisions: Iterable[str],
    grad_ckpts: Iterable[str],
    batch_sizes: Iterable[int],
    base: dict[str, Any] | None = None,
) -> list[Series]:
    """model x precision x checkpointing, each a series over the batch sizes."""
    batches = sorted(set(batch_sizes))
    out = []
    for model in models:
        for precision in precisions:
            for ckpt in grad_ckpts:
                config = normalize(
                    {**(base or {}), "model": model, "precision": precision, "grad_ckpt": ckpt}
                )
                out.append(Series(config, batches))
    return out


def suite_grid(cells: Iterable[Any], device: str | None = None) -> list[Series]:
    """A suite's cells grouped into series (by everything but the batch size); `device` overrides."""
    groups: dict[str, Series] = {}
    for cell in cells:
        config = dict(cell.config)
        if device is not None:
            config["device"] = device
        batch = config["batch_size"]
        key = repr(sorted((k, repr(v)) for k, v in normalize(config).items() if k != "batch_size"))
        if key not in groups:
            groups[key] = Series(normalize({**config}), [])
        if batch not in groups[key].batch_sizes:
            groups[key].batch_sizes.append(batch)
    return list(groups.values())


def _cost(series: Series) -> int:
    from ditbench.models.dit import get_config

    cfg = get_config(series.config["model"])
    return cfg.depth * cfg.hidden_size


def _work(series: Series, budgets: list[Budget]) -> list[list[Prediction]]:
    import warnings

    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    return predict_budgets(series.config, series.batch_sizes, budgets)


def evaluate(
    series: list[Series],
    budgets: list[Budget],
    jobs: int = 1,
    progress: Callable[[int, int, Series], None] | None = None,
) -> list[list[list[Prediction]]]:
    """Predictions [series][budget][batch], tracing the costliest series first."""
    order = sorted(range(len(series)), key=lambda i: -_cost(series[i]))
    results: list[list[list[Prediction]] | None] = [None] * len(series)
    jobs = max(1, min(jobs, len(series)))
    if jobs == 1:
        for n, i in enumerate(order, 1):
            results[i] = _work(series[i], budgets)
            if progress:
                progress(n, len(series), series[i])
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch threads
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {pool.submit(_work, series[i], budgets): i for i in order}
            for n, future in enumerate(as_completed(futures), 1):
                i = futures[future]
                results[i] = future.result()
                if progress:
                    progress(n, len(series), series[i])
    return results  # type: ignore[return-value]


def default_jobs() -> int:
    return max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))


def largest_batches(predictions: Iterable[Prediction]) -> dict[tuple[str, str, str], Prediction | None]:
    """Per (model, precision, grad_ckpt): the prediction at the largest batch that fits (None: none fits)."""
    best: dict[tuple[str, str, str], Prediction | None] = {}
    for p in predictions:
        key = (p.model, p.precision, p.grad_ckpt)
        best.setdefault(key, None)
        if p.fits and (best[key] is None or p.batch_size > best[key].batch_size):
            best[key] = p
    return best
