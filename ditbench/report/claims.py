"""Claims files: statements about DiT training resources that a run can check (format: docs/reports.md;
claims/dit_resource_guide.yaml is one). The whole file is validated before anything is checked: every
mistake names the file and key path."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator

from ditbench.core.errors import UserError, did_you_mean, shorten
from ditbench.core.validation import check, refuse, unknown_key
from ditbench.files.yamlio import load_yaml_file
from ditbench.hardware.cards import find_card
from ditbench.metrics import registry
from ditbench.records.metrics import IMAGES_PER_S, MFU, STEPS_PER_S
from ditbench.report.cells import knobs

# metric -> (kind, unit, what it is): the record's own (records.metrics) and figures derived from a
# record. Memory is the figure that decides fit (ditbench.report.memory).
METRICS: dict[str, tuple[str, str, str]] = {
    "peak_memory_gib": ("memory", "GiB", "peak memory that decides fit (reserved + CUDA context)"),
    "peak_memory_gb": ("memory", "GB", "the same in GB of 10^9 bytes"),
    "peak_allocated_gib": ("memory", "GiB", "the allocator's peak allocated memory"),
    STEPS_PER_S.name: ("speed", STEPS_PER_S.unit, "training steps per second at the cell's global batch"),
    IMAGES_PER_S.name: ("speed", IMAGES_PER_S.unit, "training images per second (all GPUs)"),
    "step_time": ("speed", "s", "median time of one training step, in seconds"),
    "days_to_target": ("speed", "days", "days to the report's target number of steps"),
    "gpu_hours_per_million_images": ("speed", "GPU-hours", "GPU-hours per million training images"),
    MFU.name: ("speed", MFU.unit, "model FLOPs utilisation, 0 to 1"),
}


def claimable() -> list[str]:
    """The metrics a claim may name: the table above, then the metric registry's quality outputs."""
    return [*METRICS, *(o.key for o in registry.quality_outputs())]


def metric_kind(metric: str) -> str:
    """memory, speed (both above), or quality: a registry output, read from the last evaluation."""
    return METRICS[metric][0] if metric in METRICS else "quality"


GIB_TO_GB = 2**30 / 1e9
_ABSENT = object()
CELL_EXPECTS = ("value", "range", "at_most", "at_least", "fits")
COMPARE_EXPECTS = ("ratio", "ratio_range")
DEFAULT_TOLERANCE_PCT = 10.0
MAX_CLAIMS = 1000
MAX_TEXT = 500
# Knobs a selector may name beyond the suite's matrix knobs.
EXTRA_SELECTOR_KEYS = ("device", "card", "gpu_memory_gib")


@dataclass(frozen=True)
class ClaimsFile:
    path: str
    source: str | None
    card: str | None
    claims: list[Claim]


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise refuse(f"expected non-empty text, got {_kind(value)}.")
    if len(value) > MAX_TEXT:
        raise refuse(f"text of {len(value):,} characters; at most {MAX_TEXT} are kept.")
    return value.strip()


def _card(value: Any) -> str:
    try:
        return find_card(_text(value)).name
    except UserError as err:
        raise refuse(str(err)) from None


def _pair(value: Any) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise refuse(f"expected [low, high], two numbers, got {_kind(value)}.")
    low, high = (_number(x, at=f"[{i}]") for i, x in enumerate(value))
    if low > high:
        raise refuse(f"low {low:g} is above high {high:g}; write [low, high].")
    return low, high


def _number(value: Any, positive: bool = False, at: str = "") -> float:
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) < value < 2**63:
        digits = len(str(abs(value)))  # beyond floats and what a report table holds
        raise refuse(f"expected a number within 64 bits, got one of {digits} digits.", at)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise refuse(f"expected a finite number, got {_kind(value)}.", at)
    if positive and value <= 0:
        raise refuse(f"expected a number greater than 0, got {shorten(value)}.", at)
    return float(value)


def _fits(value: Any) -> str | float:
    """A card name (its canonical name) or GiB."""
    if isinstance(value, str):
        return _card(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise refuse(f"expected a card name (e.g. RTX 4090) or a number of GiB, got {_kind(value)}.")
    return _number(value, positive=True)


def _tolerance(value: Any) -> float:
    tol = _number(value)
    if not 0 <= tol < 100:
        raise refuse(f"expected a percentage from 0 to below 100, got {tol:g}.")
    return tol


def _selector(value: Any) -> dict[str, Any]:
    """Knobs of the suite (a value or a list of allowed values), each checked as the knob checks it."""
    from ditbench.spec.knobs import KNOBS, PartialKnobs

    if not isinstance(value, dict):
        raise refuse(f"expected a mapping (key: value), got {_kind(value)}.")
    valid = (*KNOBS, *EXTRA_SELECTOR_KEYS)
    out: dict[str, Any] = {}
    for key, v in value.items():
        if key not in valid:
            raise refuse(unknown_key(key, valid), str(key))
        allowed = list(v) if isinstance(v, list) else [v]
        if not allowed:
            raise refuse("an empty list matches no cell; give a value or a list of values.", key)
        for i, x in enumerate(allowed):
            at = f"{key}[{i}]" if isinstance(v, list) else key
            if isinstance(x, (dict, list)) or x is None:
                raise refuse(f"expected a knob value (text, number, true/false), got {_kind(x)}.", at)
            if isinstance(x, float) and not math.isfinite(x):
                raise refuse(f"expected a finite value, got {x}.", at)
            if key in KNOBS:
                try:
                    allowed[i] = getattr(PartialKnobs(**{key: x}), key)
                except UserError as err:
                    raise refuse(f"{err}.", at) from None
        out[key] = allowed if isinstance(v, list) else allowed[0]
    return out


Text = Annotated[str, BeforeValidator(_text)]
Card = Annotated[str, BeforeValidator(_card)]
Selector = Annotated[dict[str, Any], BeforeValidator(_selector)]
Number = Annotated[float, BeforeValidator(_number)]
Positive = Annotated[float, BeforeValidator(lambda v: _number(v, positive=True))]
Pair = Annotated[tuple[float, float], BeforeValidator(_pair)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CompareFile(_Strict):
    model_config = ConfigDict(title="`compare`")
    from_: Selector = Field(alias="from", description="the cells' knobs on that side")
    to: Selector = Field(description="the cells' knobs on that side")

    @model_validator(mode="after")
    def _a_change(self) -> CompareFile:
        for side, sel in (("from", self.from_), ("to", self.to)):
            if not sel or any(isinstance(v, list) for v in sel.values()):
                raise refuse("give one value per knob (e.g. {precision: fp16}).", side)
        if self.from_ == self.to:
            raise refuse("`from` and `to` are the same cells; the comparison needs a change.")
        return self


class Claim(_Strict):
    """One claim as validated; `stated` is its expectation as written (22, [1.2, 1.3], "RTX 4090")."""

    model_config = ConfigDict(title="a claim")
    says: Text = Field(description="the statement, as its source words it")
    cell: Selector | None = None
    compare: CompareFile | None = Field(None, description="a mapping (key: value): {from: ..., to: ...}")
    metric: Any = None
    value: Positive | None = None
    range: Pair | None = None
    at_most: Number | None = None
    at_least: Number | None = None
    fits: Annotated[str | float, BeforeValidator(_fits)] | None = None
    ratio: Positive | None = None
    ratio_range: Pair | None = None
    tolerance_pct: Annotated[float, BeforeValidator(_tolerance)] | None = None
    card: Card | None = None  # the card the claim's absolute speeds are about (else the file's)
    note: Text | None = None
    _stated: Any = PrivateAttr(None)

    @property
    def expect(self) -> str:
        return next(k for k in (*CELL_EXPECTS, *COMPARE_EXPECTS) if getattr(self, k) is not None)

    @property
    def kind(self) -> str:
        return "compare" if self.compare is not None else "fits" if self.expect == "fits" else "cell"

    @property
    def stated(self) -> Any:
        return self._stated

    @property
    def change_from(self) -> dict[str, Any] | None:
        return self.compare.from_ if self.compare else None

    @property
    def change_to(self) -> dict[str, Any] | None:
        return self.compare.to if self.compare else None

    @property
    def fits_card(self) -> str | None:
        """The card a `fits` claim names (its canonical name), None for GiB or another claim."""
        return self.fits if isinstance(self.fits, str) else None

    @property
    def fits_gib(self) -> float | None:
        return find_card(self.fits).usable_gib if self.fits_card else self.fits

    @property
    def low(self) -> float:
        return self.accepted[0]

    @property
    def high(self) -> float:
        return self.accepted[1]

    @property
    def accepted(self) -> tuple[float, float]:
        """The accepted interval, tolerance applied (-inf / inf when open)."""
        expect = self.expect
        value = getattr(self, expect)
        if expect in ("value", "ratio"):
            return value * (1 - self.tolerance_pct / 100), value * (1 + self.tolerance_pct / 100)
        if expect in ("range", "ratio_range"):
            return value
        if expect == "at_least":
            return value, math.inf
        return -math.inf, self.fits_gib if expect == "fits" else value

    @model_validator(mode="wrap")
    @classmethod
    def _one_expectation(cls, item: Any, handler: Any) -> Claim:
        """The rules between keys, in the order a reader fixes them (before the values are read)."""
        if not isinstance(item, dict):
            raise refuse(f"expected a mapping (key: value), got {_kind(item)}.")
        if not set(item) <= set(cls.model_fields):
            return handler(item)  # the unknown key is the first thing to say
        expects = [k for k in (*CELL_EXPECTS, *COMPARE_EXPECTS) if k in item]
        if len(expects) != 1:
            listed = ", ".join(f"`{k}`" for k in (*CELL_EXPECTS, *COMPARE_EXPECTS))
            got = f"got {', '.join(expects)}" if expects else "got none"
            raise refuse(f"a claim states exactly one expectation, one of {listed}; {got}.")
        expect = expects[0]
        if "compare" in item and expect not in COMPARE_EXPECTS:
            raise refuse("a `compare` claim states `ratio` or `ratio_range` (to / from).", expect)
        if "compare" not in item and expect in COMPARE_EXPECTS:
            raise refuse(f"`{expect}` compares cells: add `compare: {{from: ..., to: ...}}`.", expect)
        metric = item.get("metric")
        if expect == "fits" and metric is not None:
            raise refuse("a `fits` claim is about memory; leave `metric` out.", "metric")
        valid = claimable()
        if expect != "fits" and metric not in valid:
            hint = did_you_mean(metric, valid)
            raise refuse(f"unknown metric {shorten(metric)}.{hint} Valid: {', '.join(valid)}.", "metric")
        if "tolerance_pct" in item and expect not in ("value", "ratio"):
            raise refuse("a tolerance goes with `value` or `ratio` only.", "tolerance_pct")
        if item[expect] is None:
            raise refuse("expected a value, got nothing.", expect)
        if expect in ("value", "ratio") and item.get("tolerance_pct") is None:
            item = {**item, "tolerance_pct": DEFAULT_TOLERANCE_PCT}
        claim = handler({**item, "cell": {}} if item.get("cell") is None else item)
        claim._stated = item[expect]
        return claim


class ClaimsDocument(_Strict):
    source: Text | None = None
    card: Card | None = None
    claims: list[Claim] = Field(
        min_length=1,
        max_length=MAX_CLAIMS,
        description=f"a non-empty list of claims (at most {MAX_CLAIMS:,})",
    )


def _kind(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "text", bool: "true/false", type(None): "nothing"}
    return f"{names.get(type(value), 'a ' + type(value).__name__)} {shorten(value)}"


def parse_claims(raw: Any, path: str = "<claims>") -> ClaimsFile:
    """Validate a parsed claims document; raise UserError naming the key path on any mistake."""
    label = f"claims {shorten(path, 200, quote=False)}"
    if raw is None:
        raise UserError(f"{label}: the file is empty; a claims file needs a `claims:` list.")
    if not isinstance(raw, dict):
        raise UserError(f"{label}: expected a mapping (key: value), got {_kind(raw)}.")
    doc = check(ClaimsDocument, raw, label, where_first=True)
    return ClaimsFile(
        path, doc.source, doc.card, [c.model_copy(update={"card": c.card or doc.card}) for c in doc.claims]
    )


# The claims files shipped in the package (package data); the repository's claims/ links here.
CLAIMS_DIR = Path(__file__).resolve().parent.parent / "claims"


def resolve_claims(arg: str | Path) -> Path:
    """The claims file `arg` means: an existing path as given, else a shipped one of that name
    (`--claims dit_resource_guide`), as suites resolve."""
    from ditbench.spec.suite import resolve_shipped

    return resolve_shipped(arg, CLAIMS_DIR, "claims file")


def load_claims(path: str | Path) -> ClaimsFile:
    """Read and validate a claims file (bounded, UTF-8, no duplicate keys: see ditbench.files.yamlio)."""
    return parse_claims(load_yaml_file(path, "claims"), str(path))


# ------------------------------------------------------------------------------ as a report says it


def gb_scale(metric: str | None) -> float:
    """The factor from GiB to the metric's memory unit."""
    return GIB_TO_GB if metric == "peak_memory_gb" else 1


def _unit(metric: str) -> str:
    return METRICS[metric][1] if metric in METRICS else ""  # a quality figure has none


def fmt(v: float, metric: str | None) -> str:
    if metric == MFU.name:
        return MFU.show(v)
    if metric is not None and metric_kind(metric) == "quality":
        return registry.OUTPUTS[metric].fmt.format(v)
    unit = _unit(metric) if metric else "GiB"
    if unit in ("GiB", "GB"):
        return f"{v:.2f} {unit}"  # as every memory figure in the report
    text = f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return f"{text} {unit}".rstrip()


def claimed_text(claim: Claim) -> str:
    m, tol, low, high = claim.metric, claim.tolerance_pct, claim.low, claim.high
    if claim.expect == "fits":
        gib = claim.fits_gib
        return f"fits {claim.fits_card} ({gib:g} GiB)" if claim.fits_card else f"fits {gib:g} GiB"
    if claim.expect == "ratio":
        return f"{m} to/from ×{float(claim.stated):g} ± {tol:g}% ({low:.3g}–{high:.3g})"
    if claim.expect == "ratio_range":
        return f"{m} to/from ×{low:.3g}–{high:.3g}"
    if claim.expect == "at_most":
        return f"at most {fmt(high, m)}"
    if claim.expect == "at_least":
        return f"at least {fmt(low, m)}"
    unit = _unit(m) if m and m != MFU.name else ""  # said once, after the upper end
    interval = f"{fmt(low, m).removesuffix(unit).strip() if unit else fmt(low, m)}–{fmt(high, m)}"
    return interval if claim.expect == "range" else f"{fmt(float(claim.stated), m)} ± {tol:g}% ({interval})"


def spread(values: list[float], metric: str | None) -> str:
    if len(values) == 1:
        return fmt(values[0], metric)
    return f"{fmt(min(values), metric)} to {fmt(max(values), metric)} over {len(values)} cells"


# ------------------------------------------------------------------------------ which cells it means


def _listed(want: Any) -> list[Any]:
    return want if isinstance(want, list) else [want]


def _equal(have: Any, want: Any) -> bool:
    if isinstance(have, bool) or isinstance(want, bool):
        return have is want
    return have == want


def matches(k: dict[str, Any], selector: dict[str, Any]) -> bool:
    return all(any(_equal(k.get(key, _ABSENT), w) for w in _listed(want)) for key, want in selector.items())


def why_no_match(df: pd.DataFrame, selector: dict[str, Any]) -> str:
    all_knobs = [knobs(r) for r in df["record"]]
    for key, want in selector.items():
        present = list(dict.fromkeys(str(k.get(key, "(not set)")) for k in all_knobs))
        if not any(_equal(k.get(key, _ABSENT), w) for k in all_knobs for w in _listed(want)):
            listed = ", ".join(present[:8]) + (", ..." if len(present) > 8 else "")
            return f"no cell in this run has {key} = {want} (it has {listed})"
    return f"no cell in this run matches {selector_text(selector)} as a whole"


def selector_text(selector: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in selector.items())
