"""Inside a cell's submitit job (SLURM, or submitit's local executor): what each of its tasks runs.

SLURM starts one task per rank through srun, no torchrun. Each task of a multi-process cell runs
`launch.rank` and writes `exit<R>.json`; task 0 then judges and aggregates the ranks as torchrun's
launcher does. The out folder must be shared.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ditbench.bench.launch import base, procs, torchrun
from ditbench.bench.launch.files import read_report, read_spec, write_result
from ditbench.bench.launch.process import child_env
from ditbench.files.fileio import open_log, write_atomic, write_json_atomic
from ditbench.spec.cell import CellSpec

POLL_S = 0.2
PEER_GRACE_S = 10.0  # a failed peer's rank is given this long to write its own report, then stopped
STOP_GRACE_S = 5.0  # between SIGTERM and SIGKILL
LOG_TAIL_BYTES = 6000


class StoppedBySlurm(BaseException):
    """SLURM is ending the job (its time limit, scancel, a requeue): the task stops without a result."""


def _leave_the_end_to_slurm() -> None:
    """A job SLURM stops is recorded from SLURM's state, not from what its task saw. submitit turns the
    time-limit warning (SIGUSR2) into an exception that would end the job FAILED: it is ignored here.
    SIGTERM stops the task without a result; the submitter then reads the job's state."""

    def stop(signum, frame):
        raise StoppedBySlurm(f"{signal.Signals(signum).name} from SLURM: no result; the job's state says why")

    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, stop)


def started_path(result_path: Path) -> Path:
    """`<key>.started.json`: written when the job starts (the record's start and duration come from it)."""
    return result_path.with_name(result_path.name.replace(".result.json", ".started.json"))


def read_started(result_path: Path) -> dict:
    """What the job's task 0 wrote when it started: {} before that (or for a cell that is no job)."""
    return read_report(started_path(result_path)) or {}


def run_task(spec_path: str, result_path: str, log_path: str, timeout_s: float) -> None:
    """One task of a cell's job; returns None (the result is the RESULT file, never a pickle)."""
    import submitit

    job = submitit.JobEnvironment()
    if job.cluster == "slurm":
        _leave_the_end_to_slurm()
    spec, doc = read_spec(spec_path)
    result = Path(result_path)
    if job.global_rank == 0:
        info = {"started_unix": time.time(), "job_id": job.job_id, "hostnames": list(job.hostnames)}
        write_json_atomic(started_path(result), info)
    if job.num_tasks != spec.world_size:
        if job.global_rank == 0:
            why = f"the job has {job.num_tasks} task(s) but the cell needs {spec.world_size} rank(s)"
            write_result(result, {"status": "error", "reason": why + "; ditbench submits one task per rank"})
        return
    about = {k: doc.get(k) for k in ("cell_id", "cell_name", "rendezvous", "out_dir")}
    launcher = base.for_cell(spec, ranks=JOB_RANKS)  # the one process, or this task's rank
    launcher.launch(spec, about, timeout_s, Path(spec_path), result, Path(log_path))


def _rank_env(spec, job) -> dict[str, str]:
    from submitit.helpers import TorchDistributedEnvironment

    dist = TorchDistributedEnvironment()
    env = child_env()
    local = job.cluster == "local"  # one machine: its own loopback, not a name that may not resolve
    env.update(
        MASTER_ADDR="127.0.0.1" if local else dist.master_addr,
        MASTER_PORT=str(dist.master_port),
        RANK=str(dist.rank),
        WORLD_SIZE=str(dist.world_size),
        LOCAL_RANK=str(dist.local_rank),
        LOCAL_WORLD_SIZE=str(dist.local_world_size),
        GROUP_RANK=str(job.node),
    )
    base.share_cores(env, spec, dist.local_world_size, os.environ)  # the ranks on one node, as under torchrun
    return env


def _peer_failed(report_dir: Path, rank: int) -> bool:
    for path in report_dir.glob("exit[0-9]*.json"):
        data = read_report(path)
        if data and data.get("rank") != rank and (data.get("returncode") != 0 or data.get("timed_out")):
            return True
    return False


@dataclass(frozen=True)
class JobRanks:
    """A Launcher for a multi-process cell in its submitit job: each task runs a rank, task 0 the result."""

    def launch(
        self, spec: CellSpec, about, timeout_s: float, spec_path: Path, result_path: Path, log_path: Path
    ):
        import submitit

        job = submitit.JobEnvironment()
        env = _rank_env(spec, job)
        rank = int(env["RANK"])
        report_dir = base.report_dir(result_path)
        report_dir.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        timed_out, timed_out_at, failed_peer_at = False, None, None
        with open_log(report_dir / f"task{rank}.log", append=True) as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", base.RANK_MODULE, str(spec_path), str(report_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own group, stopped as a whole
                preexec_fn=procs.die_with_parent(signal.SIGKILL),
            )
            try:
                while proc.poll() is None:
                    now = time.monotonic()
                    if now - start > timeout_s:
                        timed_out, timed_out_at = True, time.time()  # before the rank is stopped
                        break
                    if failed_peer_at is None and _peer_failed(report_dir, rank):
                        failed_peer_at = now
                    if failed_peer_at is not None and now - failed_peer_at > PEER_GRACE_S:
                        break
                    time.sleep(POLL_S)
            finally:  # Ctrl-C, scancel's SIGTERM, a timeout, a failed peer: the rank goes with us
                if proc.poll() is None:
                    procs.stop_tree(proc, {}, STOP_GRACE_S)
        write_json_atomic(
            report_dir / f"exit{rank}.json",
            {
                "rank": rank,
                "returncode": proc.returncode,
                "timed_out": timed_out,
                "timed_out_at": timed_out_at,
            },
        )
        if rank == 0:
            deadline = time.monotonic() + max(0.0, timeout_s - (time.monotonic() - start)) + 2 * PEER_GRACE_S
            _write_cell_result(spec, result_path, log_path, report_dir, timeout_s, start, deadline, job)


JOB_RANKS = JobRanks()


def _write_cell_result(spec, result, log_path, report_dir, timeout_s, start, deadline, job) -> None:
    """Task 0: every task's exit, then the cell's result as the torchrun launcher would judge it."""
    world = spec.world_size
    exits: dict[int, dict] = {}
    while True:
        exits = {r: d for r in range(world) if (d := read_report(report_dir / f"exit{r}.json")) is not None}
        if len(exits) == world or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    missing = [r for r in range(world) if r not in exits]
    codes = [exits[r].get("returncode") for r in sorted(exits)]
    returncode = next((c for c in codes if c != 0), 0) if not missing else 1
    logs = "".join(
        f"--- rank {r} ---\n{procs.tail(report_dir / f'task{r}.log', LOG_TAIL_BYTES)}" for r in range(world)
    )
    if missing:
        logs += f"\nno exit report from the task(s) of rank(s) {', '.join(map(str, missing))}\n"
    limits = [d["timed_out_at"] for d in exits.values() if isinstance(d.get("timed_out_at"), (int, float))]
    launched = torchrun.LaunchResult(
        returncode=returncode,
        timed_out=any(bool(d.get("timed_out")) for d in exits.values()),
        timed_out_at=min(limits, default=None),  # the first task to reach the limit stopped the cell
        duration_s=time.monotonic() - start,
        output_tail=logs[-LOG_TAIL_BYTES:],
        launcher="srun" if job.cluster == "slurm" else "submitit-local",
        **torchrun.read_reports(report_dir),
    )
    rdzv = torchrun.Rendezvous(nnodes=spec.knobs.nodes, node_rank=0)
    write_result(result, torchrun.result_of_launch(launched, spec, timeout_s, rdzv))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # every rank's output in the cell's log, as the local runner keeps it; atomic: replaces a link
    write_atomic(log_path, logs)
