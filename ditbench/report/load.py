"""results.jsonl files as a pandas DataFrame, one row per record: each line validated once into a
`records.model.Record` (the `record` column), its sections flattened with dots (`metrics.step_ms.median`),
integer columns as nullable Int64, `source` = file:line. A torn last line (a killed writer) is skipped
with a warning; anything else that is not a record is a UserError naming the file, line and key."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from ditbench.bench.cell.window import noise_advice
from ditbench.bench.repeats import combine
from ditbench.core.errors import UserError, shorten
from ditbench.files.outpaths import inside, not_a_file
from ditbench.records.jsonl import TORN, as_record, lines
from ditbench.records.metrics import finite
from ditbench.records.model import SCHEMA, SCHEMA_PREFIX, Record

KEEP_CHOICES = ("latest", "all")
SECTIONS = ("config", "metrics", "smoke", "env")  # flattened into columns


def add_results(parser) -> None:
    """The RESULTS files a command reads (`report`, `export`), as `load_results` takes them."""
    parser.add_argument(
        "results",
        nargs="+",
        metavar="RESULTS",
        help="results.jsonl files written by `ditbench run` (or their run directories)",
    )


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}, "c": [1, 2]} -> {"a.b": 1, "c": [1, 2]}; an empty or null dict gives its own key."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict) and obj:
        for key, value in obj.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            out.update(flatten(value, name))
    elif prefix:
        out[prefix] = None if isinstance(obj, dict) else obj
    return out


def grid_file(source: Any, grid: Any) -> Path | None:
    """The sample grid a record names (`quality.evaluations[].grid`, relative to the folder of the
    results file its row's `source` names), or None where it is no file inside that folder: an
    absolute or `..` path or a link out of the run is never read."""
    text = str(source or "")
    if not text:
        return None
    path = Path(text.rsplit(":", 1)[0]) if ":" in text else Path(text)
    found = inside(path if path.is_dir() else path.parent, grid)  # `export RUN_DIR`: the folder itself
    return found if found is not None and found.is_file() else None


def read_records(
    path: str | Path, judge_metrics: bool = False, side: str = ""
) -> list[tuple[int, Record, dict]]:
    """(line number, record, its JSON) for every record of one results file, validated; `side` heads a
    message."""
    path = Path(path)
    if path.is_dir():
        candidate = path / "results.jsonl"
        if not candidate.is_file():
            raise UserError(
                f"{path} is a directory without a results.jsonl; give the results file that "
                "`ditbench run --out DIR` wrote (DIR/results.jsonl)."
            )
        path = candidate
    why = not_a_file(path)  # a FIFO or /dev/null is named as such, and never opened
    if why is not None:
        raise UserError(
            f"results file {path} {why}; give the results.jsonl that `ditbench run` "
            "wrote (for example runs/NAME/results.jsonl)."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(
            f"{path} is not a text file ({err.reason} at byte {err.start}); give a results.jsonl "
            "written by `ditbench run`."
        ) from None
    records = []
    for number, value, problem in lines(text):
        where = f"{side} {path} line {number}".lstrip()
        if problem == TORN:
            warnings.warn(
                f"{path}: line {number} is an incomplete record (the run was probably stopped while "
                "writing it); skipped",
                stacklevel=2,
            )
        elif problem is not None:
            raise UserError(
                f"{where} is {problem}; a results file has one JSON result record per line, as "
                "`ditbench run` writes it."
            )
        else:
            records.append((number, _validate(value, where, judge_metrics), value))
    return records


def _validate(value: Any, where: str, judge_metrics: bool) -> Record:
    if not isinstance(value, dict):
        raise UserError(
            f"{where} is a JSON {type(value).__name__}, not a result record (a JSON object with "
            f'"schema": "{SCHEMA}"); is this the results.jsonl of `ditbench run`?'
        )
    schema = value.get("schema")
    if not (isinstance(schema, str) and schema.startswith(SCHEMA_PREFIX)):
        raise UserError(
            f'{where} is not a ditbench result record: its "schema" is {shorten(schema)}, expected '
            f"{SCHEMA!r}; is this the results.jsonl of `ditbench run`?"
        )
    contradiction = value_problem(value, judge_metrics=judge_metrics)  # values pandas can hold
    record, problem = as_record(value) if contradiction is None else (None, None)
    if problem is not None:
        name, cid = value.get("cell_name"), value.get("cell_id")
        if isinstance(name, str) and isinstance(cid, str):
            where += f" (cell `{shorten(name, 100, quote=False)}`, {shorten(cid, 40, quote=False)})"
        raise UserError(
            f"{where} is not a valid result record: {problem}. Is this the results.jsonl of `ditbench run`, "
            "unedited?"
        )
    contradiction = contradiction or record.contradiction()  # checked against itself: ids, rates, dates
    if contradiction is not None:
        field, why = contradiction
        raise UserError(
            f"{where}, field {field}: {why}. A record must agree with itself; was it edited by hand?"
        )
    return record


def value_problem(raw: dict[str, Any], *, judge_metrics: bool = False) -> tuple[str, str] | None:
    """(field, what is wrong) for the first value of a record as read that pandas cannot hold: an integer
    beyond 64 bits, a float that is not finite (the writer stores NaN and inf as null: a JSON
    `Infinity` was put there by hand). judge_metrics=True leaves `metrics` and `quality` to a caller that
    names each value it cannot use by cell (the gate, whose policy may allow some)."""
    skip = ("metrics", "quality") if judge_metrics else ()
    stack: list[tuple[str, Any]] = [(k, v) for k, v in raw.items() if k not in skip]
    while stack:
        path, value = stack.pop()
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            digits = len(str(abs(value))) if value.bit_length() < 20_000 else "thousands of"
            return path, f"is an integer of {digits} digits, beyond the 64-bit range a report can hold"
        if isinstance(value, float) and not math.isfinite(value):
            return path, f"is {value!r}; a record holds finite numbers (its writer stores NaN as null)"
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}", v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


def record_row(record: Record, source: str = "", raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """One DataFrame row: top-level values, then the flattened sections (of the JSON read, `raw`, in its
    order and numbers), then the record itself."""
    raw = record.dump() if raw is None else raw
    row = {key: value for key, value in raw.items() if key not in SECTIONS}
    for section in SECTIONS:
        value = raw.get(section)
        row.update(flatten(value, section) if isinstance(value, dict) else {section: value})
    row["source"] = source
    row["record"] = record
    return row


def load_results(
    paths: str | Path | Iterable[str | Path],
    keep: str = "latest",
    judge_metrics: bool = False,
    side: str = "",
) -> pd.DataFrame:
    """Every record of the given results files, one row per record.

    keep="latest": per cell_id, the record the runner would take (within a file the last line, across
    files the latest started_at, then the file given last); a cell's repeats combined into one row
    (bench.repeats.combine; `source` names every line). keep="all": every record.
    judge_metrics=True (the gate) leaves non-finite or huge metric values to the caller, which names
    each one by cell; otherwise they are input errors, like every contradiction (Record.contradiction).
    """
    if keep not in KEEP_CHOICES:
        raise UserError(f"keep={keep!r} is not valid; use one of {', '.join(KEEP_CHOICES)}.")
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows = []
    file_index: list[int] = []
    for index, path in enumerate(paths):
        for lineno, record, raw in read_records(path, judge_metrics, side):
            rows.append(record_row(record, f"{path}:{lineno}", raw))
            file_index.append(index)
    if not rows:
        names = ", ".join(str(p) for p in paths) or "(none)"
        raise UserError(
            f"no result records in {names}; run `ditbench run SUITE.yaml --out DIR` first, or check "
            "that you gave its DIR/results.jsonl."
        )
    df = _frame(rows, file_index)
    if keep == "latest":
        # within a file the last line wins (as bench.repeats.latest_by_repeat); then, across files, the
        # later started_at (NaT sorts first, so a dated record beats an undated one), then file order
        df["_repeat"] = [r.repeat_index for r in df["record"]]
        df = df.drop_duplicates(["_file", "cell_id", "_repeat"], keep="last")
        df = df.sort_values(["started_at", "_file"], na_position="first", kind="stable")
        df = df.drop_duplicates(["cell_id", "_repeat"], keep="last").sort_values("_order", kind="stable")
        if (df["_repeat"] > 1).any() or any(r.repeat_count > 1 for r in df["record"]):
            rows = _combine_repeats(df)
            df = _frame(rows, [0] * len(rows))
    df = df.drop(columns=[c for c in ("_order", "_file", "_repeat") if c in df]).reset_index(drop=True)
    return _tidy_columns(df, rows)


def _frame(rows: list[dict[str, Any]], file_index: list[int]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["_order"] = range(len(df))
    df["_file"] = file_index
    if "started_at" in df:
        df["started_at"] = pd.to_datetime(df["started_at"], utc=True, errors="coerce", format="ISO8601")
    else:
        df["started_at"] = pd.NaT
    return df


def _combine_repeats(df: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per cell from the latest record of each of its repeats (up to the K of the cell's
    latest record), in the order of each cell's first kept line."""
    latest = df.sort_values(["started_at", "_file", "_order"], na_position="first", kind="stable")
    k = {cid: r.repeat_count for cid, r in zip(latest["cell_id"], latest["record"], strict=True)}
    rows = []
    for cid, group in df.groupby("cell_id", sort=False):
        group = group[group["_repeat"] <= k[cid]].sort_values("_repeat", kind="stable")
        records, sources = list(group["record"]), [str(x) for x in group["source"]]
        if len(records) == 1 and k[cid] == 1:
            rows.append(record_row(records[0], sources[0]))
            continue
        paths = {src.rpartition(":")[0] for src in sources}
        lines = ",".join(src.rpartition(":")[2] for src in sources)
        source = f"{paths.pop()}:{lines}" if len(paths) == 1 else "; ".join(sources)
        rows.append(record_row(combine(records), source))
    return rows


def _tidy_columns(df: pd.DataFrame, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Drop empty placeholders of objects other records fill; integer columns as nullable Int64."""
    ancestors = {name[:i] for name in df.columns for i, ch in enumerate(name) if ch == "."}
    df = df.drop(columns=[c for c in df.columns if c in ancestors and df[c].isna().all()])
    # pandas turns ints into floats as soon as one record lacks the field: decide on the raw values.
    kinds: dict[str, bool] = {}
    for row in rows:
        for key, v in row.items():
            if v is None or key in ("record", "source", "started_at"):
                continue
            # True/False stay boolean; an integer beyond int64 (a metric the gate judges) stays an object
            is_int = isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63
            kinds[key] = kinds.get(key, True) and is_int
    for c in df.columns:
        if kinds.get(c) and df[c].dtype != "Int64":
            df[c] = pd.array([None if pd.isna(v) else int(v) for v in df[c]], dtype="Int64")
    return df


def column(df: pd.DataFrame, name: str) -> pd.Series:
    """df[name] as floats, or all-NaN when no record has that field (e.g. mfu on a CPU run)."""
    if name not in df:
        return pd.Series(float("nan"), index=df.index, dtype=float)
    return pd.to_numeric(df[name], errors="coerce").astype(float)


def number(value: float | None) -> tuple[float | None, str | None]:
    """(float, None) for a finite number, (None, None) for null, else (None, why it is not usable)."""
    if value is None:
        return None, None
    if not math.isfinite(value):
        return None, f"is {value!r}, not a finite number"
    return float(value), None


def noise_parts(noise: dict[str, Any], spread: str) -> list[str]:
    """A noisy window's figures against their bounds (the step-time spread, named `spread`, and the
    throughput gap), then what to change (bench.window.noise_advice)."""
    parts = []
    for name, bound, label in (
        ("step_spread", "spread_bound", spread),
        ("throughput_gap", "gap_bound", "throughput gap"),
    ):
        v, b = finite(noise.get(name)), finite(noise.get(bound))
        if v is not None:
            parts.append(f"{label} {v:.3g}" + (f" (bound {b:.3g})" if b is not None else ""))
    if (advice := noise_advice(noise)) is not None:
        parts.append(advice)
    return parts


def value(row: pd.Series | dict[str, Any], name: str) -> float | None:
    """A numeric field of one row, or None when absent, null or NaN."""
    v = row.get(name) if hasattr(row, "get") else None
    if v is None or isinstance(v, bool):
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if v != v else v
