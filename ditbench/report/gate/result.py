"""What a comparison found: how far each metric moved, per cell, and for the whole gate (with its JSON)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ditbench.records.metrics import HIGHER, Metric
from ditbench.report.gate.policy import Policy

VERDICTS = (
    "regression",
    "new failure",
    "inconclusive",
    "improved",
    "pass",
    "fixed",
    "still failing",
    "no longer measured",
    "stopped (allowed)",
    "only in base",
    "only in new",
)
FAILING_VERDICTS = ("regression", "new failure", "no longer measured")  # a cell that stops running fails
INCONCLUSIVE_EXIT = {"inconclusive": 3, "pass": 0, "fail": 1}  # by the policy's `inconclusive`


# How far a metric moved, and whether that crosses its rule (the metrics: ditbench.records.metrics).
@dataclass(frozen=True)
class Crossing:
    change_pct: float | None  # signed (new - base) / |base|; None when base is 0 (no finite percentage)
    direction: str  # "worse", "better" or "same"
    crossed: bool  # moved beyond the threshold (percent and min_abs) in that direction

    def verdict(self, significant: bool) -> str:
        """regression / improvement for a significant crossing, noise for another, else unchanged."""
        if not self.crossed:
            return "unchanged"
        if not significant:
            return "noise"
        return "regression" if self.direction == "worse" else "improvement"


def crossing(metric: Metric, base: float, new: float, threshold_pct: float, min_abs: float) -> Crossing:
    """How far new moved from base, and whether that crosses the rule. Values must be finite."""
    delta = new - base
    worse = -delta if metric.direction == HIGHER else delta  # > 0: moved the wrong way
    moved = direction(worse)
    change = delta / abs(base) * 100 if base != 0 else None
    if change is not None and not math.isfinite(change):
        change = None  # a base near the smallest float: the percentage overflows
    if moved == "same":
        return Crossing(0.0 if change is None else change, moved, False)
    # From a base of 0 any move is infinitely many percent: only min_abs can hold it back.
    pct = abs(change) if change is not None else math.inf
    return Crossing(change, moved, pct > threshold_pct and abs(delta) >= min_abs)


def direction(worse: float) -> str:
    """How a metric moved, from how far it moved the wrong way (> 0: worse)."""
    return "worse" if worse > 0 else "better" if worse < 0 else "same"


@dataclass
class MetricDelta:
    metric: str
    label: str
    base: float
    new: float
    change_pct: float | None  # signed: (new - base) / |base|; None from a base of 0
    threshold_pct: float
    # regression | improvement | unchanged | noise (beyond the threshold, not significant) |
    # inconclusive (its interval straddles the threshold)
    verdict: str
    significance: str  # "p=0.0012", "not tested (n=3/20 < 5; threshold decides)", "within noise ..."
    p_value: float | None = None
    direction: str = "same"  # worse | better | same: which way the metric moved
    weak: bool = False  # the verdict rests on a noisy window or on an unknown quality noise
    weak_reason: str | None = None
    step: int | None = None  # quality metrics: the training step of the compared evaluation
    noise: float | None = None  # quality metrics: the difference that counts as beyond noise
    interval_pct: list[float] | None = None  # confidence interval of change_pct (low, high)
    interval_level: float | None = None  # its confidence level, e.g. 0.95
    mde_pct: float | None = None  # minimum detectable effect at that interval (report.gate.timing.mde)

    @classmethod
    def judged(
        cls, metric, rule, b: float, n: float, c: Crossing, significant: bool, significance: str, **more
    ):
        """The delta of `metric` from base b to new n: its crossing `c` of `rule`, significant or not."""
        verdict = c.verdict(significant)
        more["direction"] = c.direction
        return cls(
            metric.name, metric.label, b, n, c.change_pct, rule.threshold_pct, verdict, significance, **more
        )


@dataclass
class CellResult:
    cell_id: str
    cell_name: str
    verdict: str  # see VERDICTS
    base_status: str | None
    new_status: str | None
    reason: str | None = None
    metrics: list[MetricDelta] = field(default_factory=list)
    untested: bool = False  # a gated timing metric could not be tested for significance
    weak: bool = False  # one of its verdicts is weak (see MetricDelta.weak)
    not_compared: list[dict[str, str]] = field(default_factory=list)  # allowed by allow_incomparable
    not_measured: list[str] = field(default_factory=list)  # gated, but measured by neither run
    missing_steps: list[int] = field(default_factory=list)  # quality steps the base has and new lacks


@dataclass
class Comparison:
    base_path: str
    new_path: str
    cells: list[CellResult]
    env_differences: dict[str, tuple[list[str], list[str]]]
    policy: Policy
    env: dict[str, str]
    inception_official: bool | None = None  # None: no quality metric was compared
    unused_overrides: list[int] = field(default_factory=list)  # policy overrides no compared cell matched
    # Differences named but never gated (env.named_differences): key -> (base values, new values).
    env_notes: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    ab: dict[str, Any] | None = None  # `ditbench ab`: how the sides ran (ab.run.about)

    @property
    def tool(self) -> str:
        return "ditbench ab" if self.ab is not None else "ditbench compare"

    @property
    def regressions(self) -> list[CellResult]:
        return [c for c in self.cells if c.verdict in FAILING_VERDICTS]

    @property
    def compared(self) -> int:
        """How many metric values were positively compared; a pass needs at least one."""
        return sum(len(c.metrics) for c in self.cells)

    @property
    def missing(self) -> list[CellResult]:
        """Cells missing from the new run, or ok cells lacking quality steps the base evaluated."""
        return [c for c in self.cells if c.verdict == "only in base" or c.missing_steps]

    @property
    def failed(self) -> bool:
        return bool(self.regressions) or (self.policy.fail_on_missing and bool(self.missing))

    @property
    def largest_mde(self) -> float | None:
        """The largest minimum detectable effect of any timed verdict: what this run could see."""
        found = [d.mde_pct for c in self.cells for d in c.metrics if d.mde_pct is not None and d.step is None]
        return max(found) if found else None

    @property
    def inconclusive(self) -> list[CellResult]:
        return [c for c in self.cells if c.verdict == "inconclusive"]

    @property
    def exit_code(self) -> int:
        """0 pass, 1 regression, 3 inconclusive (the policy's `inconclusive` may map it to pass or fail)."""
        if self.failed:
            return 1
        if self.inconclusive:
            return INCONCLUSIVE_EXIT.get(self.policy.inconclusive, 3)
        return 0

    @property
    def result(self) -> str:
        return {0: "pass", 1: "regression", 3: "inconclusive"}[self.exit_code]

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in self.cells)

    def to_json(self) -> dict[str, Any]:
        p = self.policy
        return {
            "result": self.result,
            "exit_code": self.exit_code,
            "base": self.base_path,
            "new": self.new_path,
            "counts": {v: self.count(v) for v in VERDICTS},
            "compared_metrics": self.compared,
            "weak_cells": sum(c.weak for c in self.cells),
            "largest_mde_pct": self.largest_mde,
            "inception_official": self.inception_official,
            "env": self.env,
            "env_differences": {k: {"base": b, "new": n} for k, (b, n) in self.env_differences.items()},
            "env_notes": {k: {"base": b, "new": n} for k, (b, n) in self.env_notes.items()},
            "policy": {
                "source": p.source,
                **p.settings(),
                "thresholds_pct": {k: r.threshold_pct for k, r in p.rules.items()},
                "unused_overrides": self.unused_overrides,
            },
            "cells": [asdict(c) for c in self.cells],
            **({"ab": self.ab} if self.ab is not None else {}),
        }


def to_json_text(c: Comparison) -> str:
    return json.dumps(c.to_json(), indent=2, allow_nan=False, default=str)
