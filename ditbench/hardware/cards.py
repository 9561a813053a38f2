"""GPU cards by name: the memory a process can use, the compute capability and the datasheet of each.

`usable_gib` is the total memory the driver reports (nvidia-smi's "Total", MiB / 1024), less than the
marketing size (an "RTX 4090 24 GB" exposes 23.99 GiB). A generic name several cards answer to (`A100`,
`V100`) picks the largest; `ambiguity(name)` says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ditbench.core.errors import UserError, did_you_mean, shorten


@dataclass(frozen=True)
class Card:
    name: str
    usable_gib: float  # total memory the driver exposes
    memory_class_gb: int  # the size it is sold as: 12, 16, 24, 32, 40, 48, 80, 94, 141
    arch: tuple[int, int]  # compute capability: decides bf16, flash attention, the cuBLAS workspace
    aliases: tuple[str, ...] = ()


CARDS: tuple[Card, ...] = (
    Card("RTX 3060 12GB", 11.76, 12, (8, 6), ("3060",)),
    Card("RTX 4070 12GB", 11.99, 12, (8, 9), ("4070",)),
    Card("T4", 14.75, 16, (7, 5), ("Tesla T4",)),
    Card("RTX 4080 16GB", 15.99, 16, (8, 9), ("4080",)),
    Card("V100 16GB", 15.77, 16, (7, 0), ("V100-16GB", "Tesla V100 16GB")),
    Card("RTX 3090", 23.69, 24, (8, 6), ("3090",)),
    Card("RTX 4090", 23.99, 24, (8, 9), ("4090",)),
    Card("L4", 22.49, 24, (8, 9), ("NVIDIA L4",)),
    Card("A10", 22.49, 24, (8, 6), ("A10G", "NVIDIA A10")),
    # 32 GB GDDR7 (NVIDIA GeForce RTX 5090 product page); nvidia-smi shows 32607 MiB.
    Card("RTX 5090", 31.84, 32, (12, 0), ("5090",)),
    # 32 GB HBM2 (NVIDIA Tesla V100 datasheet, SXM2 and PCIe 32GB); nvidia-smi shows 32510 MiB.
    Card(
        "V100-32GB", 31.75, 32, (7, 0), ("V100 32GB", "Tesla V100 32GB", "V100-SXM2-32GB", "V100-PCIE-32GB")
    ),
    Card("A100-40GB", 39.39, 40, (8, 0), ("A100 40GB", "A100-SXM4-40GB", "A100-PCIE-40GB")),
    Card("RTX A6000", 47.99, 48, (8, 6), ("A6000",)),
    Card("L40S", 44.99, 48, (8, 9), ("L40", "L40S 48GB")),
    Card("A100-80GB", 79.35, 80, (8, 0), ("A100 80GB", "A100-SXM4-80GB")),
    Card("H100", 79.65, 80, (9, 0), ("H100 SXM", "H100 80GB", "H100-SXM5-80GB")),
    Card("H100 NVL", 93.58, 94, (9, 0), ("H100 94GB",)),
    Card("H200", 139.8, 141, (9, 0), ("H200 141GB", "NVIDIA H200")),
)

MEMORY_CLASSES_GB = (12, 16, 24, 32, 40, 48, 80, 94, 141)
GENERIC_NAMES = {"A100": "A100-80GB", "V100": "V100-32GB"}


@dataclass(frozen=True)
class Datasheet:
    """A card's speed figures for the time model (plan/speed.py), dense (no sparsity), in TFLOPS/GB/s.

    `fp16` is the tensor-core rate for fp16/bf16 inputs with float32 accumulation (what PyTorch's
    matmuls use; GeForce cards run it at half their fp16-accumulate rate); `tf32` equals `fp32` on
    cards without TF32 (before Ampere). `link_gbs`: per-GPU bandwidth in one direction to the other
    GPUs of a node (NVLink where the card has it, else PCIe), what a ring all-reduce moves data at.
    """

    fp32: float
    tf32: float
    fp16: float
    memory_gbs: float
    link_gbs: float
    link: str
    bf16: bool = True
    # fp32, tf32, fp16, bf16 TFLOPS of large matmuls as measured on the card, where the project measured
    # them: what a datasheet's boost-clock peak is not (an H200 sustains 76-82% of it).
    sustained: tuple[float, float, float, float] | None = None


# Vendor datasheets / architecture whitepapers (dense figures; "with sparsity" halved):
# H100/H200 SXM: NVIDIA H100 and H200 datasheets (67 / 494.7 / 989.4; HBM3 3.35 TB/s, HBM3e 4.8 TB/s;
# NVLink 4 900 GB/s both ways). H100 NVL: H100 datasheet (60 / 417.5 / 835.5; 3.9 TB/s; NVLink bridge
# 600 GB/s). A100 SXM: A100 datasheet (19.5 / 156 / 312; 1,555 GB/s 40GB, 2,039 GB/s 80GB; NVLink 3
# 600 GB/s). V100 SXM2: V100 datasheet (15.7 fp32, 125 tensor fp16, 900 GB/s, NVLink 2 300 GB/s).
# T4, L4, A10, L40S, RTX A6000: their product datasheets. GeForce: NVIDIA's Ampere GA102 and Ada
# AD102 whitepapers (fp16 tensor with fp32 accumulate) and product pages (memory bandwidth); RTX 5090:
# its product page (104.8 fp32, 1,792 GB/s). PCIe per direction: Gen3 x16 16, Gen4 32, Gen5 64 GB/s.
DATASHEETS: dict[str, Datasheet] = {
    "RTX 3060 12GB": Datasheet(12.7, 12.7, 25.4, 360, 32, "PCIe 4.0"),
    "RTX 4070 12GB": Datasheet(29.1, 29.1, 58.3, 504, 32, "PCIe 4.0"),
    "T4": Datasheet(8.1, 8.1, 65.0, 320, 16, "PCIe 3.0", bf16=False),
    "RTX 4080 16GB": Datasheet(48.7, 48.7, 97.5, 717, 32, "PCIe 4.0"),
    "V100 16GB": Datasheet(15.7, 15.7, 125.0, 900, 150, "NVLink 2", bf16=False),
    "RTX 3090": Datasheet(35.6, 35.6, 71.0, 936, 32, "PCIe 4.0"),
    "RTX 4090": Datasheet(82.6, 82.6, 165.2, 1008, 32, "PCIe 4.0"),
    "L4": Datasheet(30.3, 60.0, 121.0, 300, 32, "PCIe 4.0"),
    "A10": Datasheet(31.2, 62.5, 125.0, 600, 32, "PCIe 4.0"),
    "RTX 5090": Datasheet(104.8, 104.8, 209.5, 1792, 64, "PCIe 5.0"),
    "V100-32GB": Datasheet(15.7, 15.7, 125.0, 900, 150, "NVLink 2", bf16=False),
    "A100-40GB": Datasheet(19.5, 156.0, 312.0, 1555, 300, "NVLink 3"),
    "RTX A6000": Datasheet(38.7, 77.4, 154.8, 768, 32, "PCIe 4.0"),
    "L40S": Datasheet(91.6, 183.0, 362.0, 864, 32, "PCIe 4.0"),
    "A100-80GB": Datasheet(19.5, 156.0, 312.0, 2039, 300, "NVLink 3"),
    "H100": Datasheet(67.0, 494.7, 989.4, 3350, 450, "NVLink 4"),
    "H100 NVL": Datasheet(60.0, 417.5, 835.5, 3900, 300, "NVLink bridge"),
    # sustained: the 8192^3 matmuls of benchmarks/h200_official_dit_anchor.jsonl
    "H200": Datasheet(67.0, 494.7, 989.4, 4800, 450, "NVLink 4", sustained=(50.6, 405.5, 748.8, 780.5)),
}


def described(tflops: float, mem_bw: float) -> Datasheet:
    """A card not in the table (`plan --tflops --mem-bw`): its dense bf16/fp16 tensor TFLOPS (tf32 and
    fp32 half of it, as on Ampere and later) and its memory GB/s, over PCIe 4.0 between GPUs."""
    for flag, value in (("--tflops", tflops), ("--mem-bw", mem_bw)):
        if not math.isfinite(value) or not 0 < value <= 1e6:
            raise UserError(f"{flag} must be a finite number above 0, got {value}")
    return Datasheet(tflops / 2, tflops / 2, tflops, mem_bw, 32, "PCIe 4.0")


def _key(text: str) -> str:
    low = text.lower().replace("nvidia", "").replace("geforce", "").replace("tesla", "")
    return re.sub(r"[^a-z0-9]", "", low)


_BY_KEY = {_key(alias): card for card in CARDS for alias in (card.name, *card.aliases)}
_BY_KEY.update({_key(generic): _BY_KEY[_key(name)] for generic, name in GENERIC_NAMES.items()})


def find_card(name: str) -> Card:
    """The card called `name` (case, spaces, dashes and "NVIDIA", "GeForce", "Tesla" do not matter)."""
    card = _BY_KEY.get(_key(str(name)))
    if card is not None:
        return card
    names = [c.name for c in CARDS]
    hint = did_you_mean(name, names, show="{!r}")
    raise UserError(
        f"unknown card {shorten(name)}.{hint} Known cards: {', '.join(names)}; or describe it: its memory "
        "in GiB (gpu_memory_gib; `ditbench plan --memory-gib GIB --tflops T --mem-bw GBS`)."
    )


def ambiguity(name: str) -> str | None:
    """What a generic card name chose and its alternatives, as a sentence; None for an exact name."""
    generic = next((g for g in GENERIC_NAMES if _key(g) == _key(str(name))), None)
    if generic is None:
        return None
    chosen = find_card(generic)
    alternatives = ", ".join(
        f"{c.name} ({c.usable_gib:.2f} GiB)"
        for c in CARDS
        if c is not chosen and any(_key(a).startswith(_key(generic)) for a in (c.name, *c.aliases))
    )
    return (
        f"card {shorten(name)} names several cards: chose {chosen.name} ({chosen.usable_gib:.2f} GiB "
        f"usable), the largest; the other {generic}: {alternatives}. Name the card exactly for another."
    )


def cards_in_class(memory_class_gb: int) -> list[Card]:
    return [c for c in CARDS if c.memory_class_gb == memory_class_gb]


def check_gib(value: object, where: str) -> float:
    """A memory size in GiB: a finite number > 0 (NaN and inf are refused, not silently passed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:  # NaN too
        raise UserError(f"{where} must be a finite number of GiB greater than 0, got {shorten(value)}.")
    return float(value)
