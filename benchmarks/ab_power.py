"""How often `ditbench ab` gets it right on a busy machine: A/A invocations and injected slowdowns.

Each invocation is one `ditbench ab` of the ci_gate suite's CPU cells (OVERRIDES: ci_gate's matrix
at the smallest model and image size, so that a cell process takes seconds on a CPU), capped at
--budget-min (default 4.5: with the probe and start-up, within 5 minutes). Conditions (issue 36,
point 6):

  interleaved, a second process keeping one core busy (--no-busy turns it off):
    aa       12 A/A (both sides this interpreter)                target: at most 1 verdict other than pass
    slow10   12 with B 10% slower (--b-env DITBENCH_INJECT_FAULT=DiT=slow:0.10)
                                                                   target: >= 11 regressions, no pass
    slow05   6 with B 5% slower at an images/s threshold of 2%    target: no pass
  duet (the machine as it is: a busy process would land on one side only): 6 of each.

    nice -n 5 python benchmarks/ab_power.py --out reports/ab            # the full run (about 3 hours)
    python benchmarks/ab_power.py --only aa,slow10 --count 1 --out /tmp/ab_pilot   # a pilot

Every finished invocation is written at once to OUT/raw.json and OUT/README.md (a run cut short keeps
what it measured; --resume continues OUT/raw.json). The seed of invocation i is i: rerunnable.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OVERRIDES = [
    "device=cpu",
    "model=DiT-T/4",
    "image_size=32",
    "batch_size=8",
    "precision=fp32",
    "steps={warmup: 5, measure: 50, min_seconds: 1}",
    "smoke.cells=none",
    "timeout_s=120",
]
FAULT = "DITBENCH_INJECT_FAULT=DiT=slow:{:g}"  # every cell name starts with its model
# name -> (duet, slowdown of B, images/s threshold %, invocations, target)
CONDITIONS = {
    "aa": (False, None, 5.0, 12, "at most 1 verdict other than pass"),
    "slow10": (False, 0.10, 5.0, 12, ">= 11 regressions, no pass"),
    "slow05": (False, 0.05, 2.0, 6, "no pass"),
    "duet_aa": (True, None, 5.0, 6, "at most 1 verdict other than pass"),
    "duet_slow10": (True, 0.10, 5.0, 6, ">= 5 regressions, no pass"),
    "duet_slow05": (True, 0.05, 2.0, 6, "no pass"),
}


def met(name: str, c: dict[str, int]) -> bool:
    """Whether the counts so far meet the condition's target."""
    slow = CONDITIONS[name][1]
    if slow is None:  # A/A: at most one verdict other than pass
        return c["total"] - c["pass"] <= 1
    if slow == 0.10:  # at most one verdict other than regression, and never a pass
        return not c["pass"] and c["total"] - c["regression"] <= 1
    return not c["pass"]


VERDICT = {0: "pass", 1: "regression", 2: "error", 3: "inconclusive"}


def invoke(name: str, i: int, args: argparse.Namespace, work: Path) -> dict:
    duet, slow, threshold, _, _ = CONDITIONS[name]
    policy = work / f"policy_{threshold:g}.yaml"
    policy.write_text(f"alpha: {args.alpha:g}\nmetrics:\n  images_per_s: {threshold:g}\n")
    out = work / f"{name}-{i}"
    cmd = [sys.executable, "-m", "ditbench", "ab", "ci_gate", *OVERRIDES, "--policy", str(policy)]
    cmd += ["--out", str(out), "--seed", str(i), "--json", "--budget-min", f"{args.budget_min:g}"]
    cmd += ["--max-rounds", str(args.duet_rounds if duet else args.rounds)] + (["--duet"] if duet else [])
    if slow is not None:
        cmd += ["--b-env", FAULT.format(slow)]
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("DITBENCH_INJECT_FAULT", "GITHUB_STEP_SUMMARY")}
    done = subprocess.run(cmd, capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"})
    row = {
        "condition": name,
        "seed": i,
        "exit_code": done.returncode,
        "wall_s": round(time.monotonic() - start, 1),
    }
    row["verdict"] = VERDICT.get(done.returncode, "error")
    row["load_1min"] = os.getloadavg()[0]
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        row["error"] = done.stderr.strip()[-800:]
        return row
    ab = doc.get("ab") or {}
    row.update(rounds=ab.get("rounds"), stopped=ab.get("stopped"), mde_pct=doc.get("largest_mde_pct"))
    row["cells"] = []
    for c in doc.get("cells", []):
        ips = next((m for m in c["metrics"] if m["metric"] == "images_per_s"), {})
        cell = {"cell": c["cell_name"], "verdict": c["verdict"]}
        cell.update({k: ips.get(k) for k in ("change_pct", "interval_pct", "mde_pct")})
        cell.update({k: ab.get("cells", {}).get(c["cell_name"], {}).get(k) for k in ("rounds", "ratios")})
        row["cells"].append(cell)
    return row


def counts(rows: list[dict], name: str) -> dict[str, int]:
    mine = [r for r in rows if r["condition"] == name]
    out = {v: sum(r["verdict"] == v for r in mine) for v in VERDICT.values()}
    return {**out, "total": len(mine)}


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
    return f"{min(values):.1f} / {q[4]:.1f} / {max(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


def write_report(out: Path, meta: dict, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "raw.json").write_text(json.dumps({**meta, "invocations": rows}, indent=1) + "\n")
    lines = [
        "# `ditbench ab` on a busy 2-core machine (benchmarks/ab_power.py)",
        "",
        f"Suite `ci_gate` with `{' '.join(OVERRIDES)}` ({meta['cells']}); policy alpha {meta['alpha']:g}, "
        f"images/s threshold per condition; `--budget-min {meta['budget_min']:g}`, `--max-rounds "
        f"{meta['rounds']}` interleaved and {meta['duet_rounds']} duet; interleaved conditions with "
        f"{'a background process keeping one core busy' if meta['busy'] else 'no background process'}, "
        f"duet on the machine as it is. Machine: {meta['machine']}. Started {meta['started']}, last "
        f"invocation {meta.get('updated', '-')}; code {meta['commit']}.",
        "",
        "| condition | threshold | run | pass | regression | inconclusive | error | target | met "
        "| rounds (min / median / max) | largest MDE % (min / median / max) | wall s (max) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---:|",
    ]
    for name, (_, _, threshold, want, target) in CONDITIONS.items():
        mine = [r for r in rows if r["condition"] == name]
        if not mine:
            continue
        c = counts(rows, name)
        done = ("yes" if c["total"] >= want else "so far") if met(name, c) else "no"
        rounds = [float(r["rounds"]) for r in mine if r.get("rounds")]
        mdes = [r["mde_pct"] for r in mine if r.get("mde_pct") is not None]
        lines.append(
            f"| {name} | {threshold:g}% | {c['total']} of {want} | {c['pass']} | {c['regression']} | "
            f"{c['inconclusive']} | {c['error']} | {target} | {done} | {_spread(rounds)} | {_spread(mdes)} | "
            f"{max(r['wall_s'] for r in mine):.0f} |"
        )
    lines += [
        "",
        "Per invocation: verdict, rounds, why it stopped; per cell the images/s change, interval, MDE.",
        "",
    ]
    lines += [
        "| condition | seed | verdict | rounds | stopped | wall s | load | cells |",
        "|---|---:|---|---:|---|---:|---:|---|",
    ]
    for r in rows:
        cells = "; ".join(
            f"{c['verdict']} {c.get('change_pct') or 0:+.1f}% "
            + (
                f"[{c['interval_pct'][0]:+.1f}, {c['interval_pct'][1]:+.1f}] "
                if c.get("interval_pct")
                else ""
            )
            + (f"MDE {c['mde_pct']:.1f}%" if c.get("mde_pct") is not None else "")
            for c in r.get("cells", [])
        )
        cells = cells or r.get("error", "")[-200:].replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {r['condition']} | {r['seed']} | {r['verdict']} | {r.get('rounds', '-')} | "
            f"{r.get('stopped', '-')} | {r['wall_s']:.0f} | {r['load_1min']:.1f} | {cells} |"
        )
    lines += [
        "",
        "Raw figures: raw.json (every invocation's verdicts, intervals, MDE and B/A ratios per round).",
    ]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def simulate(sigma: float, rounds: int, alpha: float, sims: int = 4000, seed: int = 0) -> dict[str, dict]:
    """What the targets need: per condition, the share of invocations (2 cells, independent) that pass,
    regress or stay inconclusive when each round's log B/A ratio is the condition's slowdown plus
    normal noise of sd `sigma`, under ab's own rule (report.gate.timing: looks, levels, MDE)."""
    import math

    import numpy as np
    from scipy.stats import norm

    from ditbench.report.gate.timing import POWER, hl_interval, look_alpha

    out = {}
    for name in ("aa", "slow10", "slow05"):
        _, slow, threshold, _, _ = CONDITIONS[name]
        rng = np.random.default_rng(seed)
        x = math.log1p(slow or 0.0) + sigma * rng.standard_normal((sims * 2, rounds))
        verdict = np.zeros(sims * 2, dtype=int)  # 0 open, 1 regression, 2 pass
        bound = -math.log1p(-threshold / 100)  # images/s down T% <=> step ratio above this
        for n in range(1, rounds + 1):
            _, low, high, attained = hl_interval(x[:, :n], look_alpha(n, rounds, alpha, last=n == rounds))
            if not attained:
                continue
            z = norm.isf(attained / 2)
            seen = (high - low) / 2 / z * (z + norm.ppf(POWER))  # the MDE, as a log ratio
            still = verdict == 0
            verdict[still & (low > bound)] = 1
            verdict[still & (high <= bound) & (seen <= bound)] = 2
        cells = verdict.reshape(sims, 2)
        out[name] = {
            "pass": float(np.mean((cells == 2).all(axis=1))),
            "regression": float(np.mean((cells == 1).any(axis=1))),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE.parent / "reports" / "ab")
    parser.add_argument("--only", default=",".join(CONDITIONS), help="conditions to run, comma-separated")
    parser.add_argument(
        "--count", type=int, default=None, help="invocations per condition (default: its own)"
    )
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=12, help="--max-rounds of an interleaved invocation")
    parser.add_argument("--duet-rounds", type=int, default=24, help="--max-rounds of a duet invocation")
    parser.add_argument("--budget-min", type=float, default=4.5)
    parser.add_argument("--no-busy", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument(
        "--work", type=Path, default=None, help="where the ab runs go (default: a temp folder)"
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="run nothing: print what each condition would give at paired noise of 2-30%% (ab's own rule)",
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in CONDITIONS]
    if unknown:
        parser.error(f"unknown condition(s) {', '.join(unknown)}; known: {', '.join(CONDITIONS)}")
    if args.simulate:
        print(
            "| paired noise (sd of log B/A) | rounds | A/A pass | +10% regression | +10% pass | +5%@2% pass |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        for sigma in (0.02, 0.03, 0.04, 0.06, 0.10, 0.20, 0.30):
            for rounds in (args.rounds, args.duet_rounds):
                p = simulate(sigma, rounds, args.alpha)
                print(
                    f"| {sigma:.0%} | {rounds} | {p['aa']['pass']:.0%} | {p['slow10']['regression']:.0%} | "
                    f"{p['slow10']['pass']:.0%} | {p['slow05']['pass']:.0%} |"
                )
        return 0
    from ditbench.spec.suite import load_suite

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
    meta = {
        "cells": ", ".join(c.cell_name for c in load_suite("ci_gate", OVERRIDES).cells),
        "alpha": args.alpha,
        "rounds": args.rounds,
        "duet_rounds": args.duet_rounds,
        "budget_min": args.budget_min,
        "busy": not args.no_busy,
        "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit.stdout.strip() or "unknown",
    }
    rows: list[dict] = []
    if args.resume and (args.out / "raw.json").exists():
        old = json.loads((args.out / "raw.json").read_text())
        rows = old.pop("invocations")
        meta.update(old)
    work = args.work or Path(tempfile.mkdtemp(prefix="ab_power_"))
    work.mkdir(parents=True, exist_ok=True)
    for name in names:
        duet, _, _, want, _ = CONDITIONS[name]
        busy = None if duet or args.no_busy else subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            while (n := sum(r["condition"] == name for r in rows)) < (args.count or want):
                row = invoke(name, n + 1, args, work)
                rows.append(row)
                meta["updated"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
                write_report(args.out, meta, rows)
                said = f"{row['verdict']} after {row.get('rounds')} rounds, {row['wall_s']:.0f} s"
                print(f"{name} #{n + 1}: {said}", flush=True)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    print(json.dumps({n: counts(rows, n) for n in names}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
