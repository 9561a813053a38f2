"""Scoring sample batches against a reference: the library behind `ditbench fid` and the quality loop.

    samples ──features──> pool3, logits, spatial ──┐
    reference ──(precomputed | cache | features, once)──> mu/sigma, mu_s/sigma_s, pool3 ──> metrics

`Scorer` holds one reference and one Inception network; the reference is read, hashed and
featurised (or served from the cache) at most once, however many batches are scored, so a
training run scores its samples in-process at each evaluation point:

    from ditbench.metrics.evaluate import Scorer

    scorer = Scorer("refs/VIRTUAL_imagenet256_labeled.npz", metrics="fid,is,pr",
                    inception="test", device="cuda")      # "test": no download, not comparable
    scorer.check(5000)                    # fail now, not after training, if 5,000 cannot do it
    for step in (0, 1000, 2000):
        images = sample(model, 5000)      # uint8 N x H x W x 3 (numpy), or an ImageSource
        result = scorer.score(images)     # dict in the `ditbench fid` JSON schema
        print(step, result["metrics"]["fid"], result["inception"]["official"])

`evaluate(samples, ref, ...)` is the one-shot form that `ditbench fid` uses. Metrics come from
the registry (registry.py). Metrics not asked for explicitly are skipped, with the reason in
the result, when the inputs cannot support them (KID with fewer than 1,000 samples); asked-for
metrics that cannot be computed, or inputs that allow no metric at all, are an error, raised
before any image goes through the network.
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
from ditbench.errors import UserError
from ditbench.metrics import bootstrap, registry
from ditbench.metrics.defaults import DEFAULTS
from ditbench.metrics.features import FeatureExtractor
from ditbench.metrics.inception_score import split_rule
from ditbench.metrics.npz_io import ArrayImages, ImageSource, open_images
from ditbench.metrics.reference import PreparedReference
from ditbench.metrics.spec import FEATURE_DIMS, Metric, MetricInputs
from ditbench.precision import tf32_mode

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
    """Scores uint8 image batches against one reference with one Inception network.

    `reference`: an ADM reference npz (images and/or mu, sigma, mu_s, sigma_s), a folder of
    images, a ditbench statistics file (a cache entry), an ImageSource or a uint8 array.
    `metrics`: names or a comma-separated string (None: all the inputs allow). `inception`: a
    weight file, "test" or None (see weights.py), or pass a ready `extractor`. Metric options
    (`is_splits`, `kid_subset_size`, ...) are keywords; see registry.OPTIONS.
    Construction checks the reference's files and the options; nothing is computed until the
    first `score` (or `prepare`).
    """

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

    # ---- which metrics the inputs allow: decided from counts alone ----------------------------
    def _reference_problems(self) -> dict[str, str]:
        need = {m.name: m.needs(self.options) for m in self.wanted}
        return {m.name: p for m in self.wanted if (p := self.reference.problem(m, need[m.name]))}

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
        """Load the network and gather the reference's statistics (cache or features) now.

        Optional: the first `score` does it otherwise. Returns the seconds the reference took.
        """
        problems = self._reference_problems()
        if self.explicit and problems:
            raise UserError(" ".join(f"Cannot compute {m}: {p}" for m, p in problems.items()))
        keys = {k for m in self.wanted if m.name not in problems for k in m.reference_keys}
        return self.reference.ensure(keys, self.extractor, self._pending_warnings.append)

    # ---- scoring ----------------------------------------------------------------------------
    def score(self, samples, name: str | None = None) -> dict:
        """Score a batch (uint8 N x H x W x 3 array, ImageSource, npz path or folder); see `SCHEMA`."""
        t_start = time.perf_counter()
        source = as_source(samples, name or "samples array")
        sample_name = name or (str(source.path) if source.path else "the samples")
        active, skipped = self.plan(source.count, sample_name)
        warns, timings = self._begin(source.height, source.width, active)
        t = time.perf_counter()
        feats = self.extractor.extract(source, want=_features(active), desc="sample features")
        timings["sample_features"] = time.perf_counter() - t
        return self._finish(source.describe(), feats, active, skipped, warns, timings, t_start)

    def features_for(self, n: int) -> tuple[str, ...]:
        """The sample features (inception.FEATURE_DIMS names) that scoring `n` samples reads."""
        return _features(self.plan(n)[0])

    def score_features(self, feats: dict[str, torch.Tensor], height: int, width: int, name: str) -> dict:
        """Score samples whose features were extracted elsewhere (e.g. by several ranks, each its share)
        with this scorer's network: `feats` holds `features_for(n)`, N x d float32 each."""
        t_start = time.perf_counter()
        n = len(next(iter(feats.values())))
        active, skipped = self.plan(n, name)
        missing = set(_features(active)) - set(feats)
        if missing:
            raise ValueError(f"score_features needs the features {sorted(missing)}")
        warns, timings = self._begin(height, width, active)
        about = {"path": None, "name": name, "count": n, "height": height, "width": width}
        return self._finish(about, feats, active, skipped, warns, timings, t_start)

    def _begin(self, height: int, width: int, active) -> tuple[list[str], dict[str, float]]:
        """(warnings, timings) before the samples' features: the network and the reference, ready."""
        warns, self._pending_warnings = self._pending_warnings, []
        ref_size = self.reference.image_size
        if ref_size is not None and ref_size != (height, width):
            warns.append(
                f"the samples are {height}x{width} (height x width) but the reference "
                f"{self.reference.name} is {ref_size[0]}x{ref_size[1]}: both are resized to 299x299 for "
                "the network, so the metrics also measure the resolution gap. Papers compare at one size."
            )
        timings: dict[str, float] = {}
        t = time.perf_counter()
        extractor = self.extractor
        timings["load_network"] = time.perf_counter() - t
        keys = {k for m in active for k in m.reference_keys}
        timings["reference_features"] = self.reference.ensure(keys, extractor, warns.append)
        return warns, timings

    def _finish(self, about: dict, feats, active, skipped, warns, timings, t_start: float) -> dict:
        inputs = MetricInputs(
            samples=feats,
            reference=self.reference.stats,
            reference_from_images=frozenset(self.reference.from_images),
            reference_count=self.reference.count,
            device=self.extractor.device,
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
            "inception": ex.weights_info(),
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
                "inception_weights": ex.weights_info(),
                **self.options,
                **_is_rule(self.wanted, self.options, samples.get("count")),
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
        if ex.weights.banner:
            result["banner"] = ex.weights.banner
        return result


def _interval_fields(boot: bootstrap.Intervals | None) -> dict:
    """`intervals` ({key: [low, high]}) and `bootstrap` (how, and the SEs) when the bootstrap ran."""
    if boot is None:
        return {}
    about = {"rule": bootstrap.RULE, "level": bootstrap.LEVEL, "se": boot.se}
    return {"intervals": boot.intervals, "bootstrap": about}


def _is_rule(wanted, options, n) -> dict:
    """The Inception Score's split rule, where the score was asked for: which rule and how many splits."""
    if n is None or not any(m.name == "is" for m in wanted):
        return {}
    return {"is_split_rule": split_rule(options["is_splits"], n)}


def _features(active) -> tuple[str, ...]:
    return tuple(f for f in FEATURE_DIMS if any(f in m.sample_features for m in active))


def _checked(metric: Metric, values: dict[str, float]) -> dict[str, float]:
    """A metric's outputs, all declared and finite: a NaN is never written as a result."""
    declared = {o.key for o in metric.outputs}
    assert set(values) == declared, f"{metric.name} returned {sorted(values)}, declares {sorted(declared)}"
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    if bad:
        raise UserError(
            f"{metric.title} came out {values[bad[0]]} ({', '.join(bad)}): the features hold NaN or "
            "infinite values, which uint8 images and finite weights cannot produce; check the weight file."
        )
    return {k: float(v) for k, v in values.items()}


def evaluate(samples, ref, *, inception_weights=DEFAULTS["inception_weights"], **scorer_args) -> dict:
    """Score `samples` (npz path, folder, uint8 NHWC array or ImageSource) against `ref`, once.

    The samples are opened (and checked) before the reference. The keywords are `Scorer`'s
    (`metrics`, `device`, `batch_size`, `tf32`, `num_workers`, `cache`, `cache_dir`, `progress`,
    `extractor` and the metric options), `inception_weights` being its `inception`.
    """
    source = as_source(samples)
    return Scorer(ref, inception=inception_weights, **scorer_args).score(source)


def default_output_path(samples) -> Path | None:
    """`samples.npz` -> `samples.metrics.json`; folder `imgs/` -> `imgs.metrics.json` beside it."""
    if isinstance(samples, str | Path):
        p = Path(samples)
        return p.with_name((p.stem if p.is_file() else p.name) + ".metrics.json")
    return None
