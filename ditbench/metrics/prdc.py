"""Improved precision and recall (Kynkaanniemi et al. 2019), ADM convention (k = 3).

A set's manifold is the union of balls around its points, radius the distance to the k-th nearest other
point. Distances go block by block, so 50,000 x 10,000 never holds more than one block in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ditbench.core.errors import UserError
from ditbench.metrics.spec import Metric, MetricInputs, Need, Option, Output

if TYPE_CHECKING:
    import torch

K = 3  # ADM and Kynkaanniemi et al.
BLOCK = 10000  # rows x columns of one distance block


def _squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    d = a.square().sum(1, keepdim=True) - 2.0 * (a @ b.T) + b.square().sum(1).unsqueeze(0)
    return d.clamp_min_(0)


def knn_radii(feats: torch.Tensor, k: int = K, block: int = BLOCK) -> torch.Tensor:
    """Squared distance from each point to its k-th nearest other point in the same set."""
    import torch

    n = feats.shape[0]
    if n < k + 1:
        raise UserError(f"Precision/recall with k={k} needs at least {k + 1} points per set; got {n}.")
    radii = torch.empty(n, dtype=feats.dtype, device=feats.device)
    for i in range(0, n, block):
        rows = feats[i : i + block]
        # The k+1 smallest per column block, merged: the point itself is one of them (distance ~0).
        best = torch.cat(
            [
                _squared_distances(rows, feats[j : j + block])
                .topk(min(k + 1, min(block, n - j)), dim=1, largest=False)
                .values
                for j in range(0, n, block)
            ],
            dim=1,
        )
        radii[i : i + block] = best.kthvalue(k + 1, dim=1).values
    return radii


def manifold_coverage(
    query: torch.Tensor, points: torch.Tensor, radii: torch.Tensor, block: int = BLOCK
) -> torch.Tensor:
    """For each query, whether it lies in some ball (points[j], radii[j]) (boundary included)."""
    import torch

    inside = torch.zeros(query.shape[0], dtype=torch.bool, device=query.device)
    for i in range(0, query.shape[0], block):
        q = query[i : i + block]
        for j in range(0, points.shape[0], block):
            d = _squared_distances(q, points[j : j + block])
            inside[i : i + block] |= (d <= radii[j : j + block].unsqueeze(0)).any(1)
    return inside


def precision_recall(
    sample_feats,
    ref_feats,
    k: int = K,
    block: int = BLOCK,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,  # None: float32
) -> tuple[float, float]:
    """(precision, recall) of samples against references on pool3 features."""
    import torch

    dev = device if device is not None else torch.as_tensor(sample_feats).device
    dtype = torch.float32 if dtype is None else dtype
    s = torch.as_tensor(sample_feats).to(dev, dtype)
    r = torch.as_tensor(ref_feats).to(dev, dtype)
    precision = manifold_coverage(s, r, knn_radii(r, k, block), block).double().mean().item()
    recall = manifold_coverage(r, s, knn_radii(s, k, block), block).double().mean().item()
    return precision, recall


NEIGHBOURS = 32  # nearest others kept per sample for the bootstrap's radii; fewer than k drawn is rare


def _resampler(inputs: MetricInputs, options):
    """Precision and recall of resampled samples against the fixed reference (metrics.bootstrap),
    without the N^2 distances of each resample.

    Precision is a per-sample fact: its mean over the drawn indices. Recall needs each drawn sample's
    k-th nearest other drawn point (a sample drawn c times has c - 1 others at 0): from its NEIGHBOURS
    nearest samples, kept once, else against the drawn set. The (reference, sample) pairs any radius up
    to the kept neighbours' reach could cover are kept once; None when they would not fit in memory.
    """
    import torch

    k, block, dev = options["pr_k"], options["pr_block_size"], inputs.device
    s, r = inputs.pool3(torch.float32)
    n, keep = s.shape[0], min(NEIGHBOURS, s.shape[0] - 1)
    inside = manifold_coverage(s, r, knn_radii(r, k, block), block).cpu().numpy()
    near_d = torch.empty(n, keep, dtype=torch.float32, device=dev)
    near_i = torch.empty(n, keep, dtype=torch.long, device=dev)
    for i in range(0, n, block):  # block x block distances at a time, as knn_radii
        best_d, best_i = [], []
        for j in range(0, n, block):
            d = _squared_distances(s[i : i + block], s[j : j + block])
            if i == j:
                d.fill_diagonal_(torch.inf)  # a sample is not its own neighbour
            top = d.topk(min(keep, d.shape[1]), dim=1, largest=False)
            best_d.append(top.values)
            best_i.append(top.indices + j)
        top = torch.cat(best_d, 1).topk(keep, dim=1, largest=False)
        near_d[i : i + block], near_i[i : i + block] = top.values, torch.cat(best_i, 1).gather(1, top.indices)
    reach = near_d[:, -1]  # no radius found from the list is larger
    pairs_r, pairs_s, pairs_d = [], [], []
    count = 0
    for i in range(0, r.shape[0], block):
        for j in range(0, n, block):
            d = _squared_distances(r[i : i + block], s[j : j + block])
            hit = (d <= reach[j : j + block].unsqueeze(0)).nonzero()
            count += len(hit)
            if count > 50_000_000:  # about 1 GB of pairs
                return None
            pairs_r.append(hit[:, 0] + i)
            pairs_s.append(hit[:, 1] + j)
            pairs_d.append(d[hit[:, 0], hit[:, 1]])
    pr_, ps_, pd_ = (torch.cat(x).cpu().numpy() for x in (pairs_r, pairs_s, pairs_d))
    near_d, near_i = near_d.cpu().numpy(), near_i.cpu().numpy()
    s_host, r_host = s.cpu(), r.cpu()
    m = r.shape[0]

    def one(index: np.ndarray) -> dict[str, float]:
        counts = np.bincount(index, minlength=n)
        drawn = np.flatnonzero(counts)
        need = k - (counts[drawn] - 1)  # others still to find beyond the sample's own copies
        cum = np.cumsum(counts[near_i[drawn]], axis=1)
        found = cum >= need[:, None]
        radius = near_d[drawn, found.argmax(1)]
        radius[need <= 0] = 0.0
        all_radii = np.full(n, -np.inf, dtype=np.float32)  # not drawn: no ball
        all_radii[drawn] = radius
        covered = np.zeros(m, dtype=bool)
        ok = pd_ <= all_radii[ps_]
        covered[pr_[ok]] = True
        for j in drawn[~found.any(1) & (need > 0)]:  # fewer than k of the kept neighbours drawn
            d = _squared_distances(s_host[j : j + 1], s_host[drawn])[0].numpy()
            others = np.repeat(d, counts[drawn] - (drawn == j))  # its own copies but one, then the rest
            rad = np.partition(others, k - 1)[k - 1]
            covered |= _squared_distances(r_host, s_host[j : j + 1])[:, 0].numpy() <= rad
        return {"precision": float(inside[index].mean()), "recall": float(covered.mean())}

    return one


def _compute(inputs: MetricInputs, options) -> dict[str, float]:
    import torch

    s, r = inputs.pool3(torch.float32)
    k, block = options["pr_k"], options["pr_block_size"]
    precision, recall = precision_recall(s, r, k=k, block=block, device=inputs.device)
    return {"precision": precision, "recall": recall}


PR = Metric(
    name="pr",
    title="Precision/recall",
    sample_features=("pool3",),
    reference_keys=("pool3",),
    outputs=(
        Output("precision", "Precision", "{:.4f}", "higher"),
        Output("recall", "Recall", "{:.4f}", "higher"),
    ),
    options=(
        Option("pr_k", K, "precision/recall: the k of the k-th nearest neighbour radius"),
        Option("pr_block_size", BLOCK, "precision/recall: rows and columns per distance block"),
    ),
    needs=lambda o: Need(
        o["pr_k"] + 1, o["pr_k"] + 1, f"k={o['pr_k']} needs k + 1 points per set", "lower --pr-k"
    ),
    compute=_compute,
    resampler=_resampler,
)
