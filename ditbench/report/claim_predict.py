"""Claims the run did not measure, judged from `ditbench plan`'s prediction (`report --predict`).

A cell claim about memory or speed, or a fits claim, whose cell is complete (model, precision and
batch size; checkpointing defaults to none) is predicted on the claim's card (the claims file's
`card`, or the fits claim's card): memory as the planner's peak the card must hold (reserved + the
CUDA context, the claims' `peak_memory_gib`), speed from the time model. A claim the run did not
measure gets "predicted: held" or "predicted: not held" with the prediction's band (the memory
planner's 6%, the speed calibration's worst leave-one-out error); a measured claim keeps its verdict,
and the prediction is shown beside it. Issue 22's rule holds here as for measured verdicts: a band
that spans what the claim accepts is "predicted: inconclusive". Compare claims and cells with open
knobs are not predicted (the run's cells decide what they compare), and say so.

The report's advice checks are predicted through the same calls (`predict`, `band`, `judge`:
advice_predict).
"""

from __future__ import annotations

import math
from typing import Any

from ditbench.report.claim_check import NOT_MEASURED, ClaimResult
from ditbench.report.claim_values import GIB_TO_GB, fmt
from ditbench.report.claims import metric_kind

PREDICTED_HELD, PREDICTED_NOT_HELD = "predicted: held", "predicted: not held"
PREDICTED_INCONCLUSIVE = "predicted: inconclusive"
PREDICTED_VERDICTS = (PREDICTED_HELD, PREDICTED_NOT_HELD, PREDICTED_INCONCLUSIVE)
_REQUIRED = ("model", "precision", "batch_size")


def predict(config: dict[str, Any], card: str) -> tuple[Any, str | None]:
    """The planner's prediction of a one-GPU cell (checkpointing none unless set) on a card, or
    (None, why not): a cell the planner refuses is said, not fatal to the report."""
    from ditbench.plan import predict_cell

    try:
        pred = predict_cell({"grad_ckpt": "none", **config}, card)
    except Exception as err:
        return None, f"not predicted: {err}"
    if pred.status not in ("fits", "oom"):
        return None, f"not predicted: {pred.reason or pred.status}"
    return pred, None


def memory_band_pct() -> float:
    """The memory planner's band: its largest error on the H200 anchors, as `plan` calls a fit tight."""
    from ditbench.plan.render import TIGHT_MARGIN

    return 100 * TIGHT_MARGIN


def band(v: float, pct: float) -> tuple[float, float]:
    """A predicted figure's interval: v -+ pct%."""
    return v * (1 - pct / 100), v * (1 + pct / 100)


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
        "steps_per_s": steps,
        "images_per_s": per_gpu_images,
        "step_time": None if not steps else 1 / steps,
        "days_to_target": None if not steps else target_steps / steps / 86400,
        "gpu_hours_per_million_images": None if not per_gpu_images else 1e6 / per_gpu_images / 3600,
    }.get(metric)


def predict_claims(results: list[ClaimResult], card: str | None, target_steps: int) -> None:
    """Add the planner's prediction to each claim result it can predict (in place)."""
    for r in results:
        c = r.claim
        if c.kind == "compare" or any(k not in c.cell for k in _REQUIRED):
            r.predicted = {"verdict": None, "why": "not predicted: the claim's cell leaves knobs open"}
            continue
        where = c.fits_card if c.kind == "fits" else (c.card or card)
        if where is None:
            r.predicted = {"verdict": None, "why": "not predicted: the claim names no card"}
            continue
        pred, why = predict({k: v for k, v in c.cell.items() if k not in ("card", "gpu_memory_gib")}, where)
        if pred is None:
            r.predicted = {"verdict": None, "why": why}
            continue
        if c.kind == "fits":
            verdict, band_pct = fit_verdict(pred), memory_band_pct()
            text = f"{'fits' if pred.fits else 'does not fit'} {where}"
        else:
            kind = metric_kind(c.metric or "")
            v = _value(pred, c.metric or "", target_steps) if kind in ("memory", "speed") else None
            if v is None:
                r.predicted = {"verdict": None, "why": "not predicted: the planner has no such figure here"}
                continue
            band_pct = memory_band_pct() if kind == "memory" else pred.predicted_speed_band_pct
            ends = [_value(pred, c.metric or "", target_steps, s) for s in band(1.0, band_pct or 0.0)]
            verdict, text = judge(min(ends), max(ends), c.low, c.high), fmt(v, c.metric)
        band_text = f" +-{band_pct:g}%" if band_pct is not None else ""
        r.predicted = {"verdict": verdict, "value": text, "band_pct": band_pct, "card": where}
        shown = f"{verdict} ({text}{band_text} on {where}, by ditbench plan)"
        if r.verdict == NOT_MEASURED:
            r.measured = f"— ({text}{band_text} predicted)"
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
