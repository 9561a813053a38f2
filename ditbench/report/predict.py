"""`report --predict`: the claims and advice checks the run did not measure, judged from `ditbench plan`
(docs/reports.md, "Predicted verdicts"). No batch size is invented: a claim whose cell is incomplete is
predicted on the run's matching cells or pairs."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from ditbench.hardware.cards import cards_in_class
from ditbench.plan.speed import band, memory_band_pct
from ditbench.records.metrics import IMAGES_PER_S, STEPS_PER_S
from ditbench.report import advice
from ditbench.report.advice import AdviceCheck
from ditbench.report.cells import knob_key
from ditbench.report.claim_check import NOT_MEASURED, SHOWN, ClaimResult
from ditbench.report.claims import GIB_TO_GB, fmt, metric_kind

PREDICTED_HELD, PREDICTED_NOT_HELD = "predicted: held", "predicted: not held"
PREDICTED_INCONCLUSIVE = "predicted: inconclusive"
PREDICTED_VERDICTS = (PREDICTED_HELD, PREDICTED_NOT_HELD, PREDICTED_INCONCLUSIVE)
_REQUIRED = ("model", "precision", "batch_size")
_NOT_CELL = ("card", "gpu_memory_gib", "device")  # where the run ran, not what the planner predicts
ATTENTION_NOT_PREDICTED = (
    "not predicted: the planner traces attention with its default kernel, so its time model cannot tell "
    "flash from math"
)
CALIBRATION_CARD = "H200"  # the H200 anchors: the shipped speed calibration and the memory table
DIT_CELL = {"model": "DiT-XL/2", "batch_size": 32}  # the DiT paper's run: batch 256 over 8 GPUs
NOT_PREDICTABLE = {
    "check_flash_speedup": ATTENTION_NOT_PREDICTED,
    "check_quality_unchanged": "not predicted: the planner predicts memory and speed, not sample quality",
}
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
    """A prediction's interval [lo, hi] against the accepted [low, high] (issue 22's rule)."""
    if low <= lo and hi <= high:
        return PREDICTED_HELD
    if hi < low or lo > high:
        return PREDICTED_NOT_HELD
    return PREDICTED_INCONCLUSIVE


def fit_verdict(pred: Any) -> str:
    """A fit predicted on a card, held to its band: a fit within 6% of the card's memory (`plan`'s
    "tight") or an out-of-memory within 6% of fitting is inconclusive."""
    lo, hi = band(pred.device_gib, memory_band_pct())
    if pred.fits and hi <= pred.memory_gib:
        return PREDICTED_HELD
    if pred.fits is False and lo > pred.memory_gib:
        return PREDICTED_NOT_HELD
    return PREDICTED_INCONCLUSIVE


# ------------------------------------------------------------------------------------------ claims


def _times(x: float | None, k: float) -> float | None:
    return None if x is None else x * k


def _value(pred, metric: str, target_steps: int, scale: float = 1.0) -> float | None:
    """A claim metric from the prediction, with its base figure (memory, steps/s) times `scale`."""
    steps, images = _times(pred.predicted_steps_per_s, scale), _times(pred.predicted_images_per_s, scale)
    device = _times(pred.device_gib, scale)
    return {
        "peak_memory_gib": device,
        "peak_memory_gb": _times(device, GIB_TO_GB),
        "peak_allocated_gib": _times(pred.peak_allocated_gib, scale),
        STEPS_PER_S.name: steps,
        IMAGES_PER_S.name: images,
        "step_time": 1 / steps if steps else None,
        "days_to_target": target_steps / steps / 86400 if steps else None,
        "gpu_hours_per_million_images": 1e6 / images / 3600 if images else None,
    }.get(metric)


def _interval(pred: Any, metric: str, target_steps: int) -> tuple[float, float, float | None] | None:
    """A claim metric's predicted value, the interval its band gives, and the band %, or None."""
    kind = metric_kind(metric)
    if kind not in ("memory", "speed") or _value(pred, metric, target_steps) is None:
        return None
    band_pct = memory_band_pct() if kind == "memory" else pred.predicted_speed_band_pct
    ends = [_value(pred, metric, target_steps, s) for s in band(1.0, band_pct or 0.0)]
    return min(ends), max(ends), band_pct  # type: ignore[type-var]


def _band_text(band_pct: float | None) -> str:
    return f" +-{band_pct:g}%" if band_pct is not None else ""


def _not(why: str) -> dict[str, Any]:
    return {"verdict": None, "why": why}


def _predict_cell(c: Any, where: str, target_steps: int, cache: dict) -> dict[str, Any]:
    pred, why = _cached(c.cell, where, cache)
    if pred is None:
        return _not(why)
    if c.kind == "fits":
        text = f"{'fits' if pred.fits else 'does not fit'} {where}"
        return {"verdict": fit_verdict(pred), "value": text, "band_pct": memory_band_pct(), "card": where}
    got = _interval(pred, c.metric or "", target_steps)
    if got is None:
        return _not("not predicted: the planner has no such figure here")
    lo, hi, band_pct = got
    value = fmt(_value(pred, c.metric or "", target_steps), c.metric)
    return {"verdict": judge(lo, hi, c.low, c.high), "value": value, "band_pct": band_pct, "card": where}


def _predict_run_fits(matched: list[Labelled], where: str, cache: dict) -> dict[str, Any]:
    """A fits claim over the run's matching cells: held when one fits, not held when none can."""
    cells = []
    for label, knobs in matched:
        pred, why = _cached(knobs, where, cache)
        if pred is None:
            return _not(f"{why} ({label})")
        cells.append({"cell": label, "device_gib": pred.device_gib, "verdict": fit_verdict(pred)})
    verdicts = [x["verdict"] for x in cells]
    verdict = (
        PREDICTED_HELD if PREDICTED_HELD in verdicts else _all_or_inconclusive(verdicts, PREDICTED_NOT_HELD)
    )
    return {
        "verdict": verdict,
        "value": f"{verdicts.count(PREDICTED_HELD)} of {len(cells)} run cell(s) fit {where}",
        "band_pct": memory_band_pct(),
        "card": where,
        "cells": cells,
        "detail": "; ".join(f"{x['cell']}: {x['device_gib']:.2f} GiB" for x in cells[:SHOWN]),
    }


def _all_or_inconclusive(verdicts: list[str], verdict: str) -> str:
    return verdict if all(v == verdict for v in verdicts) else PREDICTED_INCONCLUSIVE


def _predict_compare(r: ClaimResult, where: str, target_steps: int, cache: dict) -> dict[str, Any]:
    """A compare claim over the run's pairs: the median ratio, judged with its worst-case interval."""
    c, metric = r.claim, r.claim.metric or ""
    if "attention" in {**(c.change_from or {}), **(c.change_to or {})}:
        return _not(ATTENTION_NOT_PREDICTED)
    if not r.pairs:
        return _not("not predicted: the run has no pair of cells that differ as claimed")
    pairs, band_pcts = [], set()
    for (a_label, a), (b_label, b) in r.pairs:
        ends = []
        for label, knobs in ((a_label, a), (b_label, b)):
            pred, why = _cached(knobs, where, cache)
            got = None if pred is None else _interval(pred, metric, target_steps)
            if got is None:
                return _not(f"{why or 'not predicted: the planner has no such figure'} ({label})")
            ends.append((_value(pred, metric, target_steps), got))
        (va, (a_lo, a_hi, a_pct)), (vb, (b_lo, b_hi, b_pct)) = ends
        if not va or not a_lo:
            return _not(f"not predicted: zero on the from side ({a_label})")
        lo, hi = ratio_band((b_lo, b_hi), (a_lo, a_hi))
        pairs.append({"from": a_label, "to": b_label, "ratio": vb / va, "interval": [lo, hi]})
        band_pcts |= {a_pct, b_pct}
    ratio = statistics.median(p["ratio"] for p in pairs)
    lo, hi = (statistics.median(p["interval"][i] for p in pairs) for i in (0, 1))
    band_pct = max((b for b in band_pcts if b is not None), default=None)
    of = f", median of {len(pairs)} pairs" if len(pairs) > 1 else ""
    with_band = (
        f", ×{lo:.2f}–×{hi:.2f} with each cell's{_band_text(band_pct)}" if band_pct is not None else ""
    )
    return {
        "verdict": judge(lo, hi, c.low, c.high),
        "value": f"×{ratio:.2f}{of}{with_band}",
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
        if where is None:
            r.predicted = _not("not predicted: the claim names no card")
        elif c.kind == "compare":
            r.predicted = _predict_compare(r, where, target_steps, cache)
        elif all(k in c.cell for k in _REQUIRED):
            r.predicted = _predict_cell(c, where, target_steps, cache)
        elif c.kind == "fits" and r.matched:
            r.predicted = _predict_run_fits(r.matched, where, cache)
        else:
            r.predicted = _not(
                "not predicted: the claim's cell leaves knobs open and no cell of the run matches it"
            )
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


# ------------------------------------------------------------------------------------------ advice


def class_card(gb: int) -> str:
    """The card of a memory class (hardware/cards.py) with the most usable memory."""
    return max(cards_in_class(gb), key=lambda c: c.usable_gib).name


def _label(config: dict[str, Any]) -> str:
    ckpt = config.get("grad_ckpt", "none")
    return f"{config['model']} {config['precision']} ckpt={ckpt} bs={config['batch_size']}"


def _pair(low: dict[str, Any], high: dict[str, Any]) -> tuple[Any, Any, str | None]:
    """Two cells predicted on the calibration card, or why not."""
    (a, why_a), (b, why_b) = (predict(cell, CALIBRATION_CARD) for cell in (low, high))
    return a, b, why_a or why_b


def _said(verdict: str, values: dict[str, Any], text: str, rule: str, card: str = CALIBRATION_CARD) -> dict:
    return {"verdict": verdict, "card": card, "values": values, "text": text, "rule": rule}


def predict_fp16_halves() -> dict[str, Any]:
    half, full, why = _pair({**DIT_CELL, "precision": "fp16"}, {**DIT_CELL, "precision": "fp32"})
    if why:
        return _not(why)
    mem, fp16, fp32 = memory_band_pct(), half.peak_allocated_gib, full.peak_allocated_gib
    ratio = fp16 / fp32
    lo, hi = ratio_band(band(fp16, mem), band(fp32, mem))
    verdict = judge(lo, hi, high=advice.FP16_HALVES_MAX_RATIO)
    values = {
        "ratio": ratio,
        "interval": [lo, hi],
        "fp32_gib": fp32,
        "fp16_gib": fp16,
        "memory_band_pct": mem,
    }
    return _said(
        verdict,
        values,
        f"{verdict} (fp16/fp32 peak allocated {ratio:.2f}, {lo:.2f} to {hi:.2f} with each cell's "
        f"+-{mem:g}%: DiT-XL/2 bs=32 {fp32:.2f} -> {fp16:.2f} GiB on the {CALIBRATION_CARD}, "
        "by ditbench plan)",
        f"predicted (--predict): DiT-XL/2 at batch 32, fp16 against fp32, on the {CALIBRATION_CARD}; "
        f"held when the ratio's interval (each cell +-{mem:g}%) lies wholly at or below "
        f"{advice.FP16_HALVES_MAX_RATIO:.0%}, not held when wholly above, else inconclusive",
    )


def predict_ckpt_tradeoff() -> dict[str, Any]:
    cell = {**DIT_CELL, "precision": "fp32"}
    full, none, why = _pair({**cell, "grad_ckpt": "full"}, cell)
    if why:
        return _not(why)
    mem, speed = memory_band_pct(), full.predicted_speed_band_pct
    if speed is None or not full.predicted_steps_per_s or not none.predicted_steps_per_s:
        return _not(f"not predicted: no speed prediction on the {CALIBRATION_CARD}")
    saving = 1 - full.peak_allocated_gib / none.peak_allocated_gib
    r_lo, r_hi = ratio_band(band(full.peak_allocated_gib, mem), band(none.peak_allocated_gib, mem))
    s_lo, s_hi = 1 - r_hi, 1 - r_lo
    extra = none.predicted_steps_per_s / full.predicted_steps_per_s - 1
    slow = ratio_band(band(none.predicted_steps_per_s, speed), band(full.predicted_steps_per_s, speed))
    e_lo, e_hi = slow[0] - 1, slow[1] - 1
    both = [judge(s_lo, s_hi, low=advice.CKPT_MIN_SAVING), judge(e_lo, e_hi, high=advice.CKPT_MAX_EXTRA_TIME)]
    # held when both parts are held, not held when one is not
    verdict = PREDICTED_NOT_HELD if PREDICTED_NOT_HELD in both else _all_or_inconclusive(both, PREDICTED_HELD)
    values = {"saving": saving, "saving_interval": [s_lo, s_hi], "extra_time": extra}
    values |= {"extra_time_interval": [e_lo, e_hi], "memory_band_pct": mem, "speed_band_pct": speed}
    return _said(
        verdict,
        values,
        f"{verdict} (memory saved {saving:.0%}, {s_lo:.0%} to {s_hi:.0%} with each cell's "
        f"+-{mem:g}%; extra time {extra:.0%}, {e_lo:.0%} to {e_hi:.0%} with each cell's +-{speed:g}%: "
        f"DiT-XL/2 fp32 bs=32 {none.peak_allocated_gib:.2f} -> {full.peak_allocated_gib:.2f} GiB, "
        f"{none.predicted_steps_per_s:.2f} -> {full.predicted_steps_per_s:.2f} steps/s on the "
        f"{CALIBRATION_CARD}, by ditbench plan)",
        f"predicted (--predict): DiT-XL/2 fp32 at batch 32, checkpointed against not, on the "
        f"{CALIBRATION_CARD}; each ratio's interval takes both cells' bands (memory +-{mem:g}%, speed "
        f"+-{speed:g}%), and the verdict is held or not held only where both intervals decide it",
    )


def predict_fit(config: dict[str, Any], gb: int) -> dict[str, Any]:
    card = class_card(gb)
    pred, why = predict(config, card)
    if why:
        return _not(why)
    mem, verdict = memory_band_pct(), fit_verdict(pred)
    rate, speed_pct = pred.predicted_images_per_s, pred.predicted_speed_band_pct
    speed = f", {rate:.0f} images/s +-{speed_pct:g}%" if rate and speed_pct is not None else ""
    values = {"device_gib": pred.device_gib, "card_gib": pred.memory_gib, "memory_band_pct": mem}
    values |= {IMAGES_PER_S.key: rate, "speed_band_pct": speed_pct}
    return _said(
        verdict,
        values,
        f"{verdict} ({_label(config)} needs {pred.device_gib:.2f} GiB +-{mem:g}% of the {card}'s "
        f"{pred.memory_gib:.2f}{speed}, by ditbench plan)",
        f"predicted (--predict): {_label(config)} on the {card} (the {gb} GB card with the most "
        f"memory); held when the planner's peak (reserved + CUDA context) +{mem:g}% fits it, not held "
        f"when it does not fit even -{mem:g}%, else inconclusive",
        card,
    )


PREDICTORS: dict[str, Callable[[], dict[str, Any]]] = {
    "check_fp16_halves": predict_fp16_halves,
    "check_ckpt_tradeoff": predict_ckpt_tradeoff,
    "check_24gb_l4": lambda: predict_fit(
        {"model": "DiT-L/4", "precision": "fp16", "grad_ckpt": "full", "batch_size": 32}, 24
    ),
    # DiT's batch per GPU, the size the decision tree aims for: batch 1 fits almost anything
    "check_12gb_b8": lambda: predict_fit({"model": "DiT-B/8", "precision": "fp16", "batch_size": 32}, 12),
    "check_48gb_xl2": lambda: predict_fit({**DIT_CELL, "precision": "fp32"}, 48),  # the paper's precision
}


def predict_advice(checks: list[AdviceCheck]) -> None:
    """Add the planner's prediction to each advice check (in place); measured verdicts stay."""
    for c in checks:
        predictor = PREDICTORS.get(c.key)
        c.predicted = _not(NOT_PREDICTABLE.get(c.key, "not predicted")) if predictor is None else predictor()
