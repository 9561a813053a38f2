"""One cell's evaluations: sample with the EMA weights, decode, score against the reference, per seed.

Samples follow `ditbench sample`'s plan (seeded shards), so the images do not depend on the process
count; rank 0 scores the gathered features in shard order. `metrics` is the mean over seeds, `spread`
their SD. Every cell's grid has the same noise (GRID_SEED) and labels, so two grids of one model shape
differ by the training setting alone.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from ditbench.files.fileio import atomic_write
from ditbench.hardware import dist
from ditbench.metrics import registry
from ditbench.spec.cell import CellSpec

GRID_SEED = 1_000_003  # a prime far from the scoring seeds (0, 1, ...)
COLUMNS = 8
MIN_SIDE = 128  # small images are enlarged (nearest neighbour) so that a reader can see them: 32 px x 4
PAD = 2
DIT_PAPER_CLASSES = (207, 360, 387, 974, 88, 979, 417, 279)  # DiT's sample.py: retriever, otter, panda, ...


def grid_labels(n: int, num_classes: int) -> np.ndarray:
    """The grid's labels: for 1,000 classes those DiT's sampling script shows, else 0, 1, 2, ..."""
    if num_classes == 1000:
        return np.resize(np.array(DIT_PAPER_CLASSES, dtype=np.int64), n)
    return np.arange(n, dtype=np.int64) % num_classes


def tile(images: np.ndarray, columns: int = COLUMNS) -> np.ndarray:
    """uint8 N x H x W x 3 -> one uint8 image: rows of `columns`, white padding, small images enlarged."""
    n, h, w, _ = images.shape
    scale = max(1, -(-MIN_SIDE // max(h, w)))
    if scale > 1:
        images = images.repeat(scale, axis=1).repeat(scale, axis=2)
        h, w = h * scale, w * scale
    columns = max(1, min(columns, n))
    rows = -(-n // columns)
    out = np.full((rows * (h + PAD) + PAD, columns * (w + PAD) + PAD, 3), 255, dtype=np.uint8)
    for i, image in enumerate(images):
        r, c = divmod(i, columns)
        top, left = PAD + r * (h + PAD), PAD + c * (w + PAD)
        out[top : top + h, left : left + w] = image
    return out


SPLIT = "ranks split the samples (shard k on rank k mod world); rank 0 gathers the features and scores"


def reference_digest(path: str) -> str:
    """`sha256:<hex>` of what the reference holds (a file's bytes, a folder's images), memoised on disk."""
    from ditbench.metrics.npz_io import FolderImages
    from ditbench.metrics.reference import ReferenceCache

    p = Path(path)
    content = FolderImages(p) if p.is_dir() else p
    return "sha256:" + ReferenceCache().content_hash(content)


class Evaluator:
    """Without a ready `extractor`, the section's Inception network is loaded on each rank."""

    def __init__(self, spec: CellSpec, ctx, extractor=None):
        from ditbench.models.configs import latent_size
        from ditbench.models.diffusion import create_diffusion
        from ditbench.sampling.sampler import make_shard
        from ditbench.sampling.shards import labels_for

        self.q, self.knobs, self.ctx = spec.quality, spec.knobs, ctx
        self.labels = labels_for(self.q.samples, self.knobs.num_classes)
        sampler = self.q.sampler
        self._images = functools.partial(  # (model, labels=, seed=) -> uint8 N x H x W x 3 images
            make_shard,
            vae=None,
            diffusion=create_diffusion(str(sampler.steps)),
            latent=latent_size(self.knobs.image_size),
            cfg_scale=sampler.cfg_scale,
            sampler=sampler.name,
            guidance_channels=None,
            precision=sampler.precision,
            device=ctx.device,
            decode=self._decoder(),
        )
        self.scorer = None
        if ctx.rank == 0:
            from ditbench.metrics.evaluate import Scorer
            from ditbench.models import builtin_data

            ref = self.q.reference  # a built-in dataset's name resolved to its file
            self.reference = str(builtin_data.resolve(ref)) if builtin_data.is_builtin(ref) else ref
            self.scorer = Scorer(
                self.reference,
                inception=self.q.inception,
                extractor=extractor,
                device=ctx.device,
                progress=False,
            )
        self._extractor = extractor
        self.want: tuple[str, ...] = ()

    def _decoder(self):
        name = self.q.decoder(self.knobs)
        if name == "pixels":
            from ditbench.models import pixels

            if pixels.colour_of(self.knobs.data) == "rgb":
                self.decoder_desc = "pixels (one RGB pixel per latent cell, exact)"
                return pixels.decode_rgb
            self.decoder_desc = "pixels (2x2 grey blocks, exact)"
            return pixels.decode
        from ditbench.models.vae import decode_latents
        from ditbench.sampling.sampler import build_vae

        vae = build_vae(name, self.ctx.device)
        self.decoder_desc = f"VAE {name}"
        return lambda z: decode_latents(vae, z)

    @property
    def extractor(self):
        if self.scorer is not None:
            return self.scorer.extractor
        if self._extractor is None:
            from ditbench.metrics.weights import FeatureExtractor

            self._extractor = FeatureExtractor(self.q.inception, device=self.ctx.device, progress=False)
        return self._extractor

    def prepare(self) -> dict[str, Any]:
        """Check the sample count, load the network, gather the reference's statistics: what the record
        says about the reference and the network (rank 0; {} elsewhere)."""
        info: dict[str, Any] = {}
        if self.scorer is not None:
            active, skipped = self.scorer.plan(self.q.samples)  # before any training: fail now if it must
            seconds = self.scorer.prepare()
            weights = self.scorer.extractor.weights
            info = {
                "reference": {
                    "path": self.q.reference,
                    "digest": reference_digest(self.reference),
                    "file": self.reference,
                    "count": self.scorer.reference.count,
                },
                "inception": {k: getattr(weights, k) for k in ("name", "sha256", "official", "recipe")},
                "metrics": [m.name for m in active],
                "skipped": skipped,
                "reference_s": round(seconds, 3),
            }
            if weights.banner:
                info["banner"] = weights.banner
            self.want = self.scorer.features_for(self.q.samples)
        self.want = dist.all_gather_objects(self.ctx, self.want)[0]
        self.extractor  # noqa: B018 - every rank loads its network now, not inside the first evaluation
        return info

    def evaluate(self, model, step: int, train_wall_s: float, grid: tuple[Path, str] | None) -> dict | None:
        """The evaluation at `step` (rank 0; None on the others). `grid`: (output dir, cell id)."""
        per_seed, warnings, sample_s, score_s = [], [], 0.0, 0.0
        keys = [o.key for o in registry.quality_outputs()]
        for seed in self.q.seeds:
            t = self._now()
            shards, images = self._sample(model, seed)
            sample_s += self._now() - t
            t = self._now()
            result = self._score(shards, images, seed)
            score_s += self._now() - t
            if result is not None:
                per_seed.append({"seed": seed, **{k: result["metrics"].get(k) for k in keys}})
                if result.get("intervals"):
                    per_seed[-1]["interval"] = result["intervals"]
                    per_seed[-1]["bootstrap_se"] = result["bootstrap"]["se"]
                warnings += [w for w in result["warnings"] if w not in warnings]
        grid_file = self._grid(model, step, grid) if grid is not None and self.q.grid else None
        if self.ctx.rank != 0:
            return None
        out = {
            "step": step,
            "train_wall_s": round(train_wall_s, 3),
            "train_gpu_s": round(train_wall_s * self.ctx.world_size, 3),
            "sample_s": round(sample_s, 3),
            "score_s": round(score_s, 3),
            "seeds": list(self.q.seeds),
            "per_seed": per_seed,
            "metrics": {k: _mean([p[k] for p in per_seed]) for k in keys},
            "spread": _spread(per_seed, keys) if len(per_seed) > 1 else None,
            **_bootstrap(per_seed, keys),
            "grid": grid_file,
        }
        if warnings:
            out["warnings"] = warnings
        return out

    def _now(self) -> float:
        if self.ctx.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.ctx.device)
        return time.perf_counter()

    def _sample(self, model, seed: int) -> tuple[list[int], list[np.ndarray]]:
        """This rank's shards of one seed's samples: (shard indices, uint8 N x H x W x 3 per shard)."""
        from ditbench.sampling.shards import shard_count, shard_seed

        b = self.q.batch_size
        mine = list(range(self.ctx.rank, shard_count(self.q.samples, b), self.ctx.world_size))
        images = [
            self._images(model, labels=self.labels[k * b : (k + 1) * b], seed=shard_seed(seed, k))
            for k in mine
        ]
        return mine, images

    def _score(self, shards: list[int], images: list[np.ndarray], seed: int) -> dict | None:
        """Features of this rank's images, gathered on rank 0 in shard order and scored there."""
        import torch

        from ditbench.metrics.npz_io import ArrayImages

        feats: dict[str, np.ndarray] = {}
        if images:
            batch = ArrayImages(np.concatenate(images), f"samples of seed {seed}")
            extracted = self.extractor.extract(batch, want=self.want, desc="sample features")
            feats = {k: v.numpy() for k, v in extracted.items()}
        rows = np.repeat(shards, [len(x) for x in images])  # the shard of each row, ascending
        gathered = dist.all_gather_objects(self.ctx, (rows, feats))
        if self.scorer is None:
            return None
        order = np.argsort(np.concatenate([r for r, _ in gathered]), kind="stable")  # shard order
        joined = {
            name: torch.from_numpy(np.concatenate([f[name] for r, f in gathered if len(r)])[order])
            for name in self.want
        }
        h, w = images[0].shape[1:3] if images else (None, None)
        return self.scorer.score_features(joined, h, w, f"the samples of seed {seed}")

    def _grid(self, model, step: int, grid: tuple[Path, str]) -> str | None:
        """Rank 0 samples the grid (fixed noise and labels) and writes it; its path relative to the run."""
        if self.ctx.rank != 0:
            return None
        from PIL import Image

        out_dir, cell_id = grid
        labels = grid_labels(self.q.grid, self.knobs.num_classes)
        picture = tile(self._images(model, labels=labels, seed=GRID_SEED))
        relative = f"grids/{cell_id}/step{step:07d}.png"  # relative to the run's folder, as the record says
        atomic_write(Path(out_dir) / relative, lambda f: Image.fromarray(picture).save(f, format="PNG"))
        return relative


def _mean(values: list[float | None]) -> float | None:
    if not values or any(v is None for v in values):
        return None
    return float(statistics.fmean(values))


def _bootstrap(per_seed: list[dict], keys: list[str]) -> dict[str, Any]:
    """`bootstrap_se` (one seed's standard error, the root mean square over seeds) and `interval` (of
    the mean over seeds: mean +- z x se / sqrt(seeds)) per metric, where every seed was bootstrapped."""
    from ditbench.metrics import bootstrap

    if not per_seed or not all("bootstrap_se" in p for p in per_seed):
        return {}
    se, interval = {}, {}
    for k in keys:
        values = [p["bootstrap_se"].get(k) for p in per_seed]
        mean = _mean([p[k] for p in per_seed])
        if mean is None or any(v is None for v in values):
            continue
        se[k] = math.sqrt(statistics.fmean(v * v for v in values))
        half = bootstrap.Z * se[k] / math.sqrt(len(values))
        interval[k] = [mean - half, mean + half]
    return {"bootstrap_se": se, "interval": interval} if se else {}


def _spread(per_seed: list[dict], keys: list[str]) -> dict[str, float | None]:
    """Sample standard deviation over seeds of each metric (null where a seed lacks it)."""
    out = {}
    for k in keys:
        values = [p[k] for p in per_seed]
        ok = all(v is not None and math.isfinite(v) for v in values)
        out[k] = float(statistics.stdev(values)) if ok else None
    return out
