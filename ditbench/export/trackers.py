"""Write TrackerRuns into TensorBoard, MLflow or Weights & Biases (what goes where: docs/export.md).
Each writer skips what its tracker holds already and imports the tracker (its extra) only when asked.
A file store the user names is opened with MLFLOW_ALLOW_FILE_STORE=true: MLflow 3 keeps it behind that
switch, and naming the store is the user's choice of it. W&B takes series one call per step, ascending.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlparse

from ditbench.core.errors import UserError, shorten
from ditbench.core.escape import md_text
from ditbench.core.extras import require_extra
from ditbench.export.runs import TrackerRun
from ditbench.files.fileio import mkdir_real
from ditbench.files.imageload import GRID_PIXELS, load_rgb

Report = tuple[str, dict[str, Path]] | None  # (the report's id, its files)
RECORD_TAG = "ditbench.record"
BATCH = 100  # MLflow's log_batch takes at most 100 params and 1,000 metrics a call
# The exporting machine's stats, git state and packages say nothing about the run a record holds.
QUIET = {
    "silent": True, "console": "off", "disable_git": True, "disable_code": True,
    "x_disable_stats": True, "x_disable_meta": True, "x_save_requirements": False,
}  # fmt: skip


def _write_new(jobs: Iterable[tuple[str, Callable[[], bool], Callable[[], None]]]) -> dict:
    """Each (label, exported, write) job written unless `exported()`, asked just before, says the tracker
    holds it: {"written": [labels], "skipped": [labels]}."""
    done: dict[str, list[str]] = {"written": [], "skipped": []}
    for label, exported, write in jobs:
        there = exported()
        if not there:
            write()
        done["skipped" if there else "written"].append(label)
    return done


def _record_key(run: TrackerRun) -> str:
    return f"{run.tags.get('run_id')}/{run.tags.get('cell_id')}"


# ------------------------------------------------------------------------------------------ TensorBoard


def _events(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("events.out.tfevents.*"))


def _png(path: Path):
    import numpy as np

    return np.asarray(load_rgb(path, GRID_PIXELS, "a sample grid"))  # its size checked first, from the header


def _identity(run: TrackerRun) -> str:  # markdown TensorBoard renders: a record's text escaped
    rows = "\n".join(f"| {md_text(k)} | {md_text(v)} |" for k, v in sorted(run.tags.items()))
    return f"**{md_text(run.name)}**\n\n| key | value |\n|---|---|\n{rows}"


def _tensorboard_run(folder: Path, run: TrackerRun) -> None:
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    hparam_dict = {**run.params, **{f"tag.{k}": v for k, v in run.tags.items() if k in ("status", "label")}}
    with SummaryWriter(log_dir=str(mkdir_real(folder, "--to tensorboard"))) as writer:
        for summary in hparams(hparam_dict, run.metrics):
            writer.file_writer.add_summary(summary)
        for tag, value in run.metrics.items():
            writer.add_scalar(tag, value, 0)
        for tag, points in run.series.items():
            for step, value in points:
                writer.add_scalar(tag, value, step)
        for tag, step, path in run.images:
            writer.add_image(tag, _png(path), step, dataformats="HWC")
        writer.add_text("record", _identity(run), 0)


def _tensorboard_report(folder: Path, files: dict[str, Path]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(mkdir_real(folder, "--to tensorboard"))) as writer:
        for path in files.values():
            if path.suffix == ".md":
                writer.add_text(f"report/{path.name}", path.read_text(encoding="utf-8"), 0)
            elif path.suffix == ".png":
                writer.add_image(f"report/{path.stem}", _png(path), 0, dataformats="HWC")


def to_tensorboard(runs: list[TrackerRun], target: Path, report: Report) -> dict:
    """Each run (a folder `target / run.key`: one safe name, made here, never a link) not yet in `target`;
    {"written": [...], "skipped": [...]} of run folders."""
    require_extra("tensorboard", "tensorboard", "ditbench export --to tensorboard")
    jobs = [(target / run.key, functools.partial(_tensorboard_run, run=run)) for run in runs]
    if report is not None:
        jobs.append((target / f"report-{report[0]}", functools.partial(_tensorboard_report, files=report[1])))
    return _write_new((str(f), functools.partial(_events, f), functools.partial(w, f)) for f, w in jobs)


# ------------------------------------------------------------------------------------------ MLflow


def tracking_uri(uri: str | None) -> str:
    """The URI given, else MLflow's default (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in MLflow 3)."""
    return uri or require_extra("mlflow", "mlflow", "ditbench export --to mlflow").get_tracking_uri()


def _client(uri: str):
    require_extra("mlflow", "mlflow", "ditbench export --to mlflow")
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # the store answers now, not halfway through
    except MlflowException as err:
        hint = (  # mlflow-skinny alone: "Model registry functionality is unavailable" for sqlite
            " A sqlite store needs sqlalchemy and alembic: pip install 'ditbench[mlflow]' installs them."
            if "registry" in str(err).lower()
            else " Give a tracking server's URI (http://host:5000) or a local store (sqlite:///mlflow.db)."
        )
        raise UserError(
            f"MLflow refused the tracking URI {uri!r}: {shorten(str(err).split('. ')[0], 300, quote=False)}."
            + hint
        ) from None
    return client


def _in_experiment(client, experiment_id: str) -> set[str]:
    seen, token = set(), None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        seen.update(r.data.tags.get(RECORD_TAG) for r in page)
        token = page.token
        if not token:
            return seen


def _mlflow_run(client, experiment_id: str, run: TrackerRun) -> None:
    from mlflow.entities import Metric, Param

    tags = {**run.tags, RECORD_TAG: _record_key(run)}
    run_id = client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
    now = int(time.time() * 1000)
    params = [Param(k, str(v)) for k, v in run.params.items()]
    metrics = [Metric(k, v, now, 0) for k, v in run.metrics.items()]
    metrics += [Metric(k, v, now, step) for k, points in run.series.items() for step, v in points]
    for i in range(0, max(len(params), len(metrics)), BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + BATCH], params=params[i : i + BATCH])
    for _, _, path in run.images:
        client.log_artifact(run_id, str(path), "grids")
    client.log_dict(run_id, run.record, "record.json")  # the whole record, as `ditbench run` wrote it
    client.set_terminated(run_id, "FINISHED")


def _mlflow_report(client, experiment_id: str, report_id: str, files: dict[str, Path]) -> None:
    tags = {"ditbench.kind": "report", RECORD_TAG: f"report/{report_id}"}
    run_id = client.create_run(experiment_id, run_name=f"report {report_id}", tags=tags).info.run_id
    for path in files.values():
        client.log_artifact(run_id, str(path), "report")
    client.set_terminated(run_id, "FINISHED")


def to_mlflow(runs: list[TrackerRun], uri: str, experiment: str, report: Report) -> dict:
    """Each run not yet in the experiment; {"written": [run names], "skipped": [...], "experiment": id}."""
    file_store = urlparse(uri).scheme in ("", "file")
    before = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    if file_store:
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        client = _client(uri)
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
        seen = _in_experiment(client, experiment_id)
        write = functools.partial(_mlflow_run, client, experiment_id)
        jobs = [(run.name, _record_key(run), functools.partial(write, run)) for run in runs]
        if report is not None:
            key = f"report/{report[0]}"
            jobs.append((key, key, functools.partial(_mlflow_report, client, experiment_id, *report)))
        there = functools.partial(operator.contains, seen)
        done = _write_new((label, functools.partial(there, record), w) for label, record, w in jobs)
        return {**done, "experiment": experiment_id}
    finally:  # the environment as it was (no unittest.mock in ditbench/)
        if before is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = before


# ------------------------------------------------------------------------------------------ W&B


def run_id(record_key: str) -> str:
    return hashlib.sha256(record_key.encode()).hexdigest()[:16]


def _in_folder(target: Path, rid: str) -> bool:
    return any((target / "wandb").glob(f"*run-*-{rid}"))


def _start(wandb, target: Path, project: str, rid: str, name: str, **kwargs):
    fields = getattr(wandb.Settings, "model_fields", {})
    settings = wandb.Settings(**{k: v for k, v in QUIET.items() if k in fields})
    mode = None if os.environ.get("WANDB_MODE") else "offline"  # the user's WANDB_MODE wins
    return wandb.init(
        dir=str(target), project=project, id=rid, name=name, mode=mode, settings=settings, **kwargs
    )


def _wandb_run(wandb, target: Path, project: str, rid: str, run: TrackerRun) -> None:
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


def _wandb_report(wandb, target: Path, project: str, rid: str, name: str, files: dict[str, Path]) -> None:
    live = _start(wandb, target, project, rid, name, job_type="report", tags=["report"])
    try:
        for path in files.values():
            Path(live.dir, "report").mkdir(exist_ok=True)
            shutil.copyfile(path, Path(live.dir, "report", path.name))
    finally:
        live.finish()


def to_wandb(runs: list[TrackerRun], target: Path, project: str, report: Report) -> dict:
    """Each run not yet in `target`; {"written": [run names], "skipped": [...], "project": name}."""
    wandb = require_extra("wandb", "wandb", "ditbench export --to wandb")
    target.mkdir(parents=True, exist_ok=True)
    jobs = [(run.name, run_id(_record_key(run)), functools.partial(_wandb_run, run=run)) for run in runs]
    if report is not None:
        name = f"report {report[0]}"
        write = functools.partial(_wandb_report, name=name, files=report[1])
        jobs.append((name, run_id(f"report/{report[0]}"), write))
    how = (wandb, target, project)
    done = _write_new(
        (label, functools.partial(_in_folder, target, rid), functools.partial(write, *how, rid))
        for label, rid, write in jobs
    )
    return {**done, "project": project}
