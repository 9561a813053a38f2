"""Seconds one bootstrap resample costs per metric at N samples (random features, no network).

    python benchmarks/bootstrap_cost.py 5000 50000 [--reference 10000] [--out reports/bootstrap_cost.json]

A resample recomputes each metric on N features drawn with replacement (metrics.bootstrap): one
computation of the metric at N, or one call of its spec's `resampler` (FID, sFID) after a preparation
made once per score; `ditbench fid --bootstrap B` costs about B times the sum
of the rows. The reference is fixed: ADM's reference batches hold 10,000 images.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from ditbench.metrics import bootstrap, registry
from ditbench.metrics.fid import feature_statistics
from ditbench.metrics.spec import FEATURE_DIMS, MetricInputs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("n", type=int, nargs="+")
    p.add_argument("--reference", type=int, default=10000)
    p.add_argument("--metrics", default="fid,sfid,is,pr,kid")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    ref_pool3 = torch.rand(args.reference, FEATURE_DIMS["pool3"], generator=g)
    ref_spatial = torch.rand(args.reference, FEATURE_DIMS["spatial"], generator=g)
    mu, sigma = feature_statistics(ref_pool3)
    mu_s, sigma_s = feature_statistics(ref_spatial)
    reference = {"mu": mu, "sigma": sigma, "mu_s": mu_s, "sigma_s": sigma_s, "pool3": ref_pool3.numpy()}
    metrics, _ = registry.parse_metrics(args.metrics)
    options = registry.resolve_options({})
    rows = []
    for n in args.n:
        samples = {name: torch.rand(n, d, generator=g) for name, d in FEATURE_DIMS.items()}
        idx = torch.from_numpy(bootstrap.draws(n, 1, 0)[0])
        drawn = {name: x[idx] for name, x in samples.items()}
        inputs = MetricInputs(
            drawn, reference, frozenset(), args.reference, torch.device("cpu"), lambda _: None
        )
        full = MetricInputs(
            samples, reference, frozenset(), args.reference, torch.device("cpu"), lambda _: None
        )
        for metric in metrics:
            t = time.perf_counter()
            one = metric.resampler(full, options) if metric.resampler is not None else None
            prepare = time.perf_counter() - t
            t = time.perf_counter()
            one(idx.numpy()) if one is not None else metric.compute(inputs, options)
            seconds = time.perf_counter() - t
            row = {"n": n, "metric": metric.name, "seconds_per_resample": round(seconds, 2)}
            if one is not None:
                row["seconds_once"] = round(prepare, 2)  # the resampler's preparation, once per score
            rows.append(row)
            once = f" (+ {prepare:.2f} s once)" if one is not None else ""
            print(f"N={n:>6,} {metric.name:>4}: {seconds:8.2f} s per resample{once}", flush=True)
    about = {
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "reference_images": args.reference,
        "default_resamples": bootstrap.RESAMPLES,
        "load_1m": os.getloadavg()[0],
    }
    if args.out:
        Path(args.out).write_text(json.dumps({"about": about, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
