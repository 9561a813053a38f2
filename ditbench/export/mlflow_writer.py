"""Write TrackerRuns as MLflow runs in one experiment of a tracking URI (a server, or a local store).

Each cell is a run named by its cell: knobs as params, identity as tags, metrics at step 0, series
at their steps, grids as artifacts under grids/ and the record itself as record.json. The report is
a run of its own (tag `ditbench.kind: report`) with report.md, report.html, results.csv and the plots
under report/. A run carries `ditbench.record` (run id/cell id); a record already in the experiment
is skipped, so exporting twice adds nothing twice. Needs mlflow-skinny with sqlalchemy and alembic
for a sqlite store (the `mlflow` extra); imported only here. A file store the user names (file:///path,
or a plain path) is opened with MLFLOW_ALLOW_FILE_STORE=true for the export: MLflow 3 keeps it behind
that switch, and naming the store is the user's choice of it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlparse

from ditbench.errors import UserError, shorten
from ditbench.export.runs import TrackerRun
from ditbench.extras import require_extra

RECORD_TAG = "ditbench.record"
BATCH = 100  # MLflow's log_batch takes at most 100 params and 1,000 metrics a call


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


def _experiment(client, name: str) -> str:
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)


def _exported(client, experiment_id: str) -> set[str]:
    seen, token = set(), None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        seen.update(r.data.tags.get(RECORD_TAG) for r in page)
        token = page.token
        if not token:
            return seen


def _log(client, run_id: str, run: TrackerRun) -> None:
    from mlflow.entities import Metric, Param

    now = int(time.time() * 1000)
    params = [Param(k, str(v)) for k, v in run.params.items()]
    metrics = [Metric(k, v, now, 0) for k, v in run.metrics.items()]
    metrics += [Metric(k, v, now, step) for k, points in run.series.items() for step, v in points]
    for i in range(0, max(len(params), len(metrics)), BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + BATCH], params=params[i : i + BATCH])
    for _, _, path in run.images:
        client.log_artifact(run_id, str(path), "grids")
    client.log_dict(run_id, run.record, "record.json")  # the whole record, as `ditbench run` wrote it


def export(
    runs: list[TrackerRun], uri: str, experiment: str, report: tuple[str, dict[str, Path]] | None
) -> dict:
    """Each run not yet in the experiment; {"written": [run names], "skipped": [...], "experiment": id}."""
    file_store = urlparse(uri).scheme in ("", "file")
    before = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    if file_store:
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        return _export(runs, uri, experiment, report)
    finally:  # the environment as it was (no unittest.mock in ditbench/)
        if before is None:
            os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = before


def _export(runs: list[TrackerRun], uri: str, experiment: str, report: tuple[str, dict[str, Path]] | None):
    client = _client(uri)
    experiment_id = _experiment(client, experiment)
    seen = _exported(client, experiment_id)
    written, skipped = [], []
    for run in runs:
        record = f"{run.tags.get('run_id')}/{run.tags.get('cell_id')}"
        if record in seen:
            skipped.append(run.name)
            continue
        created = client.create_run(experiment_id, run_name=run.name, tags={**run.tags, RECORD_TAG: record})
        _log(client, created.info.run_id, run)
        client.set_terminated(created.info.run_id, "FINISHED")
        written.append(run.name)
    if report is not None:
        record = f"report/{report[0]}"
        if record in seen:
            skipped.append(record)
        else:
            tags = {"ditbench.kind": "report", RECORD_TAG: record}
            created = client.create_run(experiment_id, run_name=f"report {report[0]}", tags=tags)
            for path in report[1].values():
                client.log_artifact(created.info.run_id, str(path), "report")
            client.set_terminated(created.info.run_id, "FINISHED")
            written.append(record)
    return {"written": written, "skipped": skipped, "experiment": experiment_id}
