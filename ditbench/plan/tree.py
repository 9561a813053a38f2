"""The decision tree: for each card class, the largest model that trains, how, and the next step up.

A class is judged on its smallest card (the asked card for its own class). "Largest": forward Gflops
per image. The advice takes the fastest setting that reaches the target batch (32 per GPU: DiT's 256
on 8 GPUs), else the one that fits the largest batch; fastest by the time model, else by the H200
anchors' order (bf16 ~ fp16 > bf16 with checkpointing > tf32 > fp32). "Next step up": the next larger
model and the first class it trains on, or what the next class up adds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ditbench.cards import MEMORY_CLASSES_GB, Card, cards_in_class
from ditbench.plan.emulation import GENERIC_ARCH
from ditbench.plan.grid import largest_batches
from ditbench.plan.predict import Prediction
from ditbench.precision import BF16_CAPABILITY, BY_SPEED, LOW_PRECISIONS

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
