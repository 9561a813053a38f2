"""Improved precision and recall (Kynkaanniemi et al. 2019), ADM convention.

Each set's manifold is the union of balls around its points, each ball's radius the distance
to the point's k-th nearest neighbour in the same set (k = 3, the point itself not counted).
Precision: the share of samples inside the reference manifold. Recall: the share of reference
points inside the sample manifold. Distances are computed block by block (a block of rows
against a block of columns), so 50,000 samples against 10,000 references never hold more than
one block of distances in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ditbench.errors import UserError
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


def _compute(inputs: MetricInputs, options) -> dict[str, float]:
    import torch

    ref = torch.from_numpy(np.asarray(inputs.reference["pool3"], dtype=np.float32))
    precision, recall = precision_recall(
        inputs.samples["pool3"], ref, k=options["pr_k"], block=options["pr_block_size"], device=inputs.device
    )
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
        Option("pr_k", K, "precision/recall: the k of the k-th nearest neighbour radius (%(default)s)"),
        Option("pr_block_size", BLOCK, "precision/recall: rows and columns per distance block (%(default)s)"),
    ),
    needs=lambda o: Need(
        o["pr_k"] + 1, o["pr_k"] + 1, f"k={o['pr_k']} needs k + 1 points per set", "lower --pr-k"
    ),
    compute=_compute,
)
