"""A cell in a fresh process of its own session (a timeout kills its whole group; it dies with its
parent). What the child cannot report itself (a hang, a segfault, the OOM killer) the parent records.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ditbench
from ditbench.bench.cell import core as cell_core
from ditbench.bench.launch import procs
from ditbench.bench.launch.files import no_result, read_spec, write_result, write_spec
from ditbench.core.errors import UserError
from ditbench.files.fileio import open_log
from ditbench.spec.cell import CellSpec

MODULE = "ditbench.bench.launch.process"
TORCHRUN_MODULE = "ditbench.bench.launch.torchrun"
LOG_TAIL_BYTES = 64_000  # enough for the traceback lines a record keeps


def child_env(python: str = sys.executable, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment, `extra` over it. Another interpreter (a side of `ditbench ab`) gets no
    PYTHONPATH and PYTHONSAFEPATH, so a checkout where ab runs cannot stand in for its ditbench."""
    env = dict(os.environ)
    if python == sys.executable:
        package_root = str(Path(ditbench.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    else:
        env.pop("PYTHONPATH", None)
        env["PYTHONSAFEPATH"] = "1"
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # torch and NVML then agree on device indices
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class FreshProcess:
    """A `launch.base.Launcher`: `PYTHON -m MODULE SPEC.json RESULT.json` in a session of its own;
    `ditbench ab` gives the side's interpreter, its environment and, side by side, its CPUs."""

    module: str
    python: str = sys.executable
    env: Mapping[str, str] | None = field(default=None, hash=False)  # over this process's environment
    cpus: frozenset[int] | None = None  # the CPUs the process (and what it starts) may run on

    def _preexec(self):
        die = procs.die_with_parent(signal.SIGKILL)  # no orphan keeps the GPU
        if self.cpus is None:
            return die

        def preexec() -> None:
            if die is not None:
                die()
            os.sched_setaffinity(0, self.cpus)

        return preexec

    def launch(
        self,
        spec: CellSpec,
        about: dict[str, Any],
        timeout_s: float,
        spec_path: Path,
        result_path: Path,
        log_path: Path,
    ) -> None:
        result_path.unlink(missing_ok=True)
        write_spec(spec_path, spec, **about, timeout_s=timeout_s)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open_log(log_path) as log:  # O_NOFOLLOW: a link planted in logs/ is refused, not truncated
            proc = subprocess.Popen(
                [self.python, "-m", self.module, str(spec_path), str(result_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(self.python, self.env),
                start_new_session=True,  # its own process group, which a timeout kills as a whole
                preexec_fn=self._preexec(),
            )
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                procs.kill_group(proc)
                write_result(result_path, timed_out(timeout_s, log_path))
                return
            except BaseException:  # Ctrl-C: take the cell down with us
                procs.kill_group(proc)
                raise
        if not result_path.exists():
            write_result(result_path, died(rc, log_path))


ONE_PROCESS = FreshProcess(MODULE)
TORCHRUN = FreshProcess(TORCHRUN_MODULE)  # launch.torchrun's parent starts the ranks


def timed_out(timeout_s: float, log_path: Path) -> dict[str, Any]:
    return {
        "status": "timeout",
        "reason": f"no result after {timeout_s:g} s; the cell's processes were killed",
        "traceback": procs.tail(log_path, LOG_TAIL_BYTES),
    }


def died(rc: int, log_path: Path) -> dict[str, Any]:
    """The result of a cell process that ended without writing one."""
    how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
    hint = (
        " (a SIGKILL with no result is often the kernel's out-of-memory killer)"
        if rc == -signal.SIGKILL
        else ""
    )
    return {
        "status": "error",
        "reason": f"the worker died with {how} before writing a result{hint}",
        "traceback": procs.tail(log_path, LOG_TAIL_BYTES),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m ditbench.bench.launch.process SPEC.json RESULT.json", file=sys.stderr)
        return 2
    try:
        spec, doc = read_spec(argv[0])
    except UserError as err:  # a spec this version cannot read: say so in the result
        write_result(argv[1], no_result(str(err)))
        return 0

    def join():
        from ditbench.hardware.device import resolve_device
        from ditbench.hardware.dist import DistContext

        return DistContext(device=resolve_device(spec.device))  # one process, no process group

    measured = cell_core.measure(spec, doc["cell_name"], join)
    result = measured.result
    if result["status"] == "ok" and spec.smoke_steps:
        result["smoke"] = cell_core.smoke(spec, measured)
    if result["status"] == "ok" and spec.quality is not None:
        result["quality"] = cell_core.quality(spec, measured, doc)
    write_result(argv[1], result)  # a failure's traceback is in the log already (cell_core.log_failure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
