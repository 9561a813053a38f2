"""The device check's dry run: the GPU script's whole control flow on a CPU, on every CI run.

The real run gets one call of under 10 minutes on an H200 and must bring figures back even when it
is cut short; these tests hold the dry run to the same promises: outputs after every part, inside the
deadline, and what finished survives a deadline cut and a SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_check.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import device_check  # noqa: E402
import device_publish  # noqa: E402

pytestmark = pytest.mark.slow
COMPLETED = {"ok", "not_provided", "unsupported"}


def _start(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, Path, Path, str]:
    mark = uuid.uuid4().hex
    out_env = tmp_path / "OUT"
    out_env.mkdir()
    full_env = {**os.environ, "OUT": str(out_env), "DEVICE_CHECK_TEST_MARK": mark, **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, str(SCRIPT), "--dry-run", "--work-dir", str(tmp_path / "work")]
    cmd += ["--out-dir", str(tmp_path / "reports"), *args]
    proc = subprocess.Popen(
        cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    return proc, out_env, tmp_path / "reports", mark


def _summary(out_env: Path) -> dict | None:
    try:
        return json.loads((out_env / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _left_behind(mark: str) -> list[psutil.Process]:
    """Processes of this run still alive (they inherit its marker variable)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("DEVICE_CHECK_TEST_MARK") == mark:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _watch(out_env: Path, proc: subprocess.Popen, seen: list[list[str]]) -> threading.Thread:
    """Record each new list of published parts while the check runs."""

    def loop():
        while proc.poll() is None:
            s = _summary(out_env)
            names = [p["name"] for p in s["parts"]] if s else None
            if names is not None and (not seen or seen[-1] != names):
                seen.append(names)
            time.sleep(0.1)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_dry_run_publishes_after_every_part_and_fits_its_deadline(tmp_path):
    start = time.monotonic()
    proc, out_env, reports, mark = _start(tmp_path)
    seen: list[list[str]] = []
    watcher = _watch(out_env, proc, seen)
    output, _ = proc.communicate(timeout=900)
    watcher.join()
    elapsed = time.monotonic() - start
    summary = _summary(out_env)
    assert proc.returncode == 0, output[-3000:]
    names = list(device_check.PART_NAMES)
    assert [p["name"] for p in summary["parts"]] == names
    assert {p["status"] for p in summary["parts"]} <= COMPLETED, summary["parts"]
    assert summary["finished"] and summary["elapsed_s"] < summary["deadline_s"] and elapsed < 900
    # Outputs appeared part by part: each state seen was the list of parts finished so far.
    assert all(state == names[: len(state)] for state in seen)
    assert len(seen) >= 6, seen
    for root in (out_env, reports):
        assert sorted(p.name for p in root.iterdir()) == sorted(device_publish.OUT_FILES)
        assert device_publish.check_outputs(root) == []
    assert "budget of the real run: caps 560.5 s of its 570 s deadline" in output
    parts = {p["name"]: p for p in summary["parts"]}
    gates = parts["preflight"]["figures"]["gates"]  # the committed predictions are the code's
    assert gates["predictions"]["problem"] is None and gates["budget"]["problem"] is None
    tests = parts["gpu_tests"]["figures"]
    assert tests["tests"] > 0  # collected (and skipped: no CUDA here), one pytest process per file
    assert list(tests["per_file"]) == tests["files"] == tests["files_found"][:2]
    assert all(v.startswith("0 passed, 0 failed") for v in tests["per_file"].values())
    assert parts["env"]["figures"]["measured_matmul_tflops"]["fp32"] > 0
    assert parts["fid"]["figures"]["reference_cache_hit"] is True
    assert parts["ddp"]["figures"]["step_ms_ddp"] > 0
    t = summary["targets"]
    assert [r["verdict"] for r in t["card_24gb"]] == ["met"] * len(t["card_24gb"])  # OOM, skip, smoke
    measured = [r for r in t["matched"] if r["verdict"] != "not measured"]
    assert {r["status"] for r in t["matched"]} == {"ok", "unsupported"} and measured  # tf32/fp16 on a CPU
    records = [json.loads(line) for line in (out_env / "cells.jsonl").read_text().splitlines()]
    parts_with_cells = {"matched", "suite_24gb", "compiled", "variants"}  # variants: one attention cell
    assert {r["device_check_part"] for r in records} == parts_with_cells
    md = (out_env / "summary.md").read_text()
    assert "DRY RUN" in md and "compiled, batch 256: >= 600 img/s" in md and "Planner" in md
    with tarfile.open(out_env / "logs.tgz") as tar:
        assert "device_check/matched.log" in tar.getnames()
    assert not _left_behind(mark)


def test_a_deadline_cut_keeps_what_finished(tmp_path):
    """A cell that hangs: the deadline cuts its part, the parts before it keep their outputs, the parts
    after it say why they did not run, and nothing is left running."""
    proc, out_env, _, mark = _start(
        tmp_path,
        "--parts",
        "preflight,matched,fid,planner",
        "--deadline",
        "30",
        env={"DITBENCH_INJECT_FAULT": "DiT-T/8=hang"},
    )
    start = time.monotonic()
    output, _ = proc.communicate(timeout=300)
    elapsed = time.monotonic() - start
    summary = _summary(out_env)
    status = {p["name"]: p["status"] for p in summary["parts"]}
    assert proc.returncode == 1, output[-3000:]
    assert status["preflight"] == "ok" and summary["parts"][0]["figures"]["torch"]
    assert status["matched"] == "timeout"
    assert status["fid"] == "deadline" and status["planner"] in ("failed", "deadline")
    assert elapsed < 30 + 20  # the cut came at the deadline (the stop inside it), not at the cells' timeout
    assert [r["verdict"] for r in summary["targets"]["matched"]] == ["not measured"] * 7
    assert not _left_behind(mark)


def test_a_killed_check_still_returns_every_finished_part(tmp_path):
    """The device tool kills the command at its limit (SIGKILL, no warning): $OUT holds what finished."""
    proc, out_env, _, mark = _start(
        tmp_path, "--parts", "preflight,env,matched", env={"DITBENCH_INJECT_FAULT": "DiT-T/8=hang"}
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            s = _summary(out_env)
            if s and [p["name"] for p in s["parts"]] == ["preflight", "env"]:
                break
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        time.sleep(2)  # the matched part is running (its cell hangs)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = _summary(out_env)
    assert [(p["name"], p["status"]) for p in summary["parts"]] == [("preflight", "ok"), ("env", "ok")]
    assert summary["finished"] is False and "cut short" in (out_env / "summary.md").read_text()
    assert device_publish.check_outputs(out_env) == []
    time.sleep(1)
    for p in _left_behind(mark):  # the runner's cell dies with it (PDEATHSIG); nothing else may linger
        p.kill()
        pytest.fail(f"left running after the kill: {p.cmdline()}")


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks what a machine without a GPU is told"
)
def test_the_real_check_without_a_gpu_says_so_and_stops(tmp_path):
    out_env = tmp_path / "OUT"
    env = {**os.environ, "OUT": str(out_env), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(SCRIPT), "--work-dir", str(tmp_path / "w"), "--out-dir", str(tmp_path / "r")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = _summary(out_env)
    first, *rest = summary["parts"]
    assert first["status"] == "failed" and "no CUDA device" in first["reason"]
    assert {p["status"] for p in rest} == {"not_run"} and len(rest) == len(device_check.PARTS) - 1
    assert summary["verdicts"]["met"] == 0 and summary["verdicts"]["not measured"] > 0  # nothing passes unrun
