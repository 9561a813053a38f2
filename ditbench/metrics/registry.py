"""Every metric `ditbench fid` computes, by name, in reporting order: the one table of metrics.

A metric is its own module with a `Metric` spec plus one entry in `METRICS` (or `register`). Readers look
the table up when they run (`registry.OUTPUTS`), so a registered metric reaches them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ditbench.core.errors import UserError, shorten
from ditbench.files.pretrained import cache_root
from ditbench.metrics import bootstrap, fid, inception_score, kid, prdc
from ditbench.metrics.spec import Metric, Output

DEFAULTS: dict[str, object] = {
    "batch_size": 100,  # images per Inception forward pass
    "device": "auto",  # cuda when visible, else cpu
    "tf32": False,  # TF32 changes features; metrics run in true fp32 unless asked
    "inception_weights": None,  # path or "test"; else $DITBENCH_INCEPTION_WEIGHTS; else the torch hub cache
    "num_workers": 4,  # threads decoding image files / reading the npz ahead of the network
    "cache": True,
    "cache_dir": None,  # $DITBENCH_CACHE/fid, else ~/.cache/ditbench/fid
}


def default_cache_dir() -> Path:
    return cache_root() / "fid"  # beside checkpoints/, plan/ and datasets/ in the one ditbench cache


METRICS: tuple[Metric, ...] = (fid.FID, fid.SFID, inception_score.IS, prdc.PR, kid.KID)


def index(metrics: tuple[Metric, ...]):
    """(by name, options by name, outputs by key) of a metric list, checked for clashes. The options
    include the bootstrap's (bootstrap.OPTIONS), which apply to every metric."""
    by_name = {m.name: m for m in metrics}
    options = {o.name: o for m in metrics for o in m.options} | {o.name: o for o in bootstrap.OPTIONS}
    outputs = {o.key: o for m in metrics for o in m.outputs}
    assert len(by_name) == len(metrics), "two metrics share a name"
    declared = sum(len(m.options) for m in metrics) + len(bootstrap.OPTIONS)
    assert len(options) == declared, "two options share a name"
    assert len(outputs) == sum(len(m.outputs) for m in metrics), "two outputs share a key"
    return by_name, options, outputs


BY_NAME, OPTIONS, OUTPUTS = index(METRICS)
ALL_METRICS: tuple[str, ...] = tuple(BY_NAME)


def register(metric: Metric | None = None, *, remove: str | None = None) -> None:
    """Add a metric after the others (or `remove` one by name): every reader sees it from now on."""
    global METRICS, BY_NAME, OPTIONS, OUTPUTS, ALL_METRICS
    metrics = tuple(m for m in METRICS if m.name != remove) + ((metric,) if metric else ())
    BY_NAME, OPTIONS, OUTPUTS = index(metrics)
    METRICS, ALL_METRICS = metrics, tuple(BY_NAME)


def quality_outputs() -> tuple[Output, ...]:
    """The outputs that are quality figures (FID, IS, ...; not the spreads), in reporting order."""
    return tuple(o for o in OUTPUTS.values() if o.quality)


def parse_metrics(spec: str | Iterable[str] | None) -> tuple[tuple[Metric, ...], bool]:
    """(metrics in reporting order, explicit). None means every metric, where the inputs allow."""
    if spec is None:
        return METRICS, False
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [str(s).strip().lower() for s in items if str(s).strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise UserError(
            f"--metrics {shorten(spec)}: "
            + (f"unknown metric(s) {shorten(unknown, 200)}" if unknown else "no metric named")
            + f"; choose from {','.join(ALL_METRICS)} (comma-separated)."
        )
    return tuple(m for m in METRICS if m.name in names), True


def resolve_options(given: Mapping[str, Any]) -> dict[str, int | float]:
    """Every metric option: the given values (checked) over the defaults; unknown names are errors."""
    if unknown := sorted(set(given) - set(OPTIONS)):
        raise TypeError(f"unknown metric option(s) {unknown}; known: {sorted(OPTIONS)}")
    return {name: opt.check(given[name]) if name in given else opt.default for name, opt in OPTIONS.items()}
