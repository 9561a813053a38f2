"""The figures the docs give about ditbench itself, measured with their conditions and written into
README.md and docs/*.md.

    python benchmarks/readme_times.py                      # the quick-start figures (about a minute)
    python benchmarks/readme_times.py --only cpu_smoke     # one entry (see ENTRIES)
    python benchmarks/readme_times.py --only pytest_quick  # the quick test loop, run here and timed
    python benchmarks/readme_times.py --pytest-log LOG     # the whole test suite, from a pytest run's output
    python benchmarks/readme_times.py --only cpu_quality --keep-runs runs/   # keep the suite's output
    python benchmarks/readme_times.py --rewrite            # only rewrite the marked spans from the JSON

Each figure is an entry of reports/readme_times/times.json: what ran, its wall time, and the conditions
that decide it (cores, torch threads, the load average and the CPU share of other processes during
the run, the date and the commit). The docs hold each as text between `<!-- measured:KEY -->` (or
`<!-- measured:KEY.short -->`, the figure alone) and `<!-- /measured -->`, which this script rewrites
from the JSON; a unit test (test_readme_times.py) fails when a span's text is not what the JSON says,
so a figure cannot be edited by hand or left behind when it is re-measured. Re-run the entries a
change affects (a slower step: train_sanity and the suites; more tests: pytest_quick and the
--pytest-log of a full run) and commit the JSON with the docs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TIMES = REPO / "reports" / "readme_times" / "times.json"
README = REPO / "README.md"
MARKER = re.compile(
    r"<!-- measured:(?P<key>[a-z0-9_]+)(?:\.(?P<form>short))? -->(?P<text>.*?)<!-- /measured -->", re.S
)


def documents() -> list[Path]:
    """Every file whose spans this script keeps: the README and the pages under docs/."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


# key -> the command it times (run with OMP_NUM_THREADS=1 as the README says, unless noted)
ENTRIES = {
    "train_sanity": "ditbench train --model DiT-T/4 --image-size 64 --batch-size 8 --steps 50".split(),
    "cpu_smoke": "ditbench run cpu_smoke --out {tmp}/cpu_smoke --no-progress".split(),
    "cpu_quality": "ditbench run cpu_quality --out {tmp}/cpu_quality --no-progress".split(),
    "cpu_multi": "ditbench run cpu_multi --out {tmp}/cpu_multi --no-progress".split(),
    "dit_resource_guide_cpu": "ditbench run dit_resource_guide_cpu --out {tmp}/drg_cpu --no-progress".split(),
    # the quick loop as the docs tell a developer to run it, from the repository's root
    "pytest_quick": [sys.executable, "-m", "pytest", "-m", "not slow", "-q", "-p", "no:cacheprovider"],
}
SUITES = ("cpu_smoke", "cpu_quality", "cpu_multi", "dit_resource_guide_cpu")
QUICK = ("train_sanity",)  # the default: what a change to the step can move, in about a minute
DONE_LINE = re.compile(r"done: (?P<steps>\d+) steps in (?P<s>[0-9.]+) s")
PYTEST_LINE = re.compile(
    r"(?:(?P<failed>[\d,]+) failed, )?(?P<passed>[\d,]+) passed(?:, (?P<skipped>[\d,]+) skipped)?"
    r"(?:, (?P<deselected>[\d,]+) deselected)?"
    r".*? in (?P<s>[0-9.]+)s",
    re.S,
)


def conditions(wall: float, other_busy: float) -> dict[str, Any]:
    """Cores, threads, load and other processes' CPU share (`other_busy` CPU seconds over `wall`)."""
    cores = os.cpu_count() or 1
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    return {
        "cores": cores,
        **({"cores_allowed": allowed} if allowed != cores else {}),  # pinned: the run could use fewer
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "other_cpu_share": round(max(0.0, other_busy / (wall * cores)), 2) if wall > 0 else None,
        "date": dt.date.today().isoformat(),
        "commit": _git_sha(),
    }


def _git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def measure(key: str, tmp: str) -> dict[str, Any]:
    """Run one entry's command, timing it and its conditions; the parsed figures it prints."""
    import resource

    from ditbench.bench.cell.load import busy_seconds

    cmd = [a.format(tmp=tmp) for a in ENTRIES[key]]
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the README's commands say
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, t0 = busy_seconds(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # a failed command measures nothing, but a test loop with failing tests still took its time: its
    # failures are recorded and shown beside the figure
    tests_failed = key == "pytest_quick" and proc.returncode == 1 and PYTEST_LINE.search(proc.stdout)
    if proc.returncode != 0 and not tests_failed:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    # cpu_s: the CPU time of the command's own processes, which scales to a quiet machine when the
    # wall time was stretched by other load
    command = " ".join(cmd).replace(tmp, "OUT").replace(sys.executable, "python")
    entry = {"command": command, "wall_s": round(wall, 1), "cpu_s": round(own, 1)}
    entry.update(conditions(wall, busy_seconds() - busy0 - own))
    if key == "train_sanity":
        m = DONE_LINE.search(proc.stdout + proc.stderr)
        entry["steps"], entry["steps_s"] = int(m["steps"]), float(m["s"])
    if key == "cpu_quality":
        entry["fid"] = quality_fids(Path(tmp) / "cpu_quality" / "results.jsonl")
    if key == "pytest_quick":
        entry.update(pytest_counts(proc.stdout))
    return entry


def quality_fids(results: Path) -> list[dict[str, Any]]:
    """[{step, fid, spread}] of the suite's one cell's evaluations, in step order."""
    for line in results.read_text().splitlines():
        record = json.loads(line)
        evals = (record.get("quality") or {}).get("evaluations") or []
        if evals:
            return [
                {
                    "step": e["step"],
                    "fid": round(e["metrics"]["fid"], 1),
                    "spread": round(e["spread"]["fid"], 1),
                }
                for e in evals
            ]
    raise SystemExit(f"{results}: no quality evaluations")


def pytest_counts(text: str) -> dict[str, Any]:
    """passed, skipped, deselected and pytest's own seconds from a run's last summary line."""
    matches = list(PYTEST_LINE.finditer(text))
    if not matches:
        raise SystemExit("no pytest summary line ('N passed ... in S s') in the log")
    m = matches[-1]
    counts = {k: int((m[k] or "0").replace(",", "")) for k in ("failed", "passed", "skipped", "deselected")}
    return {**counts, "pytest_s": round(float(m["s"]))}


def from_pytest_log(text: str, commit: str | None = None, date: str | None = None) -> dict[str, Any]:
    """The figures of a pytest run's last summary line (`N passed, M skipped ... in S s`); the run's
    commit and date when the log came from another checkout or day (else this checkout's, today)."""
    counts = pytest_counts(text)
    return {
        "passed": counts["passed"],
        "skipped": counts["skipped"],
        "wall_s": counts["pytest_s"],
        "cores": os.cpu_count() or 1,
        "date": date or dt.date.today().isoformat(),
        "commit": commit or _git_sha(),
    }


def _load(entry: dict[str, Any]) -> str:
    share = entry.get("other_cpu_share")
    busy = f", other processes {share:.0%} of the cores" if share is not None else ""
    threads = entry.get("omp_num_threads") or "default"
    allowed = entry.get("cores_allowed")
    pinned = f" (the run pinned to {allowed})" if allowed is not None else ""
    return (
        f"{entry['cores']} CPU cores{pinned}, OMP_NUM_THREADS={threads}, load average "
        f"{entry['load_average_1min']:g}{busy}; {entry['date']}"
    )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def render(key: str, entry: dict[str, Any], form: str | None = None) -> str:
    """The docs' text for one entry: the figure, then its conditions; form "short": the figure alone."""
    if form == "short":
        if key in ("pytest", "pytest_quick"):
            return f"{entry['passed']:,} tests in {_duration(entry['wall_s'])}"
        return _duration(entry["wall_s"])
    if key == "train_sanity":
        return (
            f"{entry['wall_s']:.0f} s wall ({entry['steps_s']:g} s for the {entry['steps']} steps; the rest "
            f"is importing torch and building the model), measured on {_load(entry)}"
        )
    if key == "cpu_quality":
        from ditbench.metrics.registry import OUTPUTS  # FID's own format, to the spread's precision

        fids = ", ".join(
            f"{OUTPUTS['fid'].plus_minus(f['fid'], f['spread'])} at step {f['step']:,}" for f in entry["fid"]
        )
        cpu = f" ({entry['cpu_s']:.0f} s of CPU time in its processes)" if "cpu_s" in entry else ""
        return (
            f"{entry['wall_s']:.0f} s for the whole suite{cpu} on {_load(entry)}; FID (test Inception, "
            f"mean ± spread over the sample seeds) {fids}"
        )
    if key in SUITES:
        return f"{_duration(entry['wall_s'])} measured on {_load(entry)}"
    if key == "pytest_quick":
        failed = f"{entry['failed']} FAILED, " if entry.get("failed") else ""
        return (
            f"{entry['passed']:,} tests passed ({failed}{entry['skipped']} skipped, {entry['deselected']:,} "
            f"slow ones deselected) in {_duration(entry['wall_s'])} on {_load(entry)}"
        )
    if key == "pytest":
        return (
            f"{entry['passed']:,} tests passed ({entry['skipped']} skipped) in {entry['wall_s']:,} s "
            f"({entry['wall_s'] / 60:.0f} min) on {entry['cores']} CPU cores with the SLURM cluster up, "
            f"measured {entry['date']}"
        )
    raise KeyError(key)


def rewrite_readme(times: dict[str, dict[str, Any]], readme: Path = README) -> list[str]:
    """Replace each marked span of one file with its entry's text; the keys it marks that the JSON lacks."""
    missing: list[str] = []

    def sub(m: re.Match) -> str:
        key = m["key"]
        if key not in times:
            missing.append(key)
            return m[0]
        form = f".{m['form']}" if m["form"] else ""
        return f"<!-- measured:{key}{form} -->{render(key, times[key], m['form'])}<!-- /measured -->"

    text = readme.read_text()
    new = MARKER.sub(sub, text)
    if new != text:
        readme.write_text(new)
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(ENTRIES), help="entries to measure")
    parser.add_argument("--pytest-log", type=Path, help="a full `pytest` run's output (the pytest entry)")
    parser.add_argument("--commit", help="with --pytest-log: the commit the logged run tested")
    parser.add_argument("--date", help="with --pytest-log: the day of the logged run (YYYY-MM-DD)")
    parser.add_argument("--keep-runs", type=Path, help="run the suites into this folder and keep them there")
    parser.add_argument(
        "--rewrite", action="store_true", help="measure nothing: rewrite the spans from the JSON"
    )
    args = parser.parse_args(argv)
    times = json.loads(TIMES.read_text()) if TIMES.is_file() else {}
    if args.pytest_log:
        times["pytest"] = from_pytest_log(args.pytest_log.read_text(errors="replace"), args.commit, args.date)
    keys = args.only or ([] if args.pytest_log or args.rewrite else list(QUICK))
    with tempfile.TemporaryDirectory() as tmp:
        runs = str(args.keep_runs.resolve()) if args.keep_runs else tmp
        for key in keys:
            print(f"measuring {key}: {' '.join(ENTRIES[key])}", file=sys.stderr)
            times[key] = measure(key, runs)
            print(f"  {render(key, times[key])}", file=sys.stderr)
    TIMES.parent.mkdir(parents=True, exist_ok=True)
    TIMES.write_text(json.dumps(times, indent=2, sort_keys=True) + "\n")
    missing = sorted({f"{p.name}: {key}" for p in documents() for key in rewrite_readme(times, p)})
    if missing:
        print(f"spans with no measurement ({', '.join(missing)}): run with --only", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
