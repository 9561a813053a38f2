"""Every option of `ditbench fid` and of the metric functions, with its default, in one place.

Modules read their defaults from here so that the CLI, the Python API and the docs agree.
"""

from __future__ import annotations

# The metrics `ditbench fid` computes when --metrics is not given, in reporting order.
ALL_METRICS = ("fid", "sfid", "is", "pr", "kid")

DEFAULTS: dict[str, object] = {
    # feature extraction
    "batch_size": 100,  # images per Inception forward pass
    "device": "auto",  # "auto" = cuda when visible, else cpu
    "tf32": False,  # TF32 changes features; metrics run in true fp32 unless asked
    "inception_weights": None,  # path; else $DITBENCH_INCEPTION_WEIGHTS; else the torch hub cache
    "num_workers": 4,  # threads decoding image files / reading the npz ahead of the network
    # Inception Score (ADM: 10 splits of consecutive samples, no shuffling)
    "is_splits": 10,
    # precision / recall (ADM: k = 3 on pool3 features)
    "pr_k": 3,
    "pr_block_size": 10000,  # rows x columns of one distance block
    # KID (torch-fidelity / MMD-GAN convention)
    "kid_subsets": 100,
    "kid_subset_size": 1000,
    "kid_degree": 3,
    "kid_coef0": 1.0,
    "kid_seed": 2020,  # torch-fidelity's default rng_seed, so the subsets are the same as its own
    # reference cache
    "cache": True,
    "cache_dir": None,  # None = $DITBENCH_CACHE, else ~/.cache/ditbench/fid
}
