"""The gate's decisions, cell by cell, in the order docs/gate-in-ci.md gives: environments (env.py),
cells by cell_id, status (allow_stopped), values that cannot be compared (refused by file, line and cell
unless allow_incomparable names them), then metrics (timing.py or `ditbench ab`'s paired judge,
quality.py). A gate that compared no value at all refuses: it never passes by default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from ditbench.records.metrics import CORE, QUALITY, Metric, table
from ditbench.report.cells import knobs
from ditbench.report.gate import env as envs
from ditbench.report.gate.inputs import (
    GateRefusal,
    Problems,
    Row,
    load_run,
    noisy,
    number,
    rows,
    run_samples,
    step_samples,
)
from ditbench.report.gate.policy import STEP_SAMPLES, Policy, Rule
from ditbench.report.gate.quality import check_identity, compare_quality
from ditbench.report.gate.result import VERDICTS, CellResult, Comparison, MetricDelta
from ditbench.report.gate.timing import StepTest, judge
from ditbench.report.quality import read_quality

FAILED = ("oom", "timeout", "nan_loss", "error")
# (cell_id, metric, rule, base value, new value) -> the delta of a timed metric (`ditbench ab`)
TimedJudge = Callable[[str, Metric, Rule, float, float], MetricDelta]


class NothingComparedError(GateRefusal):
    title = "refused, nothing comparable"


class _Cell:
    """The comparison of one cell that is ok in both runs."""

    def __init__(
        self, b: Row, n: Row, rules: dict[str, Rule], policy: Policy, problems: Problems, timed=None
    ):
        self.b, self.n, self.policy, self.problems = b, n, policy, problems
        self.rules, self.timed = rules, timed
        self.missing_steps: list[int] = []
        self.deltas: list[MetricDelta] = []
        self.not_compared: list[dict[str, str]] = []
        self.not_measured: list[str] = []
        self.untested = False
        self.official: list[bool | None] = []

    def problem(self, row: Row, metric: str | None, text: str) -> None:
        """An input that cannot be compared: refuses, unless the policy allows it for this metric."""
        if metric is not None and self.policy.allows(metric):
            self.not_compared.append({"metric": metric, "reason": f"{row.side}: {text}"})
        else:
            self.problems.add(row, text, metric)

    def run(self) -> None:
        weak = self._weak_reason()
        test = self._step_test()
        metrics = table()
        gated = [(metrics[name], rule) for name, rule in self.rules.items()]
        self._require_core()
        for metric, rule in gated:
            if metric.kind != QUALITY:
                self._measured(metric, rule, test, weak)
        quality = [(m, r) for m, r in gated if m.kind == QUALITY]
        if quality:
            self._quality(quality)

    def _require_core(self) -> None:
        """Status ok claims images/s and a step time: a record without them is not comparable."""
        for name in CORE:
            if name in self.rules:
                continue  # checked where it is compared
            metric = table()[name]
            for row in (self.b, self.n):
                v, usable = self._value(row, metric)
                if usable and v is None:
                    self.problem(row, name, f"{metric.path} is missing (a status ok record needs it)")

    def _weak_reason(self) -> str | None:
        reasons = [(row.side.lower(), noisy(row.record)) for row in (self.b, self.n)]
        return "; ".join(f"{side}: {why}" for side, why in reasons if why) or None

    def _step_test(self) -> StepTest:
        """Run-level samples (each repeat's median step time) when both runs have repeats: they sample
        the process-to-process noise; else the per-step times of the one process a side."""
        runs = self._samples(run_samples)
        if all(len(s) >= 2 for s in runs):
            return StepTest(runs[0], runs[1], self.policy, unit="runs")
        steps = self._samples(step_samples)
        return StepTest(steps[0], steps[1], self.policy)

    def _samples(self, read) -> list[list[float]]:
        """Each run's samples as `read` (run_samples or step_samples) finds them; a problem is recorded."""
        sides = []
        for row in (self.b, self.n):
            s, problem = read(row.record)
            if problem:
                self.problem(row, STEP_SAMPLES, problem)
            sides.append(s)
        return sides

    def _value(self, row: Row, metric: Metric) -> tuple[float | None, bool]:
        """(value, usable); a problem is recorded when not usable."""
        v, why = number(metric.of(row.record))
        if why is None and v is not None and metric.out_of_range(v):
            why = f"is {v:g}, not a {metric.valid} value"
        if why:
            self.problem(row, metric.name, f"{metric.path} {why}")
            return None, False
        return v, True

    def _measured(self, metric: Metric, rule: Rule, test: StepTest, weak: str | None) -> None:
        (b, ok_b), (n, ok_n) = self._value(self.b, metric), self._value(self.n, metric)
        if not (ok_b and ok_n):
            return
        if b is None or n is None:
            if b is None and n is None and not metric.core:
                self.not_measured.append(metric.name)
                return
            for row, v in ((self.b, b), (self.n, n)):
                if v is None:
                    self.problem(
                        row,
                        metric.name,
                        f"{metric.path} is missing (a status ok record needs it)"
                        if metric.core
                        else f"{metric.path} is missing, but the other run has it",
                    )
            return
        if self.timed is not None and metric.timed:
            self.deltas.append(self.timed(self.n.record.cell_id, metric, rule, b, n))
            return
        delta, untested = judge(metric, rule, b, n, test, weak)
        self.untested |= untested
        self.deltas.append(delta)

    def _quality(self, gated: list[tuple[Metric, Rule]]) -> None:
        qs = []
        for row in (self.b, self.n):
            q, problem = read_quality(row.record.quality)
            if problem:
                self.problems.add(row, problem)
                return
            qs.append(q)
        qb, qn = qs
        if qb is None and qn is None:
            self.not_measured.extend(m.name for m, _ in gated)
            return
        if qb is None or qn is None:
            row = self.b if qb is None else self.n
            for m, _ in gated:
                self.problem(row, m.name, "has no quality field, but the other run has one")
            return
        n_differs = check_identity(self.b, qb, self.n, qn, self.policy.allow_sample_count_mismatch)
        self.missing_steps = sorted(set(qb.evaluations) - set(qn.evaluations))
        deltas, not_measured, problems = compare_quality(qb, qn, gated, self.policy.quality_noise_k)
        for d in deltas if n_differs else []:
            d.weak, d.weak_reason = True, "; ".join(filter(None, (d.weak_reason, n_differs)))
        for side, metric, text in problems:
            self.problem(self.b if side == "BASE" else self.n, metric, text)
        self.not_measured.extend(not_measured)
        self.deltas.extend(deltas)
        if deltas:
            self.official += [qb.official, qn.official]

    def result(self) -> CellResult:
        verdicts = {d.verdict for d in self.deltas}
        order = (("regression", "regression"), ("inconclusive", "inconclusive"), ("improvement", "improved"))
        verdict = next((cell for metric, cell in order if metric in verdicts), "pass")
        return CellResult(
            self.n.record.cell_id,
            self.n.record.cell_name,
            verdict,
            "ok",
            "ok",
            None,
            self.deltas,
            self.untested,
            weak=any(d.weak for d in self.deltas),
            not_compared=self.not_compared,
            not_measured=self.not_measured,
            missing_steps=self.missing_steps,
        )


def _failed_repeats(row: Row) -> dict:
    """{repeat: status} of the cell's repeats that did not end ok (bench.repeats.combine)."""
    return getattr(getattr(row.record.metrics, "repeats", None), "failed", None) or {}


def _status_result(b: Row | None, n: Row | None, policy: Policy) -> CellResult:
    """The verdict of a cell that is not ok on both sides (or on one side only), or whose new repeats
    failed where the base's did not."""
    rec = (n or b).record
    cid, name = rec.cell_id, rec.cell_name
    bs = b.record.status if b else None
    ns = n.record.status if n else None
    if n is None:
        return CellResult(cid, name, "only in base", bs, None)
    if b is None:
        return CellResult(cid, name, "only in new", None, ns)
    reason = n.record.reason
    if bs == ns == "ok":
        reason = "repeats not ok in the new run: " + ", ".join(
            f"#{k} {v}" for k, v in _failed_repeats(n).items()
        )
    if bs == "ok" and policy.may_stop(cid, name):
        return CellResult(cid, name, "stopped (allowed)", bs, ns, reason)
    if bs == "ok" and (ns in FAILED or ns == "ok"):
        return CellResult(cid, name, "new failure", bs, ns, reason)
    if bs == "ok":
        return CellResult(cid, name, "no longer measured", bs, ns, reason)
    if ns == "ok":
        return CellResult(cid, name, "fixed", bs, ns)
    return CellResult(cid, name, "still failing", bs, ns, reason)


def compare_frames(
    base: pd.DataFrame,
    new: pd.DataFrame,
    policy: Policy | None = None,
    allow_env_mismatch: bool = False,
    base_path: str = "BASE",
    new_path: str = "NEW",
    timed: TimedJudge | None = None,
) -> Comparison:
    """Compare two loaded runs (report.load: one row per cell_id each); raises GateRefusal (exit 2).
    `timed` judges the timed metrics instead of timing.judge (`ditbench ab`'s paired rounds)."""
    policy = policy or Policy()
    base_rows, new_rows = rows(base, "BASE"), rows(new, "NEW")
    common = [c for c in base_rows if c in new_rows]
    if not common:
        raise NothingComparedError(
            f"no cell of {new_path} matches a cell of {base_path} (cells match by cell_id, a hash of the "
            f"whole cell config; {len(base_rows)} cells vs {len(new_rows)}). Are these runs of the same "
            "suite, and was the suite file changed since the baseline? A gate that compares nothing "
            "cannot pass; refresh the baseline if the suite changed on purpose."
        )
    diffs = envs.differences([(base_rows[c], new_rows[c]) for c in common])
    if diffs and not (allow_env_mismatch or policy.environment == "may_differ"):
        raise envs.EnvMismatchError(base_path, new_path, diffs)
    problems = Problems()
    cells: list[CellResult] = []
    compared: Counter[str] = Counter()  # metric -> cells that compared it
    unmeasured: Counter[str] = Counter()  # metric -> cells where neither run measured it
    official: list[bool | None] = []
    used_overrides: set[int] = set()
    for cid in list(base_rows) + [c for c in new_rows if c not in base_rows]:
        b, n = base_rows.get(cid), new_rows.get(cid)
        both_ok = b and n and b.record.status == n.record.status == "ok"
        lost = both_ok and _failed_repeats(n) and not _failed_repeats(b)
        if not both_ok or (lost and not policy.may_stop(cid, n.record.cell_name)):
            cells.append(_status_result(b, n, policy))
            continue
        cell_knobs = knobs(n.record)
        used_overrides.update(policy.matching(cell_knobs))
        cell = _Cell(b, n, policy.rules_for(cell_knobs), policy, problems, timed)
        cell.run()
        compared.update(d.metric for d in cell.deltas)
        unmeasured.update(cell.not_measured)
        official += cell.official
        cells.append(cell.result())
    problems.raise_any()
    _check_explicit(policy, compared, unmeasured)
    first_new = next((r for r in new_rows.values() if envs.ran(r.record)), next(iter(new_rows.values())))
    env = {k: v for k, v in envs.fingerprint(first_new.record).items() if v != "None"}
    inception = None if not official else all(o is True for o in official)
    unused = [i for i in range(len(policy.overrides)) if i not in used_overrides]
    notes = envs.named_differences([(base_rows[c], new_rows[c]) for c in common])
    result = Comparison(base_path, new_path, cells, diffs, policy, env, inception, unused, notes)
    if result.compared == 0 and not result.failed:
        counts = ", ".join(f"{result.count(v)} {v}" for v in VERDICTS if result.count(v))
        raise NothingComparedError(
            f"{new_path} vs {base_path}: no value of any matched cell could be compared ({counts}; "
            f"gated metrics: {', '.join(policy.rules) or 'none'}). A gate that compared nothing cannot "
            "pass, so it refuses (exit 2). Check that the cells ran ok in both runs and that the policy "
            "gates a metric they measure."
        )
    return result


def _check_explicit(policy: Policy, compared: Counter[str], unmeasured: Counter[str]) -> None:
    """A metric the policy file names must have been compared somewhere it was measurable."""
    missing = [m for m in sorted(policy.explicit) if unmeasured.get(m) and not compared.get(m)]
    missing = [m for m in missing if not policy.allows(m)]
    if missing:
        raise NothingComparedError(
            f"policy {policy.source} gates {', '.join(missing)}, but no cell ok in both runs measured "
            f"{'it' if len(missing) == 1 else 'them'} on both sides ({unmeasured[missing[0]]} cell(s) had "
            f"no {missing[0]} in either run). The gate cannot check what the policy asks, so it refuses "
            "(exit 2). Remove the metric from the policy, list it under allow_incomparable, or measure it."
        )


def compare_files(
    base_path: str | Path,
    new_path: str | Path,
    policy: Policy | None = None,
    allow_env_mismatch: bool = False,
) -> Comparison:
    base = load_run(base_path, "BASE")
    new = load_run(new_path, "NEW")
    return compare_frames(base, new, policy, allow_env_mismatch, str(base_path), str(new_path))
