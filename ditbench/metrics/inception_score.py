"""Inception Score, ADM convention: splits of consecutive samples (no shuffling), logits without bias.

IS = exp(E_x KL(p(y|x) || p(y))) per split, p(y) the split's mean prediction; reported as the
mean and standard deviation (ddof 0) over splits. With 50,000 samples and 10 splits each split
holds 5,000 samples, exactly as the ADM evaluator does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ditbench.errors import UserError
from ditbench.metrics.spec import Metric, MetricInputs, Need, Option, Output

if TYPE_CHECKING:
    import torch

SPLITS = 10  # ADM: 50,000 samples in splits of 5,000


def inception_score(logits: torch.Tensor | np.ndarray, splits: int = SPLITS) -> tuple[float, float]:
    """(mean, std) of the Inception Score of N x C unbiased logits over `splits` consecutive splits."""
    import torch

    x = torch.as_tensor(logits).double()
    n = x.shape[0]
    if n < splits:
        raise UserError(f"The Inception Score with {splits} splits needs at least {splits} samples; got {n}.")
    log_p = torch.log_softmax(x, dim=1)
    scores = []
    for i in range(splits):
        part = log_p[i * n // splits : (i + 1) * n // splits]
        log_py = torch.logsumexp(part, dim=0) - np.log(part.shape[0])  # log of the mean prediction
        kl = (part.exp() * (part - log_py)).sum(1).mean()
        scores.append(float(kl.exp()))
    return float(np.mean(scores)), float(np.std(scores))


def _compute(inputs: MetricInputs, options) -> dict[str, float]:
    mean, std = inception_score(inputs.samples["logits_unbiased"], options["is_splits"])
    return {"inception_score": mean, "inception_score_std": std}


IS = Metric(
    name="is",
    title="Inception Score",
    sample_features=("logits_unbiased",),
    reference_keys=(),
    outputs=(
        Output("inception_score", "Inception Score", "{:.4f}", "higher", threshold_pct=2.0),
        Output("inception_score_std", "  (std over splits)", "{:.4f}"),
    ),
    options=(Option("is_splits", SPLITS, "Inception Score splits of consecutive samples (%(default)s)"),),
    needs=lambda o: Need(
        o["is_splits"], 0, f"{o['is_splits']} splits need one sample each", "lower --is-splits"
    ),
    compute=_compute,
)
