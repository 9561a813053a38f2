"""What a run says of its cells: a line per cell as it finishes, each distinct note once with the cells
it applies to (`Notes`), the closing lines, and summary.md (the table of every cell, its notes in full)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from ditbench.bench.cell.window import noise_advice
from ditbench.core.escape import md_code, md_text
from ditbench.core.intervals import with_ends
from ditbench.core.units import memory_text
from ditbench.files.fileio import write_atomic
from ditbench.records.metrics import CPU_ALLOC, CPU_RSS, IMAGES_PER_S, PEAK_ALLOCATED
from ditbench.records.model import Part


# The records come from results.jsonl, which a user may have edited: a reader validates the fields
# every tool relies on, the rest may be anything. Every optional figure goes through these two.
def _at(value: Any, *keys: str) -> Any:
    """value[k1][k2]..., or None where a level is missing or not a mapping (a dict, or a record's part)."""
    for key in keys:
        value = value.get(key) if isinstance(value, (dict, Part)) else None
    return value


def _num(value: Any, spec: str, scale: float = 1.0) -> str | None:
    """A finite number formatted with `spec` (after * scale), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value * scale):
        return None
    return format(value * scale, spec)


# The memory a line and the table show, first found wins, each named by what it is (the report's
# and the record docs' names too).
MEMORY_SHOWN = (
    (PEAK_ALLOCATED.key, "peak allocated"),  # the CUDA allocator's, since the window started
    (CPU_ALLOC.key, "CPU allocator peak"),  # on a CPU: a fresh trainer's second step
    (CPU_RSS.key, "CPU peak RSS"),  # the process's resident memory (records from before the above)
)


def _mem(metrics: dict[str, Any]) -> str:
    """The measured peak (allocator on a GPU, CPU allocator, else RSS), named, and the prediction."""
    text = "-"
    for key, what in MEMORY_SHOWN:
        if _num(metrics.get(key), "g") is not None:
            text = f"{memory_text(metrics[key])} {what}"
            break
    if _num(metrics.get("predicted_peak_gib"), "g") is not None:
        text += f" (predicted {memory_text(metrics['predicted_peak_gib'])})"
    return text


def _noise(metrics: dict[str, Any], exact: bool = True) -> list[str]:
    """Why a window is noisy: with its figures (exact), else the same words on every cell it applies to."""
    if metrics.get("noisy") is not True:
        return []
    n = metrics.get("noise") or {}
    said = [advice] if (advice := noise_advice(n, exact)) else []
    spread, gap = n.get("step_spread"), n.get("throughput_gap")
    if _num(spread, "g") and _num(bound := n.get("spread_bound"), "g") and spread > bound:
        said.append(f"p90/p10 {spread:.2f} > {bound:g}" if exact else f"step times p90/p10 > {bound:g}")
    if _num(gap, "g") and _num(bound := n.get("gap_bound"), "g") and gap > bound:
        differ = f"{100 * gap:.0f}%" if exact else f"by more than {100 * bound:.0f}%"
        said.append(f"window vs median-step throughput differ {differ}")
    return said


def noise_note(metrics: dict[str, Any]) -> str | None:
    """'noisy (p90/p10 3.10 > 1.5)' for a cell whose step times or throughput disagree, else None."""
    return "noisy (" + ", ".join(_noise(metrics)) + ")" if metrics.get("noisy") is True else None


def notes_of(record: dict[str, Any]) -> list[str]:
    """A record's notes: why it did not end ok, why its window is noisy, why its smoke run failed."""
    if record["status"] != "ok":
        return [str(record["reason"])] if record.get("reason") else []
    smoke = _smoke_text(record.get("smoke"))
    failed = [smoke] if smoke and not smoke.startswith("smoke loss") else []
    return [f"noisy: {text}" for text in _noise(record.get("metrics") or {}, exact=False)] + failed


def cells_text(chosen: list[tuple[str, dict]], every: list[tuple[str, dict]]) -> str:
    """The (name, config) cells `chosen` of `every`, short: 'all 16 cells', 'the 8 cells with
    precision=fp16' (the fewest settings only they share), a few names, or a count."""
    n = len(chosen)
    if n == len(every) and n > 1:
        return f"all {n} cells"
    varying = [k for k in every[0][1] if len({repr(c.get(k)) for _, c in every}) > 1]
    first = chosen[0][1]
    common = {k: first[k] for k in varying if all(c.get(k) == first[k] for _, c in chosen)}
    for shared in [{k: v} for k, v in common.items()] + [common]:
        if n > 1 and shared and sum(all(c.get(k) == v for k, v in shared.items()) for _, c in every) == n:
            return f"the {n} cells with " + " ".join(f"{k}={v}" for k, v in shared.items())
    return ", ".join(name for name, _ in chosen) if n <= 3 else f"{n} of {len(every)} cells"


class Notes:
    """Each distinct note once, numbered in the order first met, with the cells it applies to."""

    def __init__(self) -> None:
        self.cells: dict[str, dict[str, tuple[str, dict]]] = {}  # note -> cell_id -> (name, config)
        self.said: set[str] = set()

    def ref(self, text: str, cell_id: str, name: str, config: dict) -> str:
        """'[n]': the number of note `text`, now noted for the cell."""
        self.cells.setdefault(text, {})[cell_id] = (name, config)
        return f"[{list(self.cells).index(text) + 1}]"

    def refs(self, record: dict[str, Any]) -> str:
        """'[1] [3]': the record's notes (notes_of), noted."""
        cell = (record.get("cell_id"), record["cell_name"], record.get("config") or {})
        return " ".join(self.ref(text, *cell) for text in notes_of(record))

    def lines(self, every: list[tuple[str, dict]], texts=None) -> list[str]:
        """'[n] note (its cells)' of `texts` (default: every note not said yet), now said."""
        chosen = [t for t in self.cells if t not in self.said] if texts is None else texts
        self.said.update(chosen)
        number = {t: i for i, t in enumerate(self.cells, 1)}
        return [f"[{number[t]}] {t} ({cells_text(list(self.cells[t].values()), every)})" for t in chosen]


def _smoke_text(smoke: dict[str, Any] | None) -> str | None:
    if not isinstance(smoke, dict):
        return None
    if smoke.get("status") not in (None, "ok"):
        return f"smoke {smoke['status']}: {smoke.get('reason') or ''}".strip()
    first, last = _num(smoke.get("first_mean"), ".4f"), _num(smoke.get("last_mean"), ".4f")
    return f"smoke loss {first} -> {last}" if first is not None and last is not None else None


def _mfu(metrics: dict[str, Any]) -> str | None:
    value = _num(_at(metrics, "mfu", "value"), ".1f", 100)
    return f"{value}%" if value is not None else None


def format_line(record: dict[str, Any], notes: Notes | None = None) -> str:
    """A cell's result on one line; with `notes`, each note is its number there (`Notes`), else in full."""
    name, status = record["cell_name"], record["status"]
    m = record.get("metrics") or {}
    refs = notes.refs(record) if notes is not None else ""
    if status != "ok":
        return f"{name}: {status.upper()}  " + (refs if notes is not None else record.get("reason") or "")
    parts = [f"{rate_text(m)} img/s", f"step {m['step_ms']['median']:.1f} ms", _mem(m)]
    if (mfu := _mfu(m)) is not None:
        parts.append(f"MFU {mfu}")
    world = m.get("world_size")
    if isinstance(world, int) and world > 1:
        eff = _num(m.get("scaling_efficiency"), ".0f", 100)
        parts.append(f"{world} ranks" + (f", scaling {eff}%" if eff else ""))
    if isinstance(emulation := m.get("emulation"), dict):
        budget = _num(emulation.get("budget_gib"), "g")
        parts.append(f"emulated {emulation.get('card') or f'{budget} GiB'}")
    smoke = _smoke_text(record.get("smoke"))
    if notes is None:
        parts += [x for x in (smoke, noise_note(m)) if x]
    else:
        parts += [
            x for x in (smoke and smoke.split(":")[0], "noisy" if m.get("noisy") is True else None) if x
        ]
    if (duration := _num(record.get("duration_s"), ".1f")) is not None:
        parts.append(f"{duration} s")
    return f"{name}: ok  " + ", ".join(parts) + (f"  {refs}" if refs else "")


def _step_text(step: Any) -> str:
    median = _num(_at(step, "median"), ".1f")
    if median is None:
        return "-"
    p10, p90 = _num(_at(step, "p10"), ".1f"), _num(_at(step, "p90"), ".1f")
    return f"{median} ({p10}-{p90})" if p10 is not None and p90 is not None else median


def rate_text(metrics: dict[str, Any]) -> str:
    """images/s; for a cell with repeats, the median over the processes with its interval and count:
    '50.0 (95% CI 45.5-55.6, 3 runs)'."""
    text = _num(metrics.get(IMAGES_PER_S.key), ".1f") or "-"
    rep = metrics.get("repeats") or {}
    ci = rep.get(f"{IMAGES_PER_S.key}_ci")
    if isinstance(ci, list) and len(ci) == 2 and all(_num(x, "g") is not None for x in ci):
        failed = (
            f", {len(rep['failed'])} failed" if isinstance(rep.get("failed"), dict) and rep["failed"] else ""
        )
        value = metrics[IMAGES_PER_S.key] if text != "-" else ci[0]
        shown, low, high = with_ends(value, ci[0], ci[1], "{:.1f}")  # to the interval's precision
        text = (shown if text != "-" else text) + f" (95% CI {low}-{high}, {rep.get('count')} runs{failed})"
    return text


def summary_table(records: list[dict[str, Any]], notes: Notes | None = None) -> str:
    """The markdown table of every cell; its note column holds the numbers of `notes`."""
    notes = notes if notes is not None else Notes()
    header = (
        "| cell | status | img/s | step ms p50 (p10-p90) | peak mem | MFU | smoke loss first -> last | "
        "note |\n|---|---|---:|---:|---:|---:|---|---|\n"
    )
    rows = []
    for r in records:
        m = r.get("metrics") or {}
        ok = r["status"] == "ok"
        smoke = r.get("smoke")
        first, last = _num(_at(smoke, "first_mean"), ".4f"), _num(_at(smoke, "last_mean"), ".4f")
        said = f"{first} -> {last}" if first is not None and last is not None else "-"
        if _at(smoke, "status") not in (None, "ok"):
            said = md_text(f"smoke {smoke['status']}")
        cells = [
            md_text(r["cell_name"]),  # user text: no HTML, link or `|` in a markdown table
            r["status"] + (" (noisy)" if ok and m.get("noisy") is True else ""),
            rate_text(m) if ok else "-",
            _step_text(m.get("step_ms")) if ok else "-",
            _mem(m) if ok else "-",
            (_mfu(m) or "-") if ok else "-",
            said,
            notes.refs(r),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return header + "\n".join(rows) + "\n"


def _emulation_text(records: list[dict[str, Any]]) -> str:
    emulated = next((e for r in records if (e := _at(r, "metrics", "emulation")) is not None), None)
    if not emulated:
        return ""
    budget = _num(emulated.get("budget_gib"), "g") or "?"
    total = _num(emulated.get("real_total_gib"), ".1f") or "?"
    card = md_text(emulated.get("card") or f"a {budget} GiB card")
    return (
        f"Emulated card: {card} ({budget} GiB) on a {md_text(emulated.get('real_gpu'))} of {total} GiB: "
        "the allocator was capped at the card's memory less the CUDA context, and `fits` means a cell "
        f"completed under that cap; {md_text(emulated.get('note'))}.\n\n"
    )


def _repeats_text(records: list[dict[str, Any]]) -> str:
    k = max((_at(r, "metrics", "repeats", "of") or 1 for r in records), default=1)
    if not isinstance(k, int) or k <= 1:
        return ""
    return (
        f"Each cell ran {k} times, each in a fresh process, round-robin across cells; img/s and step ms "
        "are the median of the per-process medians, with a 95% bootstrap interval over the processes "
        "(p10-p90 are those of the median process's steps).\n\n"
    )


def _overrides_text(overrides: dict[str, Any] | None) -> str:
    if not overrides:
        return ""
    shown = ", ".join(md_code(f"{k}={json.dumps(v)}") for k, v in overrides.items())
    return f"Overrides given on the command line: {shown}.\n\n"


def write_summary(path: Path, suite, records: list[dict[str, Any]]) -> None:
    """summary.md: what the run was, the table of every cell, and each note in full under it."""
    env = next((r["env"] for r in records if r.get("env")), {})
    device = env.get("gpu_name") or env.get("cpu") or "?"
    notes = Notes()
    table = summary_table(records, notes)
    every = [(r["cell_name"], r.get("config") or {}) for r in records]
    text = (
        f"# {md_text(suite.name)}\n\n{md_text(suite.description)}\n\n"
        + _overrides_text(getattr(suite, "overrides", None))
        + f"{len(records)} cells: {md_text(_statuses(records))}. Device: {md_text(device)}; "
        f"torch {md_text(env.get('torch'))}; "
        f"ditbench {md_text(env.get('ditbench'))} ({md_text(env.get('git_sha'))}).\n\n"
        "Peak memory is the CUDA allocator's peak allocated on a GPU (`peak allocated`); on a CPU the "
        "CPU allocator's peak over a fresh trainer's second step (`CPU allocator peak`, "
        f"{CPU_ALLOC.path}), or in older records the process's peak resident memory (`CPU peak "
        f"RSS`, {CPU_RSS.path}), which stays flat across settings. Below 1 GiB it reads in MiB. "
        "MFU is given only where the device's peak is in the table (never on a CPU).\n\n"
        + _repeats_text(records)
        + _emulation_text(records)
        + table
        + "".join(f"\n{md_text(line)}\n" for line in notes.lines(every))
    )
    write_atomic(path, text)


def _statuses(records: list[dict[str, Any]]) -> str:
    """'16 ok (14 noisy), 8 unsupported'."""
    noisy = sum(r["status"] == "ok" and _at(r, "metrics", "noisy") is True for r in records)
    counts = Counter(r["status"] for r in records)
    return ", ".join(
        f"{n} {s}" + (f" ({noisy} noisy)" if s == "ok" and noisy else "") for s, n in counts.items()
    )


def closing(records: list[dict[str, Any]], notes: Notes, took: str) -> list[str]:
    """The run's last lines: the cells by status, and each note not yet said with its cells."""
    for r in records:
        notes.refs(r)  # the notes of records earlier runs made, too
    every = [(r["cell_name"], r.get("config") or {}) for r in records]
    return [f"{len(records)} cells {took}: {_statuses(records)}", *notes.lines(every)]
