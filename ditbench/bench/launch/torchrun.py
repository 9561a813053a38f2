"""Parent side of a multi-process cell: torchrun's rendezvous, then start the ranks, judge them, aggregate.
A failed cell fails with the first rank to fail (not the peers that then lost their connection); on
timeout every process ever seen under torchrun is stopped (SIGTERM, grace, SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ditbench.bench.launch import base, procs
from ditbench.bench.launch.aggregate import aggregate
from ditbench.bench.launch.files import no_result, read_report, read_spec, write_result
from ditbench.core.errors import UserError
from ditbench.files.fileio import open_log, read_regular


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


def node_verdict(config: dict, rdzv: Rendezvous) -> tuple[str, str] | None:
    """(status, reason) for a cell this node must not start in a multi-node run, else None. Every node
    runs the suite in the same order: a cell spanning all nodes runs on each, a one-node cell on node 0."""
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


GRACE_S = 10.0  # between SIGTERM and SIGKILL when a cell's processes are stopped
POLL_S = 0.2
TIMEOUT_MARGIN_S = 15.0  # stop every rank this long before the runner's own limit kills us
LOG_TAIL_BYTES = 6000
ONE_NODE = Rendezvous()


def torchrun_command(
    nproc_per_node: int,
    entry_args: list[str],
    rdzv: Rendezvous = ONE_NODE,
    *,
    module: str = base.RANK_MODULE,
    rdzv_id: str | None = None,
    python: str = sys.executable,
    join_timeout_s: float | None = None,
    log_dir: str | Path | None = None,
) -> list[str]:
    """The torchrun command line running `python -m module *entry_args` on nproc_per_node ranks;
    `log_dir` keeps torchrun's per-attempt folders (else a `torchelastic_*` in the temp folder for good)."""
    rdzv.validate()
    if nproc_per_node < 1:
        raise UserError(f"nproc_per_node {nproc_per_node} must be at least 1.")
    # --max-restarts=0: a benchmark never retries silently
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc_per_node}",
        f"--nnodes={rdzv.nnodes}",
    ]
    cmd.append("--max-restarts=0")
    if log_dir is not None:
        cmd.append(f"--log-dir={log_dir}")
    if rdzv.nnodes == 1 and not rdzv.endpoint:
        cmd.append("--standalone")  # local store on a free port: parallel jobs never collide
    else:
        job_id = rdzv.run_id or rdzv_id or "ditbench"
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv.endpoint}", f"--rdzv-id={job_id}"]
        cmd.append(f"--node-rank={rdzv.node_rank}")
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
    smoke: dict | None = None  # smoke.json (rank 0's curve), or a rank's smoke failure
    quality: dict | None = None  # quality.json (rank 0's quality field), or a rank's quality failure
    launcher: str = "torchrun"  # what started the ranks, as the reasons name it
    # when the time limit was reached (time.time()), before anything was stopped: a rank that fails
    # after it fails because its peers were stopped, and the cell is `timeout` whatever it reports
    timed_out_at: float | None = None


def read_reports(report_dir: Path) -> dict:
    """LaunchResult's fields from the ranks' reports: every rank<R>.json by rank, the gathered ranks.json,
    the smoke and quality reports (None if absent or torn)."""
    reports: dict[int, dict] = {}
    for path in sorted(report_dir.glob("rank[0-9]*.json")):
        data = read_report(path)
        if data is not None and isinstance(data.get("rank"), int):
            reports[data["rank"]] = data
    return {
        "reports": reports,
        "gathered": read_report(report_dir / "ranks.json"),
        "smoke": read_phase(report_dir, "smoke"),
        "quality": read_phase(report_dir, "quality"),
    }


def read_phase(report_dir: Path, phase: str) -> dict | None:
    """<phase>.json (rank 0's), else the first <phase>_rank<R>.json of a rank that failed in it."""
    report = read_report(report_dir / f"{phase}.json")
    if report is None:
        failed = [d for p in sorted(report_dir.glob(f"{phase}_rank*.json")) if (d := read_report(p))]
        if failed:  # the rank that failed first; its peers then lost their connection
            first = min(failed, key=lambda d: (d.get("failed_at", float("inf")), d.get("rank", 0)))
            report = dict(first, reason=f"rank {first.get('rank')}: {first.get('reason')}")
            report.pop("rank", None)
            report.pop("failed_at", None)
    return report


def launch(
    cmd: list[str],
    report_dir: Path,
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    grace_s: float = GRACE_S,
) -> LaunchResult:
    """Run a torchrun command to completion or timeout; leave no process behind either way."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    log_path = report_dir / "torchrun.log"
    seen: dict[int, psutil.Process] = {}
    start = time.monotonic()
    with open_log(log_path, append=True) as log:
        # torchrun stays in our process group, so whoever kills our group (the runner on its own
        # timeout) kills torchrun too; torchrun puts each worker in a session of its own, and the
        # workers exit when their parent goes (procs.watch_parent).
        preexec = procs.die_with_parent(signal.SIGTERM)  # torchrun then stops its workers
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, preexec_fn=preexec
        )
        timed_out, timed_out_at = False, None
        try:
            root = psutil.Process(proc.pid)
            while proc.poll() is None:
                procs.collect_descendants(root, seen)  # remember workers, to reap any orphan later
                if time.monotonic() - start > timeout_s:
                    timed_out, timed_out_at = True, time.time()
                    break
                time.sleep(POLL_S)
        except BaseException:
            procs.stop_tree(proc, seen, grace_s)
            raise
        if timed_out:
            procs.stop_tree(proc, seen, grace_s)
        else:
            procs.kill_leftovers(proc, seen)  # a worker that outlived torchrun (should not happen)
    return LaunchResult(
        returncode=proc.returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
        output_tail=procs.tail(log_path, LOG_TAIL_BYTES),
        leftover=sorted(p.pid for p in seen.values() if procs.alive(p)),
        timed_out_at=timed_out_at,
        **read_reports(report_dir),
    )


def _first_failure(result: LaunchResult) -> dict | None:
    """The root cause: the rank that failed first (its peers fail later on a broken collective), if it
    failed before the time limit was reached (a failure after it follows from the stopped ranks)."""
    failed = [r for r in result.reports.values() if r.get("status") != "ok"]
    if not failed:
        return None
    first = min(failed, key=lambda r: (r.get("failed_at", float("inf")), r["rank"]))
    if result.timed_out and not first.get("failed_at", float("inf")) < (result.timed_out_at or float("-inf")):
        return None
    return first


def judge(
    result: LaunchResult, world_size: int, timeout_s: float, node_rank: int = 0
) -> tuple[str, str | None]:
    """(status, reason) of a launched cell. Status is one of the result record's statuses."""
    first = _first_failure(result)
    if first is not None:
        others = sorted(
            r["rank"] for r in result.reports.values() if r.get("status") != "ok" and r is not first
        )
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
        return "error", (
            f"{result.launcher} exited with code {result.returncode} and no rank reported an error "
            f"(a rank was killed or crashed hard). Last output:\n{procs.last_lines(result.output_tail, 12)}"
        )
    if node_rank == 0 and not result.gathered:
        return "error", f"{result.launcher} finished but no rank wrote the gathered ranks.json report"
    if node_rank == 0 and gathered != world_size:
        return "error", f"expected reports from {world_size} ranks, {gathered} were gathered"
    if result.returncode != 0 and any(
        (phase or {}).get("status") not in (None, "ok", "nan_loss")
        for phase in (result.smoke, result.quality)
    ):
        return "ok", None  # a rank's smoke run (or quality phase) raised and it left: that field says so
    if result.returncode != 0:
        # Every rank measured, reported and passed the final barrier; a crash while the processes
        # tear down (seen once with gloo + FSDP2: "terminate called without an active exception")
        # does not undo the measurement, but the record says it happened.
        return "ok", (
            f"every rank reported ok, then {result.launcher} exited with code {result.returncode} while the "
            f"processes shut down; the measurement is complete. Last output:\n"
            f"{procs.last_lines(result.output_tail, 4)}"
        )
    return "ok", None


def _phase_field(launched: LaunchResult, report: dict | None, what: str, **empty) -> dict:
    """A smoke run's or quality phase's report, or (measured, but a rank was killed outright) its field
    saying it left none."""
    if report is not None:
        return report
    return {
        **empty,
        "status": "error",
        "reason": f"the {what} left no report; {launched.launcher} exited with code "
        f"{launched.returncode}. Last output:\n{procs.last_lines(launched.output_tail, 6)}",
    }


def run_cell(
    spec_path: Path,
    result_path: Path,
    *,
    rdzv: Rendezvous = ONE_NODE,
    timeout_s: float = 1800.0,
    env: dict[str, str] | None = None,
) -> dict:
    """Launch the cell in SPEC through torchrun and return a result in the one-process launcher's format."""
    spec, doc = read_spec(spec_path)
    nproc, nodes = spec.knobs.gpus, spec.knobs.nodes
    if nodes != rdzv.nnodes:
        return no_result(
            f"the cell asks for nodes={nodes} but this run was started with --nnodes {rdzv.nnodes}; "
            f"start `ditbench run` on each of the {nodes} nodes with --nnodes {nodes} --node-rank R "
            "--rdzv-endpoint HOST:PORT",
            "unsupported",
        )
    reports = base.report_dir(result_path)
    if reports.exists():  # reports of an earlier attempt must not be read as this one's
        for old in reports.glob("*.json"):
            old.unlink()
    rdzv_id = f"ditbench-{doc.get('cell_id', 'cell')}"
    cmd = torchrun_command(
        nproc,
        [str(spec_path), str(reports)],
        rdzv,
        rdzv_id=rdzv_id,
        join_timeout_s=timeout_s,
        log_dir=reports / "torchelastic",  # removed with the cell's other files
    )
    env = dict(os.environ if env is None else env)
    base.share_cores(env, spec, nproc, env)  # torchrun's own default is 1 thread per rank
    launched = launch(cmd, reports, timeout_s=timeout_s, env=env)
    return result_of_launch(launched, spec, timeout_s, rdzv)


def result_of_launch(launched: LaunchResult, spec, timeout_s: float, rdzv: Rendezvous = ONE_NODE) -> dict:
    """The cell's result from its ranks' reports, in the one-process launcher's format."""
    status, reason = judge(launched, spec.world_size, timeout_s, rdzv.node_rank)
    result = no_result(reason, status)
    if status == "ok" and rdzv.node_rank == 0:
        gathered = launched.gathered
        metrics = aggregate(gathered["metrics"], global_batch=spec.global_batch)
        nodes = gathered.get("nodes", spec.knobs.nodes)
        metrics.update(launcher=launched.launcher, nodes=nodes, scaling_efficiency=None)
        result.update(metrics=metrics, env=gathered.get("env"))
        if spec.smoke_steps:
            result["smoke"] = _phase_field(
                launched, launched.smoke, "smoke run", steps=spec.smoke_steps, loss=[]
            )
        if spec.quality is not None:
            result["quality"] = _phase_field(launched, launched.quality, "quality phase", evaluations=[])
    elif status == "ok":
        result.update(
            status="skipped",
            reason=f"node {rdzv.node_rank} of {rdzv.nnodes}: its ranks finished; node 0 records the cell's "
            "metrics",
        )
    else:
        first = _first_failure(launched)
        result["traceback"] = (first or {}).get("traceback") or procs.last_lines(launched.output_tail, 30)
    return result


def main(argv: list[str] | None = None) -> int:
    """`python -m ditbench.bench.launch.torchrun SPEC.json RESULT.json`: the rendezvous and the time limit
    (less a margin, to stop every rank before the runner's own limit kills us) come from SPEC."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m ditbench.bench.launch.torchrun SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec_path, result_path = map(Path, argv)
    doc = json.loads(read_regular(spec_path))
    outer = float(doc.get("timeout_s") or 1800.0)
    timeout = max(outer - max(TIMEOUT_MARGIN_S, 0.05 * outer), 0.5 * outer)
    try:
        rdzv = Rendezvous(**doc["rendezvous"]) if doc.get("rendezvous") else ONE_NODE
        with procs.sigterm_as_interrupt():  # the runner stops us: the whole job goes down with us
            result = run_cell(spec_path, result_path, rdzv=rdzv, timeout_s=timeout)
    except UserError as err:
        result = no_result(" ".join(str(err).split()))
    write_result(result_path, result)
    log = base.report_dir(result_path) / "torchrun.log"
    if log.exists():  # into the runner's log of this cell: every rank's output, in one place
        sys.stdout.write(procs.tail(log, 200_000))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
