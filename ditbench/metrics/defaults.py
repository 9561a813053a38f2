"""Defaults of `ditbench fid`'s extraction, device and cache options, in one place.

The CLI, `Scorer`/`evaluate` and the docs read them from here. Each metric's own options and
their defaults live in its spec (`registry.OPTIONS`: `is_splits`, `pr_k`, `kid_subsets`, ...).
"""

from __future__ import annotations

DEFAULTS: dict[str, object] = {
    # feature extraction
    "batch_size": 100,  # images per Inception forward pass
    "device": "auto",  # "auto" = cuda when visible, else cpu
    "tf32": False,  # TF32 changes features; metrics run in true fp32 unless asked
    "inception_weights": None,  # path or "test"; else $DITBENCH_INCEPTION_WEIGHTS; else the torch hub cache
    "num_workers": 4,  # threads decoding image files / reading the npz ahead of the network
    # reference cache
    "cache": True,
    "cache_dir": None,  # None = $DITBENCH_CACHE, else ~/.cache/ditbench/fid
}
