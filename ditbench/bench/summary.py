"""What a run prints: one line per cell as it finishes, and summary.md (the table of every cell)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ditbench.bench.window import GAP_BOUND, SPREAD_BOUND
from ditbench.fileio import write_atomic

REASON_CHARS = 160  # of a reason in the summary table's note column


def _mem(metrics: dict[str, Any]) -> str:
    """The measured peak (allocator on a GPU, CPU allocator, else RSS) and the planner's prediction."""
    text = "-"
    for key, what in (
        ("peak_mem_allocated_gib", "alloc"),
        ("cpu_peak_alloc_gib", "CPU alloc"),
        ("cpu_peak_rss_gib", "RSS"),
    ):
        if metrics.get(key) is not None:
            text = f"{metrics[key]:.2f} GiB {what}"
            break
    if metrics.get("predicted_peak_gib") is not None:
        text += f" (predicted {metrics['predicted_peak_gib']:.2f})"
    return text


def noise_note(metrics: dict[str, Any]) -> str | None:
    """'noisy (p90/p10 3.10 > 1.5)' for a cell whose step times or throughput disagree, else None."""
    if not metrics.get("noisy"):
        return None
    n = metrics.get("noise") or {}
    said = []
    if (n.get("step_spread") or 0) > n.get("spread_bound", 0):
        said.append(f"p90/p10 {n['step_spread']:.2f} > {n['spread_bound']:g}")
    if (n.get("throughput_gap") or 0) > n.get("gap_bound", 0):
        said.append(f"window vs median-step throughput differ {100 * n['throughput_gap']:.0f}%")
    return "noisy (" + ", ".join(said) + ")"


def _smoke_text(smoke: dict[str, Any] | None) -> str | None:
    if not smoke:
        return None
    if smoke.get("status") not in (None, "ok"):
        return f"smoke {smoke['status']}: {smoke.get('reason') or ''}".strip()
    if smoke.get("first_mean") is None:
        return None
    return f"smoke loss {smoke['first_mean']:.4f} -> {smoke['last_mean']:.4f}"


def format_line(record: dict[str, Any]) -> str:
    name, status = record["cell_name"], record["status"]
    m = record.get("metrics") or {}
    if status != "ok":
        return f"{name}: {status.upper()}  {record.get('reason') or ''}"
    parts = [f"{m['images_per_s']:.1f} img/s", f"step {m['step_ms']['median']:.1f} ms", _mem(m)]
    if m.get("mfu"):
        parts.append(f"MFU {100 * m['mfu']['value']:.1f}%")
    if (m.get("world_size") or 1) > 1:
        eff = m.get("scaling_efficiency")
        parts.append(f"{m['world_size']} ranks" + (f", scaling {100 * eff:.0f}%" if eff else ""))
    if m.get("emulation"):
        parts.append(f"emulated {m['emulation']['card'] or str(m['emulation']['budget_gib']) + ' GiB'}")
    parts += [x for x in (_smoke_text(record.get("smoke")), noise_note(m)) if x]
    parts.append(f"{record['duration_s']:.1f} s")
    return f"{name}: ok  " + ", ".join(parts)


def summary_table(records: list[dict[str, Any]]) -> str:
    header = (
        "| cell | status | img/s | step ms p50 (p10-p90) | peak mem | MFU | smoke loss first -> last | "
        "note |\n|---|---|---:|---:|---:|---:|---|---|\n"
    )
    rows = []
    for r in records:
        m = r.get("metrics") or {}
        ok = r["status"] == "ok"
        step = m.get("step_ms") if ok else None
        smoke = r.get("smoke")
        note = "; ".join(x for x in (noise_note(m) if ok else None, r.get("reason")) if x)
        if smoke and smoke.get("status") not in (None, "ok"):
            note = "; ".join(x for x in (note, _smoke_text(smoke)) if x)
        cells = [
            r["cell_name"],
            r["status"] + (" (noisy)" if ok and m.get("noisy") else ""),
            f"{m['images_per_s']:.1f}" if ok else "-",
            f"{step['median']:.1f} ({step['p10']:.1f}-{step['p90']:.1f})" if step else "-",
            _mem(m) if ok else "-",
            f"{100 * m['mfu']['value']:.1f}%" if ok and m.get("mfu") else "-",
            f"{smoke['first_mean']:.4f} -> {smoke['last_mean']:.4f}"
            if smoke and smoke.get("first_mean")
            else "-",
            " ".join(note.replace("|", "/").split())[:REASON_CHARS],
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return header + "\n".join(rows) + "\n"


def _emulation_text(records: list[dict[str, Any]]) -> str:
    emulated = next(
        (
            (r.get("metrics") or {}).get("emulation")
            for r in records
            if (r.get("metrics") or {}).get("emulation")
        ),
        None,
    )
    if not emulated:
        return ""
    card = emulated["card"] or f"a {emulated['budget_gib']:g} GiB card"
    return (
        f"Emulated card: {card} ({emulated['budget_gib']:g} GiB) on a {emulated['real_gpu']} of "
        f"{emulated['real_total_gib']:.1f} GiB: the allocator was capped at the card's memory less the "
        f"CUDA context, and `fits` means a cell completed under that cap; {emulated['note']}.\n\n"
    )


def write_summary(path: Path, suite, records: list[dict[str, Any]]) -> None:
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    env = next((r["env"] for r in records if r.get("env")), {}) or {}
    device = env.get("gpu_name") or env.get("cpu") or "?"
    noisy = sum(1 for r in records if r["status"] == "ok" and (r.get("metrics") or {}).get("noisy"))
    text = (
        f"# {suite.name}\n\n{suite.description.strip()}\n\n"
        f"{len(records)} cells: "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f". Device: {device}; torch {env.get('torch')}; "
        f"ditbench {env.get('ditbench')} ({env.get('git_sha')}).\n\n"
        "Peak memory is the CUDA allocator's peak allocated on a GPU, the process's peak RSS on a CPU. "
        "MFU is given only where the device's peak is in the table (never on a CPU).\n\n"
        + _emulation_text(records)
        + (
            f"{noisy} cell(s) are marked noisy: their step times spread beyond p90/p10 > "
            f"{SPREAD_BOUND:g}, or their window's images/s and batch / median step time differ by more "
            f"than {100 * GAP_BOUND:.0f}%; read their figures as weak.\n\n"
            if noisy
            else ""
        )
        + summary_table(records)
    )
    write_atomic(path, text)
