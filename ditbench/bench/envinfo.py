"""`ditbench env`: print the environment that records capture (`ditbench.environment`), and the
peak FLOP/s behind MFU (from the table, or measured on the spot with --measure-peak)."""

from __future__ import annotations

import json
from typing import Any

from ditbench.environment import collect_env

__all__ = ["add_arguments", "collect_env", "run"]


def add_arguments(parser) -> None:
    parser.add_argument(
        "--precision",
        default="bf16",
        choices=["fp32", "tf32", "fp16", "bf16"],
        help="the precision whose peak-FLOPs entry to show (default bf16)",
    )
    parser.add_argument(
        "--measure-peak",
        action="store_true",
        help="also time a large matmul per precision (the achieved ceiling, ~1 s each)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args) -> int:
    from ditbench.bench.measure import PEAK_TFLOPS, gpu_table_key, measure_matmul_tflops, peak_entry

    env = collect_env()
    key = gpu_table_key(env["gpu_name"])
    peaks = {
        p: (peak_entry(env["gpu_name"], p) or {}).get("peak_tflops") for p in ("fp32", "tf32", "fp16", "bf16")
    }
    out: dict[str, Any] = {
        "env": env,
        "mfu_peak": peak_entry(env["gpu_name"], args.precision),
        "peak_table_row": key,
        "peak_tflops": peaks,
    }
    if args.measure_peak:
        device = "cuda" if env["gpu_count"] else "cpu"
        precisions = ["fp32", "tf32", "fp16", "bf16"] if device == "cuda" else ["fp32", "bf16"]
        out["measured_matmul_tflops"] = {p: round(measure_matmul_tflops(device, p), 2) for p in precisions}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for name, value in env.items():
        print(f"{name:<16} {value}")
    if key is None:
        what = env["gpu_name"] or "a CPU"
        print(
            f"{'mfu peak':<16} none: {what} is not in the peak table ({', '.join(PEAK_TFLOPS)}); "
            "records get mfu null rather than a guess"
        )
    else:
        entry = out["mfu_peak"]
        print(f"{'mfu peak':<16} {entry['peak_tflops']} TFLOP/s for {args.precision}: {entry['peak_basis']}")
        print(f"{'peak table':<16} " + ", ".join(f"{p} {v}" for p, v in peaks.items()))
    if "measured_matmul_tflops" in out:
        print(
            f"{'matmul (meas.)':<16} "
            + ", ".join(f"{p} {v} TFLOP/s" for p, v in out["measured_matmul_tflops"].items())
        )
    return 0
