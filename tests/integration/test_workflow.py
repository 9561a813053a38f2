"""The CI workflow as shipped: its suites exist, the CPU baseline matches the suite it gates, and the
GPU gate's compare step passes with instructions when no baseline exists and gates when one does."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ditbench.bench.catalog import shipped_suites
from ditbench.bench.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "gpu-regression.yml"
COMPARE_STEP = ROOT / ".github" / "workflows" / "gpu_gate_compare.sh"
CPU_BASELINE = ROOT / "baselines" / "cpu_smoke"


def _run_lines() -> list[str]:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return [step["run"] for job in jobs.values() for step in job["steps"] if "run" in step]


def test_the_workflow_runs_shipped_suites_and_the_quick_tests():
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    assert jobs["cpu"]["runs-on"] == "ubuntu-latest"
    assert all("DITBENCH_GPU_RUNNER" in jobs[name]["if"] for name in ("gate", "benchmarks"))
    text = "\n".join(_run_lines())
    assert 'pytest -m "not slow"' in text and "download.pytorch.org/whl/cpu" in text
    names = re.findall(r"ditbench run (\S+)", text)
    assert names and all(name in shipped_suites() for name in names), names
    assert "bash .github/workflows/gpu_gate_compare.sh" in text


def test_the_cpu_baseline_is_a_run_of_the_command_the_workflow_runs():
    (command,) = [line for line in _run_lines() if line.startswith("ditbench run cpu_smoke")]
    overrides = [a for a in command.split()[3:] if "=" in a and not a.startswith("-")]
    suite = load_suite("cpu_smoke", overrides)
    records = [json.loads(line) for line in (CPU_BASELINE / "results.jsonl").read_text().splitlines()]
    assert {r["cell_id"] for r in records} == {c.cell_id for c in suite.cells}
    assert all(r["suite_overrides"] == suite.overrides for r in records)
    assert {r["status"] for r in records} == {"ok", "unsupported"}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_without_a_gpu_baseline_the_gate_says_how_to_make_one_and_passes(tmp_path):
    summary = tmp_path / "summary.md"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "BASE": str(tmp_path / "none.jsonl")}
    proc = subprocess.run(["bash", str(COMPARE_STEP)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = summary.read_text()
    assert "no baseline yet" in text and "refresh_baseline" in text and "ci-gate-new-baseline" in text


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.slow
def test_with_a_baseline_the_step_is_the_gate(tmp_path):
    new = tmp_path / "ci" / "results.jsonl"
    new.parent.mkdir()
    records = [json.loads(line) for line in (CPU_BASELINE / "results.jsonl").read_text().splitlines()]
    for r in records:  # the smoke run stopped learning: its last loss window doubled
        if r.get("smoke"):
            r["smoke"]["last_mean"] *= 2
    new.write_text("".join(json.dumps(r) + "\n" for r in records))
    env = {
        **os.environ,
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "BASE": str(CPU_BASELINE / "results.jsonl"),
        "POLICY": str(CPU_BASELINE / "policy.yaml"),
        "NEW": str(new),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(["bash", str(COMPARE_STEP)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "smoke loss" in (new.parent / "compare.md").read_text()
