"""Run a suite: every cell in a fresh process, one record per cell appended to results.jsonl.

Isolation: each cell runs in a fresh process of its own session (`launch.process`; through
torchrun for several processes), so the allocator and its peak counters start clean, and a crash,
an out-of-memory or a hang in one cell cannot take the suite down; a timeout kills the cell's
whole process group.

Resume: a rerun into the same directory skips cells whose latest record is `ok` (same cell_id);
`force=True` reruns everything. After an out-of-memory at batch B, the larger batches of the same
series (the same cell except the batch size) are recorded `skipped` without being started.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditbench.bench.faults import FAULT_ENV, FAULT_RANK_ENV, check_fault_rank, parse_fault_spec
from ditbench.bench.launch.process import run_isolated
from ditbench.bench.records import SCHEMA, append_record, latest_by_cell, read_records
from ditbench.bench.suite import Cell, Suite
from ditbench.bench.summary import format_line, write_summary
from ditbench.device import cuda_visible, device_type
from ditbench.errors import UserError
from ditbench.precision import unsupported_reason

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.md"
TRACEBACK_LINES = 15


@dataclass
class RunOptions:
    out: Path
    force: bool = False
    cell_filters: list[str] = field(default_factory=list)
    timeout_s: float | None = None  # overrides the suite's per-cell timeout
    oom_skip: bool = True
    progress: bool = True
    rendezvous: dict | None = None  # torchrun's multi-node options (launch.rendezvous.Rendezvous)


@dataclass
class Visible:
    """What this machine can run, decided once in the parent (no CUDA context is created)."""

    cuda: bool
    gpu_count: int

    @classmethod
    def detect(cls) -> Visible:
        import torch

        cuda = cuda_visible()
        return cls(cuda=cuda, gpu_count=torch.cuda.device_count() if cuda else 0)


def precheck(cell: Cell, visible: Visible, rendezvous: dict | None = None) -> tuple[str, str] | None:
    """(status, reason) for a cell that cannot run here, decided without starting it."""
    config = cell.config
    device = device_type(config["device"], visible.cuda)
    if device == "cuda" and not visible.cuda:
        return "unsupported", "the suite asks for device cuda but no CUDA device is visible"
    reason = unsupported_reason(config["precision"], device)
    if reason:
        return "unsupported", reason
    # gpus > 1 on a CPU: that many gloo processes through torchrun (the multi-GPU path, testable anywhere)
    if device == "cuda" and config["gpus"] > visible.gpu_count:
        return "unsupported", f"gpus={config['gpus']} but {visible.gpu_count} CUDA device(s) are visible"
    if rendezvous or config["nodes"] > 1:
        from ditbench.bench.launch.rendezvous import Rendezvous, node_verdict

        return node_verdict(config, Rendezvous(**(rendezvous or {})))
    return None


def check_options(options: RunOptions) -> None:
    """Refuse, before any cell starts, what would otherwise fail midway (or never end)."""
    timeout = options.timeout_s
    if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
        raise UserError(f"--timeout-s must be a finite, positive number of seconds, got {timeout}.")
    parse_fault_spec(os.environ.get(FAULT_ENV))  # a typo would fail every cell it names, one by one
    check_fault_rank(os.environ.get(FAULT_RANK_ENV))


def select_cells(suite: Suite, filters: list[str]) -> list[Cell]:
    if not filters:
        return list(suite.cells)
    return [c for c in suite.cells if any(f in c.cell_name or f == c.cell_id for f in filters)]


def run_order(cells: list[Cell]) -> list[Cell]:
    """Suite order, except that within a series smaller batches go first (so an OOM can skip the rest)."""
    first: dict[str, int] = {}
    for i, cell in enumerate(cells):
        first.setdefault(cell.series_key, i)
    return sorted(cells, key=lambda c: (first[c.series_key], c.config["batch_size"]))


# ---------------------------------------------------------------------------------------------


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def make_record(
    suite: Suite,
    run_id: str,
    cell: Cell,
    result: dict[str, Any],
    env: dict[str, Any] | None,
    started_at: str,
    duration_s: float,
) -> dict[str, Any]:
    record = {
        "schema": SCHEMA,
        "suite": suite.name,
        "run_id": run_id,
        "cell_id": cell.cell_id,
        "cell_name": cell.cell_name,
        "suite_baseline": suite.baseline,
        "config": cell.config,
        "status": result["status"],
        "reason": result.get("reason"),
        "metrics": result.get("metrics"),
        "smoke": result.get("smoke"),
        "env": result.get("env") or env,
        "started_at": started_at,
        "duration_s": round(duration_s, 3),
    }
    if result.get("quality") is not None:  # the cell's sample quality (ditbench.quality)
        record["quality"] = result["quality"]
    if result.get("traceback"):
        lines = result["traceback"].rstrip().splitlines()
        record["traceback"] = "\n".join(lines[-TRACEBACK_LINES:])
    return record


def run_suite(
    suite: Suite, options: RunOptions, echo: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Run (or resume) the suite; return the latest record of every selected cell, in suite order."""
    from tqdm import tqdm

    from ditbench.environment import collect_env

    check_options(options)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS_FILE
    cells = select_cells(suite, options.cell_filters)
    previous = latest_by_cell(read_records(results_path))
    visible = Visible.detect()
    env = collect_env(probe_cuda=False)  # no CUDA context in the parent: it would hold device memory

    def already_recorded(cell: Cell) -> bool:
        """ok, or unsupported here for the same reason as last time (a new line would say nothing new)."""
        prev = cell.previous(previous)
        if options.force or prev is None:
            return False
        if prev.get("status") == "ok":
            return True
        verdict = precheck(cell, visible)
        return (
            prev.get("status") == "unsupported" and verdict is not None and prev.get("reason") == verdict[1]
        )

    done = {c.cell_id for c in cells if already_recorded(c)}
    todo = [c for c in run_order(cells) if c.cell_id not in done]
    run_id = new_run_id()
    latest = {c.cell_id: c.previous(previous) for c in cells if c.cell_id in done}
    bar = tqdm(
        total=len(todo), unit="cell", disable=not options.progress, dynamic_ncols=True, file=sys.stderr
    )
    say = echo or _print_line
    if done:
        n_ok = sum(rec["status"] == "ok" for rec in latest.values())
        say(
            f"resuming {out}: {n_ok} of {len(cells)} cells already ok"
            + (f", {len(done) - n_ok} unsupported here" if len(done) > n_ok else "")
            + f", {len(todo)} to run"
        )
    previous_term = signal.signal(signal.SIGTERM, _terminate) if _main_thread() else None
    try:
        with tempfile.TemporaryDirectory(prefix="ditbench-") as tmp:
            _run_cells(suite, options, todo, run_id, env, visible, Path(tmp), results_path, latest, bar, say)
    finally:
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        bar.close()
    records = [latest[c.cell_id] for c in cells if c.cell_id in latest]
    write_summary(out / SUMMARY_FILE, suite, records)
    return records


def _print_line(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)  # above the bar, which lives on stderr
    sys.stdout.flush()  # a line per cell shows at once in a piped log, not at exit


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _terminate(signum, frame):  # SIGTERM: stop like Ctrl-C, so the running cell is killed too
    raise KeyboardInterrupt


def _run_cells(suite, options, todo, run_id, env, visible, tmp, results_path, latest, bar, say) -> None:
    oom_at: dict[str, tuple[int, str]] = {}  # series -> (smallest batch that ran out of memory, its name)
    for i, cell in enumerate(todo, 1):
        bar.set_postfix_str(cell.cell_name)
        started_at, t0 = now_iso(), time.monotonic()
        verdict = precheck(cell, visible, options.rendezvous)
        oom = oom_at.get(cell.series_key)
        if verdict is not None:
            result = {"status": verdict[0], "reason": verdict[1]}
        elif options.oom_skip and oom and cell.config["batch_size"] > oom[0]:
            result = {
                "status": "skipped",
                "reason": f"{oom[1]} ran out of memory at batch {oom[0]}; this larger batch of the same "
                "series would too",
            }
        else:
            timeout = options.timeout_s or cell.timeout_s
            log = results_path.parent / "logs" / f"{cell.cell_id}.log"
            about = {
                "cell_id": cell.cell_id,
                "cell_name": cell.cell_name,
                "rendezvous": options.rendezvous,
                "out_dir": str(results_path.parent.resolve()),  # sample grids go under it
            }
            result = run_isolated(cell.spec, about, timeout, tmp, log)
        if result["status"] == "oom":
            known = oom_at.get(cell.series_key)
            if known is None or cell.config["batch_size"] < known[0]:
                oom_at[cell.series_key] = (cell.config["batch_size"], cell.cell_name)
        record = make_record(suite, run_id, cell, result, env, started_at, time.monotonic() - t0)
        if cell.config["gpus"] * cell.config["nodes"] > 1:
            from ditbench.bench.launch.aggregate import add_scaling_efficiency

            add_scaling_efficiency(record, list(latest.values()))
        record = append_record(results_path, record)  # as written: JSON-safe
        latest[cell.cell_id] = record
        say(f"[{i}/{len(todo)}] {format_line(record)}")
        bar.update(1)
