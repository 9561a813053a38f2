"""Claims files: statements about DiT training resources, written so a run can check them.

```yaml
source: "a blog post on DiT training, 2025"   # optional: where the claims come from
card: "RTX 4090"        # optional: the card the claims' speeds are about (a name from ditbench.cards)
claims:
  - says: "DiT-L/4 in fp32 at batch 16 uses 22 GB"
    cell: {model: DiT-L/4, precision: fp32, grad_ckpt: none, batch_size: 16}
    metric: peak_memory_gib
    value: 22
    tolerance_pct: 15
  - says: "fp16 halves memory"
    compare: {from: {precision: fp32}, to: {precision: fp16}}
    metric: peak_memory_gib
    ratio: 0.5
    tolerance_pct: 15
  - says: "12 GB: DiT-B/8 with fp16"
    cell: {model: DiT-B/8, precision: fp16}
    fits: "RTX 3060 12GB"    # or a number of GiB
```

A claim selects cells with `cell` (knobs of the suite, a value or a list of allowed values) and
states what it expects: of one metric, `value` (+- `tolerance_pct`, default 10), `range: [lo, hi]`,
`at_most` or `at_least`; between cells that differ as `compare.from` -> `compare.to` (the pair
filtered by `cell`), `ratio` (to / from, +- `tolerance_pct`) or `ratio_range`; or `fits` a card.
`card` and `note` may also be set per claim. The file is read through `ditbench.yamlio` and
validated entirely before anything is checked: every mistake names the file and key path.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditbench.cards import find_card
from ditbench.errors import UserError, shorten
from ditbench.yamlio import load_yaml_file

# metric -> (kind, unit, what it is). Memory is the figure that decides fit (ditbench.report.memory).
METRICS: dict[str, tuple[str, str, str]] = {
    "peak_memory_gib": ("memory", "GiB", "peak memory that decides fit (reserved + CUDA context)"),
    "peak_memory_gb": ("memory", "GB", "the same in GB of 10^9 bytes"),
    "peak_allocated_gib": ("memory", "GiB", "the allocator's peak allocated memory"),
    "steps_per_s": ("speed", "steps/s", "training steps per second at the cell's global batch"),
    "images_per_s": ("speed", "images/s", "training images per second (all GPUs)"),
    "step_time": ("speed", "s", "median time of one training step, in seconds"),
    "days_to_target": ("speed", "days", "days to the report's target number of steps"),
    "gpu_hours_per_million_images": ("speed", "GPU-hours", "GPU-hours per million training images"),
    "mfu": ("speed", "", "model FLOPs utilisation, 0 to 1"),
}
CELL_EXPECTS = ("value", "range", "at_most", "at_least", "fits")
COMPARE_EXPECTS = ("ratio", "ratio_range")
CLAIM_KEYS = (
    "says",
    "cell",
    "compare",
    "metric",
    *CELL_EXPECTS,
    *COMPARE_EXPECTS,
    "tolerance_pct",
    "card",
    "note",
)
TOP_KEYS = ("source", "card", "claims")
DEFAULT_TOLERANCE_PCT = 10.0
MAX_CLAIMS = 1000
MAX_TEXT = 500
# Knobs a selector may name beyond the suite's matrix knobs.
EXTRA_SELECTOR_KEYS = ("device", "card", "gpu_memory_gib", "gpu_memory_gb")
INT_KNOBS = ("batch_size", "gpus", "nodes", "image_size", "num_classes", "seed")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")  # the precision policies a record can name


@dataclass(frozen=True)
class Claim:
    index: int
    says: str
    metric: str | None  # None for `fits`
    expect: str  # one of CELL_EXPECTS or COMPARE_EXPECTS
    low: float  # the accepted interval, tolerance applied (-inf / inf when open)
    high: float
    stated: Any  # the expectation as written: 22, [1.2, 1.3], "RTX 4090"
    tolerance_pct: float | None = None
    cell: dict[str, Any] = field(default_factory=dict)
    change_from: dict[str, Any] | None = None
    change_to: dict[str, Any] | None = None
    fits_gib: float | None = None
    fits_card: str | None = None
    card: str | None = None  # the card the claim's absolute speeds are about
    note: str | None = None

    @property
    def kind(self) -> str:
        return "compare" if self.change_from is not None else "fits" if self.expect == "fits" else "cell"


@dataclass(frozen=True)
class ClaimsFile:
    path: str
    source: str | None
    card: str | None
    claims: list[Claim]


class _Check:
    """Error messages that name the file and the key path, like the suite validator's."""

    def __init__(self, path: str):
        self.path = shorten(path, 200, quote=False)

    def fail(self, keypath: str, message: str) -> UserError:
        where = f" at `{keypath}`" if keypath else ""
        return UserError(f"claims {self.path}{where}: {message}")

    def keys(self, keypath: str, value: dict, valid: tuple[str, ...] | list[str]) -> None:
        for key in value:
            if key not in valid:
                close = difflib.get_close_matches(str(key), list(valid), n=1, cutoff=0.5)
                hint = f" Did you mean `{close[0]}`?" if close else ""
                raise self.fail(
                    _join(keypath, str(key)),
                    f"unknown key {shorten(key)}.{hint} Valid keys here: {', '.join(valid)}.",
                )

    def mapping(self, keypath: str, value: Any) -> dict:
        if not isinstance(value, dict):
            raise self.fail(keypath, f"expected a mapping (key: value), got {_kind(value)}.")
        return value

    def text(self, keypath: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(keypath, f"expected non-empty text, got {_kind(value)}.")
        if len(value) > MAX_TEXT:
            raise self.fail(keypath, f"text of {len(value):,} characters; at most {MAX_TEXT} are kept.")
        return value.strip()

    def number(self, keypath: str, value: Any, positive: bool = False) -> float:
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) < value < 2**63:
            digits = len(str(abs(value)))  # beyond floats and what a report table holds
            raise self.fail(keypath, f"expected a number within 64 bits, got one of {digits} digits.")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(keypath, f"expected a finite number, got {_kind(value)}.")
        if positive and value <= 0:
            raise self.fail(keypath, f"expected a number greater than 0, got {shorten(value)}.")
        return float(value)

    def pair(self, keypath: str, value: Any) -> tuple[float, float]:
        if not isinstance(value, list) or len(value) != 2:
            raise self.fail(keypath, f"expected [low, high], two numbers, got {_kind(value)}.")
        low = self.number(f"{keypath}[0]", value[0])
        high = self.number(f"{keypath}[1]", value[1])
        if low > high:
            raise self.fail(keypath, f"low {low:g} is above high {high:g}; write [low, high].")
        return low, high

    def card(self, keypath: str, value: Any) -> str:
        name = self.text(keypath, value)
        try:
            return find_card(name).name
        except UserError as err:
            raise self.fail(keypath, str(err)) from None

    def selector(self, keypath: str, value: Any) -> dict[str, Any]:
        knob_names, model_names = _vocabulary()
        value = self.mapping(keypath, value)
        valid = knob_names + EXTRA_SELECTOR_KEYS
        self.keys(keypath, value, valid)
        out: dict[str, Any] = {}
        for key, v in value.items():
            where = _join(keypath, key)
            allowed = v if isinstance(v, list) else [v]
            if not allowed:
                raise self.fail(where, "an empty list matches no cell; give a value or a list of values.")
            for i, x in enumerate(allowed):
                at = f"{where}[{i}]" if isinstance(v, list) else where
                if isinstance(x, (dict, list)) or x is None:
                    raise self.fail(at, f"expected a knob value (text, number, true/false), got {_kind(x)}.")
                if key == "model" and x not in model_names:
                    close = difflib.get_close_matches(str(x), model_names, n=1, cutoff=0.6)
                    hint = f" Did you mean `{close[0]}`?" if close else ""
                    raise self.fail(at, f"unknown model {shorten(x)}.{hint} Known: {', '.join(model_names)}.")
                if key == "precision" and x not in PRECISIONS:
                    raise self.fail(at, f"unknown precision {shorten(x)}; valid: {', '.join(PRECISIONS)}.")
                if key == "grad_ckpt" and not (
                    x in ("none", "full") or (isinstance(x, str) and re.fullmatch(r"every_[1-9]\d*", x))
                ):
                    raise self.fail(at, f"unknown grad_ckpt {shorten(x)}; valid: none, full, every_K.")
                if key in INT_KNOBS and (isinstance(x, bool) or not isinstance(x, int) or x < 0):
                    raise self.fail(at, f"{key} is a whole number, got {shorten(x)}.")
                if isinstance(x, float) and not math.isfinite(x):
                    raise self.fail(at, f"expected a finite value, got {x}.")
            out[key] = list(allowed) if isinstance(v, list) else v
        return out


def _vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(knob names, model names): the cell contract's, wherever this version of ditbench keeps it."""
    try:
        from ditbench.knobs import FIELDS
        from ditbench.models.configs import MODEL_NAMES
    except ImportError:  # before ditbench.knobs: the suite module held the knob table
        from ditbench.bench.suite import KNOB_DEFAULTS as FIELDS
        from ditbench.models.dit import MODEL_NAMES
    return tuple(FIELDS), tuple(MODEL_NAMES)


def _join(keypath: str, key: str) -> str:
    return f"{keypath}.{key}" if keypath else key


def _kind(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "text", bool: "true/false", type(None): "nothing"}
    return f"{names.get(type(value), 'a ' + type(value).__name__)} {shorten(value)}"


def parse_claims(raw: Any, path: str = "<claims>") -> ClaimsFile:
    """Validate a parsed claims document; raise UserError naming the key path on any mistake."""
    c = _Check(path)
    if raw is None:
        raise c.fail("", "the file is empty; a claims file needs a `claims:` list.")
    raw = c.mapping("", raw)
    c.keys("", raw, TOP_KEYS)
    source = c.text("source", raw["source"]) if raw.get("source") is not None else None
    card = c.card("card", raw["card"]) if raw.get("card") is not None else None
    items = raw.get("claims")
    if not isinstance(items, list) or not items:
        raise c.fail("claims", f"expected a non-empty list of claims, got {_kind(items)}.")
    if len(items) > MAX_CLAIMS:
        raise c.fail("claims", f"{len(items):,} claims; at most {MAX_CLAIMS:,} per file.")
    claims = [_claim(c, f"claims[{i}]", i, item, card) for i, item in enumerate(items)]
    return ClaimsFile(path, source, card, claims)


def _claim(c: _Check, at: str, index: int, item: Any, file_card: str | None) -> Claim:
    item = c.mapping(at, item)
    c.keys(at, item, CLAIM_KEYS)
    if "says" not in item:
        raise c.fail(at, "a claim needs `says`: the statement, as its source words it.")
    says = c.text(f"{at}.says", item["says"])
    cell = c.selector(f"{at}.cell", item["cell"]) if item.get("cell") is not None else {}
    card = c.card(f"{at}.card", item["card"]) if item.get("card") is not None else file_card
    note = c.text(f"{at}.note", item["note"]) if item.get("note") is not None else None
    expects = [k for k in (*CELL_EXPECTS, *COMPARE_EXPECTS) if k in item]
    if len(expects) != 1:
        listed = ", ".join(f"`{k}`" for k in (*CELL_EXPECTS, *COMPARE_EXPECTS))
        got = f"got {', '.join(expects)}" if expects else "got none"
        raise c.fail(at, f"a claim states exactly one expectation, one of {listed}; {got}.")
    expect = expects[0]
    change_from = change_to = None
    if "compare" in item:
        if expect not in COMPARE_EXPECTS:
            raise c.fail(f"{at}.{expect}", "a `compare` claim states `ratio` or `ratio_range` (to / from).")
        cmp = c.mapping(f"{at}.compare", item["compare"])
        c.keys(f"{at}.compare", cmp, ("from", "to"))
        for side in ("from", "to"):
            if side not in cmp:
                raise c.fail(f"{at}.compare", f"`compare` needs `{side}`: the cells' knobs on that side.")
        change_from = c.selector(f"{at}.compare.from", cmp["from"])
        change_to = c.selector(f"{at}.compare.to", cmp["to"])
        for side, sel in (("from", change_from), ("to", change_to)):
            if not sel or any(isinstance(v, list) for v in sel.values()):
                raise c.fail(f"{at}.compare.{side}", "give one value per knob (e.g. {precision: fp16}).")
        if change_from == change_to:
            raise c.fail(
                f"{at}.compare", "`from` and `to` are the same cells; the comparison needs a change."
            )
    elif expect in COMPARE_EXPECTS:
        raise c.fail(f"{at}.{expect}", f"`{expect}` compares cells: add `compare: {{from: ..., to: ...}}`.")
    metric = item.get("metric")
    if expect == "fits":
        if metric is not None:
            raise c.fail(f"{at}.metric", "a `fits` claim is about memory; leave `metric` out.")
    elif metric not in METRICS:
        close = difflib.get_close_matches(str(metric), list(METRICS), n=1, cutoff=0.5)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        raise c.fail(f"{at}.metric", f"unknown metric {shorten(metric)}.{hint} Valid: {', '.join(METRICS)}.")
    tol = None
    if "tolerance_pct" in item:
        if expect not in ("value", "ratio"):
            raise c.fail(f"{at}.tolerance_pct", "a tolerance goes with `value` or `ratio` only.")
        tol = c.number(f"{at}.tolerance_pct", item["tolerance_pct"])
        if not 0 <= tol < 100:
            raise c.fail(f"{at}.tolerance_pct", f"expected a percentage from 0 to below 100, got {tol:g}.")
    elif expect in ("value", "ratio"):
        tol = DEFAULT_TOLERANCE_PCT
    stated = item[expect]
    fits_gib = fits_card = None
    key = f"{at}.{expect}"
    if expect in ("value", "ratio"):
        v = c.number(key, stated, positive=True)
        low, high = v * (1 - tol / 100), v * (1 + tol / 100)
    elif expect in ("range", "ratio_range"):
        low, high = c.pair(key, stated)
    elif expect == "at_most":
        low, high = -math.inf, c.number(key, stated)
    elif expect == "at_least":
        low, high = c.number(key, stated), math.inf
    else:  # fits: a card name or GiB
        if isinstance(stated, str):
            fits_card = c.card(key, stated)
            fits_gib = find_card(fits_card).usable_gib
        elif isinstance(stated, bool) or not isinstance(stated, (int, float)):
            raise c.fail(
                key, f"expected a card name (e.g. RTX 4090) or a number of GiB, got {_kind(stated)}."
            )
        else:
            fits_gib = c.number(key, stated, positive=True)
        low, high = -math.inf, fits_gib
    return Claim(
        index=index,
        says=says,
        metric=metric,
        expect=expect,
        low=low,
        high=high,
        stated=stated,
        tolerance_pct=tol,
        cell=cell,
        change_from=change_from,
        change_to=change_to,
        fits_gib=fits_gib,
        fits_card=fits_card,
        card=card,
        note=note,
    )


def load_claims(path: str | Path) -> ClaimsFile:
    """Read and validate a claims file (bounded, UTF-8, no duplicate keys: see ditbench.yamlio)."""
    return parse_claims(load_yaml_file(path, "claims"), str(path))
