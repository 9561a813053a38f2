"""One result record as an experiment tracker's run, the same content for TensorBoard, MLflow and W&B
(what goes where: docs/export.md). Nothing here imports a tracker."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ditbench.core.errors import UserError
from ditbench.core.escape import plain
from ditbench.files.imageload import GRID_PIXELS, open_image
from ditbench.files.outpaths import safe_component
from ditbench.records.metrics import MEMORY, RECORD_METRICS, TIMING, finite
from ditbench.records.model import Quality, Record
from ditbench.report.load import flatten, grid_file

# metrics.<key> -> the group a tracker shows it under (the metric table's kind); others go under "metrics/".
GROUPS = {
    m.key: {TIMING: "speed", MEMORY: "memory"}[m.kind] for m in RECORD_METRICS if m.kind in (TIMING, MEMORY)
}
GROUPS |= {"scaling_efficiency": "speed", "measured_steps": "speed", "window_s": "speed"}
GROUPS |= {"predicted_peak_gib": "memory"}
Param = str | int | float | bool


@dataclass
class TrackerRun:
    """What one record becomes in a tracker. `key` (name, cell id, run id) is one safe folder name;
    every text is plain (no NUL, no lone surrogate: trackers write UTF-8)."""

    key: str
    name: str
    params: dict[str, Param] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    images: list[tuple[str, int, Path]] = field(default_factory=list)  # (tag, step, PNG path)
    record: dict[str, Any] = field(default_factory=dict)  # the record as JSON, for trackers that keep files
    notes: list[str] = field(default_factory=list)  # what was left out, and why (said on stderr)


def _param(value: Any) -> Param:
    if value is None:
        return "null"
    if isinstance(value, str):
        return plain(value)
    if isinstance(value, int | float | bool):
        return value
    return json.dumps(value, sort_keys=True)  # a list of steps or seeds: one readable value


def _metrics(metrics: dict[str, Any] | None) -> dict[str, float]:
    out = {}
    for key, value in flatten(metrics or {}).items():
        number = finite(value)
        if number is not None:  # per-step samples (a list), kernel names and flags are not metrics
            out[f"{GROUPS.get(key.split('.', 1)[0], 'metrics')}/{key}"] = number
    return out


def _quality(quality: Quality | None, source: str, notes: list[str]) -> tuple[dict, list]:
    series: dict[str, list[tuple[int, float]]] = {}
    images: list[tuple[str, int, Path]] = []
    if quality is None:
        return series, images
    for point in quality.train_loss or []:
        if len(point) == 2 and finite(point[0]) is not None and (v := finite(point[1])) is not None:
            series.setdefault("quality/train_loss", []).append((int(point[0]), v))
    for evaluation in quality.evaluations or []:
        step = evaluation.step
        for name, value in evaluation.metrics.items():
            if (v := finite(value)) is not None:
                series.setdefault(f"quality/{name}", []).append((step, v))
        for name, value in (evaluation.spread or {}).items():
            if (v := finite(value)) is not None:
                series.setdefault(f"quality/{name}_spread", []).append((step, v))
        grid = evaluation.grid
        path = grid_file(source, grid)  # relative to the results file, and inside its folder
        if path is None:
            if grid is not None:
                notes.append(
                    f"{source}: grid {plain(grid)!r} is not a file inside the run's folder; left out"
                )
            continue
        try:
            with open_image(path, GRID_PIXELS, "a sample grid"):  # the header only: a bomb is never decoded
                images.append(("quality/grid", step, path))
        except UserError as err:
            notes.append(f"{err} Left out.")
    return series, images


_NAME = re.compile(r"[A-Za-z0-9_.\- :/]{1,250}")  # what MLflow takes as a metric or param name


def _tracker_names(values: dict[str, Any], what: str, source: str, notes: list[str]) -> dict[str, Any]:
    """The entries whose names every tracker takes (no path that normalises to another); the rest are
    left out with a note (a hand-edited record's key should not fail the whole export)."""
    bad = [k for k in values if not _NAME.fullmatch(k) or posixpath.normpath(k) != k]
    if bad:
        notes.append(
            f"{source}: {len(bad)} {what} left out: a tracker refuses names such as {plain(bad[0])!r} "
            "(a name is letters, digits and `_-. :/`)"
        )
    return {k: v for k, v in values.items() if k not in bad}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_")[:80] or "cell"


def tracker_run(record: Record, source: str) -> TrackerRun:
    """The run for one record; `source` is its row's (`path:line`: grids are relative to that folder)."""
    raw = record.dump()
    label = record.label
    name = plain(str(record.cell_name or record.cell_id) + (f" [{label}]" if label else ""))
    params = {k: _param(v) for k, v in flatten(raw["config"]).items()}
    tags = {
        key: plain(raw[key])
        for key in ("suite", "run_id", "cell_id", "label", "status", "reason", "started_at")
        if raw.get(key) is not None
    }
    for key in ("gpu_name", "gpu_count", "cpu", "torch", "cuda", "ditbench", "git_sha", "host"):
        if (raw.get("env") or {}).get(key) is not None:
            tags[f"env.{key}"] = plain(raw["env"][key])
    metrics = raw.get("metrics") or {}
    for key in ("noisy", "fits_budget", "attention_kernel", "optimizer_kernel"):
        if metrics.get(key) is not None:
            tags[f"metrics.{key}"] = plain(metrics[key])
    # one folder name, whatever the record's ids hold; a rerun of the cell (another run id) is a new run
    key = f"{_slug(name)}-{safe_component(record.cell_id)}-{safe_component(record.run_id)}"
    run = TrackerRun(key=key, name=name, params=params, tags=tags, metrics=_metrics(metrics), record=raw)
    smoke = record.smoke
    losses = (
        [(i + 1, v) for i, x in enumerate(smoke.loss or []) if (v := finite(x)) is not None] if smoke else []
    )
    if losses:
        run.series["smoke/loss"] = losses
    for key in ("first_mean", "last_mean", "nonfinite_steps", "scaler_skips"):
        if smoke is not None and (v := finite(getattr(smoke, key))) is not None:
            run.metrics[f"smoke/{key}"] = v
    run.series.update((q := _quality(record.quality, source, run.notes))[0])
    run.images = q[1]
    run.params = _tracker_names(run.params, "parameters", source, run.notes)
    run.metrics = _tracker_names(run.metrics, "metrics", source, run.notes)
    run.series = _tracker_names(run.series, "series", source, run.notes)
    return run


def tracker_runs(df: pd.DataFrame) -> list[TrackerRun]:
    """One run per loaded record (its source is `path:line`; grids are relative to that folder)."""
    return [
        tracker_run(record, str(source)) for record, source in zip(df["record"], df["source"], strict=True)
    ]
