"""Seven sayings about DiT training, checked against every run (no claims file needed): fp16 halves
memory; checkpointing saves about half for 20-30% more time; the 24 / 12 / 48 GB card cases; flash
attention is 2-4x faster; fp16 / bf16 / checkpointing keep sample quality. Each check states its rule.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ditbench.core.errors import UserError
from ditbench.core.intervals import median_interval
from ditbench.hardware.precision import LOW_PRECISIONS
from ditbench.models.configs import get_config
from ditbench.records.metrics import IMAGES_PER_S
from ditbench.report.cells import cell_label as _cell
from ditbench.report.cells import knobs, pairs
from ditbench.report.claim_check import HELD, INCONCLUSIVE, NOT_HELD, NOT_JUDGED, NOT_MEASURED
from ditbench.report.load import value
from ditbench.report.memory import (
    MEM_ALLOCATED,
    activation_share,
    card_lower_bounds,
    fit_memory,
    fits,
    not_meaningful,
)
from ditbench.report.quality import quality_unchanged

IMG_S = IMAGES_PER_S.path

# Thresholds of the advice checks (stated in every report next to the verdicts).
FP16_HALVES_MAX_RATIO = 0.60  # "halves": fp16 peak allocated <= 60% of fp32's
CKPT_MIN_SAVING = 0.40  # "about 50% memory": saves at least 40% of peak allocated
CKPT_MAX_EXTRA_TIME = 0.35  # "for 20-30% more time": costs at most 35% more time per step
FLASH_SPEEDUP_RANGE = (2.0, 4.0)  # "2-4x faster": flash/math images/s (claims/dit_resource_guide.yaml's)
AT_SCALE = "; pairs whose {} cell's activations are under a tenth of its peak are not judged (report.memory)"


def _at_scale(found: list[tuple]) -> tuple[list[tuple], str]:
    """The pairs whose second (the larger) cell's activations could show a saving (report.memory), and
    why the others cannot ('' when none is set aside)."""
    keep = [(x, y) for x, y in found if not not_meaningful(y)]
    small = [y for x, y in found if not_meaningful(y)]
    if not small:
        return keep, ""
    y = max(small, key=lambda r: activation_share(r) or 0.0)
    return keep, f"{not_meaningful(y)} at {_cell(y)}, the largest share of {len(small)} pair(s) set aside"


def _interval(values: list[float]) -> tuple[float, float]:
    """The 95% bootstrap interval of the median (the point itself for one value)."""
    return median_interval(values) if len(values) > 1 else (values[0], values[0])


@dataclass
class AdviceCheck:
    claim: str
    verdict: str
    evidence: str
    rule: str
    numbers: list[dict[str, Any]] = field(default_factory=list)
    key: str = ""  # the check's function name (report.predict's key)
    predicted: dict[str, Any] | None = None  # `report --predict`: the planner's verdict (report.predict)

    @property
    def shown_verdict(self) -> str:
        """The measured verdict; where nothing was measured (or could show), the prediction's."""
        said = (self.predicted or {}).get("verdict")
        return said if self.verdict in (NOT_MEASURED, NOT_JUDGED) and said else self.verdict

    @property
    def shown_evidence(self) -> str:
        """The evidence, with the prediction first where it gives the verdict, else after it."""
        if not self.predicted:
            return self.evidence
        said = self.predicted["text"] if self.predicted["verdict"] else self.predicted["why"]
        if self.shown_verdict != self.verdict:
            return f"{said}; {self.evidence}"
        return f"{self.evidence}; {said}"


def check_fp16_halves(df: pd.DataFrame) -> AdviceCheck:
    claim = "fp16 halves memory"
    rule = (
        f"held when fp16's peak allocated GPU memory is at most {FP16_HALVES_MAX_RATIO:.0%} of fp32's "
        "(median over cells that differ only in precision)"
    ) + AT_SCALE.format("fp32")
    for used in LOW_PRECISIONS:  # bf16 stands in where no fp16 cell was measured
        found = [
            (x, y)
            for x, y in pairs(df, {"precision": used}, {"precision": "fp32"})
            if value(x, MEM_ALLOCATED) is not None and value(y, MEM_ALLOCATED)
        ]
        if found:
            break
    if not found:
        why = "no fp16 (or bf16) cell with an fp32 twin and GPU memory figures in this run"
        return AdviceCheck(claim, NOT_MEASURED, why, rule)
    found, small = _at_scale(found)
    if not found:
        return AdviceCheck(claim, NOT_JUDGED, small, rule)
    numbers = [
        {
            "cell": _cell(x),
            "low_gib": value(x, MEM_ALLOCATED),
            "fp32_gib": value(y, MEM_ALLOCATED),
            "ratio": value(x, MEM_ALLOCATED) / value(y, MEM_ALLOCATED),
        }
        for x, y in found
    ]
    ratios = [n["ratio"] for n in numbers]
    med = statistics.median(ratios)
    best = min(numbers, key=lambda n: n["ratio"])
    verdict = HELD if med <= FP16_HALVES_MAX_RATIO else NOT_HELD
    evidence = (
        f"{used}/fp32 peak allocated: median ratio {med:.2f} over {len(numbers)} pair(s) "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}); lowest {best['ratio']:.2f} at {best['cell']} "
        f"({best['fp32_gib']:.2f} -> {best['low_gib']:.2f} GiB)"
    )
    if used == "bf16":
        evidence = "no fp16 pair; measured with bf16, the same 16-bit autocast. " + evidence
    if verdict == NOT_HELD:
        evidence += ". Weights, gradients and Adam state stay fp32 under autocast; only activations shrink"
    return AdviceCheck(claim, verdict, evidence + (f"; {small}" if small else ""), rule, numbers)


def check_ckpt_tradeoff(df: pd.DataFrame) -> AdviceCheck:
    claim = "gradient checkpointing saves about 50% memory for 20-30% more time"
    rule = (
        f"held when checkpointing saves at least {CKPT_MIN_SAVING:.0%} of peak allocated GPU memory and "
        f"costs at most {CKPT_MAX_EXTRA_TIME:.0%} more time per step (medians over cells that differ only "
        "in grad_ckpt)"
    ) + AT_SCALE.format("un-checkpointed")
    measured = [
        (full, none)
        for full, none in pairs(df, {"grad_ckpt": "full"}, {"grad_ckpt": "none"})
        if value(full, MEM_ALLOCATED) is not None and value(none, MEM_ALLOCATED) and value(full, IMG_S)
        and value(none, IMG_S) is not None
    ]  # fmt: skip
    found, small = _at_scale(measured)
    numbers = [
        {
            "cell": _cell(full),
            "none_gib": value(none, MEM_ALLOCATED),
            "full_gib": value(full, MEM_ALLOCATED),
            "saving": 1 - value(full, MEM_ALLOCATED) / value(none, MEM_ALLOCATED),
            "extra_time": value(none, IMG_S) / value(full, IMG_S) - 1,
        }
        for full, none in found
    ]
    if not numbers:
        if small:
            return AdviceCheck(claim, NOT_JUDGED, small, rule)
        why = "no checkpointed cell with an un-checkpointed twin and GPU memory figures in this run"
        return AdviceCheck(claim, NOT_MEASURED, why, rule)
    savings, extras = ([n[key] for n in numbers] for key in ("saving", "extra_time"))
    saving, extra = statistics.median(savings), statistics.median(extras)
    held = saving >= CKPT_MIN_SAVING and extra <= CKPT_MAX_EXTRA_TIME
    # The median's interval must agree: one that spans a bound fits a verdict either way.
    (s_lo, s_hi), (e_lo, e_hi) = _interval(savings), _interval(extras)
    sure_held = s_lo >= CKPT_MIN_SAVING and e_hi <= CKPT_MAX_EXTRA_TIME
    sure_not = s_hi < CKPT_MIN_SAVING or e_lo > CKPT_MAX_EXTRA_TIME
    best = max(numbers, key=lambda n: n["saving"])
    evidence = (
        f"median memory saved {saving:.0%} (range {min(savings):.0%}-{max(savings):.0%}), median extra "
        f"time {extra:.0%} (range {min(extras):.0%}-{max(extras):.0%}) "
        f"over {len(numbers)} pair(s); largest saving at {best['cell']} ({best['none_gib']:.2f} -> "
        f"{best['full_gib']:.2f} GiB)"
    ) + (f"; {small}" if small else "")
    if not (sure_held or sure_not):
        evidence += (
            f"; 95% intervals of the medians: saved {s_lo:.0%}-{s_hi:.0%}, extra time {e_lo:.0%}-{e_hi:.0%}, "
            "which span the rule's bounds"
        )
        return AdviceCheck(claim, INCONCLUSIVE, evidence, rule, numbers)
    if not held:
        why = []
        if saving < CKPT_MIN_SAVING:
            why.append("saved less memory than claimed (weights and optimizer state are not checkpointed)")
        if extra > CKPT_MAX_EXTRA_TIME:
            why.append("cost more time than claimed")
        evidence += "; " + " and ".join(why)
    return AdviceCheck(claim, HELD if held else NOT_HELD, evidence, rule, numbers)


def _fit_check(df: pd.DataFrame, claim: str, budget: float, select: dict[str, Any], rule: str) -> AdviceCheck:
    bounds = card_lower_bounds(df)
    rows = []
    for _, r in df.iterrows():
        k = knobs(r["record"])
        single_gpu = k.get("gpus", 1) * k.get("nodes", 1) == 1
        if single_gpu and all(k.get(key) == want for key, want in select.items()):
            rows.append(r)
    if not rows:
        return AdviceCheck(claim, NOT_MEASURED, "no such cell (single GPU) in this run", rule)
    verdicts = [(fits(r, budget, bounds), r) for r in rows]
    numbers = []
    for ok, r in verdicts:
        mem, label = fit_memory(r)
        numbers.append(
            {
                "cell": _cell(r),
                "status": r["status"],
                "fits": ok,
                "memory_gib": mem,
                "memory_label": label,
                IMAGES_PER_S.key: value(r, IMG_S),
            }
        )
    fitting = [r for ok, r in verdicts if ok]
    if fitting:
        best = max(fitting, key=lambda r: (value(r, "config.batch_size") or 0, value(r, IMG_S) or 0))
        mem, label = fit_memory(best)
        mem_text = f"{mem:.2f} GiB {label}" if mem is not None else "inside the suite's cap"
        evidence = (
            f"{_cell(best)} ran at {value(best, IMG_S) or float('nan'):.1f} images/s using {mem_text}; "
            f"{len(fitting)} of {len(verdicts)} matching cell(s) fit {budget:g} GiB"
        )
        return AdviceCheck(claim, HELD, evidence, rule, numbers)
    known_no = [r for ok, r in verdicts if ok is False]
    if known_no:
        parts = []
        for r in known_no[:4]:
            mem, label = fit_memory(r)
            parts.append(
                f"{_cell(r)}: "
                + (f"{mem:.2f} GiB {label}" if r["status"] == "ok" and mem is not None else r["status"])
            )
        evidence = f"none of {len(verdicts)} matching cell(s) fit {budget:g} GiB (" + "; ".join(parts) + ")"
        return AdviceCheck(claim, NOT_HELD, evidence, rule, numbers)
    statuses = ", ".join(sorted({str(r["status"]) for _, r in verdicts}))
    evidence = (
        f"matching cells exist but say nothing about {budget:g} GiB "
        f"(status {statuses}, no memory figure, or out of memory on a smaller cap)"
    )
    return AdviceCheck(claim, NOT_MEASURED, evidence, rule, numbers)


def check_24gb_l4(df: pd.DataFrame) -> AdviceCheck:
    return _fit_check(
        df,
        "on a 24 GB card, DiT-L/4 with fp16 and checkpointing, batch 32",
        24.0,
        {"model": "DiT-L/4", "precision": "fp16", "grad_ckpt": "full", "batch_size": 32},
        "held when that exact cell (1 GPU, batch 32 per GPU) ran and fit 24 GiB",
    )


def check_12gb_b8(df: pd.DataFrame) -> AdviceCheck:
    return _fit_check(
        df,
        "12 GB: DiT-B/8 with fp16",
        12.0,
        {"model": "DiT-B/8", "precision": "fp16"},
        "held when some DiT-B/8 fp16 cell (any batch size or checkpointing, 1 GPU) fit 12 GiB; "
        "the evidence names the largest batch that fit",
    )


def check_48gb_xl2(df: pd.DataFrame) -> AdviceCheck:
    check = _fit_check(
        df,
        "48 GB and up: DiT-XL/2",
        48.0,
        {"model": "DiT-XL/2"},
        "held when some DiT-XL/2 cell (any precision, batch size or checkpointing, 1 GPU) fit "
        "48 GiB; the evidence names the largest batch that fit",
    )
    fitting = [n for n in check.numbers if n["status"] == "ok" and n["memory_gib"] is not None]
    if check.verdict == HELD and fitting:
        least = min(fitting, key=lambda n: n["memory_gib"])
        if least["memory_gib"] <= 24:
            check.evidence += (
                f"; it also fits smaller cards: {least['cell']} needed {least['memory_gib']:.2f} GiB"
            )
    return check


def _tokens(row: pd.Series) -> int | None:
    """Tokens per image: (image_size / 8 / patch)^2, the attention's sequence length."""
    model, size = row.get("config.model"), value(row, "config.image_size")
    patch = str(model).rpartition("/")[2]
    return int(size // 8 // int(patch)) ** 2 if size and patch.isdigit() else None


def _attention_share(number: dict[str, Any]) -> float | None:
    try:
        width = get_config(str(number["model"])).hidden_size
    except UserError:
        return None
    t = number["tokens"]
    return 2 * t / (12 * width + 2 * t) if t else None


def check_flash_speedup(df: pd.DataFrame) -> AdviceCheck:
    claim = "Flash attention makes DiT training 2-4x faster"
    low, high = FLASH_SPEEDUP_RANGE
    rule = (
        f"held when attention: flash trains {low:g}-{high:g}x the images/s of attention: math (the "
        "written-out softmax(QK^T/sqrt(d))V), median over GPU cells that differ only in attention"
    )
    gpu, cpu = [], []
    for flash, math_ in pairs(df, {"attention": "flash"}, {"attention": "math"}):
        fast, slow = value(flash, IMG_S), value(math_, IMG_S)
        if not fast or not slow:
            continue
        number = {
            "cell": _cell(flash),
            "model": flash.get("config.model"),
            "flash": fast,
            "math": slow,
            "speedup": fast / slow,
            "tokens": _tokens(flash),
        }
        (gpu if flash.get("config.device") == "cuda" else cpu).append(number)
    if not gpu:
        evidence = "no GPU cell with attention: flash and an attention: math twin in this run"
        if "config.attention" in df:
            refused = df[(df["status"] == "unsupported") & (df["config.attention"] == "flash")]
            if len(refused):
                evidence += f"; flash was unsupported: {str(refused.iloc[0].get('reason'))[:200]}"
        if cpu:
            evidence += f"; on a CPU flash ran {statistics.median(n['speedup'] for n in cpu):.2f}x math"
        return AdviceCheck(claim, NOT_MEASURED, evidence, rule, cpu)
    speedups = [n["speedup"] for n in gpu]
    med = statistics.median(speedups)
    best = max(gpu, key=lambda n: n["speedup"])
    verdict = HELD if low <= med <= high else NOT_HELD
    i_lo, i_hi = _interval(speedups)
    if not (low <= i_lo and i_hi <= high) and not (i_hi < low or i_lo > high):
        verdict = INCONCLUSIVE  # the median's interval spans an end of 2-4x
    evidence = (
        f"flash/math images/s: median {med:.2f}x over {len(gpu)} pair(s) (range {min(speedups):.2f}-"
        f"{max(speedups):.2f}x); largest at {best['cell']} ({best['math']:.1f} -> {best['flash']:.1f} "
        + (f"images/s, {best['tokens']} tokens)" if best["tokens"] else "images/s)")
    )
    share = _attention_share(best)
    if med < low and share is not None:
        evidence += (
            f". At {best['tokens']} tokens the attention products are {share:.0%} of {best['cell']}'s "
            "FLOPs (QK^T and the weighted sum, 2TD per token per block, against 12D^2 for the projections "
            "and MLP): the kernel can only speed up that share"
        )
    elif med > high:
        evidence += ". Faster than the saying claims"
    if verdict == INCONCLUSIVE:
        evidence += f"; the median's 95% interval {i_lo:.2f}-{i_hi:.2f}x spans an end of {low:g}-{high:g}x"
    return AdviceCheck(claim, verdict, evidence, rule, gpu)


def check_quality_unchanged(df: pd.DataFrame) -> AdviceCheck:
    verdict, evidence, step = quality_unchanged(df)
    steps = f"{step:,}" if step is not None else "N"
    return AdviceCheck(
        f"fp16 / bf16 / checkpointing do not change quality after {steps} steps",
        verdict,
        evidence,
        "held when every cell with fp16, bf16 or checkpointing has an FID within noise of its twin without "
        "it at the last step both evaluated (|difference| <= 2 x the combined spread of their seeds, the "
        "gate's rule); not held when one differs beyond it",
    )


ADVICE_CHECKS = (
    check_fp16_halves,
    check_ckpt_tradeoff,
    check_24gb_l4,
    check_12gb_b8,
    check_48gb_xl2,
    check_flash_speedup,
    check_quality_unchanged,
)


def advice_checks(df: pd.DataFrame) -> list[AdviceCheck]:
    checks = []
    for check in ADVICE_CHECKS:
        checks.append(check(df))
        checks[-1].key = check.__name__
    return checks
