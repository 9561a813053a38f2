"""The advice checks the run did not measure, judged from `ditbench plan`'s prediction (`report --predict`).

Each check is predicted through claim_predict's calls (the same planner call, bands and issue 22's
rule), on the card it is about: the 12 / 24 / 48 GB checks on the card of that memory class with the
most usable memory (the nearest to the measured check's 12 / 24 / 48 GiB budget); the ratio checks
("fp16 halves memory", "checkpointing saves about half for 20-30% more time") on both cells of DiT's
own setting (DiT-XL/2, batch 32 per GPU) on the H200, the card the speed calibration and the memory
anchors come from, against the thresholds the measured check uses. A ratio of two predictions takes
both cells' bands (one at the top of its band, the other at the bottom), so its interval is wide
where the band is (speed: the calibration's worst leave-one-out error). A measured verdict wins; the
prediction is shown beside it. Flash attention and sample quality are not predicted, and say why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ditbench.cards import cards_in_class
from ditbench.records.metrics import IMAGES_PER_S
from ditbench.report import advice
from ditbench.report.advice import AdviceCheck
from ditbench.report.claim_predict import (
    ATTENTION_NOT_PREDICTED,
    PREDICTED_HELD,
    PREDICTED_INCONCLUSIVE,
    PREDICTED_NOT_HELD,
    band,
    fit_verdict,
    judge,
    memory_band_pct,
    predict,
    ratio_band,
)

CALIBRATION_CARD = "H200"  # the H200 anchors: the shipped speed calibration and the memory table
DIT_CELL = {"model": "DiT-XL/2", "batch_size": 32}  # the DiT paper's run: batch 256 over 8 GPUs

NOT_PREDICTABLE = {
    "check_flash_speedup": ATTENTION_NOT_PREDICTED,
    "check_quality_unchanged": "not predicted: the planner predicts memory and speed, not sample quality",
}


def class_card(gb: int) -> str:
    """The card of a memory class (cards.py) with the most usable memory."""
    return max(cards_in_class(gb), key=lambda c: c.usable_gib).name


def _label(config: dict[str, Any]) -> str:
    ckpt = config.get("grad_ckpt", "none")
    return f"{config['model']} {config['precision']} ckpt={ckpt} bs={config['batch_size']}"


def _both(verdicts: list[str]) -> str:
    """Held when every part is held, not held when one is not, else inconclusive."""
    if PREDICTED_NOT_HELD in verdicts:
        return PREDICTED_NOT_HELD
    return PREDICTED_HELD if all(v == PREDICTED_HELD for v in verdicts) else PREDICTED_INCONCLUSIVE


def _pair(low: dict[str, Any], high: dict[str, Any]) -> tuple[Any, Any, str | None]:
    """Two cells predicted on the calibration card, or why not."""
    a, why_a = predict(low, CALIBRATION_CARD)
    b, why_b = predict(high, CALIBRATION_CARD)
    return a, b, why_a or why_b


def predict_fp16_halves() -> dict[str, Any]:
    half, full, why = _pair({**DIT_CELL, "precision": "fp16"}, {**DIT_CELL, "precision": "fp32"})
    if why:
        return {"verdict": None, "why": why}
    mem = memory_band_pct()
    ratio = half.peak_allocated_gib / full.peak_allocated_gib
    lo, hi = ratio_band(band(half.peak_allocated_gib, mem), band(full.peak_allocated_gib, mem))
    verdict = judge(lo, hi, high=advice.FP16_HALVES_MAX_RATIO)
    return {
        "verdict": verdict,
        "card": CALIBRATION_CARD,
        "values": {
            "ratio": ratio,
            "interval": [lo, hi],
            "fp32_gib": full.peak_allocated_gib,
            "fp16_gib": half.peak_allocated_gib,
            "memory_band_pct": mem,
        },
        "text": f"{verdict} (fp16/fp32 peak allocated {ratio:.2f}, {lo:.2f} to {hi:.2f} with each cell's "
        f"+-{mem:g}%: DiT-XL/2 bs=32 {full.peak_allocated_gib:.2f} -> {half.peak_allocated_gib:.2f} GiB "
        f"on the {CALIBRATION_CARD}, by ditbench plan)",
        "rule": f"predicted (--predict): DiT-XL/2 at batch 32, fp16 against fp32, on the {CALIBRATION_CARD}; "
        f"held when the ratio's interval (each cell +-{mem:g}%) lies wholly at or below "
        f"{advice.FP16_HALVES_MAX_RATIO:.0%}, not held when wholly above, else inconclusive",
    }


def predict_ckpt_tradeoff() -> dict[str, Any]:
    cell = {**DIT_CELL, "precision": "fp32"}
    full, none, why = _pair({**cell, "grad_ckpt": "full"}, cell)
    if why:
        return {"verdict": None, "why": why}
    mem, speed = memory_band_pct(), full.predicted_speed_band_pct
    if speed is None or not full.predicted_steps_per_s or not none.predicted_steps_per_s:
        return {"verdict": None, "why": f"not predicted: no speed prediction on the {CALIBRATION_CARD}"}
    saving = 1 - full.peak_allocated_gib / none.peak_allocated_gib
    r_lo, r_hi = ratio_band(band(full.peak_allocated_gib, mem), band(none.peak_allocated_gib, mem))
    s_lo, s_hi = 1 - r_hi, 1 - r_lo
    extra = none.predicted_steps_per_s / full.predicted_steps_per_s - 1
    slow = ratio_band(band(none.predicted_steps_per_s, speed), band(full.predicted_steps_per_s, speed))
    e_lo, e_hi = slow[0] - 1, slow[1] - 1
    verdict = _both(
        [judge(s_lo, s_hi, low=advice.CKPT_MIN_SAVING), judge(e_lo, e_hi, high=advice.CKPT_MAX_EXTRA_TIME)]
    )
    return {
        "verdict": verdict,
        "card": CALIBRATION_CARD,
        "values": {
            "saving": saving,
            "saving_interval": [s_lo, s_hi],
            "extra_time": extra,
            "extra_time_interval": [e_lo, e_hi],
            "memory_band_pct": mem,
            "speed_band_pct": speed,
        },
        "text": f"{verdict} (memory saved {saving:.0%}, {s_lo:.0%} to {s_hi:.0%} with each cell's "
        f"+-{mem:g}%; extra time {extra:.0%}, {e_lo:.0%} to {e_hi:.0%} with each cell's +-{speed:g}%: "
        f"DiT-XL/2 fp32 bs=32 {none.peak_allocated_gib:.2f} -> {full.peak_allocated_gib:.2f} GiB, "
        f"{none.predicted_steps_per_s:.2f} -> {full.predicted_steps_per_s:.2f} steps/s on the "
        f"{CALIBRATION_CARD}, by ditbench plan)",
        "rule": f"predicted (--predict): DiT-XL/2 fp32 at batch 32, checkpointed against not, on the "
        f"{CALIBRATION_CARD}; each ratio's interval takes both cells' bands (memory +-{mem:g}%, speed "
        f"+-{speed:g}%), and the verdict is held or not held only where both intervals decide it",
    }


def predict_fit(config: dict[str, Any], gb: int) -> dict[str, Any]:
    card = class_card(gb)
    pred, why = predict(config, card)
    if why:
        return {"verdict": None, "why": why}
    mem, verdict = memory_band_pct(), fit_verdict(pred)
    speed = ""
    if pred.predicted_images_per_s and pred.predicted_speed_band_pct is not None:
        speed = f", {pred.predicted_images_per_s:.0f} images/s +-{pred.predicted_speed_band_pct:g}%"
    return {
        "verdict": verdict,
        "card": card,
        "values": {
            "device_gib": pred.device_gib,
            "card_gib": pred.memory_gib,
            "memory_band_pct": mem,
            IMAGES_PER_S.key: pred.predicted_images_per_s,
            "speed_band_pct": pred.predicted_speed_band_pct,
        },
        "text": f"{verdict} ({_label(config)} needs {pred.device_gib:.2f} GiB +-{mem:g}% of the {card}'s "
        f"{pred.memory_gib:.2f}{speed}, by ditbench plan)",
        "rule": f"predicted (--predict): {_label(config)} on the {card} (the {gb} GB card with the most "
        f"memory); held when the planner's peak (reserved + CUDA context) +{mem:g}% fits it, not held "
        f"when it does not fit even -{mem:g}%, else inconclusive",
    }


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
        if predictor is None:
            c.predicted = {"verdict": None, "why": NOT_PREDICTABLE.get(c.key, "not predicted")}
        else:
            c.predicted = predictor()
