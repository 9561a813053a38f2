"""The planner's speed model on this CPU: its measured matmul peak as the datasheet, fitted on cells.

    ditbench run cpu_smoke --out /tmp/cpu_speed 'precision=[fp32,bf16]' 'smoke.cells=[]'
    python benchmarks/speed_cpu.py /tmp/cpu_speed/results.jsonl [--peak-tflops X] [--write DIR]

The CPU's "card" is its measured fp32/bf16 matmul rate at the cells' one thread (ditbench.hardware.walltime,
what `ditbench env --measure-peak` runs; or --peak-tflops), its memory bandwidth a nominal 20 GB/s.
Each finished CPU record's config is traced for the CPU (ditbench.plan) and the speed model, with the
host's time added to the work (no asynchronous device on a CPU), is fitted on the records and checked
leave-one-out. Prints a table; the machine's load at the time is printed too (a shared machine's
measurements are noisy). Target (issue 23): every cell's leave-one-out |error| <= 25%.

--write DIR keeps the figures: DIR/results.jsonl (the records fitted), DIR/loo.json (the peak, the fit
and each cell's leave-one-out prediction, which a test refits from the records) and DIR/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cells(records: list[dict], peak_tflops: float):
    from ditbench.plan.emulation import CPU
    from ditbench.plan.predict import normalize, series_trace, trace_knobs
    from ditbench.plan.speed import Cell, blocks, cpu_datasheet

    sheet = cpu_datasheet(peak_tflops * 1000)
    out = []
    for r in records:
        steps = (r.get("metrics") or {}).get("steps_per_s")
        if r.get("status") != "ok" or not steps:
            continue
        cell = normalize(r["config"])
        series = series_trace(trace_knobs(cell, CPU), CPU, disk=True)
        depth, ckpt = blocks(cell["model"], cell["grad_ckpt"])
        name = f"{cell['model']} {cell['precision']} ckpt={cell['grad_ckpt']} b{cell['batch_size']}"
        out.append(
            Cell(name, series.trace.kernels, cell["batch_size"], sheet, cell["precision"], False, steps,
                 overlap=False, blocks=depth, ckpt_blocks=ckpt)
        )  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", type=Path)
    parser.add_argument("--peak-tflops", type=float, help="the CPU's fp32 matmul TFLOP/s (default: measured)")
    parser.add_argument(
        "--write", type=Path, metavar="DIR", help="keep the records, the fit and a README here"
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    import torch

    from ditbench.plan.speed import calibrate
    from ditbench.records.jsonl import read_records

    torch.set_num_threads(1)
    peak = args.peak_tflops
    if peak is None:
        from ditbench.hardware.walltime import measure_matmul_tflops

        peak = measure_matmul_tflops("cpu", "fp32", n=512, seconds=2.0)
    records = read_records(args.results)
    found = cells(records, peak)
    cal = calibrate(found, f"{args.results} on this CPU")
    table = ["| cell | measured steps/s | leave-one-out | error | noisy |", "|---|---:|---:|---:|---|"]
    noisy = {_name(r): bool((r.get("metrics") or {}).get("noisy")) for r in records}
    for r in cal.loo:
        table.append(
            f"| {r['cell']} | {r['measured_steps_per_s']:.3f} | {r['predicted_steps_per_s']:.3f} | "
            f"{r['error_pct']:+.1f}% | {'yes' if noisy.get(r['cell']) else ''} |"
        )
    errors = [abs(r["error_pct"]) for r in cal.loo]
    loads = [(r.get("metrics") or {}).get("load") or {} for r in records]
    load_1m = [x.get(k) for x in loads for k in ("load_1m_start", "load_1m_end") if x.get(k) is not None]
    shares = [x["other_cpu_share"] for x in loads if x.get("other_cpu_share") is not None]
    load = (
        f"load average {min(load_1m):.1f}-{max(load_1m):.1f} and other processes' CPU share "
        f"{100 * min(shares):.0f}-{100 * max(shares):.0f}% during the cells' windows"
        if load_1m and shares
        else "the records carry no load"
    )
    summary = (
        f"{len(found)} cells; fp32 peak {peak * 1000:.1f} GFLOP/s (1 thread); {load}; {os.cpu_count()} CPUs; "
        f"leave-one-out median |error| {statistics.median(errors):.1f}%, worst "
        f"{max(errors):.1f}% (target: every cell within 25%); fitted: "
        + json.dumps({k: round(v, 4) for k, v in cal.params.items()})
    )
    print("\n".join(table) + "\n\n" + summary)
    if args.write:
        source = (
            "given (--peak-tflops)"
            if args.peak_tflops
            else "measured by this script (512x512 fp32 matmuls, 2 s)"
        )
        write(args.write, args.results, peak, cal, table, summary + f"\n\nThe fp32 peak was {source}.")
    return 0


def _name(record: dict) -> str:
    c = record.get("config") or {}
    return f"{c.get('model')} {c.get('precision')} ckpt={c.get('grad_ckpt')} b{c.get('batch_size')}"


def write(out: Path, results: Path, peak: float, cal, table: list[str], summary: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if results.resolve() != (out / "results.jsonl").resolve():
        shutil.copyfile(results, out / "results.jsonl")
    fit = {"peak_tflops": peak, "params": cal.params, "loo": cal.loo}
    (out / "loo.json").write_text(json.dumps(fit, indent=1) + "\n")
    (out / "README.md").write_text(
        "# The planner's speed model on this CPU (benchmarks/speed_cpu.py)\n\n"
        "`python benchmarks/speed_cpu.py results.jsonl --write DIR`, on the records of "
        "`ditbench run cpu_smoke 'precision=[fp32,bf16]' 'smoke.cells=[]'` (one torch thread per cell). "
        "Each cell is predicted by "
        "a fit on the other cells (leave-one-out).\n\n" + "\n".join(table) + "\n\n" + summary + "\n"
    )


if __name__ == "__main__":
    sys.exit(main())
