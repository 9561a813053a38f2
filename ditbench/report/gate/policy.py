"""The gate's policy: thresholds per metric, the significance test, per-cell overrides, and what may
go uncompared. A YAML policy file is merged over the defaults and validated key by key."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditbench.errors import UserError, shorten
from ditbench.report.gate.metrics import default_thresholds, table
from ditbench.report.load import flatten
from ditbench.yamlio import load_yaml_file

DEFAULT_ALPHA = 0.01
DEFAULT_MIN_SAMPLES = 5
DEFAULT_QUALITY_NOISE_K = 2.0
STEP_SAMPLES = "step_samples"  # allow_incomparable may name it: bad per-step samples skip the test
POLICY_KEYS = (
    "alpha",
    "min_samples",
    "fail_on_missing",
    "allow_incomparable",
    "quality_noise_k",
    "metrics",
    "overrides",
)


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
        default_factory=lambda: {k: Rule(v) for k, v in default_thresholds().items()}
    )
    alpha: float = DEFAULT_ALPHA
    min_samples: int = DEFAULT_MIN_SAMPLES
    fail_on_missing: bool = False
    # Metric names (and STEP_SAMPLES) whose values may be missing or unusable in a cell: such a
    # metric is listed as not compared there instead of refusing the gate. "*" allows every one.
    allow_incomparable: frozenset[str] = frozenset()
    quality_noise_k: float = DEFAULT_QUALITY_NOISE_K  # a quality change must exceed k combined spreads
    overrides: list[Override] = field(default_factory=list)
    explicit: frozenset[str] = frozenset()  # metrics the policy file gives a threshold (must be compared)
    source: str = "defaults"

    def matching(self, knobs: dict[str, Any]) -> list[int]:
        """Indices of the overrides whose match fits these knobs."""
        return [i for i, o in enumerate(self.overrides) if all(knobs.get(k) == v for k, v in o.match.items())]

    def rules_for(self, knobs: dict[str, Any]) -> dict[str, Rule]:
        rules = dict(self.rules)
        for i in self.matching(knobs):
            for name, rule in self.overrides[i].rules.items():
                if rule is None:
                    rules.pop(name, None)
                else:
                    rules[name] = rule
        return rules

    def allows(self, name: str) -> bool:
        return "*" in self.allow_incomparable or name in self.allow_incomparable


def _number(value: Any, where: str, path: str, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{path}: `{where}` must be a number >= {low:g}, got {shorten(value)}.")
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v) or v < low:
        raise UserError(f"{path}: `{where}` must be a finite number >= {low:g}, got {shorten(value)}.")
    return v


def _rules(raw: Any, where: str, path: str) -> dict[str, Rule | None]:
    if not isinstance(raw, dict):
        raise UserError(
            f"{path}: `{where}` must be a mapping of metric name to threshold, e.g. "
            "`images_per_s: 5` or `peak_mem_allocated_gib: {threshold_pct: 2, min_abs: 0.05}`."
        )
    out: dict[str, Rule | None] = {}
    metrics = table()
    for name, spec in raw.items():
        if name not in metrics:
            raise UserError(
                f"{path}: `{where}.{shorten(name, quote=False)}` is not a metric ditbench compares; "
                f"valid metrics: {', '.join(metrics)}."
            )
        key = f"{where}.{name}"
        if spec is None or spec is False:
            out[name] = None  # disabled
            continue
        if spec is True:
            raise UserError(
                f"{path}: `{key}: true` gives no threshold; write a percentage such as "
                f"`{name}: 5`, or `false` to turn the metric off."
            )
        if isinstance(spec, (int, float)):
            spec = {"threshold_pct": spec}
        if not isinstance(spec, dict):
            raise UserError(
                f"{path}: `{key}` must be a number (threshold in percent), a mapping with "
                f"threshold_pct and optional min_abs, or false; got {shorten(spec)}."
            )
        unknown = set(map(str, spec)) - {"threshold_pct", "min_abs"}
        if unknown:
            raise UserError(
                f"{path}: `{key}` has unknown key(s) {shorten(', '.join(sorted(unknown)), quote=False)}; "
                "valid: threshold_pct, min_abs."
            )
        if "threshold_pct" not in spec:
            raise UserError(
                f"{path}: `{key}` needs threshold_pct (percent the metric may move the wrong way)."
            )
        out[name] = Rule(
            _number(spec["threshold_pct"], f"{key}.threshold_pct", path),
            _number(spec.get("min_abs", 0.0), f"{key}.min_abs", path),
        )
    return out


def _allowed(raw: Any, path: str) -> frozenset[str]:
    valid = [*table(), STEP_SAMPLES]
    if raw is True:
        return frozenset({"*"})
    if raw is False or raw is None:
        return frozenset()
    if isinstance(raw, list) and all(isinstance(x, str) and x in valid for x in raw):
        return frozenset(raw)
    bad = (
        next((x for x in raw if not (isinstance(x, str) and x in valid)), raw)
        if isinstance(raw, list)
        else raw
    )
    raise UserError(
        f"{path}: `allow_incomparable` must be true, false or a list of metric names (or "
        f"{STEP_SAMPLES}); {shorten(bad)} is not one. Valid names: {', '.join(valid)}."
    )


def load_policy(path: str | Path | None) -> Policy:
    """The default policy, or a YAML policy file merged over it (validated; errors name the key)."""
    policy = Policy()
    if path is None:
        return policy
    raw = load_yaml_file(path, "policy")
    label = f"policy file {shorten(str(path), 200, quote=False)}"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(
            f"{label} must be a YAML mapping with keys {', '.join(POLICY_KEYS)}; got a {type(raw).__name__}."
        )
    unknown = [str(k) for k in raw if k not in POLICY_KEYS]
    if unknown:
        raise UserError(
            f"{label}: unknown key(s) {shorten(', '.join(unknown), quote=False)}; valid keys: "
            f"{', '.join(POLICY_KEYS)}."
        )
    policy.source = str(path)
    if "alpha" in raw:
        a = raw["alpha"]
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < 1:
            raise UserError(
                f"{label}: `alpha` must be a number between 0 and 1 (e.g. 0.01), got {shorten(a)}."
            )
        policy.alpha = float(a)
    if "min_samples" in raw:
        n = raw["min_samples"]
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 1_000_000:
            raise UserError(f"{label}: `min_samples` must be an integer from 2 to 1000000, got {shorten(n)}.")
        policy.min_samples = n
    if "fail_on_missing" in raw:
        if not isinstance(raw["fail_on_missing"], bool):
            raise UserError(f"{label}: `fail_on_missing` must be true or false.")
        policy.fail_on_missing = raw["fail_on_missing"]
    if "allow_incomparable" in raw:
        policy.allow_incomparable = _allowed(raw["allow_incomparable"], label)
    if "quality_noise_k" in raw:
        policy.quality_noise_k = _number(raw["quality_noise_k"], "quality_noise_k", label)
    explicit = set()
    if "metrics" in raw:
        for name, rule in _rules(raw["metrics"], "metrics", label).items():
            if rule is None:
                policy.rules.pop(name, None)
            else:
                policy.rules[name] = rule
                explicit.add(name)
    overrides = raw.get("overrides") or []
    if not isinstance(overrides, list):
        raise UserError(f"{label}: `overrides` must be a list of {{match: {{...}}, metrics: {{...}}}}.")
    for i, o in enumerate(overrides):
        where = f"overrides[{i}]"
        if not isinstance(o, dict) or set(o) != {"match", "metrics"}:
            raise UserError(
                f"{label}: `{where}` must be a mapping with exactly `match` (config knobs, "
                "e.g. {model: DiT-S/8}) and `metrics` (thresholds)."
            )
        match = o["match"]
        if not isinstance(match, dict) or not match:
            raise UserError(
                f"{label}: `{where}.match` must be a non-empty mapping of config knob to "
                "value, e.g. {model: DiT-S/8, precision: fp16}."
            )
        rules = _rules(o["metrics"], f"{where}.metrics", label)
        explicit.update(name for name, rule in rules.items() if rule is not None)
        policy.overrides.append(Override(flatten(match), rules))
    policy.explicit = frozenset(explicit)
    return policy
