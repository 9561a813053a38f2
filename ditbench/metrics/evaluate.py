"""Scoring sample batches against a reference: the library behind `ditbench fid` and the quality loop.

`Scorer` reads, hashes and featurises one reference (or serves it from the cache) at most once, however
many batches it scores; `evaluate(samples, ref, ...)` is the one-shot form. Metrics not asked for are
skipped, with the reason, when the inputs cannot support them; asked-for metrics that cannot be
computed are an error before any image is featurised.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch

import ditbench
from ditbench.core.errors import UserError
from ditbench.hardware.precision import tf32_mode
from ditbench.metrics import bootstrap, registry
from ditbench.metrics.inception_score import split_rule
from ditbench.metrics.npz_io import ArrayImages, ImageSource, open_images
from ditbench.metrics.reference import PreparedReference
from ditbench.metrics.registry import DEFAULTS
from ditbench.metrics.spec import FEATURE_DIMS, Metric, MetricInputs
from ditbench.metrics.weights import FeatureExtractor

SCHEMA = "ditbench.fid/1"


def as_source(x, name: str = "samples array") -> ImageSource:
    """An ImageSource from a path (npz, folder), a uint8 N x H x W x 3 array or tensor, or an ImageSource."""
    if isinstance(x, ImageSource):
        return x
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return ArrayImages(x, name)
    return open_images(x)


class Scorer:
    """Scores uint8 image batches against one reference with one Inception network. `metrics` None: all
    the inputs allow. Construction checks files and options; nothing is computed before `score`."""

    def __init__(
        self,
        reference,
        *,
        metrics=None,
        inception=DEFAULTS["inception_weights"],
        extractor: FeatureExtractor | None = None,
        device=DEFAULTS["device"],
        batch_size: int = DEFAULTS["batch_size"],
        tf32: bool = DEFAULTS["tf32"],
        num_workers: int = DEFAULTS["num_workers"],
        cache: bool = DEFAULTS["cache"],
        cache_dir=DEFAULTS["cache_dir"],
        progress: bool = True,
        **options,
    ):
        self.wanted, self.explicit = registry.parse_metrics(metrics)
        self.options = registry.resolve_options(options)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UserError(f"--batch-size must be a positive integer; got {batch_size!r}.")
        self.reference = PreparedReference(reference, cache=cache, cache_dir=cache_dir)
        self._extractor = extractor
        self._pending_warnings: list[str] = []  # from prepare(), reported by the next score()
        self._extractor_args = dict(
            weights=inception,
            device=device,
            tf32=tf32,
            batch_size=batch_size,
            num_workers=num_workers,
            progress=progress,
        )

    @property
    def extractor(self) -> FeatureExtractor:
        """The network, loaded on first use (so bad input fails before a weight file is read)."""
        if self._extractor is None:
            self._extractor = FeatureExtractor(**self._extractor_args)
        return self._extractor

    def _reference_problems(self) -> dict[str, str]:
        return {m.name: p for m in self.wanted if (p := self.reference.problem(m, m.needs(self.options)))}

    def plan(self, n: int, sample_name: str = "the samples") -> tuple[list[Metric], dict[str, str]]:
        """(metrics to compute, {skipped metric: reason}) for `n` samples; raises when it must."""
        problems = self._reference_problems()
        for metric in self.wanted:
            need = metric.needs(self.options)
            if metric.name not in problems and n < need.samples:
                hint = f"; {need.hint}" if need.hint else ""
                problems[metric.name] = (
                    f"{metric.title} needs at least {need.samples} samples ({need.why}); "
                    f"{sample_name} holds {n}{hint}."
                )
        active = [m for m in self.wanted if m.name not in problems]
        if self.explicit and problems:
            raise UserError(" ".join(f"Cannot compute {m}: {p}" for m, p in problems.items()))
        if not active:
            raise UserError(
                f"Nothing to compute: no metric can be computed from {n} sample(s). "
                + " ".join(f"{m}: {p}" for m, p in problems.items())
            )
        return active, problems

    def check(self, n: int) -> None:
        """Raise now if `n` samples could not give the asked-for metrics (before training, say)."""
        self.plan(n)

    def prepare(self) -> float:
        """Load the network and the reference's statistics now (else the first `score` does); seconds."""
        problems = self._reference_problems()
        if self.explicit and problems:
            raise UserError(" ".join(f"Cannot compute {m}: {p}" for m, p in problems.items()))
        keys = {k for m in self.wanted if m.name not in problems for k in m.reference_keys}
        return self.reference.ensure(keys, self.extractor, self._pending_warnings.append)

    def score(self, samples, name: str | None = None) -> dict:
        """Score a batch (uint8 N x H x W x 3 array, ImageSource, npz path or folder); see `SCHEMA`."""
        source = as_source(samples, name or "samples array")
        name = name or (str(source.path) if source.path else "the samples")

        def extract(want, timings):
            t = time.perf_counter()
            feats = self.extractor.extract(source, want=want, desc="sample features")
            timings["sample_features"] = time.perf_counter() - t
            return feats

        return self._score(source.describe(), name, extract)

    def features_for(self, n: int) -> tuple[str, ...]:
        """The sample features (inception.FEATURE_DIMS names) that scoring `n` samples reads."""
        return _features(self.plan(n)[0])

    def score_features(self, feats: dict[str, torch.Tensor], height: int, width: int, name: str) -> dict:
        """Score samples whose features were extracted elsewhere (e.g. by several ranks, each its share)
        with this scorer's network: `feats` holds `features_for(n)`, N x d float32 each."""
        n = len(next(iter(feats.values())))
        if missing := set(_features(self.plan(n, name)[0])) - set(feats):
            raise ValueError(f"score_features needs the features {sorted(missing)}")
        about = {"path": None, "name": name, "count": n, "height": height, "width": width}
        return self._score(about, name, lambda want, timings: feats)

    def _score(self, about: dict, name: str, features) -> dict:
        """Plan, ready the network and reference, featurise the samples, compute metrics and intervals."""
        t_start = time.perf_counter()
        active, skipped = self.plan(about["count"], name)
        warns, self._pending_warnings = self._pending_warnings, []
        ref_size = self.reference.image_size
        if ref_size is not None and ref_size != (about["height"], about["width"]):
            warns.append(
                f"the samples are {about['height']}x{about['width']} (height x width) but the reference "
                f"{self.reference.name} is {ref_size[0]}x{ref_size[1]}: both are resized to 299x299 for "
                "the network, so the metrics also measure the resolution gap. Papers compare at one size."
            )
        timings: dict[str, float] = {}
        t = time.perf_counter()
        extractor = self.extractor
        timings["load_network"] = time.perf_counter() - t
        keys = {k for m in active for k in m.reference_keys}
        timings["reference_features"] = self.reference.ensure(keys, extractor, warns.append)
        inputs = MetricInputs(
            samples=features(_features(active), timings),
            reference=self.reference.stats,
            reference_from_images=frozenset(self.reference.from_images),
            reference_count=self.reference.count,
            device=extractor.device,
            warn=warns.append,
        )
        values: dict[str, float] = {}
        with tf32_mode(False):  # statistics and distances in full precision, whatever extraction used
            for metric in active:
                t = time.perf_counter()
                values.update(_checked(metric, metric.compute(inputs, self.options)))
                timings[metric.name] = time.perf_counter() - t
            boot = bootstrap.sample_intervals(active, inputs, self.options, values)
        if boot is not None:
            timings["bootstrap"] = boot.seconds
        timings["total"] = time.perf_counter() - t_start
        return self._result(about, values, skipped, warns, timings, boot)

    def _result(self, samples: dict, values, skipped, warns, timings, boot=None) -> dict:
        ex = self.extractor
        dev = ex.device
        result = {
            "schema": SCHEMA,
            "inception": ex.weights.describe(),
            "metrics": values,
            "skipped": skipped,
            "warnings": warns,
            "samples": samples,
            "reference": self.reference.describe(),
            "settings": {
                "metrics": [m.name for m in self.wanted],
                "batch_size": ex.batch_size,
                "device": str(dev),
                "precision": ex.precision,
                "tf32": ex.tf32,
                "inception_weights": ex.weights.describe(),
                **self.options,
            },
            **_interval_fields(boot),
            "timings_s": {k: round(v, 4) for k, v in timings.items()},
            "env": {
                "ditbench": ditbench.__version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "device_name": torch.cuda.get_device_name(dev)
                if dev.type == "cuda"
                else platform.processor() or platform.machine(),
            },
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        if any(m.name == "is" for m in self.wanted):  # how the Inception Score was split
            result["settings"]["is_split_rule"] = split_rule(self.options["is_splits"], samples["count"])
        if ex.weights.banner:
            result["banner"] = ex.weights.banner
        return result


def _interval_fields(boot: bootstrap.Intervals | None) -> dict:
    """`intervals` ({key: [low, high]}) and `bootstrap` (how, and the SEs) when the bootstrap ran."""
    if boot is None:
        return {}
    about = {"rule": bootstrap.RULE, "level": bootstrap.LEVEL, "se": boot.se}
    return {"intervals": boot.intervals, "bootstrap": about}


def _features(active) -> tuple[str, ...]:
    return tuple(f for f in FEATURE_DIMS if any(f in m.sample_features for m in active))


def _checked(metric: Metric, values: dict[str, float]) -> dict[str, float]:
    """A metric's outputs, all declared and finite: a NaN is never written as a result."""
    declared = {o.key for o in metric.outputs}
    assert set(values) == declared, f"{metric.name} returned {sorted(values)}, declares {sorted(declared)}"
    if bad := [k for k, v in values.items() if not math.isfinite(v)]:
        raise UserError(
            f"{metric.title} came out {values[bad[0]]} ({', '.join(bad)}): the features hold NaN or "
            "infinite values, which uint8 images and finite weights cannot produce; check the weight file."
        )
    return {k: float(v) for k, v in values.items()}


def evaluate(samples, ref, *, inception_weights=DEFAULTS["inception_weights"], **scorer_args) -> dict:
    """Score `samples` (npz path, folder, uint8 NHWC array or ImageSource) against `ref`, once; the
    samples are checked before the reference. Keywords are `Scorer`'s, `inception_weights` its `inception`."""
    source = as_source(samples)
    return Scorer(ref, inception=inception_weights, **scorer_args).score(source)


def default_output_path(samples) -> Path | None:
    """`samples.npz` -> `samples.metrics.json`; folder `imgs/` -> `imgs.metrics.json` beside it."""
    if isinstance(samples, str | Path):
        p = Path(samples)
        return p.with_name((p.stem if p.is_file() else p.name) + ".metrics.json")
    return None
