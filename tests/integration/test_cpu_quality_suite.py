"""suites/cpu_quality.yaml shows the quality loop working: FID at the last evaluation is lower than at
step 0 by more than the noise estimate (the gate's noise_rule over the seeds' spreads), read from the
records. The committed example (reports/cpu_quality/) is checked in milliseconds; the slow test runs
the suite afresh (minutes on 2 CPU cores; OMP_NUM_THREADS=1, as the suite advises)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ditbench.report.gate.policy import DEFAULT_QUALITY_NOISE_K
from ditbench.report.gate.quality import noise_rule

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "suites" / "cpu_quality.yaml"
EXAMPLE = ROOT / "reports" / "cpu_quality"


def check_fid_falls(run_dir: Path) -> tuple[float, float, float]:
    """(FID at step 0, FID at the last evaluation, the noise bound) of the suite's evaluated cell."""
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line]
    (record,) = [r for r in records if r.get("quality")]
    q = record["quality"]
    assert record["status"] == "ok" and q["status"] == "ok", q.get("reason")
    assert q["inception"]["official"] is False and q["banner"].startswith("not the official Inception")
    first, last = q["evaluations"][0], q["evaluations"][-1]
    assert first["step"] == 0 and last["step"] == max(q["at"]) > 0
    assert len(first["seeds"]) >= 2 and last["spread"]["fid"] is not None  # a noise estimate exists
    b, n = first["metrics"]["fid"], last["metrics"]["fid"]
    noise = noise_rule(b, n, first["spread"]["fid"], last["spread"]["fid"], DEFAULT_QUALITY_NOISE_K)
    assert n < b and noise.beyond, f"FID {b:.2f} -> {n:.2f} is within the noise bound {noise.bound:.2f}"
    assert last["train_gpu_s"] > first["train_gpu_s"] == 0
    for e in q["evaluations"]:
        assert (run_dir / e["grid"]).is_file()
    return b, n, noise.bound


def test_the_committed_example_shows_fid_falling_beyond_noise():
    check_fid_falls(EXAMPLE)
    assert (EXAMPLE / "report.md").is_file() and "## Sample quality" in (EXAMPLE / "report.md").read_text()


@pytest.mark.slow
def test_the_cpu_quality_suite_lowers_fid_beyond_noise(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "ditbench", "run", str(SUITE), "--out", str(out), "--no-progress"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    check_fid_falls(out)
