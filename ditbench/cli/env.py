"""`ditbench env`: print the environment that records capture (`ditbench.hardware.environment`), and the
peak FLOP/s behind MFU (from the table, or measured on the spot with --measure-peak)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from ditbench.hardware.environment import collect_env
from ditbench.hardware.precision import PRECISIONS, compute_dtype, supported_on, unsupported_reason


def add_arguments(parser) -> None:
    from ditbench.cli.options import add_device, add_json, add_precision

    add_precision(parser, "bf16", "the precision whose peak-FLOPs entry to show")
    add_device(parser, "where --measure-peak times its matmuls")
    parser.add_argument(
        "--measure-peak",
        action="store_true",
        help="also time square matmuls per precision, the achieved ceiling: about 1 s per precision on a "
        "GPU (fp32, tf32, fp16, bf16); on a CPU fp32 and bf16, sized to a few seconds in all",
    )
    add_json(parser, "one object (environment, peaks, measured figures)")


def run(args) -> int:
    from ditbench.bench.cell.mfu import PEAK_TFLOPS, gpu_table_key, peak_entry
    from ditbench.hardware.device import resolve_device

    device = resolve_device(args.device)  # cuda without a GPU: a clean error before anything runs
    env = collect_env()
    key = gpu_table_key(env["gpu_name"])
    peaks = {p: (peak_entry(env["gpu_name"], p) or {}).get("peak_tflops") for p in PRECISIONS}
    vision = torchvision_check()
    out: dict[str, Any] = {
        "env": env,
        "torchvision_check": vision,
        "mfu_peak": peak_entry(env["gpu_name"], args.precision),
        "peak_table_row": key,
        "peak_tflops": peaks,
    }
    if args.measure_peak:
        out.update(measure_peaks(str(device)))
    if args.json:
        print(json.dumps(out, indent=2))
        return _report_torchvision(vision)
    for name, value in env.items():
        print(f"{name:<16} {value}")
    print(
        f"{'torchvision':<16} {vision['torchvision']}: " + ("loads with torch" if vision["ok"] else "BROKEN")
    )
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
        how = out["measured_matmul"]
        print(
            f"{'matmul (meas.)':<16} "
            + ", ".join(f"{p} {v:.3g} TFLOP/s" for p, v in out["measured_matmul_tflops"].items())
            + f" on {how['device']} ({how['took_s']} s)"
        )
        for p, why in how["skipped"].items():
            print(f"{'':<16} {p} not measured: {why}")
    return _report_torchvision(vision)


def _matching_torchvision(torch_version: str) -> str:
    """The torchvision release built against `torch_version` (for torch 2.M.P it is 0.(M+15).P)."""
    base, _, local = torch_version.partition("+")
    parts = base.split(".")
    if len(parts) >= 3 and parts[0] == "2" and parts[1].isdigit():
        return f"0.{int(parts[1]) + 15}.{parts[2]}" + (f"+{local}" if local else "")
    return (
        f"the release that lists torch {torch_version} (https://pytorch.org/get-started/previous-versions/)"
    )


def torchvision_check() -> dict[str, Any]:
    """Whether torchvision loads with this torch: imported, and one op of its compiled extension run.
    A mismatched pair imports fine and fails at the first compiled op (`torchvision::nms does not exist`)."""
    import torch

    result: dict[str, Any] = {
        "ok": False,
        "torch": torch.__version__,
        "torchvision": None,
        "error": None,
        "fix": None,
    }
    try:
        import torchvision
        from torchvision.ops import nms

        result["torchvision"] = getattr(torchvision, "__version__", "unknown")
        boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
        kept = nms(boxes, torch.tensor([1.0, 0.5]), 0.5)
        result["ok"] = kept.tolist() == [0]
        if not result["ok"]:
            result["error"] = f"torchvision.ops.nms kept {kept.tolist()} of two equal boxes, not [0]"
    except Exception as err:  # noqa: BLE001 - any failure to load or run the op is the finding
        result["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    if not result["ok"]:
        index = torch.__version__.partition("+")[2]
        where = f" --index-url https://download.pytorch.org/whl/{index}" if index else ""
        vision_pin = _matching_torchvision(torch.__version__).partition("+")[0]
        result["fix"] = (
            f"pip install torch=={torch.__version__.partition('+')[0]} torchvision=={vision_pin}{where}"
            if vision_pin[0].isdigit()
            else f"install torchvision {vision_pin}"
        )
    return result


def _report_torchvision(vision: dict[str, Any]) -> int:
    """Exit 0 when torchvision loads with torch; else one paragraph on stderr and exit 2."""
    if vision["ok"]:
        return 0
    shown = vision["torchvision"] or "(not importable)"
    print(
        f"ditbench: error: torch {vision['torch']} and torchvision {shown} "
        f"do not load together ({vision['error']}); image loading, `fid` and the tests need both. "
        f"Install matching versions from the same index: {vision['fix']}",
        file=sys.stderr,
    )
    return 2


CPU_SECONDS = 0.5  # per precision: a CPU's matmul rate is steady; its bound is the time a user waits
CPU_MATMUL_S = 0.05  # the side is chosen so one matmul takes about this long (slow bf16 CPUs included)


def _cpu_side(precision: str) -> int:
    """A square side whose matmul takes about CPU_MATMUL_S here, from one timed 256 x 256 matmul."""
    import torch

    dtype = compute_dtype(precision)
    a = torch.randn(256, 256, dtype=dtype)
    a @ a  # the first call pays for kernel selection
    start = time.perf_counter()
    a @ a
    rate = 2 * 256**3 / max(time.perf_counter() - start, 1e-6)
    side = (CPU_MATMUL_S * rate / 2) ** (1 / 3)
    return int(min(2048, max(128, round(side / 128) * 128)))


def measure_peaks(device: str) -> dict[str, Any]:
    """Achieved matmul TFLOP/s per precision on `device` and how they were measured (bounded on a CPU)."""
    from ditbench.hardware.walltime import measure_matmul_tflops

    start = time.perf_counter()
    tflops: dict[str, float] = {}
    sides: dict[str, int | None] = {}
    cuda = device.startswith("cuda")
    for p in PRECISIONS if cuda else supported_on("cpu"):
        sized = {} if cuda else {"n": _cpu_side(p), "seconds": CPU_SECONDS}  # CUDA: walltime's own side
        sides[p] = sized.get("n")
        tflops[p] = float(f"{measure_matmul_tflops(device, p, **sized):.4g}")
    skipped = {p: unsupported_reason(p, "cpu") for p in PRECISIONS if p not in tflops}
    how = {
        "device": device,
        "side": sides,
        "skipped": skipped,
        "took_s": round(time.perf_counter() - start, 1),
    }
    return {"measured_matmul_tflops": tflops, "measured_matmul": how}
