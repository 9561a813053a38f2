"""A cell's files between its start and its record: each finished result is appended once, never lost.

`<out>/.inflight/<key>.ticket.json` is written before the cell starts, `<key>.result.json` beside it
when it ends; `commit` appends the record and only then removes both. After a kill the next run
appends a result not yet appended (`adopt`) and nothing twice: (run_id, cell_id, repeat) names one
result. A broken ticket goes to `<out>/broken/`; a FIFO planted as one is refused, never waited on.
"""

from __future__ import annotations

import glob
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ditbench.bench.launch.aggregate import add_scaling_efficiency
from ditbench.bench.launch.files import write_result
from ditbench.bench.repeats import repeat_of
from ditbench.files.fileio import mkdir_real, read_regular, refuse_link, rmtree_real, write_json_atomic
from ditbench.records.jsonl import append_record, decode_line, lines, read_records, to_record
from ditbench.records.model import SCHEMA, RecordError

INFLIGHT_DIR = ".inflight"
BROKEN_DIR = "broken"  # beside it: tickets that could not be read or made into a record
TRACEBACK_LINES = 15
# Result keys the record places itself; any other key a cell reports (e.g. quality) is carried over.
_PLACED = ("status", "reason", "metrics", "smoke", "env", "traceback")
# A ticket's context (besides env, label and repeats): its run's and cell's keys lead the record.
_RUN_KEYS = ("suite", "run_id", "cell_id", "cell_name", "suite_baseline", "suite_overrides", "config")
_CONTEXT_KEYS = (*_RUN_KEYS, "started_at")

Finish = Callable[[dict[str, Any]], None]  # completes a record before it is appended (scaling efficiency)


@dataclass(frozen=True)
class Ticket:
    folder: Path  # <out>/.inflight
    key: str  # <cell_id>.<run_id>

    @property
    def ticket_path(self) -> Path:
        return self.folder / f"{self.key}.ticket.json"

    @property
    def spec_path(self) -> Path:
        return self.folder / f"{self.key}.spec.json"

    @property
    def result_path(self) -> Path:
        return self.folder / f"{self.key}.result.json"

    def read_context(self) -> dict[str, Any]:
        return json.loads(read_regular(self.ticket_path, "--out"))

    def set_aside(self, run_id: str, why: str) -> None:
        """Move this ticket's files to <out>/broken/ (named after the run that found them), saying why."""
        broken = mkdir_real(self.folder.parent / BROKEN_DIR, "--out")
        for path in self.folder.glob(f"{glob.escape(self.key)}.*"):
            os.replace(path, broken / f"{run_id}.{path.name}")
        warnings.warn(
            f"{self.ticket_path}: an unreadable ticket of an earlier run ({why}); moved to {broken}",
            stacklevel=3,
        )

    def remove(self) -> None:
        """Every file of this ticket: spec, result, the ranks' reports and torchrun's logs."""
        for path in self.folder.glob(f"{glob.escape(self.key)}.*"):
            rmtree_real(path)
        for path in self.folder.glob(f".{glob.escape(self.key)}.*.tmp"):  # an atomic write cut short
            path.unlink(missing_ok=True)


def tickets(folder: Path) -> Iterator[tuple[Ticket, Any]]:
    """Every ticket in `folder` with its context (None where the file cannot be read as JSON)."""
    for path in sorted(folder.glob("*.ticket.json")):
        ticket = Ticket(folder, path.name[: -len(".ticket.json")])
        try:
            context = ticket.read_context()
        except (OSError, ValueError, RecursionError):  # ValueError: not UTF-8, not JSON
            context = None
        yield ticket, context


def inflight_dir(out: Path) -> Path:
    return Path(out) / INFLIGHT_DIR


def record_context(suite, run_id: str, cell, started_at: str, **more: Any) -> dict[str, Any]:
    """What a cell's record says of its run beside the result: the suite, the run, the cell, when;
    `more`: env, label and, in a run with repeats, repeat and repeats (K > 1 only)."""
    if more.get("repeats", 1) <= 1:  # one run of each cell: no repeat keys
        more = {k: v for k, v in more.items() if k not in ("repeat", "repeats")}
    return {
        "suite": suite.name,
        "run_id": run_id,
        "cell_id": cell.cell_id,
        "cell_name": cell.cell_name,
        "suite_baseline": suite.baseline,
        "suite_overrides": suite.overrides,
        "config": cell.config,
        "started_at": started_at,
        **more,
    }


def open_ticket(folder: Path, context: dict[str, Any]) -> Ticket:
    """Write the ticket of a cell about to start; `context` holds _CONTEXT_KEYS and `env`."""
    missing = [k for k in _CONTEXT_KEYS if k not in context]
    if missing:
        raise ValueError(f"a ticket needs {', '.join(missing)}")
    mkdir_real(folder, "--out")
    repeat = f"-r{context['repeat']}" if context.get("repeats") else ""  # a run runs each repeat once
    ticket = Ticket(folder, f"{context['cell_id']}{repeat}.{context['run_id']}")
    ticket.remove()  # leftovers of an attempt with the same key (cannot be a result: one run, one attempt)
    write_json_atomic(ticket.ticket_path, {**context, "started_unix": time.time()}, default=str)
    return ticket


def write_result_file(ticket: Ticket, result: dict[str, Any]) -> None:
    """A result the runner decided itself (the cell's process writes its own)."""
    write_result(ticket.result_path, result)


def make_record(context: dict[str, Any], result: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """The record (records.model.Record as JSON) of one cell's result and its ticket's context."""
    record = {
        "schema": SCHEMA,
        **{key: context[key] for key in _RUN_KEYS},  # suite_overrides: the run's `key=value`s ({} when none)
        "status": result.get("status", "error"),
        "reason": result.get("reason"),
        "metrics": result.get("metrics"),
        "smoke": result.get("smoke"),
        "env": result.get("env") or context.get("env"),
        "started_at": context["started_at"],
        "duration_s": round(duration_s, 3),
    }
    if context.get("label"):  # `run --label`: only where one was given
        record["label"] = context["label"]
    if context.get("repeats"):  # a run with repeats: which one of how many (bench.repeats)
        record["repeat"], record["repeats"] = context.get("repeat"), context["repeats"]
    for key, value in result.items():
        if key not in _PLACED and key not in record:
            record[key] = value
    if isinstance(result.get("traceback"), str) and result["traceback"]:
        lines = result["traceback"].rstrip().splitlines()
        record["traceback"] = "\n".join(lines[-TRACEBACK_LINES:])
    return record


def valid_record(context: dict[str, Any], result: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """make_record, or where the result makes no record (another ditbench's process, a broken file),
    an error record naming the key at fault."""
    record = make_record(context, result, duration_s)
    try:
        to_record(record)
    except RecordError as err:
        record = make_record(
            context, {"status": "error", "reason": f"the cell's result is {err}"}, duration_s
        )
    return record


def read_result(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(result, None), or (None, why it cannot be used). Never raises."""
    try:
        data = read_regular(path, "--out")
    except FileNotFoundError:
        return None, "no result file"
    except OSError as err:
        return None, f"its result file could not be read ({err.strerror or err})"
    value, problem = decode_line(data)
    if problem is None and not (isinstance(value, dict) and isinstance(value.get("status"), str)):
        problem = "not a result (a JSON object with a status)"
    return (value, None) if problem is None else (None, f"its result file is {problem}")


def commit(
    results_path: Path, ticket: Ticket, duration_s: float, finish: Finish | None = None
) -> dict[str, Any]:
    """Append the record of the ticket's result (which must be there), then remove the ticket's files;
    return the record as written. An unreadable result file is recorded as an error, never raised."""
    context = ticket.read_context()
    result, problem = read_result(ticket.result_path)
    if result is None:
        result = {"status": "error", "reason": f"the cell finished but {problem}"}
    record = valid_record(context, result, duration_s)
    if finish is not None:
        finish(record)
    written = append_record(results_path, record)
    ticket.remove()
    return written


def appended_keys(results_path: Path) -> set[tuple[str, str, int]]:
    """(run_id, cell_id, repeat) of every line of results.jsonl that decodes, valid record or not."""
    try:
        data = read_regular(results_path)
    except FileNotFoundError:
        return set()
    return {
        (v["run_id"], v["cell_id"], repeat_of(v))
        for _, v, _ in lines(data)
        if isinstance(v, dict) and isinstance(v.get("run_id"), str) and isinstance(v.get("cell_id"), str)
    }


def adopt(
    results_path: Path, folder: Path, run_id: str, finish: Finish | None = None
) -> list[dict[str, Any]]:
    """Append the finished results a killed run left in `folder` (once), then empty `folder`; call it
    holding the output folder's lock. Returns the records appended, in start order."""
    refuse_link(folder, "--out")  # emptied below: through a link it would empty a folder elsewhere
    if not folder.is_dir():
        return []
    found = []
    for ticket, context in tickets(folder):
        if (why := context_problem(context)) is not None:
            ticket.set_aside(run_id, why)
            continue
        started = context.get("started_unix")
        ok = isinstance(started, (int, float)) and not isinstance(started, bool) and math.isfinite(started)
        found.append((started if ok else 0.0, ticket, context))
    adopted = []
    done = appended_keys(results_path) if found else set()
    for started, ticket, context in sorted(found, key=lambda t: t[0]):
        result, _problem = read_result(ticket.result_path)
        if result is not None and (context["run_id"], context["cell_id"], repeat_of(context)) not in done:
            try:
                ended = ticket.result_path.stat().st_mtime
            except OSError:
                ended = time.time()
            record = make_record(context, result, max(0.0, ended - started) if started else 0.0)
            record["adopted_by"] = run_id  # appended by this run after the run that measured it was killed
            try:
                why = to_record(record).unfinished()
            except RecordError as err:
                why = str(err)
            if why is not None:
                ticket.set_aside(run_id, f"its record would be invalid: {why}")
                continue
            if finish is not None:
                finish(record)
            adopted.append(append_record(results_path, record))
        ticket.remove()
    _empty(folder)
    return adopted


def context_problem(context: Any) -> str | None:
    if not isinstance(context, dict) or not all(k in context for k in _CONTEXT_KEYS):
        return f"not a JSON object with {', '.join(_CONTEXT_KEYS)}"
    return None if all(isinstance(context[k], str) for k in ("run_id", "cell_id")) else "ids not text"


def _empty(folder: Path) -> None:
    """Remove what no ticket owns any more (specs, rank reports and temp files of cut-off cells)."""
    for path in folder.iterdir():
        rmtree_real(path)


def scaling_finish(results_path: Path) -> Finish:
    """Fills a multi-process record's scaling efficiency from the one-GPU records in results.jsonl."""

    def finish(record: dict[str, Any]) -> None:
        if record["config"].get("gpus", 1) * record["config"].get("nodes", 1) > 1:
            add_scaling_efficiency(record, read_records(results_path))

    return finish
