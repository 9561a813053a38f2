"""The planner's predictions for every cell the device check measures, made here and committed.

    python benchmarks/device_predictions.py        # rewrites benchmarks/device_predictions.json

The device check compares these with the peaks it measures on the H200. They are made ahead, on any
machine, because tracing the DiT-XL/2 cells takes minutes of CPU that the GPU call cannot spare (and
the GPU machine runs another torch). Each entry is `ditbench.plan.predict_cell` of the cell's config
on the card it runs on: the H200 itself for the matched and compiled cells, the RTX 4090 for the 24 GB
suite, the CPU allocator for the dry run's stand-ins. The file records a fingerprint of the code the
prediction depends on; the device check's preflight (the dry run's too) refuses a file whose
fingerprint is not the code's, before any GPU time is spent, and prints REGENERATE.

Standard library only at import: the driver reads the file with `load` and `fingerprint`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PATH = HERE / "device_predictions.json"
SCHEMA = "ditbench.device_predictions/1"
REAL_GPU = "H200"  # the card the real run is planned for; its matched cells run on the whole card
REGENERATE = "python benchmarks/device_predictions.py"  # run in the repo root, then commit the file
# What a prediction depends on: the planner, the model, the training step (and the knobs that shape
# it), precision, the device rules and the card table. `**` keeps subpackages in.
FINGERPRINT_GLOBS = (
    "ditbench/plan/**/*.py",
    "ditbench/models/**/*.py",
    "ditbench/train/**/*.py",
    "ditbench/spec/**/*.py",
    "ditbench/hardware/device.py",
    "ditbench/hardware/precision.py",
    "ditbench/models/diffusion.py",
    "ditbench/hardware/cards.py",
)
KEY_FIELDS = ("device", "model", "precision", "grad_ckpt", "batch_size", "compile", "image_size")


def fingerprint(root: Path = REPO) -> str:
    h = hashlib.sha256()
    for pattern in FINGERPRINT_GLOBS:
        for path in sorted(root.glob(pattern)):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def staleness(table: dict[str, Any], path: Path = PATH) -> str | None:
    """Why the table (read from `path`) cannot be compared with today's code (no file, no predictions,
    another fingerprint), with the command that remakes it; None when it is current."""
    now = fingerprint()
    if not table.get("predictions"):
        why = f"{path} is missing or holds no predictions"
    elif table.get("fingerprint") != now:
        why = (
            f"{path} was made for planner code {table.get('fingerprint')}, the code is now {now} "
            "(the planner, model, step or card table changed since)"
        )
    else:
        return None
    return f"{why}: regenerate it with `{REGENERATE}` in the repo root and commit it"


def key(config: dict[str, Any], card: str | None) -> str:
    """The lookup key of a cell: its memory-shaping knobs and the card it is planned for."""
    values = [str(config.get(k, "")) for k in KEY_FIELDS]
    opt = config.get("optimizer_impl") or "auto"
    return "|".join([*values, opt, card or "-"])


def planned_card(config: dict[str, Any]) -> str | None:
    """The card a record's cell is planned for: its emulated card, else the GPU it ran on; none on a CPU."""
    if config.get("device") == "cpu":
        return None
    return config.get("card") or REAL_GPU


def cells(dry: bool) -> list[dict[str, Any]]:
    """The full configs (suite defaults applied) of every cell the check measures, dry or real."""
    import device_cells as dc

    out = []
    for suite in (dc.matched_suite(dry), dc.compiled_suite(dry), dc.suite_24gb(dry)):
        defaults = suite["defaults"]
        for partial in [{k: v[0] for k, v in suite["matrix"].items()}, *suite["include"]]:
            config = {
                "image_size": defaults["image_size"],
                "device": suite["device"],
                "compile": False,
                "grad_ckpt": "none",
                "card": suite.get("card"),
                **partial,
            }
            out.append(config)
    return out


def load(path: Path = PATH) -> dict[str, Any]:
    """{"fingerprint", "predictions": {key: prediction}, ...}; an empty table when there is no file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"fingerprint": None, "predictions": {}}
    if not isinstance(data, dict) or not isinstance(data.get("predictions"), dict):
        return {"fingerprint": None, "predictions": {}}
    return data


def lookup(table: dict[str, Any], config: dict[str, Any]) -> dict[str, Any] | None:
    return table.get("predictions", {}).get(key(config, planned_card(config)))


def predict_all() -> dict[str, Any]:
    import warnings

    sys.path.insert(0, str(REPO))
    from ditbench.plan import predict_cell

    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    table: dict[str, Any] = {}
    for dry in (False, True):
        for config in cells(dry):
            card = planned_card(config)
            k = key(config, card)
            if k in table:
                continue
            start = time.perf_counter()
            knobs = {name: value for name, value in config.items() if name != "card"}
            pred = predict_cell(knobs, card)
            # Speed is compared with what the real GPU measured, whatever card the cell emulates.
            on_gpu = pred if card in (None, REAL_GPU) else predict_cell(knobs, REAL_GPU)
            entry = {
                "predicted_steps_per_s": on_gpu.predicted_steps_per_s,
                "predicted_speed_band_pct": on_gpu.predicted_speed_band_pct,
                "status": pred.status,
                "reason": pred.reason,
                "card": card,
                "peak_allocated_gib": pred.peak_allocated_gib,
                "peak_reserved_gib": pred.peak_reserved_gib,
                "device_gib": pred.device_gib,
                "components": {name: round(v, 4) for name, v in pred.components.items()},
                "seconds": round(time.perf_counter() - start, 1),
            }
            table[k] = entry
            print(f"{k}: {pred.status} {pred.peak_allocated_gib} GiB ({entry['seconds']} s)", flush=True)
    return table


def main() -> int:
    import torch

    start = time.perf_counter()
    table = predict_all()
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    doc = {
        "schema": SCHEMA,
        "fingerprint": fingerprint(),
        "made_with": {
            "torch": torch.__version__,
            "git_sha": sha or None,
            "seconds": round(time.perf_counter() - start),
        },
        "predictions": table,
    }
    PATH.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {PATH} ({len(table)} cells)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
