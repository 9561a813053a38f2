"""The planner's speed model against an H200: calibrate it on the anchors, and check it leave-one-out.

    python benchmarks/speed_vs_h200.py [--write]

Measured: steps/s of the official facebookresearch/DiT training step on one NVIDIA H200 (latents
only; torch 2.11, CUDA 13), every `dit_train` row of benchmarks/h200_official_dit_anchor.jsonl with a
speed. Rows that give only img/s are steps/s = img/s / batch; a cell measured twice keeps its first
measurement. Predicted: the trace of ditbench's step in the official order (`zero_grad:
after_forward`, foreach AdamW) through ditbench/plan/speed.py with the H200's datasheet figures.

The speed model's efficiencies are fitted on all the cells; each cell is also predicted by a fit on
the others (leave-one-out). The shipped calibration (ditbench/plan/speed_calibration.json) adds the
published A100 figures: benchmarks/speed_vs_published.py. Targets: leave-one-out median |error| <= 10%,
worst <= 25%; the XL/2 batch-32 fp32 : tf32 : bf16 speed ratios within 10%.

--write regenerates reports/plan_vs_h200/speed.md, speed_rows.json and speed_kernels.json (each
anchor's kernel rows, which the tests refit); without it the script prints the table and exits 1 when
a target is missed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ANCHOR_FILE = ROOT / "benchmarks" / "h200_official_dit_anchor.jsonl"
REPORT = ROOT / "reports" / "plan_vs_h200"
OFFICIAL = {"zero_grad": "after_forward", "optimizer_impl": "foreach"}


def anchors(path: Path = ANCHOR_FILE) -> list[dict]:
    """The measured speed cells of the anchor file, first measurement of each cell."""
    out, seen = [], set()
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") != "dit_train" or row.get("impl") != "official":
            continue
        key = (row["model"], row["precision"], row["ckpt"], row["batch"], row["compile"])
        steps = row.get("steps_per_s")
        if steps is None and row.get("img_per_s"):
            steps = row["img_per_s"] / row["batch"]
        if steps is None or key in seen:
            continue
        seen.add(key)
        out.append(
            {"model": row["model"], "precision": row["precision"],
             "grad_ckpt": "full" if row["ckpt"] else "none", "batch_size": row["batch"],
             "compile": row["compile"], "measured_steps_per_s": steps,
             "from_img_per_s": row.get("steps_per_s") is None}
        )  # fmt: skip
    return out


def name(a: dict) -> str:
    return (
        f"{a['model']} {a['precision']}{' + compile' if a['compile'] else ''} ckpt={a['grad_ckpt']} "
        f"b{a['batch_size']}"
    )


def cells(rows: list[dict]):
    """speed.Cell per anchor (the traces come from the on-disk plan cache when they are there)."""
    from ditbench.hardware.cards import DATASHEETS
    from ditbench.plan.emulation import cuda_target
    from ditbench.plan.predict import normalize, series_trace, trace_knobs
    from ditbench.plan.speed import Cell, blocks

    target = cuda_target(None)
    out = []
    for a in rows:
        config = {k: a[k] for k in ("model", "precision", "grad_ckpt", "batch_size", "compile")}
        cell = normalize({**config, **OFFICIAL})
        series = series_trace(trace_knobs(cell, target), target, disk=True)
        depth, ckpt_blocks = blocks(a["model"], a["grad_ckpt"])
        out.append(
            Cell(name(a), series.trace.kernels, a["batch_size"], DATASHEETS["H200"], a["precision"],
                 a["compile"], a["measured_steps_per_s"], blocks=depth, ckpt_blocks=ckpt_blocks)
        )  # fmt: skip
    return out


KERNELS = REPORT / "speed_kernels.json"


def save_cells(cells_, path: Path = KERNELS) -> None:
    """Each anchor's traced kernel rows, so the fit can be checked without tracing (tests)."""
    rows = [
        {"name": c.name, "batch": c.batch, "precision": c.precision, "compile": c.compiled,
         "measured_steps_per_s": c.measured_steps_per_s, "blocks": c.blocks, "ckpt_blocks": c.ckpt_blocks,
         "kernels": [[*k, n] for k, n in sorted(c.kernels.items())]}
        for c in cells_
    ]  # fmt: skip
    path.write_text("[\n" + ",\n".join(json.dumps(r, separators=(",", ":")) for r in rows) + "\n]\n")


def load_cells(path: Path = KERNELS):
    from ditbench.hardware.cards import DATASHEETS
    from ditbench.plan.speed import Cell

    return [
        Cell(r["name"], {(k[0], k[1], k[2], *k[3:7]): k[7] for k in r["kernels"]}, r["batch"],
             DATASHEETS["H200"], r["precision"], r["compile"], r["measured_steps_per_s"],
             blocks=r["blocks"], ckpt_blocks=r["ckpt_blocks"])
        for r in json.loads(path.read_text())
    ]  # fmt: skip


def summary(cal) -> dict:
    errors = [abs(r["error_pct"]) for r in cal.loo]
    return {"cells": len(errors), "median_abs_error_pct": statistics.median(errors),
            "worst_abs_error_pct": max(errors), "within_10_pct": sum(e <= 10 for e in errors)}  # fmt: skip


def ratios(cal, rows: list[dict]) -> list[dict]:
    """XL/2 batch-32 (no checkpointing) speed relative to bf16, measured and leave-one-out predicted."""
    by = {r["cell"]: r for r in cal.loo}
    pick = {a["precision"]: name(a) for a in rows
            if a["model"] == "DiT-XL/2" and a["batch_size"] == 32 and a["grad_ckpt"] == "none"
            and not a["compile"]}  # fmt: skip
    base = by[pick["bf16"]]
    out = []
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        r = by[pick[precision]]
        measured = r["measured_steps_per_s"] / base["measured_steps_per_s"]
        predicted = r["predicted_steps_per_s"] / base["predicted_steps_per_s"]
        out.append({"precision": precision, "measured": measured, "predicted": predicted,
                    "error_pct": 100 * (predicted / measured - 1)})  # fmt: skip
    return out


def table(cal, rows: list[dict], full) -> str:
    from ditbench.plan.speed import predict

    lines = [
        "| cell | measured steps/s | predicted (all cells) | leave-one-out | LOO error |",
        "|---|---|---|---|---|",
    ]
    for a, r, c in zip(rows, cal.loo, full, strict=True):
        mark = " (from img/s)" if a["from_img_per_s"] else ""
        lines.append(
            f"| {r['cell']} | {r['measured_steps_per_s']:.3f}{mark} | {predict(c, cal.params):.3f} | "
            f"{r['predicted_steps_per_s']:.3f} | {r['error_pct']:+.1f}% |"
        )
    return "\n".join(lines)


def build():
    from ditbench.plan.speed import calibrate

    rows = anchors()
    full = cells(rows)
    cal = calibrate(full, "H200 anchors (benchmarks/h200_official_dit_anchor.jsonl, official DiT step)")
    return rows, full, cal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--write", action="store_true", help="regenerate the shipped calibration and the report"
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    start = time.perf_counter()
    rows, full, cal = build()
    seconds = time.perf_counter() - start
    s = summary(cal)
    rat = ratios(cal, rows)
    text = table(cal, rows, full)
    params = ", ".join(f"{k} {v:.3g}" for k, v in cal.params.items())
    line = (
        f"{s['cells']} cells; leave-one-out median |error| {s['median_abs_error_pct']:.1f}%, worst "
        f"{s['worst_abs_error_pct']:.1f}%, {s['within_10_pct']} within 10%; fitted on all: {params} "
        f"({seconds:.0f} s)"
    )
    rtext = "\n".join(
        ["| XL/2 b32 | measured vs bf16 | predicted (LOO) | error |", "|---|---|---|---|"]
        + [
            f"| {r['precision']} | {r['measured']:.3f} | {r['predicted']:.3f} | {r['error_pct']:+.1f}% |"
            for r in rat
        ]
    )
    print(text + "\n\n" + line + "\n\n" + rtext)
    ok = (
        s["median_abs_error_pct"] <= 10
        and s["worst_abs_error_pct"] <= 25
        and all(abs(r["error_pct"]) <= 10 for r in rat)
    )
    if args.write:
        REPORT.mkdir(parents=True, exist_ok=True)
        save_cells(full)
        (REPORT / "speed_rows.json").write_text(
            json.dumps({"summary": s, "ratios": rat, "calibration": cal.to_dict()}, indent=1) + "\n"
        )
        (REPORT / "speed.md").write_text(report(text, line, rtext))
    return 0 if ok else 1


def report(text: str, line: str, rtext: str) -> str:
    return f"""# ditbench plan's speed model against an H200 (official DiT training step)

Measured: steps/s of the official facebookresearch/DiT training step on one NVIDIA H200 (torch 2.11,
CUDA 13; benchmarks/h200_official_dit_anchor.jsonl; rows that give only img/s are img/s / batch).
Predicted: `ditbench plan`'s time model (ditbench/plan/speed.py) over the kernels of a fake-tensor
trace of ditbench's step in the official order, with the H200's measured matmul rates. "All cells" is
the fit on every row; "leave-one-out" predicts each row with a fit on the others (the shipped
calibration adds published A100 figures: reports/plan_vs_published). Targets: leave-one-out median
|error| <= 10%, worst <= 25%; XL/2 precision ratios within 10%. Regenerate:
`python benchmarks/speed_vs_h200.py --write`.

{text}

{line}

Precision ratios of DiT-XL/2 at batch 32 (no checkpointing), leave-one-out predictions:

{rtext}
"""


if __name__ == "__main__":
    sys.exit(main())
