"""One evaluation: a sample batch against a reference -> FID, sFID, IS, precision/recall, KID.

    samples ──features──> pool3, logits, spatial ──┐
    reference ──(cache | precomputed | features)──> mu/sigma, mu_s/sigma_s, pool3 ──> metrics -> result dict

Where the reference carries precomputed `mu`/`sigma` (`mu_s`/`sigma_s`), as the ADM reference
batches do, those are used for FID (sFID) and its images serve precision/recall and KID.
Metrics that were not asked for explicitly are skipped (with the reason in the result) when
the inputs cannot support them, e.g. KID with fewer than 1,000 samples; asked-for metrics that
cannot be computed are an error.
"""

from __future__ import annotations

import datetime as _dt
import platform
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import ditbench
from ditbench.errors import UserError
from ditbench.metrics.defaults import ALL_METRICS, DEFAULTS
from ditbench.metrics.features import FeatureExtractor, matmul_precision
from ditbench.metrics.fid import FewSamplesWarning, covariance_factor, feature_statistics, frechet_distance
from ditbench.metrics.inception import POOL3_DIM, SPATIAL_DIM
from ditbench.metrics.inception_score import inception_score
from ditbench.metrics.kid import kernel_inception_distance
from ditbench.metrics.npz_io import ArrayImages, ImageSource, Reference, open_images, open_reference
from ditbench.metrics.prdc import precision_recall
from ditbench.metrics.stats_cache import ReferenceCache

SCHEMA = "ditbench.fid/1"


def parse_metrics(spec: str | list | tuple | None) -> tuple[tuple[str, ...], bool]:
    """(metrics, explicit). None means all, where the inputs allow them."""
    if spec is None:
        return ALL_METRICS, False
    names = [s.strip().lower() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    bad = [n for n in names if n not in ALL_METRICS]
    if bad or not names:
        raise UserError(
            f"--metrics {','.join(names) or repr(spec)}: unknown metric(s) {bad}; choose from "
            f"{','.join(ALL_METRICS)} (comma-separated)."
        )
    return tuple(m for m in ALL_METRICS if m in names), True


def _as_source(x, name: str) -> ImageSource:
    if isinstance(x, ImageSource):
        return x
    if isinstance(x, np.ndarray):
        return ArrayImages(x, name)
    return open_images(x)


def _as_reference(x) -> Reference:
    if isinstance(x, Reference):
        return x
    if isinstance(x, ImageSource):
        return Reference(x.path, x, {})
    if isinstance(x, np.ndarray):
        return Reference(None, ArrayImages(x, "reference array"), {})
    return open_reference(x)


def evaluate(
    samples,
    ref,
    *,
    metrics=None,
    batch_size: int = DEFAULTS["batch_size"],
    device=DEFAULTS["device"],
    inception_weights=DEFAULTS["inception_weights"],
    tf32: bool = DEFAULTS["tf32"],
    cache: bool = DEFAULTS["cache"],
    cache_dir=DEFAULTS["cache_dir"],
    is_splits: int = DEFAULTS["is_splits"],
    pr_k: int = DEFAULTS["pr_k"],
    pr_block_size: int = DEFAULTS["pr_block_size"],
    kid_subsets: int = DEFAULTS["kid_subsets"],
    kid_subset_size: int = DEFAULTS["kid_subset_size"],
    kid_seed: int = DEFAULTS["kid_seed"],
    num_workers: int = DEFAULTS["num_workers"],
    progress: bool = True,
    extractor: FeatureExtractor | None = None,
) -> dict:
    """Score `samples` (npz path, folder, uint8 NHWC array or ImageSource) against `ref`.

    `ref` is an ADM reference npz (images and/or mu, sigma, mu_s, sigma_s), a folder, a uint8
    array, or a statistics file written by ditbench. Returns the result dict (see `SCHEMA`).
    """
    t_start = time.perf_counter()
    wanted, explicit = parse_metrics(metrics)
    source = _as_source(samples, "samples array")
    reference = _as_reference(ref)
    n = source.count
    timings: dict[str, float] = {}
    warns: list[str] = []

    # ---- which metrics the inputs support: decided before any compute ---------------------
    ref_stats = dict(reference.stats)
    ref_images = reference.images
    ref_n = (
        ref_images.count
        if ref_images is not None
        else (len(ref_stats["pool3"]) if "pool3" in ref_stats else None)
    )
    sample_name = str(source.path) if source.path else "the samples"

    def problem(metric: str) -> str | None:
        if metric in ("fid", "sfid"):
            key = "mu" if metric == "fid" else "mu_s"
            if key not in ref_stats and ref_images is None:
                return f"the reference {reference.path} has no images and no precomputed `{key}`."
            if n < 2 or (key not in ref_stats and ref_n < 2):
                return (
                    f"a covariance needs at least 2 images per set; got {n} samples and {ref_n} references."
                )
        elif metric == "is":
            if n < is_splits:
                return f"{is_splits} splits need at least {is_splits} samples; {sample_name} holds {n}."
        else:
            if ref_n is None:
                return f"the reference {reference.path} holds no images or pool3 features, only statistics."
            need, what = (
                (pr_k + 1, f"k={pr_k}")
                if metric == "pr"
                else (kid_subset_size, f"subsets of {kid_subset_size}")
            )
            if min(n, ref_n) < need:
                hint = " (lower --kid-subset-size)" if metric == "kid" else ""
                return f"{what} need at least {need} samples and reference images; got {n} and {ref_n}{hint}."
        return None

    skipped = {m: p for m in wanted if (p := problem(m))}
    if explicit and skipped:
        raise UserError(" ".join(f"Cannot compute {m}: {p}" for m, p in skipped.items()))
    active = [m for m in wanted if m not in skipped]

    t = time.perf_counter()
    if extractor is None:
        extractor = FeatureExtractor(
            inception_weights,
            device,
            tf32=tf32,
            batch_size=batch_size,
            num_workers=num_workers,
            progress=progress,
        )
    timings["load_network"] = time.perf_counter() - t
    dev = extractor.device

    # ---- reference: precomputed statistics, cache, or a feature pass ----------------------
    needs_images = (
        ("fid" in active and "mu" not in ref_stats)
        or ("sfid" in active and "mu_s" not in ref_stats)
        or (({"pr", "kid"} & set(active)) and "pool3" not in ref_stats)
    )
    cache_info: dict = {"used": False, "hit": False}
    ref_from_images: set[str] = set()
    t = time.perf_counter()
    if needs_images:
        store = ReferenceCache(cache_dir) if cache else None
        entry = None
        if store is not None:
            key = store.key(
                store.content_hash(reference), extractor.weights_info()["sha256"], extractor.precision
            )
            entry = store.load(key)
            cache_info = {
                "used": True,
                "hit": entry is not None,
                "key": key,
                "path": str(store.path_for(key)),
            }
        if entry is None:
            feats = extractor.extract(ref_images, want=("pool3", "spatial"), desc="reference features")
            mu, sigma = feature_statistics(feats["pool3"].to(dev))
            mu_s, sigma_s = feature_statistics(feats["spatial"].to(dev))
            entry = {
                "mu": mu,
                "sigma": sigma,
                "mu_s": mu_s,
                "sigma_s": sigma_s,
                "pool3": feats["pool3"].numpy(),
            }
            if store is not None:
                try:
                    store.save(
                        key,
                        entry,
                        {
                            "reference": str(reference.path),
                            "count": ref_images.count,
                            "inception": extractor.weights_info(),
                            "precision": extractor.precision,
                            "ditbench": ditbench.__version__,
                        },
                    )
                except OSError as err:
                    warns.append(f"could not write the reference cache entry {store.path_for(key)}: {err}")
        for k, v in entry.items():
            if k not in ref_stats:  # precomputed statistics in the reference take precedence
                ref_stats[k] = v
                ref_from_images.add(k)
    timings["reference_features"] = time.perf_counter() - t

    # ---- samples ---------------------------------------------------------------------------
    want = [
        k
        for k, ms in (("pool3", {"fid", "pr", "kid"}), ("logits_unbiased", {"is"}), ("spatial", {"sfid"}))
        if ms & set(active)
    ]
    t = time.perf_counter()
    feats = extractor.extract(source, want=tuple(want), desc="sample features") if want else {}
    timings["sample_features"] = time.perf_counter() - t

    # ---- metrics ---------------------------------------------------------------------------
    values: dict[str, float] = {}

    def frechet(metric, key_mu, key_sigma, feat_key, dim):
        few = [
            f"{count} {what}"
            for count, what in ((n, "samples"), (ref_n, "reference images"))
            if count < dim and (what == "samples" or key_mu in ref_from_images)
        ]
        if few:
            msg = (
                f"{metric}: {' and '.join(few)} for {dim}-d features: the covariance is singular and the "
                "distance is biased upward (papers use 50,000 samples)."
            )
            warnings.warn(msg, FewSamplesWarning, stacklevel=3)
            warns.append(msg)
        x = feats[feat_key].to(dev)
        mu, sigma = feature_statistics(x)
        factor = covariance_factor(x, mu) if n < dim else None  # exact and fast for n < dim
        return frechet_distance(
            mu, sigma, ref_stats[key_mu], ref_stats[key_sigma], device=dev, factor1=factor
        )

    with matmul_precision(False):  # statistics and distances in full precision, whatever the extraction used
        for metric in active:
            t = time.perf_counter()
            if metric == "fid":
                values["fid"] = frechet("fid", "mu", "sigma", "pool3", POOL3_DIM)
            elif metric == "sfid":
                values["sfid"] = frechet("sfid", "mu_s", "sigma_s", "spatial", SPATIAL_DIM)
            elif metric == "is":
                values["inception_score"], values["inception_score_std"] = inception_score(
                    feats["logits_unbiased"], is_splits
                )
            else:
                ref_pool3 = torch.from_numpy(np.asarray(ref_stats["pool3"], dtype=np.float32))
                if metric == "pr":
                    values["precision"], values["recall"] = precision_recall(
                        feats["pool3"], ref_pool3, k=pr_k, block=pr_block_size, device=dev
                    )
                else:
                    values["kid"], values["kid_std"] = kernel_inception_distance(
                        feats["pool3"], ref_pool3, kid_subsets, kid_subset_size, kid_seed, device=dev
                    )
            timings[metric] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t_start

    ref_desc = {
        "path": str(reference.path) if reference.path else None,
        "count": ref_n,
        "fid_statistics": ("images" if "mu" in ref_from_images else "precomputed")
        if "mu" in ref_stats
        else None,
        "sfid_statistics": ("images" if "mu_s" in ref_from_images else "precomputed")
        if "mu_s" in ref_stats
        else None,
        "cache": cache_info,
    }
    if ref_images is not None:
        ref_desc.update(height=ref_images.height, width=ref_images.width)
    result = {
        "schema": SCHEMA,
        "inception": extractor.weights_info(),
        "metrics": values,
        "skipped": skipped,
        "warnings": warns,
        "samples": source.describe(),
        "reference": ref_desc,
        "settings": {
            "metrics": list(wanted),
            "batch_size": extractor.batch_size,
            "device": str(dev),
            "precision": extractor.precision,
            "tf32": extractor.tf32,
            "inception_weights": extractor.weights_info(),
            "is_splits": is_splits,
            "pr_k": pr_k,
            "kid_subsets": kid_subsets,
            "kid_subset_size": kid_subset_size,
            "kid_seed": kid_seed,
        },
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
    if extractor.weights.banner:
        result["banner"] = extractor.weights.banner
    return result


def default_output_path(samples) -> Path | None:
    """`samples.npz` -> `samples.metrics.json`; folder `imgs/` -> `imgs.metrics.json` beside it."""
    if isinstance(samples, str | Path):
        p = Path(samples)
        return p.with_name((p.stem if p.is_file() else p.name) + ".metrics.json")
    return None
