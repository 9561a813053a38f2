"""Prepared GPU measurement: `ditbench fid` end to end on 50,000 samples against a cached reference.

    python benchmarks/gpu_fid.py [--inception-weights PATH] [--out reports/gpu/fid.json]

What is timed is exactly what a user waits for on a second evaluation against the same
reference: `evaluate()` (the function behind `ditbench fid`) reading a 50,000-image ADM `.npz`
from disk, Inception features, FID, sFID, IS, precision/recall and KID, with the reference's
statistics and features served from the cache. Untimed preparation: random uint8 images are
written to a temporary samples `.npz` and reference `.npz`, and one evaluation fills the cache.

Weights: the GPU machine has no network. With `--inception-weights` (or the env var / torch hub
cache) the real network runs; otherwise a calibrated random InceptionV3 (same architecture,
same compute) stands in, and the JSON says so: its metric values are meaningless, its timings
are not. Target: under 30 s on one H200 (torch-fidelity's raw fp32 extractor: ~2,100 img/s).

On a machine without CUDA the script stops with a message (exit 2) unless `--allow-cpu` is
given, which runs a small smoke version (e.g. `--allow-cpu --n 40 --ref-n 20 --size 32`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from ditbench.core.errors import UserError  # noqa: E402
from ditbench.files.fileio import write_atomic  # noqa: E402
from ditbench.metrics.evaluate import evaluate  # noqa: E402
from ditbench.metrics.npz_io import write_npz_images  # noqa: E402
from ditbench.metrics.weights import TEST_NETWORK, WEIGHTS_ENV, FeatureExtractor, default_weights_path  # noqa: E402

TARGET_S = 30.0


def random_batches(n: int, size: int, seed: int, chunk: int = 1000):
    """Random uint8 images with some low-frequency structure (cheap to make at 50k x 256 px)."""
    rng = np.random.default_rng(seed)
    for i in range(0, n, chunk):
        m = min(chunk, n - i)
        cells = -(-size // 16)
        coarse = rng.integers(0, 256, size=(m, cells, cells, 3), dtype=np.uint8)
        up = np.repeat(np.repeat(coarse, 16, axis=1), 16, axis=2)[:, :size, :size]
        noise = rng.integers(0, 32, size=(m, size, size, 3), dtype=np.uint8)
        yield (up // 8 * 7 + noise).astype(np.uint8)


def pick_weights(given: str | None) -> tuple[str, str]:
    for cand in (given, os.environ.get(WEIGHTS_ENV)):
        if cand:
            return cand, "given"
    if default_weights_path().is_file():
        return str(default_weights_path()), "torch hub cache"
    return (
        TEST_NETWORK,
        "calibrated-random test network (no real weights found: timing only, values meaningless)",
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=50_000, help="generated samples (%(default)s)")
    p.add_argument(
        "--ref-n", type=int, default=10_000, help="reference images (%(default)s, as ADM's batches)"
    )
    p.add_argument("--size", type=int, default=256, help="image side in pixels (%(default)s)")
    p.add_argument("--batch-size", type=int, default=250)
    p.add_argument("--inception-weights", default=None)
    p.add_argument("--tf32", action="store_true", help="also allowed TF32 in the timed run")
    p.add_argument(
        "--from-memory",
        action="store_true",
        help="feed the samples from memory (ArrayImages) instead of the .npz on disk",
    )
    p.add_argument("--workdir", default=None, help="where the temporary .npz files go (default: a temp dir)")
    p.add_argument("--out", default="reports/gpu/fid.json")
    p.add_argument("--allow-cpu", action="store_true", help="run on CPU (a smoke test; use small --n)")
    args = p.parse_args(argv)

    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            "gpu_fid.py: no CUDA device is visible, so there is nothing to measure here. Run it on a GPU "
            "machine, or add --allow-cpu with a small --n for a smoke run.",
            file=sys.stderr,
        )
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ditbench-gpu-fid-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if not args.workdir:  # ~12 GB of temporary batches at the defaults
        import atexit
        import shutil

        atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    cache_dir = workdir / "cache"
    record: dict = {
        "schema": "ditbench.gpu_fid/1",
        "n_samples": args.n,
        "n_reference": args.ref_n,
        "image_size": args.size,
        "batch_size": args.batch_size,
        "target_s": TARGET_S,
        "samples_from": "memory" if args.from_memory else "npz on disk",
    }
    try:
        t = time.perf_counter()
        weights, weights_kind = pick_weights(args.inception_weights)
        record["weights"] = {"path": weights, "kind": weights_kind}
        samples_path = write_npz_images(
            workdir / "samples.npz", random_batches(args.n, args.size, 1), args.n, args.size, args.size
        )
        ref_path = write_npz_images(
            workdir / "ref.npz", random_batches(args.ref_n, args.size, 2), args.ref_n, args.size, args.size
        )
        samples = np.load(samples_path)["arr_0"] if args.from_memory else samples_path
        record["prepare_s"] = round(time.perf_counter() - t, 2)

        extractor = FeatureExtractor(
            weights, device, tf32=args.tf32, batch_size=args.batch_size, progress=True
        )
        kid_size = min(1000, args.n, args.ref_n)
        common = dict(extractor=extractor, cache_dir=cache_dir, kid_subset_size=kid_size)  # IS: ADM's splits
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            # Fill the reference cache (untimed); two tiny samples stand in for a batch here.
            evaluate(np.load(ref_path)["arr_0"][:2], ref_path, metrics="fid", **common)
            record["reference_cache_fill_s"] = round(time.perf_counter() - t, 2)
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            result = evaluate(samples, ref_path, **common)
            if device == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - t
    except UserError as err:
        print(f"gpu_fid.py: {err}", file=sys.stderr)
        return 2

    record.update(
        {
            "end_to_end_s": round(wall, 2),
            "meets_target": wall < TARGET_S if device == "cuda" else None,
            "sample_images_per_s": round(args.n / result["timings_s"]["sample_features"], 1),
            "reference_cache_hit": result["reference"]["cache"]["hit"],
            "timings_s": result["timings_s"],
            "metrics": result["metrics"],
            "settings": result["settings"],
            "env": {
                **result["env"],
                "platform": platform.platform(),
                "cuda": torch.version.cuda,
                "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            },
        }
    )
    out = Path(args.out)
    write_atomic(out, json.dumps(record, indent=2) + "\n")
    print(
        f"{args.n} samples at {args.size} px on {device}: {wall:.1f} s end to end "
        f"({record['sample_images_per_s']} img/s features; target {TARGET_S:.0f} s); written to {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
