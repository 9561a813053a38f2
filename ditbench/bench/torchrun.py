"""Parent side of a multi-process cell: launch it through torchrun, judge it, aggregate it.

A cell with gpus > 1 (or, on CPU, `gpus: N` meaning N gloo processes) runs as

    python -m torch.distributed.run --nproc-per-node N --nnodes M ... -m ditbench.bench.rank_worker ...

Each rank writes a small JSON report (`rank<R>.json`) into the cell's report folder: its
metrics, or its error. Each node's local rank 0 also writes every rank's gathered metrics into
`ranks.json`, and node 0 (--node-rank 0) records the cell. This module turns those files, torchrun's
exit status and the output tail into one status, reason and aggregated metrics:

- throughput is summed over ranks, steps/s is the slowest rank's, step time the slowest
  rank's at each step; memory is the largest rank's (the one that decides whether it fits)
  and the sum over ranks;
- a rank that fails fails the cell with that rank's own error (the first to fail, not the
  peers that then lost their connection);
- on timeout the whole process tree is stopped: SIGTERM, a grace period, then SIGKILL to
  every process ever seen under the launcher (torchrun starts workers in sessions of their
  own, so killing one process group is not enough).
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
            raise UserError(
                f"--node-rank {self.node_rank} must be between 0 and nnodes-1 ({self.nnodes - 1})."
            )
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
    join_timeout_s: float | None = None,
) -> list[str]:
    """The torchrun command line that runs `python -m module *entry_args` on nproc_per_node ranks."""
    rdzv.validate()
    if nproc_per_node < 1:
        raise UserError(f"nproc_per_node {nproc_per_node} must be at least 1.")
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc_per_node}",
        f"--nnodes={rdzv.nnodes}",
        "--max-restarts=0",
    ]  # a benchmark never retries silently
    if rdzv.nnodes == 1 and not rdzv.endpoint:
        cmd.append("--standalone")  # local store on a free port: parallel jobs never collide
    else:
        job_id = rdzv.run_id or rdzv_id or "ditbench"
        cmd += [
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv.endpoint}",
            f"--rdzv-id={job_id}",
            f"--node-rank={rdzv.node_rank}",
        ]
        if join_timeout_s:
            # The nodes reach a cell at different times (node 0 alone runs the one-node cells);
            # wait for the others as long as the cell may take, not torchrun's default 600 s.
            cmd.append(f"--rdzv-conf=join_timeout={int(join_timeout_s)}")
    return cmd + ["-m", module, *entry_args]


@dataclass
class LaunchResult:
    returncode: int | None
    timed_out: bool
    duration_s: float
    output_tail: str
    reports: dict[int, dict] = field(default_factory=dict)  # rank -> its rank<R>.json
    gathered: dict | None = None  # ranks.json: every rank's metrics, gathered
    leftover: list[int] = field(default_factory=list)  # pids still alive after cleanup (should be none)


def _die_with_parent() -> None:
    """Linux: torchrun gets SIGTERM if this launcher dies, and then stops its workers."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


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
        root.send_signal(signal.SIGTERM)  # torchrun forwards it to its workers and waits for them
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
        root.kill()
    killed = []
    for p in seen.values():
        if _alive(p):  # is_running() checks the creation time, so a reused pid is never hit
            try:
                p.kill()
                killed.append(p)
            except psutil.Error:
                pass
    psutil.wait_procs(killed, timeout=5)
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


def read_reports(report_dir: Path) -> tuple[dict[int, dict], dict | None]:
    """Every rank<R>.json by rank, and the gathered ranks.json (None if absent or torn)."""
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
        # torchrun stays in our process group, so whoever kills our group (the runner on its own
        # timeout) kills torchrun too; torchrun puts each worker in a session of its own, and the
        # workers exit when their parent goes (see rank_worker._watch_parent).
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
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
    leftover = sorted(p.pid for p in seen.values() if _alive(p))
    return LaunchResult(
        leftover=leftover,
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


def judge(
    result: LaunchResult, world_size: int, timeout_s: float, node_rank: int = 0
) -> tuple[str, str | None]:
    """(status, reason) of a launched cell. Status is one of the result record's statuses."""
    failed = [r for r in result.reports.values() if r.get("status") != "ok"]
    if failed:
        # The root cause is the rank that failed first; its peers fail later on a broken collective.
        first = min(failed, key=lambda r: (r.get("failed_at", float("inf")), r["rank"]))
        others = sorted(r["rank"] for r in failed if r is not first)
        also = f" (rank(s) {', '.join(map(str, others))} failed after it)" if others else ""
        return first.get("status", "error"), f"rank {first['rank']}: {first.get('reason') or 'failed'}{also}"
    if result.timed_out:
        left = (
            f"; processes {result.leftover} could not be stopped"
            if result.leftover
            else " and no process was left running"
        )
        return (
            "timeout",
            f"the cell ran past its {timeout_s:g} s limit; all {world_size} ranks were stopped{left}",
        )
    gathered = len((result.gathered or {}).get("metrics") or [])
    complete = bool(result.reports) and (node_rank != 0 or gathered == world_size)
    if result.returncode != 0 and not complete:
        tail = _last_lines(result.output_tail)
        return "error", (
            f"torchrun exited with code {result.returncode} and no rank reported an error "
            f"(a rank was killed or crashed hard). Last output:\n{tail}"
        )
    if node_rank == 0 and not result.gathered:
        return "error", "torchrun finished but no rank wrote the gathered ranks.json report"
    if node_rank == 0 and gathered != world_size:
        return "error", f"expected reports from {world_size} ranks, {gathered} were gathered"
    if result.returncode != 0:
        # Every rank measured, reported and passed the final barrier; a crash while the processes
        # tear down (seen once with gloo + FSDP2: "terminate called without an active exception")
        # does not undo the measurement, but the record says it happened.
        return "ok", (
            f"every rank reported ok, then torchrun exited with code {result.returncode} while the "
            f"processes shut down; the measurement is complete. Last output:\n"
            f"{_last_lines(result.output_tail, 4)}"
        )
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
    fits = [m.get("fits_budget") for m in per_rank]
    if "fits_budget" in out:  # the job fits only if every rank fits
        out["fits_budget"] = False if False in fits else (None if None in fits else True)
    if isinstance(out.get("images_per_s"), float):
        out["images_per_s_per_gpu"] = out["images_per_s"] / world
    # Step time: a synchronised step ends when its slowest rank ends, so take the per-step max.
    samples = [(m.get("step_ms") or {}).get("samples") for m in per_rank]
    if all(isinstance(s, list) and s for s in samples) and len({len(s) for s in samples}) == 1:
        worst = [max(vals) for vals in zip(*samples, strict=True)]
        out["step_ms"] = {
            "median": _percentile(worst, 0.5),
            "p10": _percentile(worst, 0.1),
            "p90": _percentile(worst, 0.9),
            "samples": worst,
        }
    elif any(m.get("step_ms") for m in per_rank):
        out["step_ms"] = max((m.get("step_ms") or {} for m in per_rank), key=lambda s: s.get("median", 0.0))
    # MFU of the job = summed FLOP/s over summed peak = mean of the ranks' MFU.
    mfus = [m.get("mfu") for m in per_rank]
    if all(isinstance(x, dict) and isinstance(x.get("value"), (int, float)) for x in mfus):
        out["mfu"] = dict(mfus[0], value=sum(x["value"] for x in mfus) / world)
    out["world_size"] = world
    out["global_batch"] = batch_size * world
    out["per_rank"] = [
        {
            "rank": i,
            **{k: m.get(k) for k in ("images_per_s", "steps_per_s", "peak_mem_allocated_gib")},
            "step_ms_median": (m.get("step_ms") or {}).get("median"),
        }
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


def add_scaling_efficiency(record: dict, records: list[dict]) -> None:
    """Fill record.metrics.scaling_efficiency from the same cell at 1 GPU among `records`, if any."""
    metrics = record.get("metrics") or {}
    config = record.get("config") or {}
    gpus = int(config.get("gpus", 1)) * int(config.get("nodes", 1))
    if record.get("status") != "ok" or gpus <= 1 or not metrics.get("images_per_s"):
        return
    ref = find_single_gpu_reference(config, records)
    if ref is None:
        metrics.setdefault("scaling_efficiency", None)
        return
    ref_ips = (ref.get("metrics") or {}).get("images_per_s")
    metrics["scaling_efficiency"] = scaling_efficiency(metrics["images_per_s"], gpus, ref_ips)
    metrics["scaling_reference"] = {
        "cell_id": ref.get("cell_id"),
        "run_id": ref.get("run_id"),
        "images_per_s": ref_ips,
    }


# --------------------------------------------------------------------------------------------
# One cell, end to end: what the runner starts for gpus > 1


def node_verdict(config: dict, rdzv: Rendezvous) -> tuple[str, str] | None:
    """(status, reason) for a cell this node must not start in a multi-node run, else None.

    Every node runs the same suite in the same order. A cell spanning all nodes runs on each of
    them (torchrun joins them); a one-node cell runs on node 0 only, so it is measured once.
    """
    nodes = int(config.get("nodes", 1))
    if nodes == rdzv.nnodes:
        return None
    if nodes == 1:
        if rdzv.node_rank == 0:
            return None
        return "skipped", f"a one-node cell: node 0 of this {rdzv.nnodes}-node run measures it"
    return "unsupported", (
        f"the cell needs nodes={nodes}, but this run was started with --nnodes "
        f"{rdzv.nnodes}; start it on {nodes} nodes with --nnodes {nodes}"
    )


def run_cell(
    spec_path: Path,
    result_path: Path,
    *,
    rdzv: Rendezvous = Rendezvous(),
    timeout_s: float = 1800.0,
    env: dict[str, str] | None = None,
) -> dict:
    """Launch the cell in SPEC through torchrun and return a result in the worker's format."""
    spec = json.loads(Path(spec_path).read_text())
    config = spec["config"]
    nproc = int(config["gpus"])
    nodes = int(config.get("nodes", 1))
    result: dict = {"status": "error", "reason": None, "metrics": None, "smoke": None, "env": None}
    if nodes != rdzv.nnodes:
        result.update(
            status="unsupported",
            reason=(
                f"the cell asks for nodes={nodes} but this run was started with --nnodes {rdzv.nnodes}; "
                f"start `ditbench run` on each of the {nodes} nodes with --nnodes {nodes} --node-rank R "
                "--rdzv-endpoint HOST:PORT"
            ),
        )
        return result
    world = nproc * nodes
    report_dir = Path(result_path).with_name(Path(result_path).stem + ".ranks")
    if report_dir.exists():  # reports of an earlier attempt must not be read as this one's
        for old in report_dir.glob("*.json"):
            old.unlink()
    cmd = torchrun_command(
        nproc,
        [str(spec_path), str(report_dir)],
        rdzv,
        rdzv_id=f"ditbench-{spec.get('cell_id', 'cell')}",
        join_timeout_s=timeout_s,
    )
    env = dict(os.environ if env is None else env)
    if config.get("device") == "cpu" and "OMP_NUM_THREADS" not in env:
        # N CPU ranks share the machine a one-process cell has alone: give each its share of the
        # cores (torchrun's default is 1 thread per rank), so scaling efficiency compares like with like.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    launched = launch(cmd, report_dir, timeout_s=timeout_s, env=env)
    status, reason = judge(launched, world, timeout_s, rdzv.node_rank)
    result.update(status=status, reason=reason)
    if status == "ok" and rdzv.node_rank == 0:
        gathered = launched.gathered
        metrics = aggregate(gathered["metrics"], batch_size=int(config["batch_size"]))
        metrics.update(launcher="torchrun", nodes=gathered.get("nodes", nodes), scaling_efficiency=None)
        result.update(metrics=metrics, smoke=gathered.get("smoke"), env=gathered.get("env"))
    elif status == "ok":
        result.update(
            status="skipped",
            reason=(
                f"node {rdzv.node_rank} of {rdzv.nnodes}: its ranks finished; "
                "node 0 records the cell's metrics"
            ),
        )
    else:
        failed = [r for r in launched.reports.values() if r.get("status") != "ok"]
        first = min(failed, key=lambda r: (r.get("failed_at", float("inf")), r["rank"])) if failed else None
        result["traceback"] = (first or {}).get("traceback") or _last_lines(launched.output_tail, 30)
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    from ditbench.bench.worker import write_result

    parser = argparse.ArgumentParser(
        prog="python -m ditbench.bench.torchrun", description="run one multi-process cell through torchrun"
    )
    parser.add_argument("spec")
    parser.add_argument("result")
    add_rendezvous_arguments(parser)
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds (default: the spec's timeout_s, "
        "less a margin to stop every rank before the runner's own limit)",
    )
    args = parser.parse_args(argv)

    def stop(signum, _frame):  # the runner (or a user) stops us: take the whole job down with us
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    spec = json.loads(Path(args.spec).read_text())
    timeout = args.timeout
    if timeout is None:
        outer = float(spec.get("timeout_s") or 1800.0)
        timeout = max(outer - max(15.0, 0.05 * outer), 0.5 * outer)
    try:
        rdzv = rendezvous_from_args(args)
        if spec.get("rendezvous") and args.nnodes == 1 and not args.rdzv_endpoint:
            rdzv = Rendezvous(**spec["rendezvous"])
            rdzv.validate()
        result = run_cell(Path(args.spec), Path(args.result), rdzv=rdzv, timeout_s=timeout)
    except UserError as err:
        result = {
            "status": "error",
            "reason": " ".join(str(err).split()),
            "metrics": None,
            "smoke": None,
            "env": None,
        }
    write_result(args.result, result)
    log = Path(args.result).with_name(Path(args.result).stem + ".ranks") / "torchrun.log"
    if log.exists():  # into the runner's log of this cell: every rank's output, in one place
        sys.stdout.write(_tail(log, 200_000))
        sys.stdout.flush()
    return 0


def add_rendezvous_arguments(parser) -> None:
    """torchrun's rendezvous options, for `ditbench run` (several machines run one multi-node cell)."""
    g = parser.add_argument_group("multi-node (passed to torchrun)")
    g.add_argument("--nnodes", type=int, default=1, help="number of machines in the job")
    g.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0..nnodes-1")
    g.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT every node can reach (usually node 0)")
    g.add_argument("--rdzv-id", default=None, help="job id shared by all nodes (default: per cell)")


def rendezvous_from_args(args) -> Rendezvous:
    rdzv = Rendezvous(
        nnodes=args.nnodes, node_rank=args.node_rank, endpoint=args.rdzv_endpoint, run_id=args.rdzv_id
    )
    rdzv.validate()
    return rdzv


def rendezvous_argv(rdzv: Rendezvous) -> list[str]:
    """The same options as command-line flags, to hand on to `python -m ditbench.bench.torchrun`."""
    out = ["--nnodes", str(rdzv.nnodes), "--node-rank", str(rdzv.node_rank)]
    if rdzv.endpoint:
        out += ["--rdzv-endpoint", rdzv.endpoint]
    if rdzv.run_id:
        out += ["--rdzv-id", rdzv.run_id]
    return out


if __name__ == "__main__":
    sys.exit(main())
