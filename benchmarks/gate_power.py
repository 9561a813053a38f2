"""How often `ditbench compare` gets it right on a busy machine: A/A pairs and injected slowdowns.

Each round runs the small suite (benchmarks/gate_power.yaml) four times as separate runs, each with
`--repeats K` (every repeat a fresh process): a base run, an A/A run (the same code), a run with every
step slowed by 10% (DITBENCH_INJECT_FAULT="...=slow:0.10") and one slowed by 5%. The order of the
four rotates from round to round, so no condition always runs first or last. Then it compares:
  A/A  vs base, default policy (images/s -5%)      target: pass in >= 19 of 20
  10%  vs base, default policy                     target: regression in >= 19 of 20
  5%   vs base, images/s threshold 2%              target: never pass
While it runs, a background process keeps one core busy (--no-busy turns it off).

    nice -n 5 python benchmarks/gate_power.py --pairs 20 --repeats 5 --out reports/gate_power

Every finished round is written at once to OUT/raw.json and OUT/README.md (a run cut short keeps
what it measured; --resume continues a raw.json). The figures say exactly how many pairs ran.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "gate_power.yaml"
CONDITIONS = {  # name -> (injected slowdown, images/s threshold of the policy; None: the default)
    "aa": (None, None),
    "slow10": (0.10, None),
    "slow05": (0.05, 2.0),
}
TARGETS = {
    "aa": "pass (exit 0) in >= 19 of 20",
    "slow10": "regression (exit 1) in >= 19 of 20",
    "slow05": "never pass (exit 0) with a 2% threshold",
}
VERDICT = {0: "pass", 1: "regression", 2: "error", 3: "inconclusive"}


def busy_core() -> subprocess.Popen:
    """A process that keeps one core busy (the "another job" of the check)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_suite(out: Path, repeats: int, slow: float | None, suite: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DITBENCH_INJECT_FAULT", None)
    if slow is not None:
        env["DITBENCH_INJECT_FAULT"] = f"DiT=slow:{slow:g}"  # every cell name starts with its model
    start = time.monotonic()
    cmd = [sys.executable, "-m", "ditbench", "run", str(suite), "--out", str(out)]
    subprocess.run(
        [*cmd, "--repeats", str(repeats), "--no-progress", "--force"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.monotonic() - start


def compare(base: Path, new: Path, threshold: float | None, policy_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "ditbench", "compare", str(base), str(new), "--json"]
    if threshold is not None:
        policy = policy_dir / f"policy_{threshold:g}.yaml"
        policy.write_text(f"metrics:\n  images_per_s: {threshold:g}\n")
        cmd += ["--policy", str(policy)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    out = {"exit_code": done.returncode, "verdict": VERDICT.get(done.returncode, "error")}
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        out["error"] = done.stderr.strip()[-500:]
        return out
    cells = []
    for cell in result.get("cells", []):
        ips = next((m for m in cell.get("metrics", []) if m.get("metric") == "images_per_s"), {})
        cells.append(
            {
                "cell": cell.get("cell_name"),
                "verdict": cell.get("verdict"),
                "change_pct": ips.get("change_pct"),
                "interval_pct": ips.get("interval_pct"),
                "significance": ips.get("significance"),
            }
        )
    out["cells"] = cells
    return out


def rates(rounds: list[dict]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name in CONDITIONS:
        counts: dict[str, int] = {}
        for r in rounds:
            verdict = r["pairs"][name]["verdict"]
            counts[verdict] = counts.get(verdict, 0) + 1
        out[name] = counts
    return out


def write_report(out: Path, meta: dict, rounds: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "raw.json").write_text(json.dumps({**meta, "rounds": rounds}, indent=1) + "\n")
    n = len(rounds)
    table = rates(rounds)
    lines = [
        "# Gate power on a busy 2-core machine (benchmarks/gate_power.py)",
        "",
        f"Suite `{meta['suite']}` ({meta['cells']}), `--repeats {meta['repeats']}` per run, "
        f"{n} round(s) of 4 runs each (base, A/A, +10%, +5%; the order rotates), "
        f"{'a background process keeping one core busy' if meta['busy'] else 'no background process'}; "
        f"machine: {meta['machine']}. Started {meta['started']}, last round at {meta.get('updated', '-')}; "
        f"mean run {meta.get('mean_run_s', 0):.0f} s. Load average during the rounds: "
        f"{meta.get('load_text', '-')}.",
        "",
        "| pair | policy | pairs run | pass | inconclusive | regression | error | target |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    label = {"aa": "A/A (same code)", "slow10": "+10% per step", "slow05": "+5% per step"}
    for name, (_, threshold) in CONDITIONS.items():
        c = table[name]
        policy = f"images/s {threshold:g}%" if threshold is not None else "default (images/s 5%)"
        lines.append(
            f"| {label[name]} | {policy} | {n} | {c.get('pass', 0)} | {c.get('inconclusive', 0)} | "
            f"{c.get('regression', 0)} | {c.get('error', 0)} | {TARGETS[name]} |"
        )
    lines += [
        "",
        "Per round, the images/s change of the new run against the base and its 95% interval (per cell):",
        "",
        "| round | order | A/A | +10% | +5% (2% threshold) |",
        "|---:|---|---|---|---|",
    ]
    for i, r in enumerate(rounds, 1):
        cells = []
        for name in CONDITIONS:
            pair = r["pairs"][name]
            parts = []
            for c in pair.get("cells", []):
                iv = c.get("interval_pct")
                ivt = f" [{iv[0]:+.1f}, {iv[1]:+.1f}]" if iv else ""
                ch = c.get("change_pct")
                parts.append(f"{ch:+.1f}%{ivt}" if ch is not None else "-")
            cells.append(f"{pair['verdict']}: " + "; ".join(parts))
        lines.append(f"| {i} | {' '.join(r['order'])} | " + " | ".join(cells) + " |")
    lines += ["", "Raw figures: raw.json (every compare's verdict, change and interval per cell)."]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=20, help="rounds to run (each: one pair per condition)")
    parser.add_argument("--repeats", type=int, default=5, help="--repeats of every run")
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("--out", type=Path, default=HERE.parent / "reports" / "gate_power")
    parser.add_argument("--work", type=Path, default=None, help="where the runs go (default: a temp folder)")
    parser.add_argument("--no-busy", action="store_true", help="no background process keeping a core busy")
    parser.add_argument("--resume", action="store_true", help="continue OUT/raw.json's rounds")
    parser.add_argument(
        "--recompare",
        action="store_true",
        help="compare OUT/raw.json's rounds again from their runs under --work (after a gate change), "
        "run nothing",
    )
    args = parser.parse_args()
    import platform

    from ditbench.spec.suite import load_suite

    suite = load_suite(args.suite)
    inside = args.suite.resolve().is_relative_to(HERE.parent)
    meta = {
        "suite": str(args.suite.resolve().relative_to(HERE.parent) if inside else args.suite),
        "cells": ", ".join(c.cell_name for c in suite.cells),
        "repeats": args.repeats,
        "busy": not args.no_busy,
        "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    rounds: list[dict] = []
    if (args.resume or args.recompare) and (args.out / "raw.json").exists():
        old = json.loads((args.out / "raw.json").read_text())
        rounds = old["rounds"]
        meta.update({k: v for k, v in old.items() if k != "rounds"})
    work = args.work or Path(tempfile.mkdtemp(prefix="gate_power_"))
    if args.recompare:
        for i, r in enumerate(rounds):
            folder = work / f"round{i + 1}"
            r["pairs"] = {
                n: compare(folder / "base", folder / n, CONDITIONS[n][1], folder) for n in CONDITIONS
            }
        write_report(args.out, meta, rounds)
        print(json.dumps(rates(rounds)))
        return 0
    busy = None if args.no_busy else busy_core()
    names = ["base", *CONDITIONS]
    loads: list[float] = [r["load_1min"] for r in rounds]
    durations: list[float] = [d for r in rounds for d in r["run_s"].values()]
    try:
        while len(rounds) < args.pairs:
            i = len(rounds)
            order = names[i % 4 :] + names[: i % 4]  # rotate, so no condition is always first
            folder = work / f"round{i + 1}"
            run_s = {}
            for name in order:
                slow = None if name == "base" else CONDITIONS[name][0]
                run_s[name] = round(run_suite(folder / name, args.repeats, slow, args.suite), 1)
            pairs = {
                name: compare(folder / "base", folder / name, CONDITIONS[name][1], folder)
                for name in CONDITIONS
            }
            load = os.getloadavg()[0]
            loads.append(load)
            durations += run_s.values()
            rounds.append({"order": order, "run_s": run_s, "load_1min": load, "pairs": pairs})
            meta["updated"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            meta["mean_run_s"] = sum(durations) / len(durations)
            meta["load_text"] = f"1-minute average {min(loads):.1f} to {max(loads):.1f} at the rounds' ends"
            write_report(args.out, meta, rounds)
            print(
                f"round {i + 1}: " + ", ".join(f"{n} {p['verdict']}" for n, p in pairs.items()),
                flush=True,
            )
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    print(json.dumps(rates(rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
