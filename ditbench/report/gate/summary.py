"""The gate's markdown summary, fit for a pull-request comment or $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

from collections.abc import Sequence

from ditbench.core.escape import md_code
from ditbench.core.escape import md_text as _md  # no HTML, no link, no new row or block
from ditbench.core.intervals import BOOTSTRAP_B, LEVEL
from ditbench.core.units import memory_text
from ditbench.records.metrics import MEMORY, limit, limits, table
from ditbench.report.gate.result import INCONCLUSIVE_EXIT, VERDICTS, CellResult, Comparison, MetricDelta

MAX_SUMMARY_ROWS = 150  # rows of the "All cells" table: a PR comment holds 65,536 characters
MAX_LISTED_CELLS = 10
HEADER = [
    "| cell | metric | base | new | change | threshold | significance |",
    "|---|---|---|---|---|---|---|",
]
STATUS_SECTIONS = (
    ("new failure", "New failures (ok before)"),
    ("fixed", "Fixed (failed before, ok now)"),
    ("no longer measured", "No longer measured (ok before, not run now)"),
    ("stopped (allowed)", "Stopped, allowed by the policy (allow_stopped)"),
    ("still failing", "Still failing"),
)
# (title, verdict, direction: None for either) of the metric tables after the status ones
METRIC_SECTIONS = (
    ("Inconclusive (the interval of the change straddles the threshold)", "inconclusive", None),
    ("Worse beyond the threshold, but not significant (not counted)", "noise", "worse"),
    ("Improvements", "improvement", None),
    ("Better beyond the threshold, but not significant", "noise", "better"),
)


def _value(metric: str, x: float) -> str:
    """A metric's value as the table shows it: memory in GiB, or MiB below 1 GiB; others by _fmt."""
    known = table().get(metric)
    if known is not None and known.kind == MEMORY:
        return memory_text(x)
    return _fmt(x)


def _fmt(x: float) -> str:
    if abs(x) >= 1e15:
        return f"{x:.3g}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _change(d: MetricDelta) -> str:
    return f"{d.change_pct:+.1f}%" if d.change_pct is not None else "from 0"


def _label(d: MetricDelta) -> str:
    return d.label if d.step is None else f"{d.label} @ step {d.step}"


def _names(cells: list[CellResult]) -> str:
    shown = ", ".join(md_code(x.cell_name) for x in cells[:MAX_LISTED_CELLS])
    return shown + ("…" if len(cells) > MAX_LISTED_CELLS else "")


def _metric_rows(c: Comparison, verdict: str, direction: str | None = None) -> list[str]:
    rows = []
    for cell in c.cells:
        for d in cell.metrics:
            if d.verdict == verdict and direction in (None, d.direction):
                weak = " · ⚠️ weak" if d.weak else ""
                weak += f" · MDE {d.mde_pct:.1f}%" if d.mde_pct is not None else ""
                base, new = _value(d.metric, d.base), _value(d.metric, d.new)
                rows.append(
                    f"| {_md(cell.cell_name)} | {_md(_label(d))} | {base} | {new} | "
                    f"{_change(d)} | {limit(d.metric, d.threshold_pct)} | {_md(d.significance)}{weak} |"
                )
    return rows


def _reasons_once(reasons: list[str]) -> tuple[list[str], list[str]]:
    """Each row's reference ([1], [2], ...) and the lines stating each distinct reason once, with how
    many rows share it: 36 unsupported cells share one long reason, which a table would repeat 36 times."""
    numbers: dict[str, int] = {}
    refs = [f"[{numbers.setdefault(r, len(numbers) + 1)}]" if r else "" for r in reasons]
    notes = [
        f"[{n}] {_md(r)} ({reasons.count(r)} cell{'s' if reasons.count(r) != 1 else ''})"
        for r, n in numbers.items()
    ]
    return refs, (["", "<br>".join(notes)] if notes else [])


def _status_text(x: CellResult) -> str:
    """A cell's status in the table: one word when unchanged, new/missing for cells on one side only."""
    base, new = _md(x.base_status), _md(x.new_status)  # a record's text
    if x.base_status is None:
        return f"new ({new})"
    if x.new_status is None:
        return f"missing (was {base})"
    return new if x.base_status == x.new_status else f"{base} → {new}"


def _head(c: Comparison) -> list[str]:
    n_reg = len(c.regressions)
    if c.failed:
        head = f"## ❌ {c.tool}: {n_reg} regression{'s' if n_reg != 1 else ''}"
        if not n_reg:
            head = f"## ❌ {c.tool}: cells or quality steps missing from the new run"
    elif c.inconclusive:
        n_inc = len(c.inconclusive)
        mark = {0: "✅", 1: "❌"}.get(c.exit_code, "❔")
        mapped = {0: " (counted as pass by the policy)", 1: " (counted as failing by the policy)"}
        head = f"## {mark} {c.tool}: {n_inc} inconclusive{mapped.get(c.exit_code, '')}"
    else:
        head = f"## ✅ {c.tool}: no regression"
    matched = sum(x.verdict not in ("only in base", "only in new") for x in c.cells)
    counts = ", ".join(f"{c.count(v)} {v}" for v in VERDICTS if c.count(v))
    lines = [
        head,
        "",
        f"Base {md_code(c.base_path)} vs new {md_code(c.new_path)}: {matched} cells matched ({counts}); "
        f"{c.compared} values compared.",
        "Environment: " + (", ".join(f"{_md(k)} {_md(v)}" for k, v in c.env.items()) or "unknown") + ".",
    ]
    if c.largest_mde is not None:
        lines.append(
            f"This comparison could see timing changes of {c.largest_mde:.1f}% or more (the largest "
            "minimum detectable effect of its timed verdicts, at 80% power); a pass needs it within the "
            "threshold."
        )
    if c.env_differences:
        why = (
            "both sides ran here, in one `ditbench ab`: what differs is the code under test"
            if c.ab is not None
            else "the policy says `environment: may_differ`"
            if c.policy.environment == "may_differ"
            else "with --allow-env-mismatch"
        )
        lines += ["", f"> ⚠️ **Environments differ** (compared anyway, {why}): " + _pairs(c.env_differences)]
    if c.env_notes:
        lines += [
            "",
            "> ℹ️ Named, not gated: " + _pairs(c.env_notes) + " (CPU cells run the same kernels in "
            "torch's CPU and CUDA builds of one release).",
        ]
    if c.inception_official is False:
        lines += [
            "",
            "> ⚠️ **Not the official Inception weights**: the FID / IS compared here are not comparable "
            "with papers (both runs used the same weights, so they are comparable with each other).",
        ]
    return lines


def _pairs(diffs: dict[str, tuple[list[str], list[str]]]) -> str:
    return (
        "; ".join(f"{_md(k)}: {_md(', '.join(b))} → {_md(', '.join(n))}" for k, (b, n) in diffs.items()) + "."
    )


def _table(title: str, rows: list[str], header: list[str] = HEADER, notes: Sequence[str] = ()) -> list[str]:
    """A titled table with its notes below, or nothing when it has no row."""
    return ["", f"### {title}", ""] + header + rows + list(notes) if rows else []


def _sections(c: Comparison) -> list[str]:
    lines = _table("Regressions", _metric_rows(c, "regression"))
    for verdict, title in STATUS_SECTIONS:
        cells = [x for x in c.cells if x.verdict == verdict]
        refs, notes = _reasons_once([x.reason or "" for x in cells])
        rows = [
            f"| {_md(x.cell_name)} | {_status_text(x)} | {ref} |" for x, ref in zip(cells, refs, strict=True)
        ]
        lines += _table(title, rows, ["| cell | status | reason |", "|---|---|---|"], notes)
    for title, verdict, direction in METRIC_SECTIONS:
        lines += _table(title, _metric_rows(c, verdict, direction))
    pairs = [(x, m) for x in c.cells for m in x.not_compared][:MAX_SUMMARY_ROWS]
    refs, notes = _reasons_once([str(m["reason"]) for _, m in pairs])
    skipped = [
        f"| {_md(x.cell_name)} | {_md(m['metric'])} | {ref} |"
        for (x, m), ref in zip(pairs, refs, strict=True)
    ]
    title = "Not compared (allowed by the policy's allow_incomparable)"
    return lines + _table(title, skipped, ["| cell | metric | why |", "|---|---|---|"], notes)


def _notes(c: Comparison) -> list[str]:
    lines: list[str] = []
    untested = [x for x in c.cells if x.untested]
    if untested:
        lines += [
            "",
            f"**Significance not tested** for {len(untested)} cell(s) with a change beyond the threshold: "
            f"fewer than {c.policy.min_samples} samples (steps, or repeats) on a side (or too few to reach "
            f"p<{c.policy.alpha:g}), so the threshold alone decided: {_names(untested)}.",
        ]
    weak = [x for x in c.cells if x.weak]
    if weak:
        reasons = sorted({d.weak_reason for x in weak for d in x.metrics if d.weak and d.weak_reason})
        lines += [
            "",
            f"**Weak verdicts** in {len(weak)} cell(s): {_names(weak)}. They still count (a noisy cell's "
            "timing regression passed its significance test; a quality change without a known noise "
            "crossed its threshold), but re-measure before acting on them. Why: "
            + _md("; ".join(reasons[:5]))
            + ".",
        ]
    fail = " (fails the gate: fail_on_missing)" if c.policy.fail_on_missing else ""
    rows = [
        f"| {_md(x.cell_name)} | {', '.join(map(str, x.missing_steps[:20]))} |"
        for x in c.cells
        if x.missing_steps
    ]
    title = f"Quality steps the base evaluated and the new run lacks{fail}"
    lines += _table(title, rows, ["| cell | steps |", "|---|---|"])
    for verdict, title in (
        ("only in base", "Missing from the new run"),
        ("only in new", "New cells (no baseline)"),
    ):
        rows = [
            f"| {_md(x.cell_name)} | {md_code(x.cell_id)} | {_md(x.base_status or x.new_status)} |"
            for x in c.cells
            if x.verdict == verdict
        ]
        title += fail if verdict == "only in base" else ""
        lines += _table(title, rows, ["| cell | cell_id | status |", "|---|---|---|"])
    return lines


def _all_cells(c: Comparison) -> list[str]:
    metrics = table()
    shown = [m for m in metrics if m in c.policy.rules][:4]
    rows = []
    # Changed cells first; the table is capped so the summary fits a pull-request comment.
    ordered = sorted(c.cells, key=lambda x: x.verdict == "pass")
    for x in ordered[:MAX_SUMMARY_ROWS]:
        by = {d.metric: d for d in x.metrics}
        vals = [f"{_value(m, by[m].new)} ({_change(by[m])})" if m in by else "—" for m in shown]
        status = _status_text(x)
        verdict = x.verdict + (" (weak)" if x.weak else "")
        rows.append(f"| {_md(x.cell_name)} | {status} | " + " | ".join(vals) + f" | {verdict} |")
    more = len(ordered) - MAX_SUMMARY_ROWS
    return (
        [
            "",
            "<details><summary>All cells</summary>",
            "",
            "| cell | status | " + " | ".join(metrics[m].label for m in shown) + " | verdict |",
            "|---|---|" + "---|" * len(shown) + "---|",
        ]
        + rows
        + ([f"| … {more} more cells (all pass); see `--json` | | |"] if more > 0 else [])
        + ["", "</details>"]
    )


def _policy_line(c: Comparison) -> list[str]:
    p = c.policy
    rules = limits({k: r.threshold_pct for k, r in p.rules.items()})
    allowed = "every metric" if "*" in p.allow_incomparable else ", ".join(sorted(p.allow_incomparable))
    unused = ""
    if c.unused_overrides:
        shown = "; ".join(
            f"overrides[{i}] (match {_md(p.overrides[i].match)})" for i in c.unused_overrides[:5]
        )
        unused = f" ⚠️ No compared cell matched {shown}: check its knobs and values."
    if c.ab is not None:
        timing = (
            "a timing change is judged on the per-round ratio B/A of the two sides' per-process median "
            "step times: the Hodges-Lehmann estimate with its exact Wilcoxon signed-rank interval, looked "
            "at after every round at a level from an O'Brien-Fleming-type alpha-spending function (the "
            f"looks' levels add up to alpha {p.alpha:g}). A regression needs the interval wholly beyond "
            "the threshold; a pass needs it within the threshold and a minimum detectable effect (80% "
            "power) within the threshold too; otherwise the cell runs another round, and is inconclusive "
            f"when the rounds or the time run out (policy `inconclusive: {p.inconclusive}`: exits "
            f"{INCONCLUSIVE_EXIT[p.inconclusive]}). "
        )
    else:
        timing = (
            f"a timing change is a regression only if its {LEVEL:.0%} bootstrap interval (of the ratio of "
            f"median step times, {BOOTSTRAP_B} resamples) lies wholly beyond the threshold and the samples "
            f"differ by a Mann-Whitney U test at p<{p.alpha:g} (with ≥{p.min_samples} samples a side); an "
            "interval that straddles the threshold is inconclusive (policy "
            f"`inconclusive: {p.inconclusive}`: exits {INCONCLUSIVE_EXIT[p.inconclusive]}), and so is a "
            "pass whose minimum detectable effect (80% power) exceeds the threshold. Where both runs have "
            "repeats (`run --repeats K`) the samples are the repeats' per-process median step times, which "
            "sample process-level noise (start-up, clocks, machine load); else they are one run's per-step "
            "times, which sample only step-to-step noise, so the interval is narrow. "
        )
    stopped = ", ".join(sorted(p.allow_stopped)) if "*" not in p.allow_stopped else "every cell"
    return [
        "",
        f"Policy ({_md(p.source)}): {rules or 'no metric'}; {timing}"
        f"Memory and loss are gated on the threshold alone; a quality change must also exceed "
        f"{p.quality_noise_k:g}σ of the combined spread (each side's seeds' or its bootstrap's, "
        "whichever is larger)."
        + (f" Allowed to go uncompared: {allowed}." if allowed else "")
        + (f" Allowed to stop running: {_md(stopped)}." if p.allow_stopped else "")
        + unused,
    ]


def _ab_lines(c: Comparison) -> list[str]:
    """How `ditbench ab` ran the sides: the order, the seed, the rounds, and each side's software."""
    if c.ab is None:
        return []
    a = c.ab
    how = {
        "duet": "duet (each cell's A and B at the same time, each on its half of the CPUs, the halves "
        "drawn again for every pair)",
        "interleaved": "interleaved (each round: the cells in a random order, each cell's A and B back "
        "to back in a random order)",
    }[a["mode"]]
    lines = [
        "",
        f"How it ran: {how}; seed {a['seed']} (`--seed {a['seed']}` repeats the order); {a['rounds']} of "
        f"at most {a['max_rounds']} rounds ({_md(a['stopped'])}); {a['wall_s'] / 60:.1f} min.",
        "",
        "| side | python | environment | ditbench | torch |",
        "|---|---|---|---|---|",
    ]
    for name, side in a["sides"].items():
        env = " ".join(f"{k}={v}" for k, v in side.get("env", {}).items()) or "—"
        lines.append(
            f"| {name} | {_md(side.get('python'))} | {_md(env)} | {_md(side.get('ditbench', '?'))} | "
            f"{_md(side.get('torch', '?'))} |"
        )
    return lines


def summary_markdown(c: Comparison) -> str:
    lines = _head(c) + _ab_lines(c) + _sections(c) + _notes(c) + _all_cells(c) + _policy_line(c)
    return "\n".join(lines) + "\n"
