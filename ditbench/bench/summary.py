"""What a run prints: one line per cell as it finishes, and summary.md (the table of every cell)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ditbench.bench.load import LOAD_BOUND
from ditbench.bench.window import GAP_BOUND, SPREAD_BOUND, noise_advice
from ditbench.escape import md_code, md_text
from ditbench.fileio import write_atomic
from ditbench.interval_text import with_ends
from ditbench.records.metrics import CPU_ALLOC, CPU_RSS, IMAGES_PER_S, PEAK_ALLOCATED
from ditbench.units import memory_text

REASON_CHARS = 160  # of a reason in the summary table's note column


# The records come from results.jsonl, which a user may have edited: a reader validates the fields
# every tool relies on, the rest may be anything. Every optional figure goes through these two.
def _at(value: Any, *keys: str) -> Any:
    """value[k1][k2]..., or None where a level is missing or not a mapping."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
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


def noise_note(metrics: dict[str, Any]) -> str | None:
    """'noisy (p90/p10 3.10 > 1.5)' for a cell whose step times or throughput disagree, else None."""
    if metrics.get("noisy") is not True:
        return None
    n = metrics.get("noise") or {}
    advice = noise_advice(n)
    said = [advice] if advice is not None else []  # first: the table's note column is cut short
    spread, bound = _num(n.get("step_spread"), ".2f"), _num(n.get("spread_bound"), "g")
    if spread is not None and bound is not None and n["step_spread"] > n["spread_bound"]:
        said.append(f"p90/p10 {spread} > {bound}")
    gap = _num(n.get("throughput_gap"), ".0f", 100)
    if gap is not None and _num(n.get("gap_bound"), "g") is not None and n["throughput_gap"] > n["gap_bound"]:
        said.append(f"window vs median-step throughput differ {gap}%")
    return "noisy (" + ", ".join(said) + ")"


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


def format_line(record: dict[str, Any]) -> str:
    name, status = record["cell_name"], record["status"]
    m = record.get("metrics") or {}
    if status != "ok":
        return f"{name}: {status.upper()}  {record.get('reason') or ''}"
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
    parts += [x for x in (_smoke_text(record.get("smoke")), noise_note(m)) if x]
    if (duration := _num(record.get("duration_s"), ".1f")) is not None:
        parts.append(f"{duration} s")
    return f"{name}: ok  " + ", ".join(parts)


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


def summary_table(records: list[dict[str, Any]]) -> str:
    header = (
        "| cell | status | img/s | step ms p50 (p10-p90) | peak mem | MFU | smoke loss first -> last | "
        "note |\n|---|---|---:|---:|---:|---:|---|---|\n"
    )
    rows = []
    for r in records:
        m = r.get("metrics") or {}
        ok = r["status"] == "ok"
        smoke = r.get("smoke")
        note = "; ".join(x for x in (noise_note(m) if ok else None, r.get("reason")) if x)
        if smoke and smoke.get("status") not in (None, "ok"):
            note = "; ".join(x for x in (note, _smoke_text(smoke)) if x)
        first, last = _num(_at(smoke, "first_mean"), ".4f"), _num(_at(smoke, "last_mean"), ".4f")
        cells = [
            md_text(r["cell_name"]),  # user text: no HTML, link or `|` in a markdown table
            r["status"] + (" (noisy)" if ok and m.get("noisy") is True else ""),
            rate_text(m) if ok else "-",
            _step_text(m.get("step_ms")) if ok else "-",
            _mem(m) if ok else "-",
            (_mfu(m) or "-") if ok else "-",
            f"{first} -> {last}" if first is not None and last is not None else "-",
            md_text(note.replace("|", "/")[:REASON_CHARS]),
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
    import json

    shown = ", ".join(md_code(f"{k}={json.dumps(v)}") for k, v in overrides.items())
    return f"Overrides given on the command line: {shown}.\n\n"


def write_summary(path: Path, suite, records: list[dict[str, Any]]) -> None:
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    env = next((r["env"] for r in records if r.get("env")), {})
    device = env.get("gpu_name") or env.get("cpu") or "?"
    noisy = sum(1 for r in records if r["status"] == "ok" and _at(r, "metrics", "noisy") is True)
    text = (
        f"# {md_text(suite.name)}\n\n{md_text(suite.description)}\n\n"
        + _overrides_text(getattr(suite, "overrides", None))
        + f"{len(records)} cells: "
        + ", ".join(f"{n} {md_text(s)}" for s, n in sorted(counts.items()))
        + f". Device: {md_text(device)}; torch {md_text(env.get('torch'))}; "
        f"ditbench {md_text(env.get('ditbench'))} ({md_text(env.get('git_sha'))}).\n\n"
        "Peak memory is the CUDA allocator's peak allocated on a GPU (`peak allocated`); on a CPU the "
        "CPU allocator's peak over a fresh trainer's second step (`CPU allocator peak`, "
        f"{CPU_ALLOC.path}), or in older records the process's peak resident memory (`CPU peak "
        f"RSS`, {CPU_RSS.path}), which stays flat across settings. Below 1 GiB it reads in MiB. "
        "MFU is given only where the device's peak is in the table (never on a CPU).\n\n"
        + _repeats_text(records)
        + _emulation_text(records)
        + (
            f"{noisy} cell(s) are marked noisy: their step times spread beyond p90/p10 > "
            f"{SPREAD_BOUND:g}, or their window's images/s and batch / median step time differ by more "
            f"than {100 * GAP_BOUND:.0f}%, or other processes took more than {100 * LOAD_BOUND:.0f}% of "
            "the CPUs during the window (rerun on a quiet machine; cells with more than one thread also gain "
            "from threads=1); read "
            "their figures as weak.\n\n"
            if noisy
            else ""
        )
        + summary_table(records)
    )
    write_atomic(path, text)
