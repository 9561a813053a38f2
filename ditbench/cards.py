"""GPU cards by name: the memory a training process can use on each, shared by the card emulation
(`gpu_memory_gib` / `card` in a suite) and the memory planner.

`usable_gib` is the card's total memory as the driver reports it
(`torch.cuda.get_device_properties(i).total_memory`, the figure `nvidia-smi` shows as "Total"),
which is less than the marketing size: an "RTX 4090 24 GB" exposes 23.99 GiB and an "A100 40GB"
39.4 GiB. The CUDA context (about 0.3-0.6 GiB, driver dependent) comes out of that too; the
emulation measures it on the spot rather than assuming a figure.

Values are from public `nvidia-smi` readings of each card (MiB / 1024), rounded to 0.01 GiB; a
driver or ECC setting can move them by a few tens of MiB.

A generic name that several cards answer to (`A100`, `V100`) picks the largest; `ambiguity(name)`
says which it chose and what else it could have meant, for the commands to show.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass

from ditbench.errors import UserError, shorten


@dataclass(frozen=True)
class Card:
    name: str
    usable_gib: float  # total memory the driver exposes
    memory_class_gb: int  # the size it is sold as: 12, 16, 24, 32, 40, 48, 80, 94, 141
    aliases: tuple[str, ...] = ()


CARDS: tuple[Card, ...] = (
    Card("RTX 3060 12GB", 11.76, 12, ("3060",)),
    Card("RTX 4070 12GB", 11.99, 12, ("4070",)),
    Card("T4", 14.75, 16, ("Tesla T4",)),
    Card("RTX 4080 16GB", 15.99, 16, ("4080",)),
    Card("V100 16GB", 15.77, 16, ("V100-16GB", "Tesla V100 16GB")),
    Card("RTX 3090", 23.69, 24, ("3090",)),
    Card("RTX 4090", 23.99, 24, ("4090",)),
    Card("L4", 22.49, 24, ("NVIDIA L4",)),
    Card("A10", 22.49, 24, ("A10G", "NVIDIA A10")),
    # 32 GB GDDR7 (NVIDIA GeForce RTX 5090 product page); nvidia-smi shows 32607 MiB.
    Card("RTX 5090", 31.84, 32, ("5090",)),
    # 32 GB HBM2 (NVIDIA Tesla V100 datasheet, SXM2 and PCIe 32GB); nvidia-smi shows 32510 MiB.
    Card(
        "V100-32GB", 31.75, 32, ("V100 32GB", "Tesla V100 32GB", "V100-SXM2-32GB", "V100-PCIE-32GB", "V100")
    ),
    Card("A100-40GB", 39.39, 40, ("A100 40GB", "A100-SXM4-40GB", "A100-PCIE-40GB")),
    Card("RTX A6000", 47.99, 48, ("A6000",)),
    Card("L40S", 44.99, 48, ("L40", "L40S 48GB")),
    Card("A100-80GB", 79.35, 80, ("A100 80GB", "A100-SXM4-80GB", "A100")),
    Card("H100", 79.65, 80, ("H100 SXM", "H100 80GB", "H100-SXM5-80GB")),
    Card("H100 NVL", 93.58, 94, ("H100 94GB",)),
    Card("H200", 139.8, 141, ("H200 141GB", "NVIDIA H200")),
)

MEMORY_CLASSES_GB = (12, 16, 24, 32, 40, 48, 80, 94, 141)
# Names several cards answer to, and the card each picks (the largest variant).
GENERIC_NAMES = {"A100": "A100-80GB", "V100": "V100-32GB"}


def _key(text: str) -> str:
    low = text.lower().replace("nvidia", "").replace("geforce", "").replace("tesla", "")
    return re.sub(r"[^a-z0-9]", "", low)


_BY_KEY = {_key(alias): card for card in CARDS for alias in (card.name, *card.aliases)}


def find_card(name: str) -> Card:
    """The card called `name` (case, spaces, dashes and "NVIDIA", "GeForce", "Tesla" do not matter)."""
    card = _BY_KEY.get(_key(str(name)))
    if card is not None:
        return card
    names = [c.name for c in CARDS]
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UserError(
        f"unknown card {shorten(name)}.{hint} Known cards: {', '.join(names)}; or give the memory "
        "in GiB instead (gpu_memory_gib / --memory-gib)."
    )


def ambiguity(name: str) -> str | None:
    """What a generic card name chose and its alternatives, as a sentence; None for an exact name."""
    generic = next((g for g in GENERIC_NAMES if _key(g) == _key(str(name))), None)
    if generic is None:
        return None
    chosen = find_card(generic)
    others = [
        c
        for c in CARDS
        if c is not chosen and any(_key(a).startswith(_key(generic)) for a in (c.name, *c.aliases))
    ]
    alternatives = ", ".join(f"{c.name} ({c.usable_gib:.2f} GiB)" for c in others)
    return (
        f"card {shorten(name)} names several cards: chose {chosen.name} ({chosen.usable_gib:.2f} GiB "
        f"usable), the largest; the other {generic}: {alternatives}. Name the card exactly for another."
    )


def cards_in_class(memory_class_gb: int) -> list[Card]:
    return [c for c in CARDS if c.memory_class_gb == memory_class_gb]


def check_gib(value: object, where: str) -> float:
    """A memory size in GiB: a finite number > 0 (NaN and inf are refused, not silently passed)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UserError(f"{where} must be a finite number of GiB greater than 0, got {shorten(value)}.")
    return float(value)
