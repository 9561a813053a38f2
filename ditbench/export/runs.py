"""One result record as an experiment tracker's run: the same content for TensorBoard, MLflow and W&B.

A cell's knobs (its `config`, flattened with dots) are the run's parameters; its record's identity
(suite, run id, label, status, reason) are tags; each finite number under `metrics` is a metric,
grouped as speed, memory or other by its key; the smoke run's loss and the quality loop's training
loss and scores are step series; the quality grids are images at their step. Nothing here imports a
tracker: the writers (tensorboard_writer, mlflow_writer) turn a TrackerRun into their own calls.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ditbench.errors import UserError
from ditbench.escape import plain
from ditbench.imageload import GRID_PIXELS, open_image
from ditbench.outpaths import safe_component
from ditbench.report.load import flatten, grid_file

# metrics.<key> -> the group a tracker shows it under; keys not listed go under "metrics/".
SPEED_KEYS = (
    "steps_per_s", "images_per_s", "images_per_s_per_gpu", "step_ms", "tflops_per_s", "mfu",
    "scaling_efficiency", "measured_steps", "window_s",
)  # fmt: skip
MEMORY_KEYS = (
    "peak_mem_allocated_gib", "peak_mem_reserved_gib", "device_mem_gib", "cpu_peak_rss_gib",
    "cpu_peak_alloc_gib", "predicted_peak_gib",
)  # fmt: skip
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
    record: dict[str, Any] = field(default_factory=dict)  # the record itself, for trackers that keep files
    notes: list[str] = field(default_factory=list)  # what was left out, and why (said on stderr)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _param(value: Any) -> Param:
    if value is None:
        return "null"
    if isinstance(value, str):
        return plain(value)
    if isinstance(value, int | float | bool):
        return value
    return json.dumps(value, sort_keys=True)  # a list of steps or seeds: one readable value


def _group(key: str) -> str:
    top = key.split(".", 1)[0]
    if top in SPEED_KEYS:
        return "speed"
    if top in MEMORY_KEYS:
        return "memory"
    return "metrics"


def _metrics(metrics: dict[str, Any] | None) -> dict[str, float]:
    out = {}
    for key, value in flatten(metrics or {}).items():
        number = _finite(value)
        if number is not None:  # per-step samples (a list), kernel names and flags are not metrics
            out[f"{_group(key)}/{key}"] = number
    return out


def _quality(quality: dict[str, Any] | None, source: str, notes: list[str]) -> tuple[dict, list]:
    series: dict[str, list[tuple[int, float]]] = {}
    images: list[tuple[str, int, Path]] = []
    if not quality:
        return series, images
    for point in quality.get("train_loss") or []:
        if isinstance(point, list) and len(point) == 2 and (v := _finite(point[1])) is not None:
            series.setdefault("quality/train_loss", []).append((int(point[0]), v))
    for evaluation in quality.get("evaluations") or []:
        step = int(evaluation.get("step", 0))
        for name, value in (evaluation.get("metrics") or {}).items():
            if (v := _finite(value)) is not None:
                series.setdefault(f"quality/{name}", []).append((step, v))
        for name, value in (evaluation.get("spread") or {}).items():
            if (v := _finite(value)) is not None:
                series.setdefault(f"quality/{name}_spread", []).append((step, v))
        grid = evaluation.get("grid")
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


def tracker_run(record: dict[str, Any], source: str) -> TrackerRun:
    """The run for one record; `source` is its row's (`path:line`: grids are relative to that folder)."""
    label = record.get("label")
    name = plain(str(record.get("cell_name") or record["cell_id"]) + (f" [{label}]" if label else ""))
    params = {k: _param(v) for k, v in flatten(record.get("config") or {}).items()}
    tags = {
        key: plain(record[key])
        for key in ("suite", "run_id", "cell_id", "label", "status", "reason", "started_at")
        if record.get(key) is not None
    }
    for key in ("gpu_name", "gpu_count", "cpu", "torch", "cuda", "ditbench", "git_sha", "host"):
        if (record.get("env") or {}).get(key) is not None:
            tags[f"env.{key}"] = plain(record["env"][key])
    metrics = record.get("metrics") or {}
    for key in ("noisy", "fits_budget", "attention_kernel", "optimizer_kernel"):
        if metrics.get(key) is not None:
            tags[f"metrics.{key}"] = plain(metrics[key])
    # one folder name, whatever the record's ids hold; a rerun of the cell (another run id) is a new run
    key = f"{_slug(name)}-{safe_component(record['cell_id'])}-{safe_component(record.get('run_id'))}"
    run = TrackerRun(key=key, name=name, params=params, tags=tags, metrics=_metrics(metrics), record=record)
    smoke = record.get("smoke") or {}
    losses = [(i + 1, v) for i, x in enumerate(smoke.get("loss") or []) if (v := _finite(x)) is not None]
    if losses:
        run.series["smoke/loss"] = losses
    for key in ("first_mean", "last_mean", "nonfinite_steps", "scaler_skips"):
        if (v := _finite(smoke.get(key))) is not None:
            run.metrics[f"smoke/{key}"] = v
    run.series.update((q := _quality(record.get("quality"), source, run.notes))[0])
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
