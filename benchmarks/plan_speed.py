"""How long `ditbench plan` takes: the default answer (cold, warm, with every trace made afresh), one
DiT-XL/2 cell, and optionally the default grid.

    python benchmarks/plan_speed.py [--card "RTX 4090"] [--grid] [--write reports/plan_speed]

Each measurement runs in a fresh process and reports wall time, CPU time (user + system of the
process; on a shared machine wall time depends on the neighbours, CPU time much less) and the lines it
printed. "cold": an empty trace cache (the shipped traces serve the default answer); "warm": the same
command again; "--no-cache": every series traced afresh (what a torch release without shipped traces
pays once; the disk cache keeps them after). Target: the default answer within 15 s on 2 cores.
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


def timed(argv: list[str], cache: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DITBENCH_CACHE": cache}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "ditbench", "plan", *argv], capture_output=True, text=True,
                         env=env, check=True).stdout  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"argv": argv, "wall_s": round(time.perf_counter() - start, 1), "cpu_s": round(cpu, 1),
            "lines": len(out.splitlines())}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--card", default="RTX 4090")
    parser.add_argument(
        "--grid", action="store_true", help="also the default grid and tree (--full: minutes)"
    )
    parser.add_argument("--write", type=Path, help="write README.md and runs.json here")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        one = ["--card", "H200", "--models", "DiT-XL/2", "--precisions", "bf16", "--grad-ckpt", "full"]
        one += ["--global-batch", "32", "--no-cache"]
        card = ["--card", args.card]
        for what, argv in [("cold", card), ("warm", card), ("--no-cache", [*card, "--no-cache"]),
                           ("one XL/2 cell", one)]:  # fmt: skip
            runs.append({"run": what, **timed(argv, cache)})
            print(runs[-1], flush=True)
        if args.grid:
            for what in ("--full cold", "--full warm"):
                runs.append({"run": what, **timed(["--card", args.card, "--full"], cache)})
                print(runs[-1], flush=True)
    load = os.getloadavg()[0]
    if args.write:
        args.write.mkdir(parents=True, exist_ok=True)
        (args.write / "runs.json").write_text(
            json.dumps({"load_average": load, "runs": runs}, indent=1) + "\n"
        )
        rows = "\n".join(
            f"| {r['run']} | `ditbench plan {' '.join(r['argv'])}` | {r['wall_s']} | {r['cpu_s']} "
            f"| {r['lines']} |"
            for r in runs
        )
        (args.write / "README.md").write_text(
            f"# How long `ditbench plan` takes ({os.cpu_count()} CPUs, load average {load:.1f})\n\n"
            f"`python benchmarks/plan_speed.py --grid --write {args.write}`; target: the default answer "
            "within 15 s.\n\n"
            "| run | command | wall s | CPU s | lines |\n|---|---|---|---|---|\n" + rows + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
