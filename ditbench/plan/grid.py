"""A grid of cells, predicted, and the decision tree over card classes (`plan --full`, a suite).

Each series (cells that differ only in batch size) is traced once, largest models first; every batch
size and every card is a replay of that trace. The tree: for each card class (judged on its smallest
card), the largest model that trains, how, and the next step up. The target batch is 32 per GPU (DiT's
256 on 8 GPUs); without a time model, settings rank by the H200 anchors' order (bf16 ~ fp16 > bf16
with checkpointing > tf32 > fp32).
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ditbench.core.errors import UnsupportedError
from ditbench.hardware.cards import MEMORY_CLASSES_GB, Card, cards_in_class
from ditbench.hardware.precision import BF16_CAPABILITY, BY_SPEED, LOW_PRECISIONS, PRECISIONS
from ditbench.models.configs import PAPER_MODEL_NAMES, get_config
from ditbench.plan.emulation import GENERIC_ARCH, traced_on
from ditbench.plan.predict import Budget, Prediction, SpeedOptions, normalize, predict_budgets

DEFAULT_PRECISIONS = PRECISIONS  # every policy
DEFAULT_GRAD_CKPT = ("none", "full", "every_2")
DEFAULT_BATCHES = (8, 16, 32, 64, 128, 256, 512)


@dataclass
class Series:
    config: dict[str, Any]  # a cell config without its batch size
    batch_sizes: list[int]


def paper_models() -> list[str]:
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
    cfg = get_config(group[0].config["model"])
    return cfg.depth * cfg.hidden_size


def _groups(series: list[Series], budgets: list[Budget]) -> list[list[int]]:
    """Indices of series that differ only in a precision that shares their trace, costliest first."""
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


_CKPT_SPEED = ("none", "every_2", "full")
DEFAULT_TARGET_BATCH = 32


def speed_rank(precision: str, grad_ckpt: str) -> tuple[int, int, int]:
    """Smaller is faster: low precision without checkpointing first, fp32 last."""
    p = BY_SPEED.index(precision) if precision in BY_SPEED else len(BY_SPEED)
    c = _CKPT_SPEED.index(grad_ckpt) if grad_ckpt in _CKPT_SPEED else 1  # every_K: between none and full
    low = precision in LOW_PRECISIONS
    return (0 if low else 1, c if low else p, p if low else c)


def _speed_key(p: Prediction) -> tuple:
    """Fastest first: the predicted images/s where the time model has one, else the anchors' order."""
    if p.predicted_images_per_s is not None:
        return (0, -p.predicted_images_per_s)
    return (1, *speed_rank(p.precision, p.grad_ckpt))


def class_cards(asked: Card | float | None = None) -> list[tuple[int, Card]]:
    """(class GB, card) for every class that has a card: the asked card (or a card of the asked GiB) for
    its own class, the smallest card of each other class (so its answer holds for every card of it)."""
    out = {
        gb: min(cards, key=lambda c: c.usable_gib)
        for gb in MEMORY_CLASSES_GB
        if (cards := cards_in_class(gb))
    }
    if isinstance(asked, (int, float)):
        gb = next((gb for gb in MEMORY_CLASSES_GB if gb >= asked), math.ceil(asked))
        asked = Card(f"a {asked:g} GiB card", asked, gb, GENERIC_ARCH)
    if asked is not None:
        out[asked.memory_class_gb] = asked
    return sorted(out.items())


@dataclass
class Advice:
    class_gb: int
    card: str
    memory_gib: float
    model: str | None  # None: no model of the grid trains
    setting: Prediction | None  # the recommended cell (largest fitting batch of that setting)
    alternatives: int  # other settings of that model that fit
    next_model: str | None
    next_needs: Prediction | None  # its least demanding cell
    next_class_gb: int | None


def _pre_ampere(card) -> bool:
    return card.arch < BF16_CAPABILITY


def _gflops(model: str, image_size: int) -> float:
    from ditbench.models.flops import forward_macs

    return forward_macs(model, image_size) / 1e9


def decision_tree(
    by_class: dict[int, list[Prediction]],
    cards: list[tuple[int, Any]],
    target_batch: int = DEFAULT_TARGET_BATCH,
) -> list[Advice]:
    """`by_class[gb]`: the grid's predictions for that class's card."""
    all_preds = [p for preds in by_class.values() for p in preds]
    if not all_preds:
        return []
    image_size = all_preds[0].config.get("image_size", 256)
    models = sorted({p.model for p in all_preds}, key=lambda m: -_gflops(m, image_size))
    advice = []
    trains_on: dict[str, int] = {}
    for gb, _card in cards:
        for model in models:
            if any(p.fits for p in by_class[gb] if p.model == model):
                trains_on.setdefault(model, gb)
    for gb, card in cards:
        preds = by_class[gb]
        if _pre_ampere(card):
            preds = [p for p in preds if p.precision != "tf32"]
        chosen_model = next((m for m in models if any(p.fits for p in preds if p.model == m)), None)
        setting, alternatives = None, 0
        if chosen_model is not None:
            best = largest_batches(p for p in preds if p.model == chosen_model and p.fits)
            ranked = sorted(best.values(), key=_speed_key)
            reach = [p for p in ranked if p.batch_size >= target_batch]
            setting = reach[0] if reach else max(ranked, key=lambda p: (p.batch_size, -ranked.index(p)))
            alternatives = len(best) - 1
        index = models.index(chosen_model) if chosen_model else len(models)
        next_model = models[index - 1] if index > 0 else None
        next_needs = None
        if next_model is not None:
            cands = [p for p in preds if p.model == next_model and p.peak_allocated_gib is not None]
            if cands:
                next_needs = min(cands, key=lambda p: (p.device_gib or p.peak_allocated_gib, p.batch_size))
        advice.append(
            Advice(
                class_gb=gb,
                card=card.name,
                memory_gib=card.usable_gib,
                model=chosen_model,
                setting=setting,
                alternatives=alternatives,
                next_model=next_model,
                next_needs=next_needs,
                next_class_gb=trains_on.get(next_model) if next_model else None,
            )
        )
    return advice
