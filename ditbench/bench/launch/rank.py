"""One rank of a multi-process cell: `torchrun ... -m ditbench.bench.launch.rank SPEC.json REPORT_DIR`.

Every rank runs the cell core on its share of the batch and reports in REPORT_DIR (`rank<R>.json`,
`ranks.json`, `smoke.json`, `quality.json`); the parent (`launch.torchrun`) makes them one record.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from ditbench.bench.cell import core as cell_core
from ditbench.bench.launch.files import read_spec, write_result
from ditbench.bench.launch.procs import watch_parent
from ditbench.hardware import dist


def _fail(report_dir: Path, report: dict[str, Any]) -> None:
    """Write this rank's failure and leave at once: peers stuck in a collective are stopped by torchrun."""
    report["failed_at"] = time.time()  # the first rank to fail is the cause; its peers fail after it
    write_result(report_dir / f"rank{report['rank']}.json", report)
    print(  # its traceback is in the log already (cell_core.log_failure)
        f"ditbench rank {report['rank']}: {report['status']}: {report['reason']}", file=sys.stderr, flush=True
    )
    os._exit(1)  # no process-group teardown: a peer may be waiting in a collective


def run_rank(spec_path: str, report_dir: Path) -> int:
    spec, doc = read_spec(spec_path)
    rank = int(os.environ.get("RANK", "0"))
    measured = cell_core.measure(spec, doc["cell_name"], lambda: dist.init(spec.device))
    result, ctx = measured.result, measured.ctx
    report = {"rank": rank, "world_size": getattr(ctx, "world_size", None), **result}
    if result["status"] != "ok":
        _fail(report_dir, report)
    write_result(report_dir / f"rank{ctx.rank}.json", report)
    gathered = dist.all_gather_objects(ctx, result["metrics"])
    # Every node's local rank 0 writes the gathered metrics: c10d rendezvous gives global rank 0
    # to whichever node arrives first, and the node that records the cell is --node-rank 0.
    if ctx.local_rank == 0:
        summary = {
            "world_size": ctx.world_size,
            "nodes": ctx.nodes,
            "metrics": gathered,
            "env": result["env"],
        }
        write_result(report_dir / "ranks.json", summary)
    dist.barrier(ctx)
    if spec.smoke_steps:
        agree = cell_core.agree_max(ctx)  # any rank's bad loss stops every rank's smoke run together
        smoke = cell_core.smoke(spec, measured, lambda bad: bool(agree(int(bad))))
        # ok, or a non-finite loss every rank agreed to stop at; anything else was raised on this rank alone
        _report_phase(report_dir, ctx, "smoke", smoke, smoke["status"] not in ("ok", "nan_loss"))
    if spec.quality is not None:  # the ranks split the samples; rank 0 scores and writes the field
        from ditbench.quality.loop import quality_failed

        field = cell_core.quality(spec, measured, doc)
        _report_phase(report_dir, ctx, "quality", field, quality_failed(field))
    dist.shutdown()
    return 0


def _report_phase(report_dir: Path, ctx, phase: str, field: dict, failed: bool) -> None:
    """Rank 0 writes the phase's field (`<phase>.json`); a rank whose phase raised writes its own with the
    time it failed (the first to fail is the cause) and leaves: its peers cannot go on."""
    if failed:
        write_result(
            report_dir / f"{phase}_rank{ctx.rank}.json", {"rank": ctx.rank, "failed_at": time.time(), **field}
        )
        os._exit(1)
    if ctx.rank == 0:
        write_result(report_dir / f"{phase}.json", field)
    dist.barrier(ctx)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: torchrun ... -m ditbench.bench.launch.rank SPEC.json REPORT_DIR", file=sys.stderr)
        return 2
    watch_parent()
    report_dir = Path(argv[1])
    report_dir.mkdir(parents=True, exist_ok=True)
    return run_rank(argv[0], report_dir)


if __name__ == "__main__":
    sys.exit(main())
