"""Claims the run did not measure, judged from `ditbench plan`'s prediction (`report --predict`).

A cell claim about memory or speed, or a fits claim, whose cell is complete (model, precision and
batch size; checkpointing defaults to none) is predicted on the claim's card (the claims file's
`card`, or the fits claim's card): memory as the planner's peak the card must hold (reserved + the
CUDA context, the claims' `peak_memory_gib`), speed from the time model. A claim the run did not
measure gets "predicted: held" or "predicted: not held" with the prediction's band (the memory
planner's 6%, the speed calibration's worst leave-one-out error); a measured claim keeps its verdict,
and the prediction is shown beside it. Compare claims and cells with open knobs are not predicted
(the run's cells decide what they compare), and say so.
"""

from __future__ import annotations

from ditbench.report.claim_check import NOT_MEASURED, ClaimResult
from ditbench.report.claim_values import GIB_TO_GB, fmt
from ditbench.report.claims import metric_kind

PREDICTED_HELD, PREDICTED_NOT_HELD = "predicted: held", "predicted: not held"
_REQUIRED = ("model", "precision", "batch_size")


def _value(pred, metric: str, target_steps: int) -> float | None:
    steps = pred.predicted_steps_per_s
    per_gpu_images = pred.predicted_images_per_s
    return {
        "peak_memory_gib": pred.device_gib,
        "peak_memory_gb": None if pred.device_gib is None else pred.device_gib * GIB_TO_GB,
        "peak_allocated_gib": pred.peak_allocated_gib,
        "steps_per_s": steps,
        "images_per_s": per_gpu_images,
        "step_time": None if not steps else 1 / steps,
        "days_to_target": None if not steps else target_steps / steps / 86400,
        "gpu_hours_per_million_images": None if not per_gpu_images else 1e6 / per_gpu_images / 3600,
    }.get(metric)


def predict_claims(results: list[ClaimResult], card: str | None, target_steps: int) -> None:
    """Add the planner's prediction to each claim result it can predict (in place)."""
    from ditbench.plan import predict_cell
    from ditbench.plan.render import TIGHT_MARGIN

    for r in results:
        c = r.claim
        if c.kind == "compare" or any(k not in c.cell for k in _REQUIRED):
            r.predicted = {"verdict": None, "why": "not predicted: the claim's cell leaves knobs open"}
            continue
        where = c.fits_card if c.kind == "fits" else (c.card or card)
        if where is None:
            r.predicted = {"verdict": None, "why": "not predicted: the claim names no card"}
            continue
        knobs = {k: v for k, v in c.cell.items() if k not in ("card", "gpu_memory_gib")}
        config = {"grad_ckpt": "none", **knobs}
        try:
            pred = predict_cell(config, where)
        except Exception as err:  # a cell the planner refuses: said, not fatal to the report
            r.predicted = {"verdict": None, "why": f"not predicted: {err}"}
            continue
        if c.kind == "fits":
            if pred.fits is None:
                r.predicted = {"verdict": None, "why": f"not predicted: {pred.reason or pred.status}"}
                continue
            ok, text = pred.fits, f"{'fits' if pred.fits else 'does not fit'} {where}"
            band = 100 * TIGHT_MARGIN
        else:
            kind = metric_kind(c.metric or "")
            v = _value(pred, c.metric or "", target_steps) if kind in ("memory", "speed") else None
            if v is None:
                r.predicted = {"verdict": None, "why": "not predicted: the planner has no such figure here"}
                continue
            ok, text = c.low <= v <= c.high, fmt(v, c.metric)
            band = 100 * TIGHT_MARGIN if kind == "memory" else pred.predicted_speed_band_pct
        verdict = PREDICTED_HELD if ok else PREDICTED_NOT_HELD
        band_text = f" +-{band:g}%" if band is not None else ""
        r.predicted = {"verdict": verdict, "value": text, "band_pct": band, "card": where}
        shown = f"{verdict} ({text}{band_text} on {where}, by ditbench plan)"
        if r.verdict == NOT_MEASURED:
            r.measured = f"— ({text}{band_text} predicted)"
            r.evidence = shown + (f"; {r.evidence}" if r.evidence else "")
        else:  # measured wins; the prediction is shown beside it
            r.evidence = (r.evidence + "; " if r.evidence else "") + shown


def counts(results: list[ClaimResult]) -> dict[str, int]:
    out = {PREDICTED_HELD: 0, PREDICTED_NOT_HELD: 0}
    for r in results:
        verdict = (r.predicted or {}).get("verdict")
        if r.verdict == NOT_MEASURED and verdict in out:
            out[verdict] += 1
    return out
