"""A grid of cells, predicted: the default paper grid or a suite's cells. Each series (cells that differ
only in batch size) is traced once, largest models first, in up to `jobs` processes; every batch size
and every card is a replay of that trace."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ditbench.plan.predict import Budget, Prediction, SpeedOptions, normalize, predict_budgets
from ditbench.precision import PRECISIONS

DEFAULT_PRECISIONS = PRECISIONS  # every policy
DEFAULT_GRAD_CKPT = ("none", "full", "every_2")
DEFAULT_BATCHES = (8, 16, 32, 64, 128, 256, 512)


@dataclass
class Series:
    config: dict[str, Any]  # a cell config without its batch size
    batch_sizes: list[int]


def paper_models() -> list[str]:
    from ditbench.models.configs import PAPER_MODEL_NAMES

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
    return [
        Series(normalize({**(base or {}), "model": m, "precision": p, "grad_ckpt": c}), batches)
        for m, p, c in itertools.product(models, precisions, grad_ckpts)
    ]


def suite_grid(cells: Iterable[Any], device: str | None = None) -> list[Series]:
    """A suite's cells grouped into series (by everything but the batch size); `device` overrides."""
    groups: dict[str, Series] = {}
    for cell in cells:
        config = dict(cell.config)
        if device is not None:
            config["device"] = device
        cell_config = normalize(config)
        key = repr(sorted((k, repr(v)) for k, v in cell_config.items() if k != "batch_size"))
        series = groups.setdefault(key, Series(cell_config, []))
        if config["batch_size"] not in series.batch_sizes:
            series.batch_sizes.append(config["batch_size"])
    return list(groups.values())


def _cost(group: list[Series]) -> int:
    from ditbench.models.configs import get_config

    cfg = get_config(group[0].config["model"])
    return cfg.depth * cfg.hidden_size


def _groups(series: list[Series], budgets: list[Budget]) -> list[list[int]]:
    """Indices of series that differ only in a precision that shares their trace (fp32 and tf32 on a
    GPU), costliest first."""
    from ditbench.errors import UnsupportedError
    from ditbench.plan.emulation import traced_on
    from ditbench.plan.predict import trace_key, trace_knobs

    target = traced_on(budgets[0].target)
    groups: dict[object, list[int]] = {}
    for i, s in enumerate(series):
        try:
            rest = repr(sorted((k, repr(v)) for k, v in s.config.items() if k != "precision"))
            key = trace_key(trace_knobs(s.config, target), target) + (tuple(s.batch_sizes), rest)
        except UnsupportedError:
            key = ("unsupported", i)
        groups.setdefault(key, []).append(i)
    return sorted(groups.values(), key=lambda g: -_cost([series[i] for i in g]))


def _work(
    group: list[Series], budgets: list[Budget], disk_cache: bool, speed: SpeedOptions | None = None
) -> list[list[list[Prediction]]]:
    """Predict the first series of a group; the others differ only in their precision's name (and
    speed: tf32 runs fp32's matmuls on tensor cores)."""
    import copy
    import warnings

    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    first = predict_budgets(group[0].config, group[0].batch_sizes, budgets, disk_cache, speed)
    out = [first]
    for s in group[1:]:
        rows = copy.deepcopy(first)
        for row in rows:
            for p in row:
                p.precision = s.config["precision"]
                p.config = {**s.config, "batch_size": p.batch_size}
                if p.predicted_steps_per_s is not None:
                    _respeed(p, budgets[0].target, disk_cache, speed or SpeedOptions())
        out.append(rows)
    return out


def _respeed(p: Prediction, target, disk_cache: bool, speed: SpeedOptions) -> None:
    from ditbench.plan.emulation import traced_on
    from ditbench.plan.predict import fill_speed, series_trace, trace_knobs

    first = traced_on(target)
    fill_speed(p, series_trace(trace_knobs(p.config, first), first, disk=disk_cache), speed)


def evaluate(
    series: list[Series],
    budgets: list[Budget],
    jobs: int = 1,
    progress: Callable[[int, int, Series], None] | None = None,
    disk_cache: bool = False,
    speed: SpeedOptions | None = None,
) -> list[list[list[Prediction]]]:
    """Predictions [series][budget][batch], tracing the costliest series first."""
    groups = _groups(series, budgets)
    results: list[list[list[Prediction]] | None] = [None] * len(series)
    # A worker process pays torch's imports (seconds): not worth it for a handful of traces.
    jobs = 1 if len(groups) < 4 else max(1, min(jobs, len(groups)))
    done = 0

    def collect(group: list[int], rows) -> None:
        nonlocal done
        for i, r in zip(group, rows, strict=True):
            results[i] = r
            done += 1
            if progress:
                progress(done, len(series), series[i])

    if jobs == 1:
        for group in groups:
            collect(group, _work([series[i] for i in group], budgets, disk_cache, speed))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch threads
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            futures = {
                pool.submit(_work, [series[i] for i in group], budgets, disk_cache, speed): group
                for group in groups
            }
            for future in as_completed(futures):
                collect(futures[future], future.result())
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
