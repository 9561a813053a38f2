"""The gate's policy: thresholds per metric, the significance test, per-cell overrides, and what may
go uncompared. A YAML policy file is merged over the defaults; `PolicyFile` (pydantic) validates it,
and every mistake is one paragraph naming the file and the key path (`ditbench.core.validation`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from ditbench.core.errors import UserError, shorten
from ditbench.core.validation import check, refuse
from ditbench.files.yamlio import load_yaml_file
from ditbench.records.metrics import IMAGES_PER_S, PEAK_ALLOCATED, default_thresholds, table
from ditbench.report.load import flatten
from ditbench.report.quality import DEFAULT_QUALITY_NOISE_K

DEFAULT_ALPHA = 0.01
DEFAULT_MIN_SAMPLES = 5
STEP_SAMPLES = "step_samples"  # allow_incomparable may name it: bad per-step samples skip the test
FINITE = "a finite number >= 0"
Amount = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True, description=FINITE)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rule(_Strict):
    threshold_pct: Amount = Field(description=f"{FINITE} (percent the metric may move the wrong way)")
    min_abs: Amount = 0.0  # changes smaller than this (in the metric's unit) never count


def _threshold(name: str, value: Any) -> Any:
    """A threshold as written: a percentage, {threshold_pct, min_abs}, or false/null (turned off)."""
    if value is None or value is False:
        return None
    if value is True:
        raise refuse(
            f"`{{where}}.{name}: true` gives no threshold; write a percentage such as `{name}: 5`, or "
            "`false` to turn the metric off."
        )
    if isinstance(value, (int, float)):
        return {"threshold_pct": value}
    if not isinstance(value, dict):
        raise refuse(
            f"`{{where}}.{name}` must be a number (threshold in percent), a mapping with threshold_pct "
            f"and optional min_abs, or false; got {shorten(value)}."
        )
    return value


Rules = dict[str, Annotated[Rule | None, Field(description="a threshold")]]
RULES = (
    f"a mapping of metric name to threshold, e.g. `{IMAGES_PER_S.name}: 5` or "
    f"`{PEAK_ALLOCATED.name}: {{threshold_pct: 2, min_abs: 0.05}}`"
)


def _metric_names(value: Any) -> Any:
    if isinstance(value, dict):
        metrics = table()
        for name in value:
            if name not in metrics:
                raise refuse(
                    f"`{{where}}.{shorten(name, quote=False)}` is not a metric ditbench compares; "
                    f"valid metrics: {', '.join(metrics)}."
                )
        return {name: _threshold(name, v) for name, v in value.items()}
    return value


class OverrideFile(_Strict):
    match: dict[str, Any] = Field(
        min_length=1,
        description="a non-empty mapping of config knob to value, e.g. {model: DiT-S/8, precision: fp16}",
    )
    metrics: Rules = Field(description=RULES)

    @model_validator(mode="before")
    @classmethod
    def _exactly(cls, value: Any) -> Any:
        if not isinstance(value, dict) or set(value) != {"match", "metrics"}:
            raise refuse(
                "`{where}` must be a mapping with exactly `match` (config knobs, e.g. {model: DiT-S/8}) "
                "and `metrics` (thresholds)."
            )
        return value

    _names = field_validator("metrics", mode="before")(classmethod(lambda cls, v: _metric_names(v)))


class Settings(_Strict):
    """The policy's keys that are one setting each (the rest: metrics, overrides), in the JSON's order."""

    alpha: float = Field(
        DEFAULT_ALPHA, gt=0, lt=1, strict=True, description="a number between 0 and 1 (e.g. 0.01)"
    )
    min_samples: int = Field(
        DEFAULT_MIN_SAMPLES, ge=2, le=1_000_000, strict=True, description="an integer from 2 to 1000000"
    )
    fail_on_missing: StrictBool = Field(False, description="true or false")
    # Metric names (and STEP_SAMPLES) whose values may be missing or unusable in a cell: such a
    # metric is listed as not compared there instead of refusing the gate. "*" allows every one.
    allow_incomparable: frozenset[str] = frozenset()
    # Cells (name substrings or ids; "*" every one) that may stop running: ok in the base, skipped,
    # unsupported or failed in the new run. Any other such cell is a regression.
    allow_stopped: frozenset[str] = frozenset()
    quality_noise_k: Amount = DEFAULT_QUALITY_NOISE_K  # a quality change must exceed k combined spreads
    inconclusive: Literal["inconclusive", "pass", "fail"] = Field(
        "inconclusive",
        description="one of inconclusive (exit 3), pass (exit 0) or fail (exit 1): what a cell whose "
        "interval straddles its threshold does to the gate",
    )
    # Quality at different sample counts N is compared (marked weak) instead of refused.
    allow_sample_count_mismatch: StrictBool = Field(False, description="true or false")
    environment: Literal["must_match", "may_differ"] = Field(
        "must_match",
        description="must_match (runs from different hardware or software are refused, exit 2) or "
        "may_differ (they are compared and the differences named: for a policy that gates only what "
        "does not depend on the machine)",
    )

    @field_validator("allow_incomparable", mode="before")
    @classmethod
    def _allowed(cls, raw: Any) -> frozenset[str]:
        valid = [*table(), STEP_SAMPLES]
        if raw is True:
            return frozenset({"*"})
        if raw is False or raw is None:
            return frozenset()
        if isinstance(raw, frozenset):  # a Policy built from one already validated
            return raw
        if isinstance(raw, list) and all(isinstance(x, str) and x in valid for x in raw):
            return frozenset(raw)
        bad = (
            next((x for x in raw if not (isinstance(x, str) and x in valid)), raw)
            if isinstance(raw, list)
            else raw
        )
        raise refuse(
            f"`allow_incomparable` must be true, false or a list of metric names (or {STEP_SAMPLES}); "
            f"{shorten(bad)} is not one. Valid names: {', '.join(valid)}."
        )

    @field_validator("allow_stopped", mode="before")
    @classmethod
    def _stoppable(cls, raw: Any) -> frozenset[str]:
        if raw is True or raw is False or raw is None:
            return frozenset({"*"} if raw else ())
        if isinstance(raw, frozenset):  # a Policy built from one already validated
            return raw
        if isinstance(raw, list) and all(isinstance(x, str) and x.strip() for x in raw):
            return frozenset(raw)
        raise refuse(
            "`allow_stopped` must be true, false or a list of cell-name substrings or cell ids (cells "
            f"that may go from ok to skipped, unsupported or failed without failing the gate); got "
            f"{shorten(raw)}."
        )


class PolicyFile(Settings):
    metrics: Rules = Field(default_factory=dict, description=RULES)
    overrides: list[OverrideFile] = Field(
        default_factory=list, description="a list of {match: {...}, metrics: {...}}"
    )

    _names = field_validator("metrics", mode="before")(classmethod(lambda cls, v: _metric_names(v)))

    @field_validator("overrides", mode="before")
    @classmethod
    def _none_is_empty(cls, raw: Any) -> Any:
        return [] if raw is None else raw


SETTINGS = tuple(Settings.model_fields)


@dataclass
class Override:
    match: dict[str, Any]
    rules: dict[str, Rule | None]


class Policy(Settings):
    """What the gate applies: the settings, the rules (the file's merged over the defaults), the overrides."""

    rules: dict[str, Rule] = Field(
        default_factory=lambda: {k: Rule(threshold_pct=v) for k, v in default_thresholds().items()}
    )
    overrides: list[Override] = Field(default_factory=list)
    explicit: frozenset[str] = frozenset()  # metrics the policy file gives a threshold (must be compared)
    source: str = "defaults"

    def matching(self, knobs: dict[str, Any]) -> list[int]:
        """Indices of the overrides whose match fits these knobs."""
        return [i for i, o in enumerate(self.overrides) if all(knobs.get(k) == v for k, v in o.match.items())]

    def rules_for(self, knobs: dict[str, Any]) -> dict[str, Rule]:
        rules = self.rules
        for i in self.matching(knobs):
            rules = _merged(rules, self.overrides[i].rules)
        return rules

    def settings(self) -> dict[str, Any]:
        """The SETTINGS as the JSON shows them (sets sorted)."""
        shown = {name: getattr(self, name) for name in SETTINGS}
        return {name: sorted(v) if isinstance(v, frozenset) else v for name, v in shown.items()}

    def allows(self, name: str) -> bool:
        return "*" in self.allow_incomparable or name in self.allow_incomparable

    def may_stop(self, cell_id: str, cell_name: str) -> bool:
        return any(p == "*" or p == cell_id or p in cell_name for p in self.allow_stopped)


def _merged(rules: dict[str, Rule], over: dict[str, Rule | None]) -> dict[str, Rule]:
    """rules with `over` merged in; a None in `over` turns its metric off."""
    merged = {**rules, **over}  # a metric keeps its place; a new one comes last
    return {name: rule for name, rule in merged.items() if rule is not None}


def load_policy(path: str | Path | None) -> Policy:
    """The default policy, or a YAML policy file merged over it (validated; errors name the key)."""
    if path is None:
        return Policy()
    raw = load_yaml_file(path, "policy")
    label = f"policy file {shorten(str(path), 200, quote=False)}"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        keys = ", ".join(PolicyFile.model_fields)
        raise UserError(f"{label} must be a YAML mapping with keys {keys}; got a {type(raw).__name__}.")
    given = check(PolicyFile, raw, label)
    explicit = {
        name
        for rules in (given.metrics, *(o.metrics for o in given.overrides))
        for name, r in rules.items()
        if r
    }
    return Policy(
        **{name: getattr(given, name) for name in SETTINGS},
        rules=_merged(Policy().rules, given.metrics),
        overrides=[Override(flatten(o.match), o.metrics) for o in given.overrides],
        explicit=frozenset(explicit),
        source=str(path),
    )
