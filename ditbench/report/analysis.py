"""What the measurements say: speed-up over the suite's baseline, what to run, which advice held.

Cells are compared by their knobs: the flattened `config` minus the keys that differ between
otherwise equal cells for bookkeeping reasons (`global_batch` follows batch size and GPU count;
`smoke_steps` is set only on the cells that get a smoke run). Two cells "differ only in X" when
their knobs are equal once X is set to the same value.

Memory budgets are per GPU and in GiB (a "24 GB" card has about 24 GiB: an RTX 4090 reports
23.99 GiB). A cell fits a budget when the best memory figure it has is within it: NVML device
memory (it includes the CUDA context, so it is what the card really needs), else allocator
reserved, else allocator allocated. An out-of-memory cell counts as "does not fit" only where we
know the memory it ran out of was at least the budget (the suite's cap, the card's size in
env.gpu_memory_gib, or a card that other cells showed to be bigger).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ditbench.report.load import column, flatten, value

MATCH_EXCLUDED = frozenset({"global_batch", "smoke_steps"})
FAILED = ("oom", "timeout", "nan_loss", "error")

# Thresholds of the advice checks (stated in every report next to the verdicts).
FP16_HALVES_MAX_RATIO = 0.60  # "halves": fp16 peak allocated <= 60% of fp32's
CKPT_MIN_SAVING = 0.40  # "about 50% memory": saves at least 40% of peak allocated
CKPT_MAX_EXTRA_TIME = 0.35  # "for 20-30% more time": costs at most 35% more time per step

MEM_ALLOCATED = "metrics.peak_mem_allocated_gib"
MEM_RESERVED = "metrics.peak_mem_reserved_gib"
MEM_DEVICE = "metrics.device_mem_gib"
MEM_RSS = "metrics.cpu_peak_rss_gib"
IMG_S = "metrics.images_per_s"

# Model sizes when a record carries no parameter count: S < B < L < XL, then smaller patch = more work.
_SIZE_ORDER = {"S": 0, "B": 1, "L": 2, "XL": 3}


# ---------------------------------------------------------------------------------------------- knobs


_KNOBS_CACHE: dict[int, tuple[dict[str, Any], Any, dict[str, Any]]] = {}


def knobs(record: dict[str, Any]) -> dict[str, Any]:
    """The flattened config of a record, without the bookkeeping keys (a fresh dict; safe to change)."""
    # Reports ask for the same record's knobs many times; flattening dominated big reports. The
    # entry keeps the record alive, so its id cannot be reused while cached.
    config = record.get("config")
    hit = _KNOBS_CACHE.get(id(record))
    if hit is None or hit[0] is not record or hit[1] is not config:
        if len(_KNOBS_CACHE) > 200_000:
            _KNOBS_CACHE.clear()
        flat = {k: v for k, v in flatten(config or {}).items() if k not in MATCH_EXCLUDED}
        hit = (record, config, flat)
        _KNOBS_CACHE[id(record)] = hit
    return dict(hit[2])


def knob_key(k: dict[str, Any]) -> str:
    return json.dumps(k, sort_keys=True, default=str)


def knob_index(df: pd.DataFrame, status: str | None = "ok") -> dict[str, list[int]]:
    """knob key -> row labels (only rows of the given status; None for all)."""
    index: dict[str, list[int]] = {}
    for label, row in df.iterrows():
        if status is None or row["status"] == status:
            index.setdefault(knob_key(knobs(row["record"])), []).append(label)
    return index


def varying_knobs(df: pd.DataFrame, exclude: tuple[str, ...] = ()) -> list[str]:
    """Knobs that take more than one value across the rows (absent counts as a value), headline first."""
    all_knobs = [knobs(r) for r in df["record"]]
    keys = set().union(*all_knobs) if all_knobs else set()
    vary = {
        key
        for key in keys
        if key not in exclude
        and len({json.dumps(k.get(key, "<absent>"), sort_keys=True, default=str) for k in all_knobs}) > 1
    }
    head = ["model", "precision", "grad_ckpt", "batch_size", "gpus"]
    return [k for k in head if k in vary] + sorted(vary - set(head))


def model_size_key(model: str, params: float | None) -> tuple:
    if params is not None:
        return (params, 0)
    name = str(model).removeprefix("DiT-")
    size, _, patch = name.partition("/")
    return (_SIZE_ORDER.get(size, -1), -int(patch) if patch.isdigit() else 0)


# -------------------------------------------------------------------------------------------- memory


def memory_metric(df: pd.DataFrame) -> tuple[str, str]:
    """(column, label) of the memory figure to plot and compare: device allocated, else host RSS (CPU)."""
    ok = df[df["status"] == "ok"]
    if column(ok, MEM_ALLOCATED).notna().any():
        return MEM_ALLOCATED, "peak allocated (GiB)"
    if column(ok, MEM_RSS).notna().any():
        return MEM_RSS, "CPU peak RSS (GiB)"
    return MEM_ALLOCATED, "peak allocated (GiB)"


def fit_memory(row: pd.Series | dict[str, Any]) -> tuple[float | None, str]:
    """The memory figure that decides whether a cell fits a card, and its name."""
    for name, label in (
        (MEM_DEVICE, "NVML device memory"),
        (MEM_RESERVED, "reserved"),
        (MEM_ALLOCATED, "allocated"),
    ):
        v = value(row, name)
        if v is not None:
            return v, label
    return None, ""


def card_lower_bounds(df: pd.DataFrame) -> dict[Any, float]:
    """gpu_name -> the most memory an ok cell used on it (the card holds at least that)."""
    bounds: dict[Any, float] = {}
    for _, row in df[df["status"] == "ok"].iterrows():
        mem, _ = fit_memory(row)
        if mem is not None:
            name = row.get("env.gpu_name")
            bounds[name] = max(bounds.get(name, 0.0), mem)
    return bounds


def fits(row: pd.Series, budget_gib: float, bounds: dict[Any, float] | None = None) -> bool | None:
    """Does this cell fit a card of budget_gib? None when the record cannot tell."""
    cap = value(row, "config.gpu_memory_gb")
    if row["status"] == "ok":
        flag = (row["record"].get("metrics") or {}).get("fits_budget")
        if isinstance(flag, bool) and cap is not None and cap == budget_gib:
            return flag
        mem, _ = fit_memory(row)
        if mem is not None:
            return mem <= budget_gib
        return True if cap is not None and cap <= budget_gib else None
    if row["status"] == "oom":
        if cap is not None:
            return False if cap >= budget_gib else None
        card = value(row, "env.gpu_memory_gib") or (bounds or {}).get(row.get("env.gpu_name"))
        return False if card is not None and card >= budget_gib else None
    return None


# ------------------------------------------------------------------------------------------ baseline


def baseline_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Per row: its baseline cell and the speed-up / memory saved against it.

    A cell's baseline is the ok cell equal to it except on the keys of the suite's `baseline`
    (record field suite_baseline), which take the baseline's values. Speed-up is images/s over the
    baseline's; memory saved is 1 - memory / baseline memory, in percent (negative: uses more).
    """
    mem_col, _ = memory_metric(df)
    index = knob_index(df)
    out = pd.DataFrame(
        index=df.index,
        columns=[
            "baseline_label",
            "baseline_cell_id",
            "baseline_name",
            "is_baseline",
            "speedup",
            "mem_saved_pct",
            "baseline_note",
        ],
    )
    out["is_baseline"] = False
    for label, row in df.iterrows():
        base = row.get("suite_baseline")
        if not isinstance(base, dict) or not base:
            out.at[label, "baseline_note"] = "the suite names no baseline"
            continue
        k = knobs(row["record"])
        wanted = flatten(base)
        unknown = [key for key in wanted if key not in k]
        if unknown:
            out.at[label, "baseline_note"] = f"baseline key {', '.join(unknown)} is not a knob of this cell"
            continue
        target = {**k, **wanted}
        matches = index.get(knob_key(target), [])
        if not matches:
            out.at[label, "baseline_note"] = "its baseline cell did not run ok"
            continue
        base_label = matches[-1]
        brow = df.loc[base_label]
        out.at[label, "baseline_label"] = base_label
        out.at[label, "baseline_cell_id"] = brow["cell_id"]
        out.at[label, "baseline_name"] = brow.get("cell_name")
        out.at[label, "is_baseline"] = target == k
        if row["status"] != "ok":
            continue
        speed, base_speed = value(row, IMG_S), value(brow, IMG_S)
        if speed is not None and base_speed:
            out.at[label, "speedup"] = speed / base_speed
        mem, base_mem = value(row, mem_col), value(brow, mem_col)
        if mem is not None and base_mem:
            out.at[label, "mem_saved_pct"] = (1 - mem / base_mem) * 100
    out["speedup"] = pd.to_numeric(out["speedup"], errors="coerce")
    out["mem_saved_pct"] = pd.to_numeric(out["mem_saved_pct"], errors="coerce")
    return out


# ----------------------------------------------------------------------------------- recommendations


@dataclass
class Recommendation:
    budget: str  # "24 GiB (suite cap)" or "the NVIDIA H200 it ran on"
    gpus: int
    model: str
    cell_name: str | None  # None: nothing fits
    images_per_s: float | None = None
    memory_gib: float | None = None
    memory_label: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass
class Recommendations:
    per_model: list[Recommendation]
    largest: dict[tuple[str, int], Recommendation]  # (budget, gpus) -> the biggest model with a fitting cell


def _budget_label(row: pd.Series) -> tuple[str, float | None]:
    cap = value(row, "config.gpu_memory_gb")
    if cap is not None:
        return f"{cap:g} GiB (the suite's gpu_memory_gb)", cap
    gpu = row.get("env.gpu_name")
    device = row.get("config.device")
    if device == "cpu" or not gpu:
        return "this machine (CPU)", None
    card = value(row, "env.gpu_memory_gib")
    return (f"the {gpu} ({card:.1f} GiB) it ran on" if card else f"the {gpu} it ran on"), None


def recommend(df: pd.DataFrame) -> Recommendations:
    """Per model and budget: the fastest ok cell that fits; per budget: the largest model that fits."""
    per_model: list[Recommendation] = []
    largest: dict[tuple[str, int], Recommendation] = {}
    best_size: dict[tuple[str, int], tuple] = {}
    groups: dict[tuple[str, int], list[Any]] = {}
    budgets: dict[str, float | None] = {}
    for label, row in df.iterrows():
        name, cap = _budget_label(row)
        budgets[name] = cap
        gpus = int((value(row, "config.gpus") or 1) * (value(row, "config.nodes") or 1))
        groups.setdefault((name, gpus), []).append(label)
    for (budget, gpus), labels in groups.items():
        sub = df.loc[labels]
        cap = budgets[budget]
        for model in _ordered_models(sub):
            rows = sub[sub["config.model"] == model]
            fitting = [
                r
                for _, r in rows.iterrows()
                if r["status"] == "ok" and (cap is None or fits(r, cap) is not False)
            ]
            if not fitting:
                statuses = ", ".join(f"{n} {s}" for s, n in rows["status"].value_counts().items())
                per_model.append(Recommendation(budget, gpus, model, None, note=f"nothing fits ({statuses})"))
                continue
            best = max(fitting, key=lambda r: value(r, IMG_S) or 0.0)
            mem, mem_label = fit_memory(best)
            rec = Recommendation(
                budget,
                gpus,
                model,
                best.get("cell_name"),
                value(best, IMG_S),
                mem,
                mem_label,
                knobs(best["record"]),
            )
            if cap is not None and mem is None:
                rec.note = "memory not measured; ran inside the cap"
            per_model.append(rec)
            size = model_size_key(model, value(best, "metrics.params"))
            if (budget, gpus) not in best_size or size > best_size[(budget, gpus)]:
                best_size[(budget, gpus)] = size
                largest[(budget, gpus)] = rec
    return Recommendations(per_model, largest)


def _ordered_models(df: pd.DataFrame) -> list[str]:
    models = {}
    for _, row in df.iterrows():
        m = row.get("config.model")
        p = value(row, "metrics.params")
        models[m] = max(models.get(m, p) or 0, p or 0) or None
    return sorted(models, key=lambda m: model_size_key(m, models[m]))


# ------------------------------------------------------------------------------------ advice checks

HELD, NOT_HELD, NOT_MEASURED = "held", "did not hold", "not measured"


@dataclass
class AdviceCheck:
    claim: str
    verdict: str
    evidence: str
    rule: str
    numbers: list[dict[str, Any]] = field(default_factory=list)


def pairs(df: pd.DataFrame, key: str, a: Any, b: Any) -> list[tuple[pd.Series, pd.Series]]:
    """(row with key=a, row with key=b) for ok rows that differ only in `key`."""
    index = knob_index(df)
    out = []
    for _, row in df[df["status"] == "ok"].iterrows():
        k = knobs(row["record"])
        if k.get(key) != a:
            continue
        for label in index.get(knob_key({**k, key: b}), [])[-1:]:
            out.append((row, df.loc[label]))
    return out


def _cell(row: pd.Series) -> str:
    return str(row.get("cell_name") or row.get("cell_id"))


def check_fp16_halves(df: pd.DataFrame) -> AdviceCheck:
    claim = "fp16 halves memory"
    rule = (
        f"held when fp16's peak allocated GPU memory is at most {FP16_HALVES_MAX_RATIO:.0%} of fp32's "
        "(median over cells that differ only in precision)"
    )
    used = "fp16"
    found = [
        (x, y)
        for x, y in pairs(df, "precision", "fp16", "fp32")
        if value(x, MEM_ALLOCATED) is not None and value(y, MEM_ALLOCATED)
    ]
    if not found:
        used = "bf16"
        found = [
            (x, y)
            for x, y in pairs(df, "precision", "bf16", "fp32")
            if value(x, MEM_ALLOCATED) is not None and value(y, MEM_ALLOCATED)
        ]
    if not found:
        return AdviceCheck(
            claim,
            NOT_MEASURED,
            "no fp16 (or bf16) cell with an fp32 twin and GPU memory figures in this run",
            rule,
        )
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
    return AdviceCheck(claim, verdict, evidence, rule, numbers)


def check_ckpt_tradeoff(df: pd.DataFrame) -> AdviceCheck:
    claim = "gradient checkpointing saves about 50% memory for 20-30% more time"
    rule = (
        f"held when checkpointing saves at least {CKPT_MIN_SAVING:.0%} of peak allocated GPU memory and "
        f"costs at most {CKPT_MAX_EXTRA_TIME:.0%} more time per step (medians over cells that differ only "
        "in grad_ckpt)"
    )
    numbers = []
    for full, none in pairs(df, "grad_ckpt", "full", "none"):
        mf, mn = value(full, MEM_ALLOCATED), value(none, MEM_ALLOCATED)
        sf, sn = value(full, IMG_S), value(none, IMG_S)
        if mf is None or not mn or not sf or sn is None:
            continue
        numbers.append(
            {
                "cell": _cell(full),
                "none_gib": mn,
                "full_gib": mf,
                "saving": 1 - mf / mn,
                "extra_time": sn / sf - 1,
            }
        )
    if not numbers:
        return AdviceCheck(
            claim,
            NOT_MEASURED,
            "no checkpointed cell with an un-checkpointed twin and GPU memory figures in this run",
            rule,
        )
    saving = statistics.median(n["saving"] for n in numbers)
    extra = statistics.median(n["extra_time"] for n in numbers)
    held = saving >= CKPT_MIN_SAVING and extra <= CKPT_MAX_EXTRA_TIME
    best = max(numbers, key=lambda n: n["saving"])
    evidence = (
        f"median memory saved {saving:.0%} (range {min(n['saving'] for n in numbers):.0%}-"
        f"{max(n['saving'] for n in numbers):.0%}), median extra time {extra:.0%} (range "
        f"{min(n['extra_time'] for n in numbers):.0%}-{max(n['extra_time'] for n in numbers):.0%}) "
        f"over {len(numbers)} pair(s); largest saving at {best['cell']} ({best['none_gib']:.2f} -> "
        f"{best['full_gib']:.2f} GiB)"
    )
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
    keep = []
    for label, r in df.iterrows():
        k = knobs(r["record"])
        single_gpu = k.get("gpus", 1) * k.get("nodes", 1) == 1
        if single_gpu and all(k.get(key) == want for key, want in select.items()):
            keep.append(label)
    rows = df.loc[keep]
    if not len(rows):
        return AdviceCheck(claim, NOT_MEASURED, "no such cell (single GPU) in this run", rule)
    verdicts = [(fits(r, budget, bounds), r) for _, r in rows.iterrows()]
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
                "images_per_s": value(r, IMG_S),
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
        return AdviceCheck(
            claim,
            NOT_HELD,
            f"none of {len(verdicts)} matching cell(s) fit {budget:g} GiB (" + "; ".join(parts) + ")",
            rule,
            numbers,
        )
    statuses = ", ".join(sorted({str(r["status"]) for _, r in verdicts}))
    return AdviceCheck(
        claim,
        NOT_MEASURED,
        f"matching cells exist but say nothing about {budget:g} GiB "
        f"(status {statuses}, no memory figure, or out of memory on a smaller cap)",
        rule,
        numbers,
    )


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


ADVICE_CHECKS = (check_fp16_halves, check_ckpt_tradeoff, check_24gb_l4, check_12gb_b8, check_48gb_xl2)


def advice_checks(df: pd.DataFrame) -> list[AdviceCheck]:
    return [check(df) for check in ADVICE_CHECKS]
