"""Kernel Inception Distance (Binkowski et al. 2018): unbiased MMD^2 with a cubic polynomial kernel.

k(x, y) = (x.y / d + 1)^3, averaged over `subsets` random subsets of `subset_size` samples
from each set (without replacement within a subset). The subsets are drawn as torch-fidelity
draws them (numpy RandomState(seed), one choice for each set per subset), so at the same seed
both tools score the same subsets. Kernels are computed in float64.
"""

from __future__ import annotations

import numpy as np
import torch

from ditbench.errors import UserError
from ditbench.metrics.defaults import DEFAULTS


def polynomial_kernel(
    x: torch.Tensor,
    y: torch.Tensor,
    degree: int = DEFAULTS["kid_degree"],
    coef0: float = DEFAULTS["kid_coef0"],
) -> torch.Tensor:
    return (x @ y.T / x.shape[1] + coef0) ** degree


def mmd2_unbiased(x: torch.Tensor, y: torch.Tensor, **kernel_args) -> float:
    """Unbiased MMD^2: within-set kernel means exclude the diagonal, the cross term does not."""
    m = x.shape[0]
    kxx, kyy, kxy = (polynomial_kernel(a, b, **kernel_args) for a, b in ((x, x), (y, y), (x, y)))
    within = (kxx.sum() - kxx.diagonal().sum() + kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
    return float(within - 2.0 * kxy.sum() / (m * m))


def kernel_inception_distance(
    sample_feats,
    ref_feats,
    subsets: int = DEFAULTS["kid_subsets"],
    subset_size: int = DEFAULTS["kid_subset_size"],
    seed: int = DEFAULTS["kid_seed"],
    device: str | torch.device | None = None,
    **kernel_args,
) -> tuple[float, float]:
    """(mean, std) of MMD^2 over the subsets."""
    dev = device if device is not None else torch.as_tensor(sample_feats).device
    s = torch.as_tensor(sample_feats).to(dev, torch.float64)
    r = torch.as_tensor(ref_feats).to(dev, torch.float64)
    if min(len(s), len(r)) < subset_size:
        raise UserError(
            f"KID with subsets of {subset_size} needs at least {subset_size} samples and reference "
            f"images; got {len(s)} and {len(r)}. Lower --kid-subset-size or leave kid out of --metrics."
        )
    if subset_size < 2:
        raise UserError(f"--kid-subset-size must be at least 2; got {subset_size}.")
    rng = np.random.RandomState(seed)
    values = np.empty(subsets)
    for i in range(subsets):
        si = torch.from_numpy(rng.choice(len(s), subset_size, replace=False)).to(dev)
        ri = torch.from_numpy(rng.choice(len(r), subset_size, replace=False)).to(dev)
        values[i] = mmd2_unbiased(s[si], r[ri], **kernel_args)
    return float(values.mean()), float(values.std())
