"""Write TrackerRuns as Weights & Biases runs, offline unless WANDB_MODE says otherwise: DIR/wandb/.

Each cell is a run named by its cell: its knobs are the run's config, with its identity tags as
`tag.<key>` beside them (as TensorBoard's HParams) and its status as a W&B tag; its metrics are
logged at step 0 and its series at their steps (one log call per step, ascending, as W&B requires),
its grids as images at their step, and the record itself is record.json in the run's files. The
report is a run of its own (job type `report`) with report.md, report.html, results.csv and the plots
as files. A run's id is a hash of its record (run id, cell id), so a record whose run folder is in
DIR already is skipped: exporting twice adds nothing twice. `wandb sync DIR/wandb/offline-run-*`
uploads offline runs. Needs wandb (the `wandb` extra); imported only here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ditbench.export.runs import TrackerRun
from ditbench.extras import require_extra

# The exporting machine's stats, git state and packages say nothing about the run a record holds.
QUIET = {
    "silent": True, "console": "off", "disable_git": True, "disable_code": True,
    "x_disable_stats": True, "x_disable_meta": True, "x_save_requirements": False,
}  # fmt: skip


def run_id(record_key: str) -> str:
    return hashlib.sha256(record_key.encode()).hexdigest()[:16]


def _exported(target: Path, rid: str) -> bool:
    return any((target / "wandb").glob(f"*run-*-{rid}"))


def _start(wandb, target: Path, project: str, rid: str, name: str, **kwargs):
    fields = getattr(wandb.Settings, "model_fields", {})
    settings = wandb.Settings(**{k: v for k, v in QUIET.items() if k in fields})
    mode = None if os.environ.get("WANDB_MODE") else "offline"  # the user's WANDB_MODE wins
    return wandb.init(
        dir=str(target), project=project, id=rid, name=name, mode=mode, settings=settings, **kwargs
    )


def _write_run(wandb, target: Path, project: str, rid: str, run: TrackerRun) -> None:
    config = {**run.params, **{f"tag.{k}": v for k, v in run.tags.items()}}
    tags = [run.tags["status"]] if run.tags.get("status") else None
    live = _start(wandb, target, project, rid, run.name, config=config, tags=tags, job_type="cell")
    try:
        steps: dict[int, dict] = {0: dict(run.metrics)} if run.metrics else {}
        for key, points in run.series.items():
            for step, value in points:
                steps.setdefault(step, {})[key] = value
        for key, step, path in run.images:
            steps.setdefault(step, {})[key] = wandb.Image(str(path))
        for step in sorted(steps):
            live.log(steps[step], step=step)
        Path(live.dir, "record.json").write_text(json.dumps(run.record, indent=1), encoding="utf-8")
    finally:
        live.finish()


def export(
    runs: list[TrackerRun], target: Path, project: str, report: tuple[str, dict[str, Path]] | None
) -> dict:
    """Each run not yet in `target`; {"written": [run names], "skipped": [...], "project": name}."""
    wandb = require_extra("wandb", "wandb", "ditbench export --to wandb")
    target.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for run in runs:
        rid = run_id(f"{run.tags.get('run_id')}/{run.tags.get('cell_id')}")
        if _exported(target, rid):
            skipped.append(run.name)
            continue
        _write_run(wandb, target, project, rid, run)
        written.append(run.name)
    if report is not None:
        name, rid = f"report {report[0]}", run_id(f"report/{report[0]}")
        if _exported(target, rid):
            skipped.append(name)
        else:
            live = _start(wandb, target, project, rid, name, job_type="report", tags=["report"])
            try:
                for path in report[1].values():
                    Path(live.dir, "report").mkdir(exist_ok=True)
                    shutil.copyfile(path, Path(live.dir, "report", path.name))
            finally:
                live.finish()
            written.append(name)
    return {"written": written, "skipped": skipped, "project": project}
