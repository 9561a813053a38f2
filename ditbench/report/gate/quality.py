"""The quality gate: FID, IS and the other sample metrics, compared at the last step both runs
evaluated by the noise rule of `report.quality`; made differently (weights, reference, sampler, N)
refuses (exit 2); (new - base) +- the noise bound straddling the threshold is inconclusive.
"""

from __future__ import annotations

import math
from typing import Any

from ditbench.core.errors import shorten
from ditbench.records.metrics import HIGHER, Metric
from ditbench.report.gate.inputs import GateRefusal, Row
from ditbench.report.gate.policy import Rule
from ditbench.report.gate.result import MetricDelta, crossing
from ditbench.report.load import number
from ditbench.report.quality import IDENTITY, SAMPLE_COUNT, Quality, evaluation_noise, noise_rule


class QualityMismatchError(GateRefusal):
    """Quality numbers made differently (weights, reference, sampler, sample count): not comparable."""

    title = "refused, quality measured differently"

    def __init__(self, base: Row, new: Row, differences: list[tuple[str, Any, Any]]):
        self.differences = differences
        text = "; ".join(
            f"{label}: {shorten(b, 70)} (base) vs {shorten(n, 70)} (new)" for label, b, n in differences
        )
        super().__init__(
            f"{new.where} and {base.source}: the quality metrics were made differently ({text}). FID, IS "
            "and the others depend on the Inception weights, the reference batch, the sampler and the "
            "sample count (FID's upward bias depends on the number of samples N), so numbers made "
            "differently are not comparable and the gate refuses (exit 2). Evaluate both runs the same "
            "way, or turn the quality metrics off in the policy"
            + (
                "; to compare different N anyway, set allow_sample_count_mismatch: true in the policy."
                if any(d[0] == SAMPLE_COUNT for d in differences)
                else "."
            )
        )


def check_identity(base: Row, qb: Quality, new: Row, qn: Quality, allow_n: bool = False) -> str | None:
    """Refuses quality made differently; returns why the verdicts are weak when N differs by policy."""
    differences = [(label, qb.identity[label], qn.identity[label]) for label, _ in IDENTITY]
    differences = [d for d in differences if d[1] != d[2]]
    n_differs = next((d for d in differences if d[0] == SAMPLE_COUNT), None)
    if allow_n:
        differences = [d for d in differences if d[0] != SAMPLE_COUNT]
    if differences:
        raise QualityMismatchError(base, new, differences)
    if n_differs:
        return f"N {n_differs[1]} (base) vs {n_differs[2]} (new): FID's bias depends on N"
    return None


def compare_quality(
    qb: Quality, qn: Quality, gated: list[tuple[Metric, Rule]], k: float
) -> tuple[list[MetricDelta], list[str], list[tuple[str, str, str]]]:
    """(deltas, metrics measured by neither run, problems as (side, metric, text))."""
    common = sorted(set(qb.evaluations) & set(qn.evaluations))
    if not common:
        text = (
            f"quality has no evaluation at a training step both runs have (base steps "
            f"{shorten(sorted(qb.evaluations))}, new steps {shorten(sorted(qn.evaluations))})"
        )
        return [], [], [("NEW", m.name, text) for m, _ in gated]
    step = common[-1]
    eb, en = qb.evaluations[step], qn.evaluations[step]
    deltas, not_measured, problems = [], [], []
    where = f"quality.evaluations[step {step}]"
    for metric, rule in gated:
        values, spreads = [], []
        for side, e in (("BASE", eb), ("NEW", en)):
            v, why = number(e.metrics.get(metric.path))
            if why is None and v is not None and metric.out_of_range(v):
                why = f"is {v:g}, not a {metric.valid} value"
            noise, nwhy = evaluation_noise(e, metric.path)
            if why or nwhy:
                text = f"{where}.metrics.{metric.path} {why}" if why else f"{where}.{nwhy}"
                problems.append((side, metric.name, text))
                break
            values.append(v)
            spreads.append(noise)
        if len(values) < 2:
            continue  # a side's value or noise is a problem
        b, n = values
        if b is None and n is None:
            not_measured.append(metric.name)
        elif b is None or n is None:
            problems.append(
                ("BASE" if b is None else "NEW", metric.name, f"{where}.metrics.{metric.path} is missing")
            )
        else:
            deltas.append(_judge(metric, rule, b, n, spreads[0], spreads[1], k, step))
    return deltas, not_measured, problems


def _judge(
    metric: Metric, rule: Rule, b: float, n: float, sb: float | None, sn: float | None, k: float, step: int
) -> MetricDelta:
    c = crossing(metric, b, n, rule.threshold_pct, rule.min_abs)
    noise = noise_rule(b, n, sb, sn, k)
    interval = None
    if noise.bound is None:
        significance = f"noise unknown (threshold decides; step {step})"
    else:
        significance = (
            f"{'beyond' if noise.beyond else 'within'} noise: |Δ| {abs(n - b):.3g} "
            f"{'>' if noise.beyond else '≤'} {k:g}σ {noise.bound:.3g} (step {step})"
        )
        if b != 0 and math.isfinite(noise.bound):
            interval = [(n - b - noise.bound) / abs(b) * 100, (n - b + noise.bound) / abs(b) * 100]
            significance += f"; change {interval[0]:+.1f}% to {interval[1]:+.1f}%"
    delta = MetricDelta.judged(
        metric,
        rule,
        b,
        n,
        c,
        noise.beyond is not False,
        significance,
        weak=noise.weak_reason is not None and c.crossed,
        weak_reason=noise.weak_reason if c.crossed else None,
        step=step,
        noise=noise.bound if noise.bound is not None and math.isfinite(noise.bound) else None,
        interval_pct=interval,
    )
    if interval is not None:
        worse = sorted(-x if metric.direction == HIGHER else x for x in interval)  # > 0: worse
        t = rule.threshold_pct
        if worse[0] <= t < worse[1] and (c.crossed or abs(n - b) >= rule.min_abs):
            delta.verdict = "inconclusive"  # a change beyond the threshold and one within fit the data
        elif c.crossed and c.direction == "better" and worse[1] > -t:
            delta.verdict = "noise"  # an improvement the interval does not show
    return delta
