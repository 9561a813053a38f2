"""The environment a record captures (host, CPU, GPU, driver, CUDA, torch, ditbench and its commit), in
the process that measured. Nothing here initialises CUDA unless a GPU is visible.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ditbench import __version__

NVML_MISSING = "missing nvidia-ml-py"


def git_sha() -> str | None:
    """The commit of the ditbench checkout, '+dirty' when it has local changes; None outside git."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str, check: bool = False) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=check
        )
        return done.stdout.strip()

    try:
        sha = git("rev-parse", "HEAD", check=True)
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "") if sha else None


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _nvml(query: Callable[[Any], Any]) -> Any:
    """query(pynvml) once NVML is up, or None (pynvml, the nvidia-ml-py package, is optional)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return query(pynvml)
    except Exception:  # noqa: BLE001 - NVML absent or not permitted
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_status(cuda: bool) -> str:
    """Why the record's driver and NVML device memory are (or are not) known: NVML is optional."""
    if not cuda:
        return "not used (no GPU)"
    try:
        import pynvml
    except ImportError:
        return f"{NVML_MISSING}: driver and device memory are null (pip install 'ditbench[gpu]')"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - a driver without NVML, a container without the library
        return f"unavailable: {type(err).__name__}: {str(err)[:200]}"
    return "ok"


def nvml_gpu() -> tuple[str | None, float | None]:
    """Name and memory of the first visible GPU through NVML, without touching CUDA; (None, None)."""

    def query(nv: Any) -> tuple[str, float]:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        get = nv.nvmlDeviceGetHandleByIndex if visible.isdigit() else nv.nvmlDeviceGetHandleByUUID
        handle = get(int(visible) if visible.isdigit() else visible)
        return _text(nv.nvmlDeviceGetName(handle)), round(nv.nvmlDeviceGetMemoryInfo(handle).total / 2**30, 2)

    return _nvml(query) or (None, None)


def collect_env(probe_cuda: bool = True) -> dict[str, Any]:
    """The record's `env`. probe_cuda=False (the runner's parent process) never creates a CUDA
    context, which would hold device memory for the whole suite; it asks NVML for the GPU instead."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda and probe_cuda:
        props = torch.cuda.get_device_properties(0)
        gpu_name, gpu_mem = props.name, round(props.total_memory / 2**30, 2)
    elif cuda:
        gpu_name, gpu_mem = nvml_gpu()
    else:
        gpu_name, gpu_mem = None, None
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu_name": gpu_name,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_memory_gib": gpu_mem,
        "driver": _nvml(lambda nv: _text(nv.nvmlSystemGetDriverVersion())) if cuda else None,
        "nvml": nvml_status(cuda),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "ditbench": __version__,
        "git_sha": git_sha(),
    }
