"""What the device check measures and what it is held to: the H200 anchors, the suites it runs
(on the GPU, and their tiny CPU stand-ins for the dry run) and the verdict on each target.

Standard library only: the driver (device_check.py) imports this without importing torch.

The anchors were measured on one NVIDIA H200 with the official facebookresearch/DiT training step
(latents only, no VAE; torch 2.11, CUDA 13) and are kept with every other measurement of that run in
benchmarks/h200_official_dit_anchor.jsonl; a test checks the figures below against that file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SPEED_TARGET = 1.00  # every matched cell at least as fast as the official code ...
MEMORY_SLACK_GIB = 0.005  # ... at no more memory (the anchors are rounded to 0.01 GiB)
COMPILE_TARGET_IMG_S = 600.0  # DiT-XL/2 bf16 + torch.compile at batch 256
PLANNER_TOLERANCE = (0.10, 0.5)  # predicted peak within 10% or 0.5 GiB of the measured one
MATMUL_TFLOPS = {"bf16": 780.5, "fp16": 748.8, "tf32": 405.5, "fp32": 50.6}  # same H200, n = 8192
INCEPTION_IMG_S = 2141.8  # torch-fidelity's InceptionV3, fp32, batch 500, same H200
TORCH_FIDELITY_FID_10K_S = 8.0  # torch-fidelity FID of 10,000 vs 10,000 images in memory


@dataclass(frozen=True)
class Anchor:
    model: str
    precision: str
    grad_ckpt: str
    batch_size: int
    compile: bool
    img_s: float
    peak_alloc_gib: float
    stand_in: dict  # the dry run's tiny CPU cell that takes this cell's place in the same control flow

    @property
    def cell(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "precision": self.precision,
            "grad_ckpt": self.grad_ckpt,
            "batch_size": self.batch_size,
            "compile": self.compile,
        }

    @property
    def label(self) -> str:
        extra = " compile" if self.compile else ""
        return f"{self.model} {self.precision} ckpt={self.grad_ckpt} bs={self.batch_size}{extra}"


def _tiny(precision: str, grad_ckpt: str = "none", batch_size: int = 2, model: str = "DiT-T/8") -> dict:
    return {"model": model, "precision": precision, "grad_ckpt": grad_ckpt, "batch_size": batch_size}


MATCHED = (
    Anchor("DiT-XL/2", "fp32", "none", 32, False, 54.0, 32.66, _tiny("fp32")),
    Anchor("DiT-XL/2", "tf32", "none", 32, False, 163.1, 32.66, _tiny("tf32")),
    Anchor("DiT-XL/2", "bf16", "none", 32, False, 276.9, 26.05, _tiny("bf16")),
    Anchor("DiT-XL/2", "fp16", "none", 32, False, 269.8, 26.05, _tiny("fp16")),
    Anchor("DiT-XL/2", "bf16", "full", 32, False, 194.2, 15.29, _tiny("bf16", "full")),
    Anchor("DiT-XL/2", "bf16", "none", 128, False, 371.0, 61.91, _tiny("bf16")),
    Anchor("DiT-L/4", "fp16", "none", 16, False, 199.7, 10.6, _tiny("fp16", model="DiT-T/4")),
)
# Official code + torch.compile + fused AdamW + foreach EMA; the target is 600 img/s. The dry run
# stands in an eager cell: compiling even a tiny model on 2 CPU cores takes longer than the whole run.
COMPILED = Anchor(
    "DiT-XL/2", "bf16", "none", 256, True, 596.0, 93.41, {**_tiny("bf16", batch_size=4), "compile": False}
)

# The 24 GB card: an H200 capped to an RTX 4090. What each cell must do there: run and fit, run out of
# memory (DiT-XL/2 fp32 needs 32.7 GiB), or be skipped after its series ran out of memory. The dry
# run's CPU cannot be capped, so its out-of-memory is injected (DITBENCH_INJECT_FAULT) into a real cell.
CARD_24GB = "RTX 4090"
EXPECT_24GB = (
    ({"model": "DiT-XL/2", "precision": "fp32", "grad_ckpt": "none", "batch_size": 32}, "oom", _tiny("fp32")),
    (
        {"model": "DiT-XL/2", "precision": "fp32", "grad_ckpt": "none", "batch_size": 64},
        "skipped",
        _tiny("fp32", batch_size=4),
    ),
    (
        {"model": "DiT-L/4", "precision": "fp16", "grad_ckpt": "none", "batch_size": 16},
        "ok",
        _tiny("bf16", "full"),
    ),
    (
        {"model": "DiT-XL/2", "precision": "bf16", "grad_ckpt": "full", "batch_size": 32},
        "ok",
        _tiny("bf16", "full"),
    ),
)
SMOKE_CELL = 2  # index in EXPECT_24GB of the cell that also gets the smoke run
DRY_OOM_FAULT = "DiT-T/8 fp32 ckpt=none bs=2=oom"  # the dry run's injected out-of-memory
ATTENTION_BASE = {"model": "DiT-XL/2", "precision": "bf16", "grad_ckpt": "none", "batch_size": 32}

REAL = {"image_size": 256, "device": "cuda", "steps": {"warmup": 3, "measure": 10, "min_seconds": 1.0}}
DRY = {"image_size": 64, "device": "cpu", "steps": {"warmup": 1, "measure": 2, "min_seconds": 0.0}}
SMOKE_STEPS = {False: 50, True: 5}
COMPILE_STEPS = {"warmup": 3, "measure": 8, "min_seconds": 1.0}  # the first warm-up step compiles


def _suite(name: str, dry: bool, cells: list[dict], **top) -> dict:
    """A suite of exactly these cells (the first as a one-value matrix, the rest included), each once."""
    cells = list({json.dumps(c, sort_keys=True): c for c in cells}.values())  # stand-ins may repeat
    base = DRY if dry else REAL
    steps = top.pop("steps", base["steps"])
    defaults = {
        "image_size": base["image_size"],
        "data": "synthetic",
        "steps": steps,
        **top.pop("defaults", {}),
    }
    return {
        "name": name,
        "description": "written by benchmarks/device_check.py",
        "device": base["device"],
        **top,
        "defaults": defaults,
        "matrix": {k: [v] for k, v in cells[0].items()},
        "include": cells[1:],
    }


def matched_suite(dry: bool) -> dict:
    return _suite("device_check_matched", dry, [a.stand_in if dry else a.cell for a in MATCHED])


def compiled_suite(dry: bool) -> dict:
    cell = COMPILED.stand_in if dry else {**COMPILED.cell, "optimizer_impl": "fused"}
    return _suite("device_check_compiled", dry, [cell], steps=DRY["steps"] if dry else COMPILE_STEPS)


def suite_24gb(dry: bool) -> dict:
    cells = [stand_in if dry else cell for cell, _, stand_in in EXPECT_24GB]
    smoke = {"steps": SMOKE_STEPS[dry], "cells": [cells[SMOKE_CELL]]}
    top: dict[str, Any] = {"defaults": {"smoke": smoke}}
    if not dry:
        top["card"] = CARD_24GB
    return _suite("device_check_24gb", dry, cells, **top)


COMPILE_MODE_BASE = {"model": "DiT-S/2", "precision": "bf16", "grad_ckpt": "none", "batch_size": 64}


# Each compile mode compiles cold inside the time left: only the default mode (the compiled part's,
# here on a small model beside its eager twin). max-autotune's cold compile alone outlasts the time
# variants gets; suites/gpu_speed.yaml runs all four modes.
CHECKED_COMPILE_MODES = ("default",)


def variant_cells(dry: bool, backends: list[str], modes: list[str], mode_knob: str | None) -> list[dict]:
    """A cell per attention backend beyond sdpa (DiT-XL/2 bf16 bs32, whose sdpa twin is a matched
    cell), the same cell with foreach AdamW (fused is the default on CUDA), then an eager DiT-S/2 cell
    and the same compiled in each checked mode (a small model: it compiles cold). The dry run keeps
    only one attention cell: every CPU training cell or compile more would not fit the part's dry cap
    on 2 busy cores."""
    if dry:
        return [{**MATCHED[2].stand_in, "attention": b} for b in backends[:1]]
    # In the order they matter, cheapest first: variants runs on the time the other parts left, and a
    # cut keeps the cells already done. math and flash (the advice check's pair), AdamW, the other
    # kernels (~12 s a cell), then the compile pair (a cold compile, ~40 s).
    first = [b for b in ("math", "flash") if b in backends]
    cells = [{**ATTENTION_BASE, "attention": b} for b in first]
    cells.append({**ATTENTION_BASE, "optimizer_impl": "foreach"})
    cells += [{**ATTENTION_BASE, "attention": b} for b in backends if b not in first]
    checked = [m for m in modes if m in CHECKED_COMPILE_MODES]
    if checked and mode_knob:
        cells.append(COMPILE_MODE_BASE)
        for mode in checked:
            knobs = {"compile": mode} if mode_knob == "compile" else {"compile": True, mode_knob: mode}
            cells.append({**COMPILE_MODE_BASE, **knobs})
    return cells


def variants_suite(dry: bool, cells: list[dict]) -> dict:
    return _suite("device_check_variants", dry, cells)


# ---------------------------------------------------------------------------------------------
# Verdicts: met, not met, or not measured (never met by default)
# ---------------------------------------------------------------------------------------------

MET, NOT_MET, NOT_MEASURED = "met", "not met", "not measured"


def _cfg_key(cfg: dict) -> tuple:
    return (cfg.get("model"), cfg.get("precision"), cfg.get("grad_ckpt"), cfg.get("batch_size"))


def find_record(records: list[dict], cell: dict) -> dict | None:
    """The latest record whose config has the cell's model, precision, checkpointing and batch."""
    want = _cfg_key(cell)
    found = [r for r in records if _cfg_key(r.get("config") or {}) == want]
    return found[-1] if found else None


def _metric(record: dict | None, key: str) -> float | None:
    value = ((record or {}).get("metrics") or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def anchor_verdict(anchor: Anchor, record: dict | None, dry: bool) -> dict[str, Any]:
    """A matched cell against its anchor: >= 1.00x the official img/s at <= its peak allocated GiB."""
    ips, mem = _metric(record, "images_per_s"), _metric(record, "peak_mem_allocated_gib")
    if dry and mem is None:
        mem = _metric(record, "cpu_peak_alloc_gib")  # a CPU stand-in has the CPU allocator's peak
    out: dict[str, Any] = {
        "target": f"{anchor.label}: >= {SPEED_TARGET:.2f}x {anchor.img_s:g} img/s "
        f"at <= {anchor.peak_alloc_gib:g} GiB",
        "kind": "compiled" if anchor.compile else "matched",
        "anchor": {"img_s": anchor.img_s, "peak_alloc_gib": anchor.peak_alloc_gib},
        "cell": record.get("cell_name") if record else None,
        "status": record.get("status") if record else None,
        "images_per_s": ips,
        "peak_alloc_gib": mem,
    }
    if record is None or record.get("status") != "ok" or ips is None or mem is None:
        why = (
            "no record"
            if record is None
            else f"{record.get('status')}: {record.get('reason') or 'no figures'}"
        )
        return {**out, "verdict": NOT_MEASURED, "why": why[:300]}
    ratio = ips / anchor.img_s
    fast, lean = ratio >= SPEED_TARGET, mem <= anchor.peak_alloc_gib + MEMORY_SLACK_GIB
    if anchor.compile:  # the compiled cell's target is an absolute speed
        fast = ips >= COMPILE_TARGET_IMG_S
        out["target"] = f"{anchor.label}: >= {COMPILE_TARGET_IMG_S:g} img/s (official {anchor.img_s:g})"
        lean = True
    out.update(speed_ratio=round(ratio, 3), memory_ratio=round(mem / anchor.peak_alloc_gib, 3))
    misses = ([] if fast else ["slower"]) + ([] if lean else ["more memory"])
    return {**out, "verdict": MET if not misses else NOT_MET, "why": ", ".join(misses) or None}


def planner_verdict(prediction: dict | None, record: dict | None) -> dict[str, Any]:
    """Predicted peak allocated against the measured one (CUDA allocator, or the CPU allocator on a CPU);
    for a cell that ran out of memory, whether the prediction said it would not fit."""
    measured = _metric(record, "peak_mem_allocated_gib")
    if measured is None:
        measured = _metric(record, "cpu_peak_alloc_gib")
    predicted = (prediction or {}).get("peak_allocated_gib")
    out: dict[str, Any] = {
        "cell": record.get("cell_name") if record else None,
        "measured_gib": measured,
        "predicted_gib": predicted,
        "predicted_status": (prediction or {}).get("status"),
        "measured_status": record.get("status") if record else None,
    }
    _speed(out, prediction, record)
    fit = {"fits": True, "oom": False}.get(out["predicted_status"])
    if fit is not None and out["measured_status"] in ("ok", "oom"):
        out["fit_agrees"] = fit == (out["measured_status"] == "ok")
    if out["measured_status"] == "oom" and "fit_agrees" in out:
        ok = out["fit_agrees"]
        return {**out, "verdict": MET if ok else NOT_MET, "why": None if ok else "predicted to fit"}
    if predicted is None:
        return {**out, "verdict": NOT_MEASURED, "why": "no prediction for this cell"}
    if measured is None or record is None or record.get("status") != "ok":
        return {**out, "verdict": NOT_MEASURED, "why": "no measured peak"}
    rel, gib = PLANNER_TOLERANCE
    error = predicted - measured
    out.update(error_gib=round(error, 3), error_pct=round(100 * error / measured, 1) if measured else None)
    ok = abs(error) <= max(rel * measured, gib)
    return {**out, "verdict": MET if ok else NOT_MET, "why": None if ok else "outside +-10% / +-0.5 GiB"}


def _speed(out: dict[str, Any], prediction: dict | None, record: dict | None) -> None:
    """The time model's steps/s on the real GPU against the measured ones (shown beside the memory
    verdict, which it does not change): the error and whether it is within the calibration's band."""
    predicted = (prediction or {}).get("predicted_steps_per_s")
    measured = _metric(record, "steps_per_s")
    out.update(predicted_steps_per_s=predicted, measured_steps_per_s=measured)
    if predicted and measured and record and record.get("status") == "ok":
        error = 100 * (predicted / measured - 1)
        band = (prediction or {}).get("predicted_speed_band_pct")
        within = None if band is None else abs(error) <= band
        out.update(speed_error_pct=round(error, 1), speed_within_band=within)


def expectation_verdict(expected: str, record: dict | None, smoke: bool) -> dict[str, Any]:
    """A 24 GB cell: the status it should end with (and a finished smoke run where one was asked)."""
    out = {"expected": expected, "cell": record.get("cell_name") if record else None}
    if record is None:
        return {**out, "status": None, "verdict": NOT_MEASURED, "why": "no record"}
    status = record.get("status")
    fits = (record.get("metrics") or {}).get("fits_budget")
    out.update(status=status, fits_budget=fits, reason=(record.get("reason") or "")[:200] or None)
    problems = [] if status == expected else [f"ended {status}"]
    if smoke:
        sm = record.get("smoke") or {}
        out["smoke"] = {
            k: sm.get(k) for k in ("steps", "status", "first_mean", "last_mean", "nonfinite_steps")
        }
        if sm.get("status") not in (None, "ok") or not sm.get("steps"):
            problems.append("smoke run did not finish")
    return {**out, "verdict": MET if not problems else NOT_MET, "why": ", ".join(problems) or None}
