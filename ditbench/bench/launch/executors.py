"""submitit for the submitter: make the executor, submit a cell's task, ask whether a job still runs, cancel.
submitit is optional, imported only by `--executor`; its result pickles are never read.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from ditbench.bench.launch.process import child_env
from ditbench.bench.launch.srun import run_task
from ditbench.core.errors import UserError
from ditbench.files.fileio import read_regular, rmtree_real, write_json_atomic
from ditbench.files.outlock import process_start

SUBMITIT_DIR = "submitit"
JOB_ID = {"local": re.compile(r"[1-9][0-9]{0,9}"), "slurm": re.compile(r"[0-9]{1,12}(_[0-9]{1,9})?")}
LOCAL_CONTROLLER = "submitit.local._local"  # the module a local job's controller runs
# SLURM states of a job that has not ended (sacct/squeue); anything else has ended. UNKNOWN: not (yet)
# in sacct: submitted a moment ago, or sacct is slow.
ACTIVE_STATES = set(
    "PENDING RUNNING REQUEUED REQUEUE_HOLD REQUEUE_FED CONFIGURING COMPLETING RESIZING SUSPENDED "
    "SIGNALING STAGE_OUT READY UNKNOWN".split()
)


@dataclass(frozen=True)
class JobRef:
    executor: str  # local | slurm
    job_id: str
    folder: str  # submitit's folder
    pid_started: float | None = None  # local: the controller's start time (a reused pid is not it)

    def save(self, path: Path) -> None:
        write_json_atomic(path, asdict(self))

    @classmethod
    def load(cls, path: Path) -> JobRef | None:
        try:
            data = json.loads(read_regular(path))
            ref = cls(**data)
        except (OSError, ValueError, TypeError):
            return None
        pattern = JOB_ID.get(ref.executor)  # the id goes to scancel or names a process to signal
        ok = pattern is not None and isinstance(ref.job_id, str) and pattern.fullmatch(ref.job_id)
        return ref if ok else None


def require_submitit():
    try:
        import submitit
    except ImportError:
        raise UserError(
            "--executor needs submitit, which is not installed; install it with "
            '`pip install "ditbench[slurm]"` (or `pip install submitit`).'
        ) from None
    return submitit


def make_executor(kind: str, folder: Path):
    """submitit's executor of `kind`, its files under `folder/%j`; a clear error off a SLURM cluster."""
    submitit = require_submitit()
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "local":
        return submitit.LocalExecutor(folder=folder / "%j")
    try:
        executor = submitit.SlurmExecutor(folder=folder / "%j")
    except RuntimeError:  # submitit's "Could not detect srun"
        raise UserError(
            "--executor slurm submits with sbatch, but `srun` is not on this machine's PATH: run it "
            "on a SLURM login node (or use --executor local to run the same path on this machine)."
        ) from None
    return executor


def configure(executor, kind: str, params: dict[str, Any]) -> None:
    params = dict(params)
    if kind == "slurm":
        # The job imports this copy of ditbench even where the nodes have none installed; after the
        # user's setup lines, which may activate an environment of their own.
        path = child_env()["PYTHONPATH"]
        params["setup"] = [*params.get("setup", []), f"export PYTHONPATH={shlex.quote(path)}"]
    try:
        executor.update_parameters(**params)
    except ValueError as err:  # submitit's own check of a parameter
        raise UserError(f"submitit refused the job's parameters: {' '.join(str(err).split())}") from None


def submit_cells(executor, kind: str, params: dict[str, Any], calls: list[tuple]) -> list[tuple[Any, JobRef]]:
    """Submit one job per call (args of `srun.run_task`) with the same parameters; SLURM: one job array."""
    configure(executor, kind, params)
    folder = str(Path(str(executor.folder)).parent)
    if kind == "slurm" and len(calls) > 1:
        with executor.batch():
            handles = [executor.submit(run_task, *args) for args in calls]
    else:
        handles = [executor.submit(run_task, *args) for args in calls]
    out = []
    for handle in handles:
        started = None
        if kind == "local":
            started = process_start(int(handle.job_id))
        out.append((handle, JobRef(kind, str(handle.job_id), folder, started)))
    return out


def is_active(ref: JobRef, handle=None) -> bool:
    """Whether the job may still write its result (queued, running, or unknown to sacct yet)."""
    if ref.executor == "local":
        process = getattr(handle, "_process", None)
        if process is not None:
            return process.poll() is None
        try:  # the same process (a reused pid is not), and a submitit controller
            proc = psutil.Process(int(ref.job_id))
            same = ref.pid_started is not None and abs(proc.create_time() - ref.pid_started) < 1.0
            ours = any(LOCAL_CONTROLLER in part for part in proc.cmdline())
            return same and ours and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, ValueError):
            return False
    return state(ref, handle) in ACTIVE_STATES


def state(ref: JobRef, handle=None) -> str:
    """SLURM's state of the job (submitit's watcher: one sacct call for all jobs, backing off)."""
    if ref.executor == "local":
        return "RUNNING" if is_active(ref, handle) else "FINISHED"
    from submitit.slurm.slurm import SlurmJob

    job = handle if handle is not None else SlurmJob(folder=Path(ref.folder) / "%j", job_id=ref.job_id)
    found = str(job.watcher.get_state(ref.job_id, mode="standard")).split()
    found = found[0].upper() if found else "UNKNOWN"
    return squeue_state(ref.job_id, _SQUEUE_EVERY_S) if found == "UNKNOWN" else found


_SQUEUE_EVERY_S = 60.0
_squeued: dict[str, tuple[float, str]] = {}


def squeue_state(job_id: str, max_age_s: float = 0.0) -> str:
    """squeue's word for the job: PENDING, RUNNING ..., NOT_IN_QUEUE once squeue no longer lists it,
    UNKNOWN where squeue cannot say. An answer younger than `max_age_s` is reused."""
    now = time.monotonic()
    cached = _squeued.get(job_id)
    if cached is not None and now - cached[0] < max_age_s:
        return cached[1]
    try:
        done = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return "UNKNOWN"
    words = done.stdout.split()
    if done.returncode == 0:
        found = words[0].upper() if words else "NOT_IN_QUEUE"
    else:  # squeue exits 1 for an id it has forgotten ("Invalid job id specified")
        found = "NOT_IN_QUEUE" if "invalid job id" in done.stderr.lower() else "UNKNOWN"
    _squeued[job_id] = (now, found)
    return found


def cancel(ref: JobRef, handle=None) -> None:
    """Cancel the job (scancel; the local controller gets SIGINT and stops its tasks)."""
    if ref.executor == "local":
        process = getattr(handle, "_process", None)
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            return
        if is_active(ref):
            try:
                psutil.Process(int(ref.job_id)).send_signal(signal.SIGINT)
            except psutil.Error:
                pass
        return
    try:
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        subprocess.call(["scancel", ref.job_id], timeout=60, **quiet)
    except (OSError, subprocess.TimeoutExpired):  # no scancel here: the job is left to its time limit
        pass


def cancel_if_queued(ref: JobRef) -> bool:
    """scancel a SLURM job squeue says has not started (PENDING); whether it was. Not `scancel
    --state=PENDING ID`: SLURM 22.05 then cancels every queued task of the array, not the one named.
    """
    if ref.executor != "slurm" or squeue_state(ref.job_id) != "PENDING":
        return False
    cancel(ref)
    return True


# -- a job's submitit folder --------------------------------------------------------------------

# How a job that wrote its result may end for its folder to go: SLURM's clean exit, the local
# controller's exit, or a cluster without accounting that no longer lists the job (no state to show).
CLEAN_ENDS = {"COMPLETED", "FINISHED", "NOT_IN_QUEUE"}


def retire(ref: JobRef, folder: Path, may_run: bool) -> None:
    """The job's cell is recorded: remove its folder now if the job has ended without a result, else
    once it has ended (`clear_ended`): a folder removed as the job exits fails the job (sacct FAILED)."""
    if may_run:
        ref.save(folder / f"{ref.job_id}.ending.json")
    else:
        rmtree_real(folder / ref.job_id)


def clear_ended(folder: Path, say, last: bool = False) -> None:
    """Remove the folder of each retired job that has ended COMPLETED; a job that ended any other way
    keeps its logs there and `say` tells where. Jobs that still run wait for the next call."""
    left = 0
    for path in sorted(folder.glob("*.ending.json")):
        ref = JobRef.load(path)
        found = state(ref) if ref is not None else None  # None: a file not ours, dropped
        if found in ACTIVE_STATES:
            left += 1
            continue
        if found in CLEAN_ENDS:
            rmtree_real(folder / ref.job_id)
        elif found is not None:
            say(
                f"job {ref.job_id} ended {found} after writing its cell's result (the record stands); "
                f"its logs stay in {folder / ref.job_id}"
            )
        path.unlink(missing_ok=True)
    if last and left:
        say(f"{left} job(s) still ending after their records: the next run removes their submitit folders")


# -- finding a job whose id the submitter never wrote down -----------------------------------------

NAME_PREFIX = "ditbench-"
_NAME = re.compile(r"ditbench-[0-9a-f]{16}")


def job_name(keys: list[str]) -> str:
    """The SLURM job name of one submission: a hash of its cells' ticket keys, kept in each ticket before
    sbatch runs so a rerun finds a job whose id a killed submitter never wrote down."""
    return NAME_PREFIX + hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def write_submission(path: Path, name: str, index: int | None) -> None:
    write_json_atomic(path, {"job_name": name, "array_index": index})


def find_submitted(path: Path, folder: str) -> JobRef | None:
    """The job a submission file (`write_submission`) names, if SLURM has it (squeue, then sacct)."""
    try:
        data = json.loads(read_regular(path))
        name, index = data["job_name"], data["array_index"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return None
    if index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
        return None
    base = _job_id_named(name)
    if base is None:
        return None
    return JobRef("slurm", base if index is None else f"{base}_{index}", folder)


def _job_id_named(name: str) -> str | None:
    """The (array) job id of the job called `name`: squeue knows queued and running jobs and ones that
    ended a few minutes ago (MinJobAge), sacct the ones that ended before (looked up 30 days back)."""
    asks = (
        ["squeue", "-h", f"--name={name}", "-o", "%F"],
        ["sacct", "-n", "-X", "-P", f"--name={name}", "-S", "now-30days", "-o", "JobID"],
    )
    for ask in asks:
        try:
            done = subprocess.run(ask, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        found = {m.group(0) for line in done.stdout.split() if (m := re.match(r"[0-9]{1,12}", line))}
        if done.returncode == 0 and len(found) == 1:
            return found.pop()
    return None


def job_log(ref: JobRef) -> Path:
    """Task 0's stdout (stderr goes there too) in submitit's folder."""
    return Path(ref.folder) / ref.job_id / f"{ref.job_id}_0_log.out"
