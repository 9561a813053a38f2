"""Claims the run did not measure, judged from `ditbench plan`'s prediction (`report --predict`).

A cell claim about memory or speed, or a fits claim, whose cell is complete (model, precision and
batch size; checkpointing defaults to none) is predicted on the claim's card (the claims file's
`card`, or the fits claim's card): memory as the planner's peak the card must hold (reserved + the
CUDA context, the claims' `peak_memory_gib`), speed from the time model. A claim the run did not
measure gets "predicted: held" or "predicted: not held" with the prediction's band (the memory
planner's 6%, the speed calibration's worst leave-one-out error); a measured claim keeps its verdict,
and the prediction is shown beside it. Issue 22's rule holds here as for measured verdicts: a band
that spans what the claim accepts is "predicted: inconclusive".

The run's cells decide what a compare claim compares, and which cells a fits claim with open knobs is
about: a compare claim predicts both cells of each pair the claims checker found in the run, on the
claim's card, and judges the median of the pairs' ratios (the measured rule) with its worst-case
interval (each ratio from one cell at the top of its band and the other at the bottom; the median of
the pairs' lower and upper ends bounds the median ratio); a fits claim predicts the run's matching
cells, held when one is predicted to fit, not held when none can. A claim with open knobs and no
matching cell in the run is not predicted (no batch size is invented), nor is a change of attention
kernel, and each says why.

The report's advice checks are predicted through the same calls (`predict`, `band`, `judge`:
advice_predict).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ditbench.plan.speed import band, memory_band_pct
from ditbench.records.metrics import IMAGES_PER_S, STEPS_PER_S
from ditbench.report.cells import knob_key
from ditbench.report.claim_check import NOT_MEASURED, SHOWN, ClaimResult
from ditbench.report.claim_values import GIB_TO_GB, fmt
from ditbench.report.claims import metric_kind

PREDICTED_HELD, PREDICTED_NOT_HELD = "predicted: held", "predicted: not held"
PREDICTED_INCONCLUSIVE = "predicted: inconclusive"
PREDICTED_VERDICTS = (PREDICTED_HELD, PREDICTED_NOT_HELD, PREDICTED_INCONCLUSIVE)
_REQUIRED = ("model", "precision", "batch_size")
_NOT_CELL = ("card", "gpu_memory_gib", "device")  # where the run ran, not what the planner predicts
ATTENTION_NOT_PREDICTED = (
    "not predicted: the planner traces attention with its default kernel, so its time model cannot tell "
    "flash from math"
)
Labelled = tuple[str, dict[str, Any]]  # a run's cell: its label and knobs


def predict(config: dict[str, Any], card: str) -> tuple[Any, str | None]:
    """The planner's prediction of a one-GPU cell (checkpointing none unless set) on a card, or
    (None, why not): a cell the planner refuses is said, not fatal to the report."""
    from ditbench.plan import predict_cell

    try:
        pred = predict_cell({"grad_ckpt": "none", **config}, card, disk=True)  # as `ditbench plan` does
    except Exception as err:
        return None, f"not predicted: {err}"
    if pred.status not in ("fits", "oom"):
        return None, f"not predicted: {pred.reason or pred.status}"
    return pred, None


def ratio_band(top: tuple[float, float], bottom: tuple[float, float]) -> tuple[float, float]:
    """The interval of top / bottom when each lies anywhere in its interval."""
    return top[0] / bottom[1], top[1] / bottom[0]


def judge(lo: float, hi: float, low: float = -math.inf, high: float = math.inf) -> str:
    """Issue 22's rule for a prediction's interval [lo, hi] against the accepted [low, high]: held
    only wholly inside, not held only wholly outside; an interval across an end is inconclusive."""
    if low <= lo and hi <= high:
        return PREDICTED_HELD
    if hi < low or lo > high:
        return PREDICTED_NOT_HELD
    return PREDICTED_INCONCLUSIVE


def fit_verdict(pred: Any) -> str:
    """A fit predicted on a card, by the planner's replay, held to its band: a fit within 6% of the
    card's memory (`plan`'s "tight") or an out-of-memory within 6% of fitting is inconclusive."""
    lo, hi = band(pred.device_gib, memory_band_pct())
    if pred.fits and hi <= pred.memory_gib:
        return PREDICTED_HELD
    if pred.fits is False and lo > pred.memory_gib:
        return PREDICTED_NOT_HELD
    return PREDICTED_INCONCLUSIVE


def _value(pred, metric: str, target_steps: int, scale: float = 1.0) -> float | None:
    """A claim metric from the prediction, with its base figure (memory, steps/s) times `scale`."""
    steps = None if pred.predicted_steps_per_s is None else pred.predicted_steps_per_s * scale
    per_gpu_images = None if pred.predicted_images_per_s is None else pred.predicted_images_per_s * scale
    device = None if pred.device_gib is None else pred.device_gib * scale
    return {
        "peak_memory_gib": device,
        "peak_memory_gb": None if device is None else device * GIB_TO_GB,
        "peak_allocated_gib": None if pred.peak_allocated_gib is None else pred.peak_allocated_gib * scale,
        STEPS_PER_S.name: steps,
        IMAGES_PER_S.name: per_gpu_images,
        "step_time": None if not steps else 1 / steps,
        "days_to_target": None if not steps else target_steps / steps / 86400,
        "gpu_hours_per_million_images": None if not per_gpu_images else 1e6 / per_gpu_images / 3600,
    }.get(metric)


def _interval(pred: Any, metric: str, target_steps: int) -> tuple[float, float, float | None] | None:
    """A claim metric's predicted value, the interval its band gives, and the band %, or None."""
    kind = metric_kind(metric)
    v = _value(pred, metric, target_steps) if kind in ("memory", "speed") else None
    if v is None:
        return None
    band_pct = memory_band_pct() if kind == "memory" else pred.predicted_speed_band_pct
    ends = [_value(pred, metric, target_steps, s) for s in band(1.0, band_pct or 0.0)]
    return min(ends), max(ends), band_pct  # type: ignore[type-var]


def _band_text(band_pct: float | None) -> str:
    return f" +-{band_pct:g}%" if band_pct is not None else ""


def _predict_cell(c: Any, where: str, target_steps: int, cache: dict) -> dict[str, Any]:
    pred, why = _cached(c.cell, where, cache)
    if pred is None:
        return {"verdict": None, "why": why}
    if c.kind == "fits":
        band_pct = memory_band_pct()
        text = f"{'fits' if pred.fits else 'does not fit'} {where}"
        return {"verdict": fit_verdict(pred), "value": text, "band_pct": band_pct, "card": where}
    got = _interval(pred, c.metric or "", target_steps)
    if got is None:
        return {"verdict": None, "why": "not predicted: the planner has no such figure here"}
    lo, hi, band_pct = got
    v = _value(pred, c.metric or "", target_steps)
    return {
        "verdict": judge(lo, hi, c.low, c.high),
        "value": fmt(v, c.metric),
        "band_pct": band_pct,
        "card": where,
    }


def _predict_run_fits(matched: list[Labelled], where: str, cache: dict) -> dict[str, Any]:
    """A fits claim over the run's matching cells: held when one fits, not held when none can."""
    cells, verdicts = [], []
    for label, knobs in matched:
        pred, why = _cached(knobs, where, cache)
        if pred is None:
            return {"verdict": None, "why": f"{why} ({label})"}
        verdicts.append(fit_verdict(pred))
        cells.append({"cell": label, "device_gib": pred.device_gib, "verdict": verdicts[-1]})
    verdict = (
        PREDICTED_HELD
        if PREDICTED_HELD in verdicts
        else PREDICTED_NOT_HELD
        if all(v == PREDICTED_NOT_HELD for v in verdicts)
        else PREDICTED_INCONCLUSIVE
    )
    fit = sum(v == PREDICTED_HELD for v in verdicts)
    return {
        "verdict": verdict,
        "value": f"{fit} of {len(cells)} run cell(s) fit {where}",
        "band_pct": memory_band_pct(),
        "card": where,
        "cells": cells,
        "detail": "; ".join(f"{x['cell']}: {x['device_gib']:.2f} GiB" for x in cells[:SHOWN]),
    }


def _predict_compare(r: ClaimResult, where: str, target_steps: int, cache: dict) -> dict[str, Any]:
    """A compare claim over the run's pairs: the median ratio, judged with its worst-case interval."""
    c, metric = r.claim, r.claim.metric or ""
    if "attention" in {**(c.change_from or {}), **(c.change_to or {})}:
        return {"verdict": None, "why": ATTENTION_NOT_PREDICTED}
    if not r.pairs:
        return {"verdict": None, "why": "not predicted: the run has no pair of cells that differ as claimed"}
    pairs, band_pcts = [], set()
    for (a_label, a), (b_label, b) in r.pairs:
        ends = []
        for label, knobs in ((a_label, a), (b_label, b)):
            pred, why = _cached(knobs, where, cache)
            got = None if pred is None else _interval(pred, metric, target_steps)
            if got is None:
                return {
                    "verdict": None,
                    "why": f"{why or 'not predicted: the planner has no such figure'} ({label})",
                }
            ends.append((_value(pred, metric, target_steps), got))
        (va, (a_lo, a_hi, a_pct)), (vb, (b_lo, b_hi, b_pct)) = ends
        if not va or not a_lo:
            return {"verdict": None, "why": f"not predicted: zero on the from side ({a_label})"}
        lo, hi = ratio_band((b_lo, b_hi), (a_lo, a_hi))
        pairs.append({"from": a_label, "to": b_label, "ratio": vb / va, "interval": [lo, hi]})
        band_pcts |= {a_pct, b_pct}
    ratio = statistics.median(p["ratio"] for p in pairs)
    lo, hi = (statistics.median(p["interval"][i] for p in pairs) for i in (0, 1))
    band_pct = max((b for b in band_pcts if b is not None), default=None)
    of = f", median of {len(pairs)} pairs" if len(pairs) > 1 else ""
    return {
        "verdict": judge(lo, hi, c.low, c.high),
        "value": f"×{ratio:.2f}{of}"
        + (f", ×{lo:.2f}–×{hi:.2f} with each cell's{_band_text(band_pct)}" if band_pct is not None else ""),
        "ratio": ratio,
        "interval": [lo, hi],
        "band_pct": band_pct,
        "card": where,
        "pairs": pairs,
        "detail": "; ".join(f"{p['from']} → {p['to']}: ×{p['ratio']:.2f}" for p in pairs[:SHOWN]),
    }


def _cached(knobs: dict[str, Any], card: str, cache: dict) -> tuple[Any, str | None]:
    """A cell predicted on a card once per report (pairs share cells; a claim's memory and speed
    figures share theirs)."""
    key = (knob_key(knobs), card)
    if key not in cache:
        cache[key] = predict({k: v for k, v in knobs.items() if k not in _NOT_CELL}, card)
    return cache[key]


def predict_claims(results: list[ClaimResult], card: str | None, target_steps: int) -> None:
    """Add the planner's prediction to each claim result it can predict (in place)."""
    cache: dict = {}
    for r in results:
        c = r.claim
        where = c.fits_card if c.kind == "fits" else (c.card or card)
        complete = all(k in c.cell for k in _REQUIRED)
        if where is None:
            r.predicted = {"verdict": None, "why": "not predicted: the claim names no card"}
        elif c.kind == "compare":
            r.predicted = _predict_compare(r, where, target_steps, cache)
        elif complete:
            r.predicted = _predict_cell(c, where, target_steps, cache)
        elif c.kind == "fits" and r.matched:
            r.predicted = _predict_run_fits(r.matched, where, cache)
        else:
            r.predicted = {
                "verdict": None,
                "why": "not predicted: the claim's cell leaves knobs open and no cell of the run matches it",
            }
        if r.predicted.get("verdict") is not None:
            _show(r)


def _show(r: ClaimResult) -> None:
    """The prediction in the measured column and the evidence (beside a measured verdict, which wins)."""
    p = r.predicted or {}
    text = p["value"] + ("" if "ratio" in p else _band_text(p["band_pct"]))
    detail = f": {p['detail']}" if p.get("detail") else ""
    shown = f"{p['verdict']} ({text} on {p['card']}{detail}, by ditbench plan)"
    if r.verdict == NOT_MEASURED:
        r.measured = f"— ({text} predicted)"
        r.evidence = shown + (f"; {r.evidence}" if r.evidence else "")
    else:  # measured wins; the prediction is shown beside it
        r.evidence = (r.evidence + "; " if r.evidence else "") + shown


def counts(results: list[ClaimResult]) -> dict[str, int]:
    out = dict.fromkeys(PREDICTED_VERDICTS, 0)
    for r in results:
        verdict = (r.predicted or {}).get("verdict")
        if r.verdict == NOT_MEASURED and verdict in out:
            out[verdict] += 1
    return out
