"""Inception Score, ADM convention: consecutive splits (no shuffling) of 5,000, the last one shorter,
so the score is ADM's at every N; logits without bias. `--is-splits K`: K near-equal splits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ditbench.errors import UserError
from ditbench.metrics.spec import Metric, MetricInputs, Need, Option, Output

if TYPE_CHECKING:
    import torch

ADM_SPLIT_SIZE = 5000  # samples per split in the ADM evaluator
SPLITS = 0  # 0: ADM's chunks of ADM_SPLIT_SIZE; K > 0: K equal splits


def split_bounds(n: int, splits: int = SPLITS) -> list[tuple[int, int]]:
    """[start, end) of each split of n consecutive samples under the rule `splits` selects."""
    if splits == 0:
        return [(lo, min(lo + ADM_SPLIT_SIZE, n)) for lo in range(0, n, ADM_SPLIT_SIZE)]
    return [(i * n // splits, (i + 1) * n // splits) for i in range(splits)]


def split_rule(splits: int, n: int) -> str:
    """How the score of n samples was split, for the result's settings."""
    count = len(split_bounds(n, splits))
    if splits == 0:
        return f"adm: consecutive chunks of {ADM_SPLIT_SIZE} ({count} split{'s' * (count != 1)})"
    return f"{splits} equal consecutive splits (--is-splits)"


def inception_score(logits: torch.Tensor | np.ndarray, splits: int = SPLITS) -> tuple[float, float]:
    """(mean, std) of the Inception Score of N x C unbiased logits over consecutive splits."""
    import torch

    x = torch.as_tensor(logits).double()
    n = x.shape[0]
    if n < max(splits, 1):
        raise UserError(
            f"The Inception Score with {splits} splits needs at least {splits} samples; got {n}."
            if splits
            else "The Inception Score needs at least one sample; got 0."
        )
    log_p = torch.log_softmax(x, dim=1)
    scores = []
    for lo, hi in split_bounds(n, splits):
        part = log_p[lo:hi]
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
    options=(
        Option(
            "is_splits",
            SPLITS,
            "Inception Score splits of consecutive samples; 0: ADM's chunks of 5000, the last shorter",
            minimum=0,
        ),
    ),
    needs=lambda o: (
        Need(o["is_splits"], 0, f"{o['is_splits']} splits need one sample each", "lower --is-splits")
        if o["is_splits"]
        # ADM's rule takes any N; one sample would score exactly 1 whatever it shows.
        else Need(2, 0, "one sample scores exactly 1 whatever it shows")
    ),
    compute=_compute,
)
