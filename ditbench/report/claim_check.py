"""Claims checked against a run: what a claim reads from each cell, and a verdict naming the cells used
(docs/reports.md says which verdict when). An absolute speed speaks only for the card that computed it:
when a claim names its `card`, one measured elsewhere is shown, not judged. With several records of one
cell (`--keep all`), the latest is used."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ditbench.core.errors import UserError
from ditbench.core.intervals import LEVEL, median_interval
from ditbench.hardware.cards import find_card
from ditbench.records.metrics import IMAGES_PER_S, RECORD_METRICS, STEP_MS, finite
from ditbench.report.analysis import gpu_hours_per_million_images, time_to_steps_s
from ditbench.report.cells import cell_label, knob_key, knobs
from ditbench.report.claims import (
    Claim,
    ClaimsFile,
    claimed_text,
    fmt,
    gb_scale,
    matches,
    metric_kind,
    selector_text,
    spread,
    why_no_match,
)
from ditbench.report.load import value
from ditbench.report.memory import (
    MEM_ALLOCATED,
    card_lower_bounds,
    cell_budget,
    fit_memory,
    fits,
    needs_more_than,
    not_meaningful,
)

HELD, NOT_HELD, NOT_MEASURED = "held", "not held", "not measured"
INCONCLUSIVE, NOT_JUDGED = "inconclusive", "not judged"
VERDICTS = (HELD, NOT_HELD, NOT_MEASURED, INCONCLUSIVE, NOT_JUDGED)  # in the order a summary counts them
SHOWN = 6  # cells named in one evidence text; the JSON lists them all

RECORD_PATHS = {m.name: m.path for m in RECORD_METRICS}


@dataclass
class ClaimResult:
    claim: Claim
    verdict: str
    claimed: str
    measured: str
    evidence: str
    cells: list[str] = field(default_factory=list)
    numbers: list[dict[str, Any]] = field(default_factory=list)
    predicted: dict[str, Any] | None = None  # `report --predict`: the planner's verdict (report.predict)
    # The run's cells the claim is about, as (label, knobs), for `--predict`: a compare claim's
    # pairs (from, to), a fits claim's matching cells
    pairs: list[tuple[tuple[str, dict[str, Any]], tuple[str, dict[str, Any]]]] = field(default_factory=list)
    matched: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        c = self.claim
        finite = [x if math.isfinite(x) else None for x in (c.low, c.high)]
        return {
            "says": c.says,
            "kind": c.kind,
            "metric": c.metric,
            "expect": c.expect,
            "stated": c.stated,
            "tolerance_pct": c.tolerance_pct,
            "accepted": finite,
            "cell": c.cell,
            "compare": {"from": c.change_from, "to": c.change_to} if c.change_from is not None else None,
            "fits": {"card": c.fits_card, "gib": c.fits_gib} if c.expect == "fits" else None,
            "card": c.card,
            "note": c.note,
            "verdict": self.verdict,
            "claimed": self.claimed,
            "measured": self.measured,
            "cells": self.cells,
            "evidence": self.evidence,
            "numbers": self.numbers,
            "predicted": self.predicted,
        }


@dataclass
class _Run:
    """The run as the checks read it: every row with its knobs, once (iterrows is slow)."""

    df: pd.DataFrame
    rows: list[tuple[pd.Series, dict[str, Any]]]
    index: dict[str, list[pd.Series]]  # knob key -> its rows, any status
    bounds: dict[Any, float]

    def matching(self, selector: dict[str, Any]) -> list[pd.Series]:
        return [row for row, k in self.rows if matches(k, selector)]


def check_claims(df: pd.DataFrame, claims: ClaimsFile, target_steps: int) -> list[ClaimResult]:
    df = latest_per_cell(df)
    rows = [(row, knobs(row["record"])) for _, row in df.iterrows()]
    index: dict[str, list[pd.Series]] = {}
    for row, k in rows:
        index.setdefault(knob_key(k), []).append(row)
    run = _Run(df, rows, index, card_lower_bounds(df))
    checks = {"compare": _check_compare, "fits": _check_fits, "cell": _check_cell}
    return [checks[claim.kind](run, claim, target_steps) for claim in claims.claims]


def _check_cell(run: _Run, claim: Claim, target_steps: int) -> ClaimResult:
    metric = claim.metric
    assert metric is not None
    claimed = claimed_text(claim)
    rows = run.matching(claim.cell)
    if not rows:
        return ClaimResult(claim, NOT_MEASURED, claimed, "—", why_no_match(run.df, claim.cell))
    judged: list[tuple[pd.Series, float, bool]] = []
    beyond: list[tuple[pd.Series, float]] = []  # out of memory above the claimed upper bound
    unjudged: list[tuple[pd.Series, str]] = []
    memory, speed = (metric_kind(metric) == k for k in ("memory", "speed"))
    for row in rows:
        if row["status"] == "ok":
            v, why = metric_value(row, metric, target_steps)
            elsewhere = speed_elsewhere(row, claim.card) if speed else ""
            if v is None:
                unjudged.append((row, why))
            elif elsewhere:
                unjudged.append((row, f"measured {fmt(v, metric)}, but it {elsewhere}"))
            else:
                judged.append((row, v, claim.low <= v <= claim.high))
        elif row["status"] == "oom" and memory:
            need = needs_more_than(row, run.bounds)
            need = None if need is None else need * gb_scale(metric)
            if need is not None and need > claim.high:
                beyond.append((row, need))
            else:
                text = "on a card of unknown size" if need is None else f"needs more than {fmt(need, metric)}"
                unjudged.append((row, f"out of memory, {text}"))
        else:
            unjudged.append((row, status_text(row)))
    numbers = [{**_ids(r), "value": v, "within": ok} for r, v, ok in judged]
    numbers += [{**_ids(r), "needs_more_than": n, "within": False} for r, n in beyond]
    parts = [
        f"{cell_label(r)}: {fmt(v, metric)}{basis(r, metric)} ({'inside' if ok else 'outside'} the claim)"
        for r, v, ok in judged[:SHOWN]
    ]
    parts += [
        f"{cell_label(r)}: ran out of memory, so it needs more than {fmt(n, metric)}"
        for r, n in beyond[:SHOWN]
    ]
    if judged or beyond:
        verdict = HELD if judged and all(ok for _, _, ok in judged) and not beyond else NOT_HELD
        measured = spread([v for _, v, _ in judged], metric) if judged else f"> {fmt(beyond[0][1], metric)}"
    else:
        verdict, measured = NOT_MEASURED, "—"
    evidence = "; ".join(parts)
    if speed and judged:
        evidence += where_measured([r for r, _, _ in judged])
    if unjudged:
        shown = "; ".join(f"{cell_label(r)}: {why}" for r, why in unjudged[:SHOWN])
        evidence += ("; not judged: " if evidence else "") + shown
    cells = [cell_label(r) for r, _, _ in judged] + [cell_label(r) for r, _ in beyond]
    return ClaimResult(claim, verdict, claimed, measured, evidence, cells, numbers)


def _ids(row: pd.Series) -> dict[str, Any]:
    return {"cell": cell_label(row), "cell_id": row["cell_id"]}


def _check_fits(run: _Run, claim: Claim, target_steps: int) -> ClaimResult:
    gib, bounds = claim.fits_gib, run.bounds
    assert gib is not None
    claimed = claimed_text(claim)
    rows = run.matching(claim.cell)
    matched = [_labelled(r) for r in rows]
    skipped = [r for r in rows if r["status"] == "skipped"]
    rows = [r for r in rows if r["status"] != "skipped"]
    if not rows:
        why = (
            f"all {len(skipped)} matching cells were skipped" if skipped else why_no_match(run.df, claim.cell)
        )
        return ClaimResult(claim, NOT_MEASURED, claimed, "—", why, matched=matched)
    yes, no, unknown, numbers = [], [], [], []
    for row in rows:
        verdict = fits(row, gib, bounds)
        mem, label = fit_memory(row) if row["status"] == "ok" else (None, None)
        numbers.append(
            {**_ids(row), "status": row["status"], "fits": verdict, "memory_gib": mem, "memory_basis": label}
        )
        (yes if verdict else no if verdict is False else unknown).append(row)

    def why(row: pd.Series) -> str:
        mem, label = fit_memory(row)
        if row["status"] == "ok" and mem is not None:
            return f"{mem:.2f} GiB {label}"
        if row["status"] == "oom":
            need = needs_more_than(row, bounds)
            return f"out of memory, needs more than {need:g} GiB" if need is not None else "out of memory"
        if row["status"] == "ok":
            return "no GPU memory figure" + (" (CPU)" if row.get("config.device") == "cpu" else "")
        return status_text(row)

    tail = f"; {len(skipped)} skipped cell(s) not counted" if skipped else ""
    listed = "; ".join(f"{cell_label(r)}: {why(r)}" for r in (no + unknown)[:SHOWN])
    if yes:
        best = max(yes, key=lambda r: (value(r, "config.batch_size") or 0, value(r, IMAGES_PER_S.path) or 0))
        mem, _ = fit_memory(best)
        verdict, cells = HELD, yes
        measured = f"{mem:.2f} GiB" if mem is not None else "ran inside a smaller cap"
        evidence = f"{cell_label(best)} fits {gib:g} GiB with {why(best)}; "
        evidence += f"{len(yes)} of {len(rows)} matching cell(s) fit"
    elif no and not unknown:
        verdict, cells, measured, evidence = NOT_HELD, no, "does not fit", f"none fits {gib:g} GiB: {listed}"
    else:
        verdict, cells, measured = NOT_MEASURED, [], "—"
        some = (
            f"{len(no)} matching cell(s) do not fit and {len(unknown)}"
            if no
            else f"{len(unknown)} matching cell(s)"
        )
        evidence = f"{some} cannot say: {listed}"
    labels = [cell_label(r) for r in cells]
    return ClaimResult(claim, verdict, claimed, measured, evidence + tail, labels, numbers, matched=matched)


def _check_compare(run: _Run, claim: Claim, target_steps: int) -> ClaimResult:
    metric = claim.metric
    assert metric is not None and claim.change_from is not None and claim.change_to is not None
    claimed = claimed_text(claim)
    memory, speed = (metric_kind(metric) == k for k in ("memory", "speed"))
    start = {**claim.cell, **claim.change_from}
    sources = run.matching(start)
    if not sources:
        return ClaimResult(claim, NOT_MEASURED, claimed, "—", why_no_match(run.df, start))
    ratios: list[tuple[pd.Series, pd.Series, float]] = []
    bounded: list[str] = []  # an out-of-memory side proves the ratio outside the claim
    unjudged: list[str] = []
    cannot_show = 0
    pairs: list[tuple[tuple[str, dict[str, Any]], tuple[str, dict[str, Any]]]] = []
    for row in sources:
        twins = run.index.get(knob_key({**knobs(row["record"]), **claim.change_to}), [])
        if not twins:
            continue
        twin = twins[-1]
        pairs.append((_labelled(row), _labelled(twin)))
        pair = f"{cell_label(row)} → {cell_label(twin)}"
        both_ok = row["status"] == twin["status"] == "ok"
        cpu = next(
            (speed_elsewhere(x, claim.card) for x in (row, twin) if x.get("config.device") == "cpu"), ""
        )
        if speed and cpu and both_ok:
            unjudged.append(f"{pair}: {cpu}")
            cannot_show += 1
        elif both_ok:
            a, why_a = metric_value(row, metric, target_steps)
            b, why_b = metric_value(twin, metric, target_steps)
            small = memory and a and b is not None and not_meaningful(row)
            if small:  # a memory change cannot show where activations are a sliver of the peak
                unjudged.append(f"{pair}: {small}")
                cannot_show += 1
            elif a and b is not None:
                ratios.append((row, twin, b / a))
            else:
                unjudged.append(f"{pair}: {why_a or why_b or 'zero on the from side'}")
        elif memory and (text := _oom_bound(row, twin, claim, metric, target_steps, run.bounds)):
            bounded.append(f"{pair}: {text}")
        else:
            bad = row if row["status"] != "ok" else twin
            unjudged.append(f"{pair}: {cell_label(bad)} {status_text(bad)}")
    numbers = [
        {
            "from": cell_label(a),
            "to": cell_label(b),
            "from_id": a["cell_id"],
            "to_id": b["cell_id"],
            "ratio": r,
        }
        for a, b, r in ratios
    ]
    cells = list(dict.fromkeys(c for a, b, _ in ratios for c in (cell_label(a), cell_label(b))))
    if not ratios and not bounded:
        if not pairs:
            why = (
                f"no cell matching {selector_text(start)} has a twin with {selector_text(claim.change_to)} "
                "(all other knobs equal) in this run"
            )
        else:
            why = "; ".join(unjudged[:SHOWN])
        # every pair that ran, ran on a CPU or at a scale the claim cannot show: no verdict
        verdict, why = (NOT_JUDGED, "not judged: " + why) if cannot_show else (NOT_MEASURED, why)
        return ClaimResult(claim, verdict, claimed, "—", why, cells, numbers, pairs=pairs)
    parts = []
    if ratios:
        values = [r for _, _, r in ratios]
        med = statistics.median(values)
        verdict = HELD if claim.low <= med <= claim.high and not bounded else NOT_HELD
        measured = f"×{med:.2f}"
        if len(values) > 1:
            measured += f" (median of {len(values)}, ×{min(values):.2f}–×{max(values):.2f})"
        if len(values) > 1 and not bounded:
            low, high = median_interval(values)
            measured += f"; {LEVEL:.0%} CI of the median ×{low:.2f}–×{high:.2f}"
            inside = claim.low <= low and high <= claim.high
            if not inside and not (high < claim.low or low > claim.high):
                verdict = INCONCLUSIVE  # the data fit a value inside the claim and one outside it
        parts.append("; ".join(f"{cell_label(a)} → {cell_label(b)}: ×{r:.2f}" for a, b, r in ratios[:SHOWN]))
        if speed:
            parts[-1] += where_measured([x for a, b, _ in ratios for x in (a, b)])
    else:
        verdict, measured = NOT_HELD, "outside (out of memory)"
    parts += bounded[:SHOWN]
    if unjudged:
        parts.append("not judged: " + "; ".join(unjudged[:SHOWN]))
    return ClaimResult(claim, verdict, claimed, measured, "; ".join(parts), cells, numbers, pairs=pairs)


def _labelled(row: pd.Series) -> tuple[str, dict[str, Any]]:
    return cell_label(row), knobs(row["record"])


def _oom_bound(
    row: pd.Series, twin: pd.Series, claim: Claim, metric: str, target_steps: int, bounds: dict
) -> str:
    """A memory ratio with one side out of memory is bounded; '' unless the bound falls outside the claim."""
    scale = gb_scale(metric)
    if row["status"] == "oom" and twin["status"] == "ok":
        need, (b, _) = needs_more_than(row, bounds), metric_value(twin, metric, target_steps)
        if need and b is not None and b / (need * scale) < claim.low:
            return f"ratio below ×{b / (need * scale):.2f} (the from cell ran out of memory), under the claim"
    if twin["status"] == "oom" and row["status"] == "ok":
        need, (a, _) = needs_more_than(twin, bounds), metric_value(row, metric, target_steps)
        if need and a and need * scale / a > claim.high:
            return f"ratio above ×{need * scale / a:.2f} (the to cell ran out of memory), over the claim"
    return ""


# ------------------------------------------------------------------------------ what a run says


def metric_value(row: pd.Series, metric: str, target_steps: int) -> tuple[float | None, str]:
    """(value, "") of an ok cell, or (None, why it has none)."""
    kind = metric_kind(metric)
    if kind == "quality":
        q = row["record"].quality  # the last evaluation's figure
        v = q.evaluations[-1].metrics.get(metric) if q is not None and q.evaluations else None
        v = finite(v)
        return (v, "") if v is not None else (None, f"no quality evaluation of the record has {metric}")
    if kind == "memory" and row.get("config.device") == "cpu":
        return None, "a CPU cell has no GPU memory figure"
    if metric in ("peak_memory_gib", "peak_memory_gb"):
        mem, _ = fit_memory(row)
        v = None if mem is None else mem * gb_scale(metric)
    elif metric == "peak_allocated_gib":
        v = value(row, MEM_ALLOCATED)
    elif metric == "step_time":
        ms = value(row, STEP_MS.path)
        v = None if ms is None else ms / 1000
    elif metric == "days_to_target":
        s = time_to_steps_s(row, target_steps)
        v = None if s is None else s / 86400
    elif metric == "gpu_hours_per_million_images":
        v = gpu_hours_per_million_images(row)
    else:  # the record's own (images/s, steps/s, MFU): read where the gate reads them
        v = value(row, RECORD_PATHS[metric])
    return (v, "") if v is not None else (None, f"the record has no {metric}")


def speed_elsewhere(row: pd.Series, card: str | None) -> str:
    """Why this cell's absolute speed does not speak for `card` ('' when it does, or no card is named)."""
    if card is None:
        return ""
    if row.get("config.device") == "cpu":
        return f"ran on a CPU, not on an {card}"
    budget = cell_budget(row)
    if budget is not None and budget.emulated:
        return f"ran on {budget.ran_on()}: that is the {budget.real_gpu}'s speed, not an {card}'s"
    gpu = row.get("env.gpu_name")
    try:
        same = bool(gpu) and find_card(str(gpu)).name == card
    except UserError:
        same = False
    return "" if same else f"ran on {gpu or 'an unknown GPU'}, not on an {card}"


def where_measured(rows: list[pd.Series]) -> str:
    """'; speeds measured on a CPU' (or on a capped bigger card) for speed evidence; '' on a plain GPU."""
    places = []
    for row in rows:
        budget = cell_budget(row)
        if row.get("config.device") == "cpu":
            places.append("a CPU")
        elif budget is not None and budget.emulated:
            places.append(budget.ran_on())
    places = list(dict.fromkeys(places))
    return f"; speeds measured on {' and '.join(places)}" if places else ""


def latest_per_cell(df: pd.DataFrame) -> pd.DataFrame:
    if not df["cell_id"].duplicated().any():
        return df
    order = df.assign(_order=range(len(df)))
    order = order.sort_values(["started_at", "_order"], na_position="first", kind="stable")
    return order.drop_duplicates("cell_id", keep="last").sort_values("_order").drop(columns="_order")


def basis(row: pd.Series, metric: str) -> str:
    if metric in ("peak_memory_gib", "peak_memory_gb"):
        _, label = fit_memory(row)
        return f" {label}" if label else ""
    return ""


def status_text(row: pd.Series) -> str:
    reason = row.get("reason")
    reason = f" ({str(reason)[:120]})" if isinstance(reason, str) and reason else ""
    return f"status {row['status']}{reason}"
