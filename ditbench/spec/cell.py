"""The typed cell spec: a cell's contract between the suite, the runner and the process that measures it.

`CellSpec` = the knobs + how the cell is measured + where; its flat JSON is the record's `config` and a
cell process's spec file. A cell id hashes only what differs from the defaults, so a new knob with a
default leaves every id as it was.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import Field, model_serializer, model_validator

from ditbench.core.errors import shorten
from ditbench.core.validation import refuse, unknown_key
from ditbench.spec.base import Choice, Int, Real, SpecModel
from ditbench.spec.knobs import KNOBS, Knobs
from ditbench.spec.quality import QualitySpec

MAX_STEPS = 10**7  # a window or smoke run longer than this is a typo, not a benchmark
MAX_SECONDS = 7 * 24 * 3600.0  # a week: a longer window or timeout is a typo
ID_CHARS = 12  # hex characters of the sha256: 48 bits, no collision within any real suite
MEASUREMENT_KEYS = ("global_batch", "steps", "smoke_steps", "device", "gpu_memory_gib", "card")


class Steps(SpecModel):
    """The measured window: `warmup` steps, then at least `measure` steps and `min_seconds`."""

    warmup: Int(0, MAX_STEPS) = 5
    measure: Int(1, MAX_STEPS) = 20
    min_seconds: Real(0.0, MAX_SECONDS) = 5.0


class CellSpec(SpecModel):
    FLAT = ("knobs",)
    knobs: Knobs
    device: Choice("cuda", "cpu")  # resolved, so a CPU result never stands in for a GPU one
    steps: Steps = Steps()
    smoke_steps: Int(0, MAX_STEPS) = 0
    # the emulated card's memory budget (GiB), None = the real card; its name (ditbench.hardware.cards)
    gpu_memory_gib: Real(0.0, 1e6, low_open=True, optional=True) = None
    card: str | None = Field(None, strict=True)
    quality: QualitySpec | None = None  # sample quality to evaluate (the suite's `quality` section)

    @property
    def world_size(self) -> int:
        return self.knobs.gpus * self.knobs.nodes

    @property
    def rank_batch(self) -> int:
        return self.knobs.rank_batch

    @property
    def global_batch(self) -> int:
        return self.knobs.global_batch

    @model_validator(mode="wrap")
    @classmethod
    def _flat(cls, data: Any, handler: Any) -> CellSpec:
        """The flat form (a record's config, a spec file): the knobs at the top, global_batch checked."""
        if not isinstance(data, dict) or "knobs" in data:
            return handler(data)
        for key in data:
            if key not in (*KNOBS, *MEASUREMENT_KEYS, "quality"):
                raise refuse(unknown_key(key, (*KNOBS, *MEASUREMENT_KEYS, "quality")), str(key))
        if missing := [k for k in MEASUREMENT_KEYS if k not in data]:
            raise refuse(f"missing {', '.join(missing)}")
        rest = {k: v for k, v in data.items() if k not in KNOBS and k != "global_batch"}
        spec = handler({**rest, "knobs": {k: v for k, v in data.items() if k in KNOBS}})
        if data["global_batch"] != spec.global_batch:
            raise refuse(
                f"{shorten(data['global_batch'])} is not batch_size x gpus x nodes x grad_accum",
                "global_batch",
            )
        return spec

    @model_serializer(mode="wrap")
    def _flatten(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        flat = {**out.pop("knobs"), "global_batch": self.global_batch}
        flat.update((k, out[k]) for k in ("steps", "smoke_steps", "device", "gpu_memory_gib", "card"))
        if self.quality is not None:
            flat["quality"] = out["quality"]
        return flat

    def identity(self) -> dict[str, Any]:
        """What a cell id hashes: the knobs and settings that differ from their defaults, and the device."""
        config = self.model_dump(mode="json")
        out: dict[str, Any] = self.knobs.non_defaults()
        for key in ("steps", "smoke_steps", "gpu_memory_gib", "card", "quality"):
            if getattr(self, key) != CellSpec.model_fields[key].default:
                out[key] = config[key]
        out["device"] = self.device
        return out


def cell_id(spec: CellSpec) -> str:
    """Short stable hash of the cell (key order and defaults left implicit do not matter)."""
    text = json.dumps(spec.identity(), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:ID_CHARS]
