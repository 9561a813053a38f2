"""Input arrays checked when they are read: NaN latents would fail a run at its first steps, a label
of 2.7 or -1 would be truncated or index out of range. The refusal names the file and the first bad value.
"""

from __future__ import annotations

import torch

from ditbench.errors import UserError


def check_latents(latents: torch.Tensor, labels: torch.Tensor, where: str) -> None:
    """UserError naming `where` for non-finite latents or labels that are not non-negative integers."""
    if latents.is_complex() or not (latents.is_floating_point() or latents.dtype in _INTS):
        raise UserError(f"latent file {where!r}: latents are {latents.dtype}, expected float32 numbers")
    if latents.is_floating_point():
        finite = torch.isfinite(latents)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            first = int((~finite).flatten(1).any(1).nonzero()[0])
            raise UserError(
                f"latent file {where!r} holds {bad:,} NaN or infinite values (the first in latent {first}); "
                "training on it would fail at its first steps. Re-encode the images with "
                "`ditbench extract-latents`, or drop those latents."
            )
    if labels.is_floating_point():
        if not bool(torch.isfinite(labels).all()) or not bool((labels == labels.round()).all()):
            raise UserError(f"latent file {where!r}: labels must be whole class numbers, not fractions, NaN")
    elif labels.is_complex() or labels.dtype not in _INTS:
        raise UserError(f"latent file {where!r}: labels are {labels.dtype}, expected integer class numbers")
    if labels.numel() and int(labels.min()) < 0:
        low = int(labels.min())
        raise UserError(f"latent file {where!r}: labels must be class numbers from 0, got {low}")


_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
