"""The regression gate: compare a new run with a baseline run, cell by cell.

Decisions, in the order they are taken:

1. Environment. Two runs are comparable only on the same hardware and software stack: the
   keys in ENV_KEYS (GPU model and count, driver, CUDA, torch; the CPU model for CPU-only runs)
   must agree for every matched cell. Host name, Python patch level, kernel, ditbench version
   and git sha are left out on purpose: runners in a pool differ in host name, and the code is
   what a gate is meant to test. A mismatch refuses the comparison (exit 2) unless
   allow_env_mismatch is set, in which case the differences head the summary.
2. Cells are matched by cell_id (a hash of the cell's whole config). Cells on one side only are
   listed; they fail the gate only with `fail_on_missing: true` in the policy.
3. Status. ok -> oom / timeout / nan_loss / error is a regression ("new failure"); not ok -> ok
   is "fixed"; ok -> skipped / unsupported is listed as "no longer measured" (the suite or the
   machine stopped running it, which is not a measurement of the code); a failure that changes
   kind (oom -> error) is "still failing".
4. Metrics, for cells ok on both sides, each with a direction (throughput up is good; time,
   memory and FID down are good) and a threshold in percent. A metric regresses when it moves
   the wrong way by more than its threshold AND, for metrics timed per step, the per-step times
   (metrics.step_ms.samples) differ significantly by a two-sided Mann-Whitney U test (p < alpha,
   shifted the same way). With fewer than min_samples samples on either side, or too few for
   the test to ever reach p < alpha, the test is not applied and the threshold alone decides;
   the summary says so for each such cell. The test runs only for a metric that crossed its
   threshold (elsewhere it could change nothing). Memory and FID have no per-step samples and
   are near-deterministic, so the threshold alone decides for them.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from scipy.stats import mannwhitneyu

from ditbench.errors import UserError
from ditbench.report.load import flatten, value

HIGHER, LOWER = "higher", "lower"
FAILED = ("oom", "timeout", "nan_loss", "error")
NOT_RUN = ("skipped", "unsupported")
SAMPLES = "metrics.step_ms.samples"

# Which environment keys must agree (see the module docstring); "cpu" only when no GPU was used.
ENV_KEYS = ("gpu_name", "gpu_count", "driver", "cuda", "torch")
ENV_KEYS_CPU = ("cpu",)


@dataclass(frozen=True)
class Metric:
    name: str
    column: str
    direction: str  # which way is better
    label: str
    timed: bool  # derived from the per-step times, so the step samples can test it


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("images_per_s", "metrics.images_per_s", HIGHER, "images/s", True),
        Metric("images_per_s_per_gpu", "metrics.images_per_s_per_gpu", HIGHER, "images/s per GPU", True),
        Metric("steps_per_s", "metrics.steps_per_s", HIGHER, "steps/s", True),
        Metric("step_ms", "metrics.step_ms.median", LOWER, "step ms (median)", True),
        Metric("tflops_per_s", "metrics.tflops_per_s", HIGHER, "TFLOP/s", True),
        Metric("mfu", "metrics.mfu.value", HIGHER, "MFU", True),
        Metric(
            "peak_mem_allocated_gib", "metrics.peak_mem_allocated_gib", LOWER, "peak allocated GiB", False
        ),
        Metric("peak_mem_reserved_gib", "metrics.peak_mem_reserved_gib", LOWER, "peak reserved GiB", False),
        Metric("device_mem_gib", "metrics.device_mem_gib", LOWER, "device memory GiB", False),
        Metric("cpu_peak_rss_gib", "metrics.cpu_peak_rss_gib", LOWER, "CPU peak RSS GiB", False),
        Metric("fid", "metrics.fid", LOWER, "FID", False),
        Metric("smoke_last_loss", "smoke.last_mean", LOWER, "smoke loss (last window)", False),
    )
}

# Default thresholds in percent; a metric not listed is not gated unless a policy enables it.
# Throughput and reserved memory are noisier than allocated memory, which is near-deterministic.
DEFAULT_THRESHOLDS: dict[str, float] = {
    "images_per_s": 5.0,
    "peak_mem_allocated_gib": 2.0,
    "peak_mem_reserved_gib": 5.0,
    "fid": 2.0,
}
DEFAULT_ALPHA = 0.01
MAX_SUMMARY_ROWS = 150  # rows of the "All cells" table in the markdown summary
DEFAULT_MIN_SAMPLES = 5


# ------------------------------------------------------------------------------------------ policy


@dataclass
class Rule:
    threshold_pct: float
    min_abs: float = 0.0  # changes smaller than this (in the metric's unit) never count


@dataclass
class Override:
    match: dict[str, Any]
    rules: dict[str, Rule | None]


@dataclass
class Policy:
    rules: dict[str, Rule] = field(
        default_factory=lambda: {k: Rule(v) for k, v in DEFAULT_THRESHOLDS.items()}
    )
    alpha: float = DEFAULT_ALPHA
    min_samples: int = DEFAULT_MIN_SAMPLES
    fail_on_missing: bool = False
    overrides: list[Override] = field(default_factory=list)
    source: str = "defaults"

    def rules_for(self, knobs: dict[str, Any]) -> dict[str, Rule]:
        rules = dict(self.rules)
        for o in self.overrides:
            if all(knobs.get(k) == v for k, v in o.match.items()):
                for name, rule in o.rules.items():
                    if rule is None:
                        rules.pop(name, None)
                    else:
                        rules[name] = rule
        return rules


POLICY_KEYS = ("alpha", "min_samples", "fail_on_missing", "metrics", "overrides")


def _rules(raw: Any, where: str, path: Path) -> dict[str, Rule | None]:
    if not isinstance(raw, dict):
        raise UserError(
            f"{path}: `{where}` must be a mapping of metric name to threshold, e.g. "
            "`images_per_s: 5` or `peak_mem_allocated_gib: {threshold_pct: 2, min_abs: 0.05}`."
        )
    out: dict[str, Rule | None] = {}
    for name, spec in raw.items():
        if name not in METRICS:
            raise UserError(
                f"{path}: `{where}.{name}` is not a metric ditbench compares; valid metrics: "
                f"{', '.join(METRICS)}."
            )
        key = f"{where}.{name}"
        if spec is None or spec is False:
            out[name] = None  # disabled
            continue
        if isinstance(spec, bool):
            raise UserError(
                f"{path}: `{key}: true` gives no threshold; write a percentage such as "
                f"`{name}: 5`, or `false` to turn the metric off."
            )
        if isinstance(spec, (int, float)):
            spec = {"threshold_pct": spec}
        if not isinstance(spec, dict):
            raise UserError(
                f"{path}: `{key}` must be a number (threshold in percent), a mapping with "
                f"threshold_pct and optional min_abs, or false; got {spec!r}."
            )
        unknown = set(spec) - {"threshold_pct", "min_abs"}
        if unknown:
            raise UserError(
                f"{path}: `{key}` has unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                "valid: threshold_pct, min_abs."
            )
        if "threshold_pct" not in spec:
            raise UserError(
                f"{path}: `{key}` needs threshold_pct (percent the metric may move the wrong way)."
            )
        values = {}
        for field_name in ("threshold_pct", "min_abs"):
            v = spec.get(field_name, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise UserError(f"{path}: `{key}.{field_name}` must be a number >= 0, got {v!r}.")
            values[field_name] = float(v)
        out[name] = Rule(**values)
    return out


def load_policy(path: str | Path | None) -> Policy:
    """The default policy, or a YAML policy file merged over it (validated; errors name the key)."""
    policy = Policy()
    if path is None:
        return policy
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"policy file {path} does not exist; give a YAML file such as "
            "`metrics: {images_per_s: 5, peak_mem_allocated_gib: 2}`."
        )
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(
            f"policy file {path} is not valid YAML{where}: {getattr(err, 'problem', err)}."
        ) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(
            f"policy file {path} must be a YAML mapping with keys {', '.join(POLICY_KEYS)}; "
            f"got a {type(raw).__name__}."
        )
    unknown = [k for k in raw if k not in POLICY_KEYS]
    if unknown:
        raise UserError(
            f"policy file {path}: unknown key(s) {', '.join(map(str, unknown))}; valid keys: "
            f"{', '.join(POLICY_KEYS)}."
        )
    policy.source = str(path)
    if "alpha" in raw:
        a = raw["alpha"]
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < 1:
            raise UserError(
                f"policy file {path}: `alpha` must be a number between 0 and 1 (e.g. 0.01), got {a!r}."
            )
        policy.alpha = float(a)
    if "min_samples" in raw:
        n = raw["min_samples"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise UserError(f"policy file {path}: `min_samples` must be an integer >= 2, got {n!r}.")
        policy.min_samples = n
    if "fail_on_missing" in raw:
        if not isinstance(raw["fail_on_missing"], bool):
            raise UserError(f"policy file {path}: `fail_on_missing` must be true or false.")
        policy.fail_on_missing = raw["fail_on_missing"]
    if "metrics" in raw:
        for name, rule in _rules(raw["metrics"], "metrics", path).items():
            if rule is None:
                policy.rules.pop(name, None)
            else:
                policy.rules[name] = rule
    overrides = raw.get("overrides") or []
    if not isinstance(overrides, list):
        raise UserError(
            f"policy file {path}: `overrides` must be a list of {{match: {{...}}, metrics: {{...}}}}."
        )
    for i, o in enumerate(overrides):
        where = f"overrides[{i}]"
        if not isinstance(o, dict) or set(o) - {"match", "metrics"} or "match" not in o or "metrics" not in o:
            raise UserError(
                f"policy file {path}: `{where}` must be a mapping with exactly `match` (config knobs, "
                "e.g. {model: DiT-S/8}) and `metrics` (thresholds)."
            )
        match = o["match"]
        if not isinstance(match, dict) or not match:
            raise UserError(
                f"policy file {path}: `{where}.match` must be a non-empty mapping of config knob to "
                "value, e.g. {model: DiT-S/8, precision: fp16}."
            )
        policy.overrides.append(Override(flatten(match), _rules(o["metrics"], f"{where}.metrics", path)))
    return policy


# ------------------------------------------------------------------------------------------ result


@dataclass
class MetricDelta:
    metric: str
    label: str
    base: float
    new: float
    change_pct: float  # signed: (new - base) / base
    threshold_pct: float
    verdict: str  # regression | improvement | unchanged | noise
    significance: str  # "p=0.0012", "not tested (n=3/20 < 5)", "no per-step samples"
    p_value: float | None = None


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


VERDICTS = (
    "regression",
    "new failure",
    "improved",
    "pass",
    "fixed",
    "still failing",
    "no longer measured",
    "only in base",
    "only in new",
)
FAILING_VERDICTS = ("regression", "new failure")


@dataclass
class Comparison:
    base_path: str
    new_path: str
    cells: list[CellResult]
    env_differences: dict[str, tuple[list[str], list[str]]]
    policy: Policy
    env: dict[str, str]

    @property
    def regressions(self) -> list[CellResult]:
        return [c for c in self.cells if c.verdict in FAILING_VERDICTS]

    @property
    def failed(self) -> bool:
        if self.regressions:
            return True
        return self.policy.fail_on_missing and any(c.verdict == "only in base" for c in self.cells)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in self.cells)

    def to_json(self) -> dict[str, Any]:
        return {
            "result": "regression" if self.failed else "pass",
            "exit_code": self.exit_code,
            "base": self.base_path,
            "new": self.new_path,
            "counts": {v: self.count(v) for v in VERDICTS},
            "env": self.env,
            "env_differences": {k: {"base": b, "new": n} for k, (b, n) in self.env_differences.items()},
            "policy": {
                "source": self.policy.source,
                "alpha": self.policy.alpha,
                "min_samples": self.policy.min_samples,
                "fail_on_missing": self.policy.fail_on_missing,
                "thresholds_pct": {k: r.threshold_pct for k, r in self.policy.rules.items()},
            },
            "cells": [asdict(c) for c in self.cells],
        }


class EnvMismatchError(UserError):
    """The two runs come from different hardware or software; comparing them would mislead."""

    def __init__(self, message: str, differences: dict[str, tuple[list[str], list[str]]]):
        super().__init__(message)
        self.differences = differences


# ------------------------------------------------------------------------------------------ logic


def _env_fingerprint(record: dict[str, Any]) -> dict[str, str]:
    env = record.get("env") or {}
    keys = ENV_KEYS if env.get("gpu_name") else ENV_KEYS + ENV_KEYS_CPU
    return {k: str(env.get(k)) for k in keys}


def env_differences(base: pd.DataFrame, new: pd.DataFrame, common: list[str]) -> dict[str, tuple[list, list]]:
    """key -> (base values, new values) for fingerprint keys that differ between matched cells."""
    b = base.set_index("cell_id")["record"]
    n = new.set_index("cell_id")["record"]
    ids = common or []
    pairs = [(_env_fingerprint(b[i]), _env_fingerprint(n[i])) for i in ids]
    diffs: dict[str, tuple[list, list]] = {}
    for fb, fn in pairs:
        for key in sorted(set(fb) | set(fn)):
            if fb.get(key, "None") != fn.get(key, "None"):
                bv, nv = diffs.setdefault(key, ([], []))
                if fb.get(key, "None") not in bv:
                    bv.append(fb.get(key, "None"))
                if fn.get(key, "None") not in nv:
                    nv.append(fn.get(key, "None"))
    return diffs


def _p_min(n: int, m: int) -> float:
    """Smallest two-sided p-value an exact Mann-Whitney U test can give for sample sizes n and m."""
    return min(1.0, 2 / math.comb(n + m, min(n, m)))  # int / int: no float overflow for long windows


def _samples(row: pd.Series) -> list[float]:
    s = row.get(SAMPLES)
    if not isinstance(s, list):
        return []
    return [
        float(x) for x in s if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    ]


def compare_metrics(
    base: pd.Series, new: pd.Series, rules: dict[str, Rule], policy: Policy
) -> tuple[list[MetricDelta], bool]:
    """Every gated metric both rows have; and whether a timing metric crossed its threshold untested."""
    deltas = []
    untested_crossing = False
    bs, ns = _samples(base), _samples(new)
    enough = len(bs) >= policy.min_samples and len(ns) >= policy.min_samples
    testable = enough and _p_min(len(bs), len(ns)) < policy.alpha
    test: tuple[float, float] | None = None

    def significance_test() -> tuple[float, float]:
        """(p-value, shift of the median step time; > 0: steps got slower), computed once, on demand."""
        nonlocal test
        if test is None:
            p = float(mannwhitneyu(ns, bs, alternative="two-sided").pvalue)
            test = (p, float(np.median(ns) - np.median(bs)))
        return test

    for name, rule in rules.items():
        metric = METRICS[name]
        b, n = value(base, metric.column), value(new, metric.column)
        if b is None or n is None or b == 0:
            continue
        change = (n - b) / abs(b) * 100
        worse = -change if metric.direction == HIGHER else change  # > 0: moved the wrong way
        big = abs(n - b) >= rule.min_abs
        crossed_bad = worse > rule.threshold_pct and big
        crossed_good = -worse > rule.threshold_pct and big
        if not metric.timed:
            significance, significant_bad, significant_good = (
                "no per-step samples (threshold decides)",
                True,
                True,
            )
        elif not (crossed_bad or crossed_good):
            # Significance only matters once a threshold is crossed; skipping it keeps big gates fast.
            significance, significant_bad, significant_good = "within threshold (not tested)", False, False
        elif testable:
            p_value, sample_shift = significance_test()
            significance = f"p={p_value:.2g}"
            # Slower steps mean lower throughput and higher step time alike.
            significant_bad = p_value < policy.alpha and sample_shift > 0
            significant_good = p_value < policy.alpha and sample_shift < 0
        else:
            why = (
                f"n={len(bs)}/{len(ns)} < {policy.min_samples}"
                if not enough
                else f"n={len(bs)}/{len(ns)} cannot reach p<{policy.alpha:g}"
            )
            significance = f"not tested ({why}; threshold decides)"
            significant_bad = significant_good = True
            untested_crossing = True
        if crossed_bad:
            verdict = "regression" if significant_bad else "noise"
        elif crossed_good:
            verdict = "improvement" if significant_good else "noise"
        else:
            verdict = "unchanged"
        deltas.append(
            MetricDelta(
                name,
                metric.label,
                b,
                n,
                change,
                rule.threshold_pct,
                verdict,
                significance,
                test[0] if metric.timed and test is not None and (crossed_bad or crossed_good) else None,
            )
        )
    return deltas, untested_crossing


def compare_frames(
    base: pd.DataFrame,
    new: pd.DataFrame,
    policy: Policy | None = None,
    allow_env_mismatch: bool = False,
    base_path: str = "BASE",
    new_path: str = "NEW",
) -> Comparison:
    """Compare two loaded runs (one row per cell_id each); raises EnvMismatchError unless allowed."""
    from ditbench.report.analysis import knobs  # analysis pulls in more than the gate needs at import

    policy = policy or Policy()
    base_rows = {r["cell_id"]: r for _, r in base.iterrows()}
    new_rows = {r["cell_id"]: r for _, r in new.iterrows()}
    common = [c for c in base_rows if c in new_rows]
    if not common:
        raise UserError(
            f"no cell of {new_path} matches a cell of {base_path} (cells match by cell_id, a hash of the "
            f"whole cell config; {len(base_rows)} cells vs {len(new_rows)}). Are these runs of the same "
            "suite, and was the suite file changed since the baseline? A gate that compares nothing "
            "cannot pass; refresh the baseline if the suite changed on purpose."
        )
    diffs = env_differences(base, new, common)
    if diffs and not allow_env_mismatch:
        text = "; ".join(f"{k}: {', '.join(b)} (base) vs {', '.join(n)} (new)" for k, (b, n) in diffs.items())
        raise EnvMismatchError(
            f"{base_path} and {new_path} were measured on different hardware or software ({text}). "
            "Speed and memory from different stacks are not comparable, so the gate refuses. Re-measure "
            "the baseline on this machine (see the README on refreshing the baseline), or pass "
            "--allow-env-mismatch to compare anyway.",
            diffs,
        )
    cells: list[CellResult] = []
    for cid in list(base_rows) + [c for c in new_rows if c not in base_rows]:
        b, n = base_rows.get(cid), new_rows.get(cid)
        name = str((n if n is not None else b).get("cell_name") or cid)
        if n is None:
            cells.append(CellResult(cid, name, "only in base", b["status"], None))
            continue
        if b is None:
            cells.append(CellResult(cid, name, "only in new", None, n["status"]))
            continue
        bs, ns = b["status"], n["status"]
        reason = n.get("reason") if isinstance(n.get("reason"), str) else None
        if bs == "ok" and ns == "ok":
            deltas, untested = compare_metrics(b, n, policy.rules_for(knobs(n["record"])), policy)
            verdicts = {d.verdict for d in deltas}
            verdict = (
                "regression"
                if "regression" in verdicts
                else "improved"
                if "improvement" in verdicts
                else "pass"
            )
            cells.append(CellResult(cid, name, verdict, bs, ns, None, deltas, untested))
        elif bs == "ok" and ns in FAILED:
            cells.append(CellResult(cid, name, "new failure", bs, ns, reason))
        elif bs == "ok":
            cells.append(CellResult(cid, name, "no longer measured", bs, ns, reason))
        elif ns == "ok":
            cells.append(CellResult(cid, name, "fixed", bs, ns))
        else:
            cells.append(CellResult(cid, name, "still failing", bs, ns, reason))
    env = (
        {k: v for k, v in _env_fingerprint(new.iloc[0]["record"]).items() if v != "None"} if len(new) else {}
    )
    return Comparison(base_path, new_path, cells, diffs, policy, env)


def compare_files(
    base_path: str | Path,
    new_path: str | Path,
    policy: Policy | None = None,
    allow_env_mismatch: bool = False,
) -> Comparison:
    from ditbench.report.load import load_results

    base = load_results(base_path)
    new = load_results(new_path)
    return compare_frames(base, new, policy, allow_env_mismatch, str(base_path), str(new_path))


# ------------------------------------------------------------------------------------------ summary


def _fmt(x: float) -> str:
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def _limit(metric: str, threshold_pct: float) -> str:
    """The threshold written the way it bites: -5% for throughput, +2% for memory."""
    return f"{'-' if METRICS[metric].direction == HIGHER else '+'}{threshold_pct:g}%"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary_markdown(c: Comparison) -> str:
    """A summary fit for a pull-request comment or $GITHUB_STEP_SUMMARY."""
    n_reg = len(c.regressions)
    if c.failed:
        head = f"## ❌ ditbench compare: {n_reg} regression{'s' if n_reg != 1 else ''}"
        if not n_reg:
            head = "## ❌ ditbench compare: cells missing from the new run"
    else:
        head = "## ✅ ditbench compare: no regression"
    matched = sum(c_.verdict not in ("only in base", "only in new") for c_ in c.cells)
    counts = ", ".join(f"{c.count(v)} {v}" for v in VERDICTS if c.count(v))
    lines = [
        head,
        "",
        f"Base `{c.base_path}` vs new `{c.new_path}`: {matched} cells matched ({counts}).",
        "Environment: " + (", ".join(f"{k} {v}" for k, v in c.env.items()) or "unknown") + ".",
    ]
    if c.env_differences:
        lines += [
            "",
            "> ⚠️ **Environments differ** (compared anyway with --allow-env-mismatch): "
            + "; ".join(f"{k}: {', '.join(b)} → {', '.join(n)}" for k, (b, n) in c.env_differences.items())
            + ".",
        ]

    def metric_rows(verdicts: tuple[str, ...], metric_verdicts: tuple[str, ...]) -> list[str]:
        rows = []
        for cell in c.cells:
            if cell.verdict not in verdicts:
                continue
            for d in cell.metrics:
                if d.verdict in metric_verdicts:
                    rows.append(
                        f"| {_md(cell.cell_name)} | {d.label} | {_fmt(d.base)} | {_fmt(d.new)} | "
                        f"{d.change_pct:+.1f}% | {_limit(d.metric, d.threshold_pct)} | "
                        f"{_md(d.significance)} |"
                    )
        return rows

    header = [
        "| cell | metric | base | new | change | threshold | significance |",
        "|---|---|---|---|---|---|---|",
    ]
    reg = metric_rows(("regression",), ("regression",))
    if reg:
        lines += ["", "### Regressions", ""] + header + reg
    sections = [
        ("new failure", "New failures (ok before)"),
        ("fixed", "Fixed (failed before, ok now)"),
        ("no longer measured", "No longer measured (ok before, not run now)"),
        ("still failing", "Still failing"),
    ]
    for verdict, title in sections:
        rows = [
            f"| {_md(x.cell_name)} | {x.base_status} → {x.new_status} | {_md(x.reason or '')} |"
            for x in c.cells
            if x.verdict == verdict
        ]
        if rows:
            lines += ["", f"### {title}", "", "| cell | status | reason |", "|---|---|---|"] + rows
    imp = metric_rows(("improved", "regression"), ("improvement",))
    if imp:
        lines += ["", "### Improvements", ""] + header + imp
    noise = metric_rows(("pass", "improved", "regression"), ("noise",))
    if noise:
        lines += ["", "### Beyond the threshold but not significant (not counted)", ""] + header + noise
    untested = [x for x in c.cells if x.untested]
    if untested:
        lines += [
            "",
            f"**Significance not tested** for {len(untested)} cell(s) with a change beyond the threshold: "
            f"fewer than {c.policy.min_samples} per-step samples on a side (or too few to reach "
            f"p<{c.policy.alpha:g}), so the threshold alone decided: "
            + ", ".join(f"`{x.cell_name}`" for x in untested[:10])
            + ("…" if len(untested) > 10 else "")
            + ".",
        ]
    for verdict, title in (
        ("only in base", "Missing from the new run"),
        ("only in new", "New cells (no baseline)"),
    ):
        rows = [
            f"| {_md(x.cell_name)} | `{x.cell_id}` | {x.base_status or x.new_status} |"
            for x in c.cells
            if x.verdict == verdict
        ]
        if rows:
            fail = (
                " (fails the gate: fail_on_missing)"
                if verdict == "only in base" and c.policy.fail_on_missing
                else ""
            )
            lines += ["", f"### {title}{fail}", "", "| cell | cell_id | status |", "|---|---|---|"] + rows
    shown = [m for m in METRICS if m in c.policy.rules][:4]
    all_rows = []
    # Changed cells first; the table is capped so the summary fits a pull-request comment (65,536 chars).
    ordered = sorted(c.cells, key=lambda x: x.verdict == "pass")
    for x in ordered[:MAX_SUMMARY_ROWS]:
        by = {d.metric: d for d in x.metrics}
        vals = []
        for m in shown:
            d = by.get(m)
            vals.append(f"{_fmt(d.new)} ({d.change_pct:+.1f}%)" if d else "—")
        status = x.new_status if x.base_status == x.new_status else f"{x.base_status} → {x.new_status}"
        all_rows.append(f"| {_md(x.cell_name)} | {status} | " + " | ".join(vals) + f" | {x.verdict} |")
    lines += (
        [
            "",
            "<details><summary>All cells</summary>",
            "",
            "| cell | status | " + " | ".join(METRICS[m].label for m in shown) + " | verdict |",
            "|---|---|" + "---|" * len(shown) + "---|",
        ]
        + all_rows
        + (
            [f"| … {len(ordered) - MAX_SUMMARY_ROWS} more cells (all pass); see `--json` | | |"]
            if len(ordered) > MAX_SUMMARY_ROWS
            else []
        )
        + ["", "</details>"]
    )
    rules = ", ".join(f"{METRICS[k].label} {_limit(k, r.threshold_pct)}" for k, r in c.policy.rules.items())
    lines += [
        "",
        f"Policy ({c.policy.source}): {rules}; a timing change counts only if the per-step times differ "
        f"by a Mann-Whitney U test at p<{c.policy.alpha:g} (tested with ≥{c.policy.min_samples} samples a "
        "side). Memory and FID are gated on the threshold alone.",
    ]
    return "\n".join(lines) + "\n"


def refusal_markdown(base_path: str, new_path: str, err: EnvMismatchError) -> str:
    rows = [f"| {k} | {', '.join(b)} | {', '.join(n)} |" for k, (b, n) in err.differences.items()]
    return (
        "\n".join(
            [
                "## ⛔ ditbench compare: refused, environments differ",
                "",
                f"`{base_path}` and `{new_path}` were measured on different hardware or software, so their "
                "speed and memory are not comparable. Refresh the baseline on this runner, or pass "
                "`--allow-env-mismatch`.",
                "",
                "| key | base | new |",
                "|---|---|---|",
            ]
            + rows
        )
        + "\n"
    )


def to_json_text(c: Comparison) -> str:
    return json.dumps(c.to_json(), indent=2, default=str)
