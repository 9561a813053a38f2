"""The environment a result record captures, and `ditbench env`, which prints it.

`collect_env()` is called in the worker (the process that ran the cell), so the record describes
the device the numbers came from. Nothing here initialises CUDA unless a GPU is visible.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from ditbench import __version__


def git_sha() -> str | None:
    """The commit of the ditbench checkout, '+dirty' when it has local changes; None outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "") if sha else None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_driver() -> str | None:
    try:
        import pynvml  # optional: the nvidia-ml-py package
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # noqa: BLE001 - NVML absent or not permitted
        return None


def _nvml_gpu() -> tuple[str | None, float | None]:
    """Name and memory of the first visible GPU through NVML, without touching CUDA."""
    try:
        import pynvml

        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        handle = (
            pynvml.nvmlDeviceGetHandleByIndex(int(visible))
            if visible.isdigit()
            else pynvml.nvmlDeviceGetHandleByUUID(visible)
        )
        name = pynvml.nvmlDeviceGetName(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        return (name.decode() if isinstance(name, bytes) else name), round(memory, 2)
    except Exception:  # noqa: BLE001 - NVML is optional
        return None, None


def collect_env(probe_cuda: bool = True) -> dict[str, Any]:
    """The record's `env`. probe_cuda=False (the runner's parent process) never creates a CUDA
    context, which would hold device memory for the whole suite; it asks NVML for the GPU instead."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda and probe_cuda:
        props = torch.cuda.get_device_properties(0)
        gpu_name, gpu_mem = props.name, round(props.total_memory / 2**30, 2)
    elif cuda:
        gpu_name, gpu_mem = _nvml_gpu()
    else:
        gpu_name, gpu_mem = None, None
    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu_name": gpu_name,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_memory_gib": gpu_mem,
        "driver": nvidia_driver() if cuda else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "ditbench": __version__,
        "git_sha": git_sha(),
    }
    return env


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
