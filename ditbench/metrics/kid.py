"""Kernel Inception Distance (Binkowski et al. 2018): unbiased MMD^2 with a cubic polynomial kernel.

k(x, y) = (x.y / d + 1)^3 in float64, averaged over `subsets` random subsets of `subset_size` from each
set, drawn as torch-fidelity draws them (RandomState(seed)), so at one seed both score the same subsets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ditbench.core.errors import UserError
from ditbench.metrics.spec import Metric, MetricInputs, Need, Option, Output

if TYPE_CHECKING:
    import torch

SUBSETS = 100
SUBSET_SIZE = 1000
DEGREE = 3
COEF0 = 1.0
SEED = 2020  # torch-fidelity's default rng_seed, so the subsets are the same as its own


def polynomial_kernel(
    x: torch.Tensor, y: torch.Tensor, degree: int = DEGREE, coef0: float = COEF0
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
    subsets: int = SUBSETS,
    subset_size: int = SUBSET_SIZE,
    seed: int = SEED,
    device: str | torch.device | None = None,
    **kernel_args,
) -> tuple[float, float]:
    """(mean, std) of MMD^2 over the subsets."""
    import torch

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


KERNEL_CACHE_BYTES = 2 * 2**30  # the resampler's sample kernel; beyond this the bootstrap reruns KID


def _resampler(inputs: MetricInputs, options):
    """KID of resampled samples against the fixed reference (metrics.bootstrap), from kernels kept once.

    A resample draws its subsets as `kernel_inception_distance` would (positions depend only on N), so
    each reference subset's kernel sum is computed once. With c_t each sample's count in subset t, the
    sample terms come from the samples' kernel K, kept once: c_t K c_t - c_t . diag K, and the cross
    term c_t . (K_sr e_t). A resample is one T x N by N x N product; None when K is too large.
    """
    import torch

    subsets, m, seed = options["kid_subsets"], options["kid_subset_size"], options["kid_seed"]
    kernel = {"degree": options["kid_degree"], "coef0": options["kid_coef0"]}
    dev = inputs.device
    s, r = inputs.pool3(torch.float64)
    n = len(s)
    if 8 * n * n > KERNEL_CACHE_BYTES:
        return None
    rng = np.random.RandomState(seed)
    positions, ref_rows, within_ref = [], [], np.empty(subsets)
    for t in range(subsets):
        positions.append(rng.choice(n, m, replace=False))
        ref_rows.append(rng.choice(len(r), m, replace=False))
        rows = r[torch.from_numpy(ref_rows[t]).to(dev)]
        k = polynomial_kernel(rows, rows, **kernel)
        within_ref[t] = float(k.sum() - k.diagonal().sum())
    # Each sample's kernel summed over each reference subset: against every used row once, then
    # summed per subset by a 0/1 membership matrix (rows x subsets), a block of samples at a time.
    used = np.unique(np.concatenate(ref_rows))
    member = torch.zeros(len(used), subsets, dtype=torch.float64, device=dev)
    for t, rows in enumerate(ref_rows):
        member[np.searchsorted(used, rows), t] = 1.0
    r_used = r[torch.from_numpy(used).to(dev)]
    cross = torch.cat(
        [polynomial_kernel(s[i : i + 1000], r_used, **kernel) @ member for i in range(0, n, 1000)]
    )
    cross = cross.cpu().numpy()
    k_ss = polynomial_kernel(s, s, **kernel)
    diag = k_ss.diagonal().clone()
    ones = torch.ones(m, dtype=torch.float64, device=dev)

    def one(index: np.ndarray) -> dict[str, float]:
        counts = torch.zeros(subsets, n, dtype=torch.float64, device=dev)
        for t in range(subsets):
            counts[t].index_add_(0, torch.from_numpy(index[positions[t]]).to(dev), ones)
        within_s = ((counts @ k_ss) * counts).sum(1) - counts @ diag
        cross_t = (counts.cpu().numpy() * cross.T).sum(1)
        values = (within_s.cpu().numpy() + within_ref) / (m * (m - 1)) - 2.0 * cross_t / (m * m)
        return {"kid": float(values.mean()), "kid_std": float(values.std())}

    return one


def _compute(inputs: MetricInputs, options) -> dict[str, float]:
    import torch

    draws = (options["kid_subsets"], options["kid_subset_size"], options["kid_seed"])
    kernel = {"degree": options["kid_degree"], "coef0": options["kid_coef0"]}
    mean, std = kernel_inception_distance(*inputs.pool3(torch.float64), *draws, **kernel)
    return {"kid": mean, "kid_std": std}


KID = Metric(
    name="kid",
    title="KID",
    sample_features=("pool3",),
    reference_keys=("pool3",),
    outputs=(
        Output("kid", "KID", "{:.6f}", "lower", valid="any"),  # the unbiased estimate can be negative
        Output("kid_std", "  (std over subsets)", "{:.6f}"),
    ),
    options=(
        Option("kid_subsets", SUBSETS, "KID: random subsets averaged over"),
        Option("kid_subset_size", SUBSET_SIZE, "KID: samples per subset", minimum=2),
        Option("kid_seed", SEED, "KID: seed of the subset draws", minimum=0, maximum=2**32 - 1),
        Option("kid_degree", DEGREE, "KID: degree of the polynomial kernel"),
        Option("kid_coef0", COEF0, "KID: constant of the polynomial kernel", minimum=None, kind=float),
    ),
    needs=lambda o: Need(
        o["kid_subset_size"],
        o["kid_subset_size"],
        f"subsets of {o['kid_subset_size']}",
        "lower --kid-subset-size",
    ),
    compute=_compute,
    resampler=_resampler,
)
