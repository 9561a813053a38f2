"""How long `ditbench plan` takes: one DiT-XL/2 cell, and the whole default grid for one card.

    python benchmarks/plan_speed.py            # one XL/2 cell per precision/checkpointing pair
    python benchmarks/plan_speed.py --grid     # + the default grid (1008 cells), cold and warm cache

Each measurement runs in a fresh process (nothing traced before, an empty trace cache) and reports
wall time and CPU time: on a shared machine wall time depends on the neighbours, CPU time much less.
Targets: under 5 s per XL/2 cell on 2 cores; the default grid for one card under 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CELL = """
import json, time, warnings, resource
warnings.filterwarnings("ignore")
import torch  # imports are not the cell's time
from torch._subclasses.fake_tensor import FakeTensorMode
from ditbench.plan import predict_cell
cpu0, wall0 = time.process_time(), time.perf_counter()
p = predict_cell({config}, "H200")
print(json.dumps({{"wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0,
                  "peak_gib": p.peak_allocated_gib}}))
"""


def one_cell(config: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", CELL.format(config=repr(config))],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def grid(card: str, cache: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DITBENCH_CACHE": cache}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "ditbench", "plan", "--card", card, "--json"],
        stdout=subprocess.DEVNULL,
        env=env,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", action="store_true", help="also time the default grid (minutes)")
    parser.add_argument("--card", default="RTX 4090")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for precision, ckpt in (("fp32", "none"), ("bf16", "none"), ("bf16", "full"), ("fp16", "every_2")):
        config = {"model": "DiT-XL/2", "precision": precision, "grad_ckpt": ckpt, "batch_size": 32}
        r = one_cell(config)
        print(
            f"DiT-XL/2 {precision} ckpt={ckpt}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU "
            f"(peak {r['peak_gib']:.2f} GiB)"
        )
    if args.grid:
        with tempfile.TemporaryDirectory() as cache:
            cold = grid(args.card, cache)
            warm = grid("A100-80GB", cache)
        print(
            f"default grid, {args.card}, cold cache: {cold['wall_s']:.0f} s wall, {cold['cpu_s']:.0f} s CPU"
        )
        print(f"default grid, A100-80GB, warm cache: {warm['wall_s']:.0f} s wall, {warm['cpu_s']:.0f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
