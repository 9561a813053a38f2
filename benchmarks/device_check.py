"""The device check: everything ditbench measures on a GPU, in one call that always brings figures back.

    python benchmarks/device_check.py                  # on the GPU machine (benchmarks/gpu_all.sh wraps it)
    python benchmarks/device_check.py --dry-run        # the same control flow on a CPU, tiny settings

Parts, in order: preflight; `ditbench env --measure-peak`; the gpu-marked tests (one pytest process
per file); the cells matched to the official DiT code's H200 figures; a suite capped to a 24 GB card
(one expected out-of-memory, a smoke run); `ditbench fid` on 8,000 samples against cached reference
statistics; DiT-XL/2 bf16 compiled at batch 256; DDP overhead at one GPU; sampling throughput; the
attention backends, foreach AdamW and compile's default mode on the time the others left; the
planner's predictions against the measured peaks.

One global deadline (--deadline, 570 s) bounds the run. Each part has a cap, sized above the time it
is expected to take on an H200, and the caps add up to less than the deadline (the run prints the
sum), so every part gets its whole cap; `variants` gets what is left. Every part runs in a process
group of its own and is killed at its cap (the stop inside it).

The preflight refuses, before any GPU time is spent (the dry run too): predictions made for other
code than today's (it prints the command that remakes them, `python benchmarks/device_predictions.py`),
and parts whose caps do not fit the deadline (the dry run holds the real plan to the real deadline).

After every part the summary (summary.md, summary.json: each target met, not met or not measured),
the cells' records (cells.jsonl) and the logs (logs.tgz) are rewritten atomically
in --out-dir (reports/gpu/) and copied into $OUT when it is set: a call cut short at any moment
returns every finished part. $OUT gets these 4 files only (the device tool returns at most 8).

What the GPU machine lacks is checked first (preflight): nvidia-ml-py is there; diffusers (the VAE of
the sampling part) and torch-fidelity are not, and a part that needs a missing package reports
`unsupported`. To carry diffusers, once, here in the repo root (the wheels are pure Python):

    python3 -m pip download --no-deps --only-binary=:all: -d .whl diffusers==0.42.1 importlib_metadata

then name `.whl` in the device call's carry and run `benchmarks/gpu_all.sh`, which installs what .whl
holds into /tmp/site before it starts this script. No part needs torch-fidelity (ditbench's FID has
its own Inception network); the GPU machine has no Inception weights either, so FID runs on the
calibrated test network: its timings are real, its values are not comparable with papers.

The planner's predictions are made ahead (benchmarks/device_predictions.py) and committed, so the
GPU's minutes go to measuring. Exit status: 0 when every part ran and every target was met (dry run:
every part's control flow completed), 1 otherwise, 2 when the preflight refused the real run (stale
predictions, an oversized plan, no CUDA device) or for a usage error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import device_predictions as dp  # noqa: E402
import device_publish as publish  # noqa: E402
import device_report as report  # noqa: E402
import device_steps as steps  # noqa: E402

from ditbench.bench.launch.procs import die_with_parent  # noqa: E402 - stdlib + psutil, no torch

# The real run's deadline fits one device-tool call: timeout_s 595 (at most 600) covers it, gpu_all.sh's
# install of the carried wheels (~5-10 s) and the last publish. The dry run's is its CI bound.
DEADLINE_S = {False: 570.0, True: 420.0}
GRACE_S = 2.0  # between the SIGTERM and the SIGKILL of a part cut short (inside its cap)
MARGIN_S = 3.0  # kept for the last publish
PUBLISH_S = 0.5  # per part: writing the summary, cells and logs after it (~0.1 s in the dry run)
DONE = ("ok", "not_provided", "unsupported")  # statuses of a part whose control flow completed


@dataclass(frozen=True)
class Part:
    name: str
    what: str
    # (real, dry run): the most it may take, its stop at the cap included. None: it takes what the
    # parts before it left (the one part that is measured only when time is left).
    cap_s: tuple[float | None, float | None]
    min_s: tuple[float, float]  # less time left than this: not started, it could not finish
    expected_s: tuple[float, float] = (0.0, 0.0)  # (low, high) on the H200, what the cap is sized from
    needs: tuple[str, ...] = ()  # Python packages (distribution names)


# In the order they run. Each cap, less GRACE_S, is at least 10% above the H200 time expected of the
# part (issue 24), and the caps with PUBLISH_S per part and MARGIN_S add up to less than the deadline
# (`budget`), so no part is squeezed by the ones before it. `variants` runs on what the others leave:
# ~140 s when they take their usual time, ~70 s at their slowest, nothing if all were cut at their caps.
PARTS = (
    Part("preflight", "the machine, the packages, the predictions, the budget", (13, 40), (5, 5), (5, 10)),
    Part("env", "ditbench env --measure-peak: the matmul ceilings", (16, 30), (10, 5), (8, 12)),
    # 45-75 s in one process; five files, five starts of torch
    Part("gpu_tests", "pytest -m gpu, one process per test file", (90, 120), (30, 10), (55, 80)),
    Part("matched", "the cells matched to the official code's H200 figures", (112, 120), (40, 10), (75, 100)),
    Part("suite_24gb", "a suite capped to an RTX 4090: one OOM, a smoke run", (46, 90), (30, 10), (30, 40)),
    Part("fid", "ditbench fid on 8,000 samples vs cached reference statistics", (52, 90), (20, 5), (25, 45)),
    Part("compiled", "DiT-XL/2 bf16 compiled at batch 256 (>= 600 img/s)", (134, 60), (110, 5), (100, 120)),
    Part("ddp", "DDP overhead at one GPU", (41, 60), (15, 5), (25, 35)),
    Part("sampling", "sampling, 250 DDPM steps, cfg 1.5", (46, 90), (15, 5), (30, 40), needs=("diffusers",)),
    Part("variants", "attention backends, foreach AdamW, compile (on the time left)", (None, None), (25, 5)),
    Part("planner", "the planner's predictions vs the measured peaks (in process)", (2, 15), (0, 0), (0, 1)),
)
PART_NAMES = tuple(p.name for p in PARTS)


def budget(parts: tuple[Part, ...], deadline_s: float, dry: bool) -> tuple[float, str | None]:
    """(seconds the parts may take at most, None) or (the same, why they do not fit the deadline).

    The sum of the fixed caps, PUBLISH_S per part and MARGIN_S: when it fits, every part gets its whole
    cap whatever the parts before it took. The part without a cap takes what is left."""
    total = sum(p.cap_s[dry] or 0.0 for p in parts) + PUBLISH_S * len(parts) + MARGIN_S
    if total <= deadline_s:
        return total, None
    caps = ", ".join(f"{p.name} {p.cap_s[dry]:g}" for p in parts if p.cap_s[dry])
    return total, (
        f"the parts' caps ({caps} s) with {PUBLISH_S:g} s per part for publishing and {MARGIN_S:g} s of "
        f"margin add up to {total:g} s, over the {deadline_s:g} s deadline: later parts would be cut "
        "or not started. Lower a cap in benchmarks/device_check.py (PARTS), run fewer parts (--parts) "
        "or give a longer --deadline (at most the device tool's 600 s less the install)"
    )


class Clock:
    """Seconds since the start against the global deadline."""

    def __init__(self, deadline_s: float, now=time.monotonic):
        self.now, self.start, self.deadline_s = now, now(), deadline_s

    def elapsed(self) -> float:
        return self.now() - self.start

    def left(self) -> float:
        return self.deadline_s - self.elapsed()

    def cap(self, part: Part, later: tuple[Part, ...], dry: bool) -> tuple[float | None, str | None]:
        """(seconds this part may take, its stop included, None) or (None, why it is not started).
        A part without a cap of its own leaves the later parts theirs."""
        own = part.cap_s[dry]
        reserve = 0.0 if own else sum((p.cap_s[dry] or 0.0) + PUBLISH_S for p in later)
        cap = min(own or float("inf"), self.left() - reserve - MARGIN_S)
        if cap < part.min_s[dry]:
            kept = f", less {reserve:.0f} s kept for later parts" if reserve else ""
            return (
                None,
                f"{max(0.0, self.left()):.0f} s left{kept}; it needs at least {part.min_s[dry]:.0f} s",
            )
        return cap, None


class Runner:
    """Runs a part's command in a process group of its own, killed (TERM, then KILL) at its cap."""

    def __init__(self, extra_pythonpath: str | None = None):
        self.pythonpath = os.pathsep.join(p for p in (str(REPO), extra_pythonpath) if p)

    def run(
        self, cmd: list[str], cap_s: float, log: Path, env: dict | None = None, stdout: Path | None = None
    ):
        """The exit status, or None when the cap cut it."""
        full_env = {**os.environ, **(env or {}), "PYTHONPATH": self.pythonpath, "PYTHONUNBUFFERED": "1"}
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as log_file, open(stdout or os.devnull, "wb") as out_file:
            log_file.write(f"$ {' '.join(cmd)}\n".encode())
            log_file.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=out_file if stdout else log_file,
                stderr=log_file,
                start_new_session=True,  # its own group, which a cap cut kills as a whole
                preexec_fn=die_with_parent(signal.SIGKILL),  # and it dies with the check, even by SIGKILL
            )
            try:  # the cap includes the stop: TERM at cap - GRACE_S
                return proc.wait(timeout=max(cap_s - GRACE_S, 0.1))
            except subprocess.TimeoutExpired:
                self.stop(proc)
                return None
            except BaseException:
                self.stop(proc)
                raise

    @staticmethod
    def stop(proc: subprocess.Popen) -> None:
        for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


@dataclass
class Check:
    """One run of the device check: its settings, what the parts left, and where it publishes."""

    dry: bool
    work: Path
    out_dir: Path
    out_env: Path | None
    clock: Clock
    runner: Runner
    without: set[str]
    selected: tuple[Part, ...] = PARTS
    plan_deadline_s: float = DEADLINE_S[False]  # what the real plan is held to (the dry run checks it too)
    predictions: Path = dp.PATH
    python: str = sys.executable
    parts: list[dict] = field(default_factory=list)
    records: dict[str, list[dict]] = field(default_factory=dict)
    preflight: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def has(self, dist: str) -> bool:
        module = steps.PACKAGE_MODULES.get(dist, dist)
        return dist not in self.without and importlib.util.find_spec(module) is not None

    def table(self) -> dict[str, Any]:
        return dp.load(self.predictions)

    def gates(self) -> dict[str, Any]:
        """What preflight refuses before any GPU time is spent: predictions made for other code, and a
        real plan whose caps exceed its deadline (the dry run holds the real plan to the real deadline)."""
        total, over = budget(self.selected, self.plan_deadline_s, dry=False)
        table = self.table()
        return {
            "predictions": {
                "file": str(self.predictions),
                "fingerprint": table.get("fingerprint"),
                "code_fingerprint": dp.fingerprint(),
                "problem": dp.staleness(table, self.predictions),
            },
            "budget": {
                "caps_s": {p.name: p.cap_s[False] for p in self.selected},
                "total_s": round(total, 1),
                "deadline_s": self.plan_deadline_s,
                "problem": over,
            },
        }

    def log(self, name: str) -> Path:
        return self.work / "logs" / f"{name}.log"

    def publish(self, finished: bool = False) -> None:
        self.meta.update(elapsed_s=round(self.clock.elapsed(), 1), finished=finished, machine=self.preflight)
        self.meta["carry"] = steps.carry_advice(self)
        summary = report.build_summary(self.meta, self.parts, self.records, self.table())
        publish.publish(
            self.out_dir, self.out_env, summary, report.markdown(summary), self.records, self.work
        )


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_part(check: Check, part: Part, later: tuple[Part, ...]) -> dict:
    result = {"name": part.name, "what": part.what, "status": None, "reason": None, "figures": None}
    missing = [d for d in part.needs if not check.has(d)]
    if check.stop_reason:
        return {**result, "status": "not_run", "reason": check.stop_reason}
    if missing:
        return {
            **result,
            "status": "unsupported",
            "reason": f"needs {', '.join(missing)}, which this machine lacks (see the carry note)",
        }
    cap, why = check.clock.cap(part, later, check.dry)
    if cap is None:
        return {**result, "status": "deadline", "reason": f"not started: {why}"}
    start = time.monotonic()
    try:
        result.update(steps.STEPS[part.name](check, cap))
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - the check's own failure in one part must not lose the rest
        tail = traceback.format_exc().strip().splitlines()[-6:]
        result.update(status="error", reason=f"{type(err).__name__}: {err}", figures={"traceback": tail})
    result.update(seconds=round(time.monotonic() - start, 1), cap_s=round(cap, 1))
    if any(part.expected_s) and not check.dry:  # what the H200 is expected to take, beside what it took
        result["expected_s"] = list(part.expected_s)
    return result


def exit_status(check: Check) -> int:
    if any(p["name"] == "preflight" and p["status"] == "failed" for p in check.parts) and not check.dry:
        return 2
    completed = all(p["status"] in DONE for p in check.parts)
    if check.dry:
        return 0 if completed else 1
    summary = report.counts(report.targets(check.records, check.table(), False))
    return 0 if completed and summary[report.dc.NOT_MET] == 0 and summary[report.dc.NOT_MEASURED] == 0 else 1


def _interrupt(signum, frame):  # SIGTERM (the device tool's limit, a user): stop like Ctrl-C
    raise KeyboardInterrupt


def run(check: Check) -> int:
    parts = check.selected
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for i, part in enumerate(parts):
            print(f"=== {part.name}: {part.what} ({check.clock.left():.0f} s left)", flush=True)
            try:
                result = run_part(check, part, parts[i + 1 :])
            except KeyboardInterrupt:
                check.parts.append(
                    {
                        "name": part.name,
                        "what": part.what,
                        "status": "interrupted",
                        "reason": "stopped by a signal",
                    }
                )
                check.stop_reason = "the check was interrupted"
                for rest in parts[i + 1 :]:
                    check.parts.append(
                        {
                            "name": rest.name,
                            "what": rest.what,
                            "status": "not_run",
                            "reason": check.stop_reason,
                        }
                    )
                check.publish()
                print("interrupted; what finished is published", file=sys.stderr)
                return 130
            check.parts.append(result)
            print(
                f"=== {part.name}: {result['status']}"
                + (f" ({result['reason']})" if result["reason"] else ""),
                flush=True,
            )
            check.publish()
    finally:
        signal.signal(signal.SIGTERM, previous)
    check.publish(finished=True)
    return exit_status(check)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="the same control flow on a CPU with tiny settings")
    p.add_argument(
        "--deadline", type=float, default=None, help="seconds for the whole check (570; dry run 420)"
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where the summary goes (reports/gpu; dry run: the work dir)",
    )
    p.add_argument(
        "--work-dir", type=Path, default=None, help="runs, logs and temporary files (default: a temp dir)"
    )
    p.add_argument(
        "--parts",
        default=",".join(PART_NAMES),
        help="comma list of parts to run (default: all; preflight always runs first)",
    )
    p.add_argument(
        "--predictions",
        type=Path,
        default=dp.PATH,
        help=f"the planner's predictions (default: {dp.PATH.relative_to(REPO)}, made by {dp.REGENERATE})",
    )
    p.add_argument(
        "--without", default="", help="treat these packages as missing (to see what such a machine reports)"
    )
    args = p.parse_args(argv)
    selected = tuple(x.strip() for x in args.parts.split(",") if x.strip())
    if selected and "preflight" not in selected:
        selected = ("preflight", *selected)  # it is what refuses stale predictions and an oversized plan
    unknown = [x for x in selected if x not in PART_NAMES]
    if unknown or not selected:
        p.error(
            f"--parts: unknown part(s) {', '.join(unknown) or '(none given)'}; valid: {', '.join(PART_NAMES)}"
        )
    deadline = DEADLINE_S[args.dry_run] if args.deadline is None else args.deadline
    if not (deadline > 0 and deadline < 86400):
        p.error(f"--deadline must be a positive number of seconds under a day, got {args.deadline}")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="ditbench-device-check-"))
    out_dir = args.out_dir or (work / "report" if args.dry_run else REPO / "reports" / "gpu")
    work.mkdir(parents=True, exist_ok=True)
    out_env = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    check = Check(
        dry=args.dry_run,
        work=work,
        out_dir=out_dir,
        out_env=out_env,
        clock=Clock(deadline),
        runner=Runner(os.environ.get("PYTHONPATH")),
        without={x.strip() for x in args.without.split(",") if x.strip()},
        selected=tuple(p for p in PARTS if p.name in selected),
        plan_deadline_s=DEADLINE_S[False] if args.dry_run else deadline,
        predictions=args.predictions.resolve(),
    )
    check.meta = {
        "dry_run": args.dry_run,
        "started_at": _now_iso(),
        "deadline_s": deadline,
        "git_sha": _git_sha(),
        "code_fingerprint": dp.fingerprint(),
        "parts_selected": list(selected),
        "work_dir": str(work),
    }
    print(
        f"device check{' (dry run)' if args.dry_run else ''}: deadline {deadline:.0f} s, work {work}, "
        f"out {out_dir}"
    )
    total, over = budget(check.selected, check.plan_deadline_s, dry=False)
    print(
        f"budget of the real run: caps {total:g} s of its {check.plan_deadline_s:g} s deadline"
        + (" (variants takes what is left)" if any(p.cap_s[False] is None for p in check.selected) else "")
        + (": OVER, preflight refuses" if over else "")
    )
    status = run(check)
    print(f"summary: {out_dir / 'summary.md'}" + (f" (copied to {out_env})" if out_env else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
