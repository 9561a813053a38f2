"""Inception Score, ADM convention: splits of consecutive samples (no shuffling), logits without bias.

IS = exp(E_x KL(p(y|x) || p(y))) per split, p(y) the split's mean prediction; reported as the
mean and standard deviation (ddof 0) over splits. With 50,000 samples and 10 splits each split
holds 5,000 samples, exactly as the ADM evaluator does.
"""

from __future__ import annotations

import numpy as np
import torch

from ditbench.errors import UserError
from ditbench.metrics.defaults import DEFAULTS


def inception_score(
    logits: torch.Tensor | np.ndarray, splits: int = DEFAULTS["is_splits"]
) -> tuple[float, float]:
    """(mean, std) of the Inception Score of N x C unbiased logits over `splits` consecutive splits."""
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
