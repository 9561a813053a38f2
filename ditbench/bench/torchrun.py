"""Parent side of a multi-process cell: launch it through torchrun, judge it, aggregate it.

A cell with gpus > 1 (or, on CPU, `gpus: N` meaning N gloo processes) runs as

    python -m torch.distributed.run --nproc-per-node N --nnodes M ... -m ditbench.bench.rank_worker ...

Each rank writes a small JSON report (`rank<R>.json`) into the cell's report folder: its
metrics, or its error. Global rank 0 also gathers every rank's metrics into `ranks.json`, so
a multi-node job is aggregated where rank 0 ran. This module turns those files, torchrun's
exit status and the output tail into one status, reason and aggregated metrics:

- throughput is summed over ranks, steps/s is the slowest rank's, step time the slowest
  rank's at each step; memory is the largest rank's (the one that decides whether it fits)
  and the sum over ranks;
- a rank that fails fails the cell with that rank's own error (the first to fail, not the
  peers that then lost their connection);
- on timeout the whole process tree is stopped: SIGTERM, a grace period, then SIGKILL to
  every process ever seen under the launcher (torchrun starts workers in their own sessions,
  so killing one process group is not enough).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ditbench.errors import UserError

RANK_WORKER_MODULE = "ditbench.bench.rank_worker"
# Config keys that differ between a cell and its one-GPU reference for scaling efficiency.
SCALING_KEYS = ("gpus", "nodes", "global_batch", "strategy")


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's rendezvous options: how the nodes of a multi-node job find each other."""

    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None  # host:port of the c10d store (any one node, usually node 0)
    run_id: str | None = None  # shared by every node of one job; derived from the cell if not given

    def validate(self) -> None:
        if self.nnodes < 1:
            raise UserError(f"--nnodes {self.nnodes} must be at least 1.")
        if not 0 <= self.node_rank < self.nnodes:
            raise UserError(f"--node-rank {self.node_rank} must be between 0 and nnodes-1 ({self.nnodes - 1}).")
        if self.nnodes > 1 and not self.endpoint:
            raise UserError(
                f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT, an address every node can reach "
                "(usually node 0's hostname and a free port, e.g. node0:29500)."
            )
        if self.endpoint and ":" not in self.endpoint:
            raise UserError(f"--rdzv-endpoint {self.endpoint!r} must be HOST:PORT, e.g. node0:29500.")


def torchrun_command(
    nproc_per_node: int,
    entry_args: list[str],
    rdzv: Rendezvous = Rendezvous(),
    *,
    module: str = RANK_WORKER_MODULE,
    rdzv_id: str | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The torchrun command line that runs `python -m module *entry_args` on nproc_per_node ranks."""
    rdzv.validate()
    if nproc_per_node < 1:
        raise UserError(f"nproc_per_node {nproc_per_node} must be at least 1.")
    cmd = [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}",
           f"--nnodes={rdzv.nnodes}", "--max-restarts=0"]  # a benchmark never retries silently
    if rdzv.nnodes == 1 and not rdzv.endpoint:
        cmd.append("--standalone")  # local store on a free port: parallel jobs never collide
    else:
        job_id = rdzv.run_id or rdzv_id or "ditbench"
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv.endpoint}", f"--rdzv-id={job_id}",
                f"--node-rank={rdzv.node_rank}"]
    return cmd + ["-m", module, *entry_args]


@dataclass
class LaunchResult:
    returncode: int | None
    timed_out: bool
    duration_s: float
    output_tail: str
    reports: dict[int, dict] = field(default_factory=dict)  # rank -> its rank<R>.json
    gathered: list[dict] | None = None  # ranks.json from global rank 0: every rank's metrics


def _collect_descendants(proc: psutil.Process, seen: dict[int, psutil.Process]) -> None:
    try:
        for child in proc.children(recursive=True):
            seen.setdefault(child.pid, child)
    except psutil.Error:
        pass


def _stop_tree(root: subprocess.Popen, seen: dict[int, psutil.Process], grace_s: float) -> None:
    """SIGTERM the launcher (torchrun forwards it to its workers), then SIGKILL whatever is left."""
    try:
        root_ps = psutil.Process(root.pid)
        _collect_descendants(root_ps, seen)
    except psutil.Error:
        pass
    if root.poll() is None:
        try:
            os.killpg(root.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    for p in list(seen.values()):
        try:
            p.terminate()
        except psutil.Error:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (root.poll() is None or any(_alive(p) for p in seen.values())):
        time.sleep(0.1)
    _kill_leftovers(root, seen)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_leftovers(root: subprocess.Popen, seen: dict[int, psutil.Process]) -> None:
    if root.poll() is None:
        try:
            os.killpg(root.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for p in seen.values():
        if _alive(p):  # is_running() checks the creation time, so a reused pid is never hit
            try:
                p.kill()
            except psutil.Error:
                pass
    try:
        root.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, limit: int = 6000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def read_reports(report_dir: Path) -> tuple[dict[int, dict], list[dict] | None]:
    reports: dict[int, dict] = {}
    for path in sorted(report_dir.glob("rank*.json")):
        try:
            data = json.loads(path.read_text())
            reports[int(data["rank"])] = data
        except (OSError, ValueError, KeyError):
            continue
    gathered = None
    ranks_file = report_dir / "ranks.json"
    if ranks_file.exists():
        try:
            gathered = json.loads(ranks_file.read_text())
        except (OSError, ValueError):
            gathered = None
    return reports, gathered


def launch(
    cmd: list[str],
    report_dir: Path,
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    grace_s: float = 10.0,
) -> LaunchResult:
    """Run a torchrun command to completion or timeout; leave no process behind either way."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    log_path = report_dir / "torchrun.log"
    seen: dict[int, psutil.Process] = {}
    start = time.monotonic()
    with open(log_path, "ab") as log:
        # Own session: the launcher and its group can be signalled without touching the caller.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        timed_out = False
        try:
            root_ps = psutil.Process(proc.pid)
            while proc.poll() is None:
                _collect_descendants(root_ps, seen)  # remember workers, to reap any orphan later
                if time.monotonic() - start > timeout_s:
                    timed_out = True
                    break
                time.sleep(0.2)
        except BaseException:
            _stop_tree(proc, seen, grace_s)
            raise
        if timed_out:
            _stop_tree(proc, seen, grace_s)
        else:
            _kill_leftovers(proc, seen)  # a worker that outlived torchrun (should not happen)
    reports, gathered = read_reports(report_dir)
    return LaunchResult(
        returncode=proc.returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
        output_tail=_tail(log_path),
        reports=reports,
        gathered=gathered,
    )


def new_rdzv_id() -> str:
    return "ditbench-" + uuid.uuid4().hex[:12]


# --------------------------------------------------------------------------------------------
# Judging and aggregating


def _last_lines(text: str, n: int = 12) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


def judge(result: LaunchResult, world_size: int, timeout_s: float, node_rank: int = 0) -> tuple[str, str | None]:
    """(status, reason) of a launched cell. Status is one of the result record's statuses."""
    failed = [r for r in result.reports.values() if r.get("status") != "ok"]
    if failed:
        # The root cause is the rank that failed first; its peers fail later on a broken collective.
        first = min(failed, key=lambda r: (r.get("failed_at", float("inf")), r["rank"]))
        others = sorted(r["rank"] for r in failed if r is not first)
        also = f" (rank(s) {', '.join(map(str, others))} failed after it)" if others else ""
        return first.get("status", "error"), f"rank {first['rank']}: {first.get('reason') or 'failed'}{also}"
    if result.timed_out:
        return "timeout", (f"the cell ran past its {timeout_s:g} s limit; all {world_size} ranks were stopped "
                           "and no process was left running")
    if result.returncode != 0:
        tail = _last_lines(result.output_tail)
        return "error", (f"torchrun exited with code {result.returncode} and no rank reported an error "
                         f"(a rank was killed or crashed hard). Last output:\n{tail}")
    if node_rank == 0 and not result.gathered:
        return "error", "torchrun finished but rank 0 wrote no ranks.json report"
    if node_rank == 0 and len(result.gathered) != world_size:
        return "error", f"expected reports from {world_size} ranks, rank 0 gathered {len(result.gathered)}"
    return "ok", None


_SUM_KEYS = ("images_per_s", "tflops_per_s")
_MIN_KEYS = ("steps_per_s",)
_MEM_KEYS = ("peak_mem_allocated_gib", "peak_mem_reserved_gib", "device_mem_gib", "cpu_peak_rss_gib")


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def aggregate(per_rank: list[dict], *, batch_size: int) -> dict:
    """One metrics dict from every rank's metrics (rank order)."""
    if not per_rank:
        raise ValueError("no rank metrics to aggregate")
    world = len(per_rank)
    out = dict(per_rank[0])  # per-model constants (params, model_flops_per_image) from rank 0
    for key in _SUM_KEYS:
        vals = [m.get(key) for m in per_rank]
        if all(isinstance(v, (int, float)) for v in vals):
            out[key] = float(sum(vals))
    for key in _MIN_KEYS:
        vals = [m.get(key) for m in per_rank]
        if all(isinstance(v, (int, float)) for v in vals):
            out[key] = float(min(vals))
    for key in _MEM_KEYS:
        vals = [m.get(key) for m in per_rank]
        if all(isinstance(v, (int, float)) for v in vals):
            out[key] = float(max(vals))
            out[key + "_sum"] = float(sum(vals))
    if isinstance(out.get("images_per_s"), float):
        out["images_per_s_per_gpu"] = out["images_per_s"] / world
    # Step time: a synchronised step ends when its slowest rank ends, so take the per-step max.
    samples = [(m.get("step_ms") or {}).get("samples") for m in per_rank]
    if all(isinstance(s, list) and s for s in samples) and len({len(s) for s in samples}) == 1:
        worst = [max(vals) for vals in zip(*samples)]
        out["step_ms"] = {"median": _percentile(worst, 0.5), "p10": _percentile(worst, 0.1),
                          "p90": _percentile(worst, 0.9), "samples": worst}
    elif any(m.get("step_ms") for m in per_rank):
        out["step_ms"] = max((m.get("step_ms") or {} for m in per_rank), key=lambda s: s.get("median", 0.0))
    # MFU of the job = summed FLOP/s over summed peak = mean of the ranks' MFU.
    mfus = [m.get("mfu") for m in per_rank]
    if all(isinstance(x, dict) and isinstance(x.get("value"), (int, float)) for x in mfus):
        out["mfu"] = dict(mfus[0], value=sum(x["value"] for x in mfus) / world)
    out["world_size"] = world
    out["global_batch"] = batch_size * world
    out["per_rank"] = [
        {"rank": i, **{k: m.get(k) for k in ("images_per_s", "steps_per_s", "peak_mem_allocated_gib")},
         "step_ms_median": (m.get("step_ms") or {}).get("median")}
        for i, m in enumerate(per_rank)
    ]
    return out


def reference_key(config: dict) -> str:
    """The config with the GPU-count knobs removed: equal keys mean 'the same cell at another size'."""
    return json.dumps({k: v for k, v in config.items() if k not in SCALING_KEYS}, sort_keys=True, default=str)


def scaling_efficiency(images_per_s: float, gpus: int, images_per_s_at_1: float | None) -> float | None:
    """images/s at N / (N x images/s of the same cell at 1 GPU); None without a usable reference."""
    if not images_per_s_at_1 or images_per_s_at_1 <= 0 or gpus < 1:
        return None
    return images_per_s / (gpus * images_per_s_at_1)


def find_single_gpu_reference(config: dict, records: list[dict]) -> dict | None:
    """The latest ok record of the same cell at gpus == 1, from records of the same run (or any)."""
    key = reference_key(config)
    best = None
    for rec in records:
        cfg = rec.get("config") or {}
        if rec.get("status") == "ok" and int(cfg.get("gpus", 1)) == 1 and reference_key(cfg) == key:
            best = rec
    return best


def summarize_failure_for_user(status: str, reason: str | None) -> str:
    return f"{status}: {reason}" if reason else status
