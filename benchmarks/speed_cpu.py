"""The planner's speed model on this CPU: its measured matmul peak as the datasheet, fitted on cells.

    ditbench run cpu_smoke --out /tmp/cpu_speed 'precision=[fp32,bf16]' 'smoke.cells=[]'
    python benchmarks/speed_cpu.py /tmp/cpu_speed/results.jsonl [--peak-tflops X]

The CPU's "card" is its measured fp32/bf16 matmul rate at the cells' one thread (ditbench.bench.mfu,
what `ditbench env --measure-peak` runs; or --peak-tflops), its memory bandwidth a nominal 20 GB/s.
Each finished CPU record's config is traced for the CPU (ditbench.plan) and the speed model, with the
host's time added to the work (no asynchronous device on a CPU), is fitted on the records and checked
leave-one-out. Prints a table; the machine's load at the time is printed too (a shared machine's
measurements are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
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
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    import torch

    from ditbench.plan.measured_records import read_results
    from ditbench.plan.speed import calibrate

    torch.set_num_threads(1)
    peak = args.peak_tflops
    if peak is None:
        from ditbench.bench.mfu import measure_matmul_tflops

        peak = measure_matmul_tflops("cpu", "fp32", n=512, seconds=2.0)
    load = os.getloadavg()
    found = cells(read_results(args.results), peak)
    cal = calibrate(found, f"{args.results} on this CPU")
    print("| cell | measured steps/s | leave-one-out | error |\n|---|---|---|---|")
    for r in cal.loo:
        print(
            f"| {r['cell']} | {r['measured_steps_per_s']:.3f} | {r['predicted_steps_per_s']:.3f} | "
            f"{r['error_pct']:+.1f}% |"
        )
    errors = [abs(r["error_pct"]) for r in cal.loo]
    print(
        f"\n{len(found)} cells; fp32 peak {peak * 1000:.1f} GFLOP/s (1 thread); load average {load[0]:.1f} "
        f"on {os.cpu_count()} CPUs; leave-one-out median |error| {statistics.median(errors):.1f}%, worst "
        f"{max(errors):.1f}%; fitted: " + json.dumps({k: round(v, 4) for k, v in cal.params.items()})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
