"""`ditbench ab` with real cell processes: a side given as another interpreter path (its processes
start without our PYTHONPATH) whose steps take four times as long is a regression (by so much that
the load of a busy machine cannot hide it in 6 rounds), and each side's
records are on disk."""

from __future__ import annotations

import json
import sys

import pytest

from ditbench.cli import main

SUITE = """\
name: ablive
device: cpu
defaults: {image_size: 32, data: synthetic, steps: {warmup: 2, measure: 10, min_seconds: 0}, timeout_s: 120}
matrix: {model: [DiT-T/4], precision: [fp32], grad_ckpt: [none], batch_size: [4]}
"""


@pytest.mark.slow
def test_a_side_four_times_as_slow_is_a_regression(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    suite, policy, python = tmp_path / "s.yaml", tmp_path / "p.yaml", tmp_path / "python"
    suite.write_text(SUITE)
    policy.write_text("alpha: 0.05\n")
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # another path: the side's own env
    python.chmod(0o755)
    out = tmp_path / "out"
    argv = ["ab", str(suite), "--b", str(python), "--b-env", "DITBENCH_INJECT_FAULT=DiT=slow:3.0"]
    code = main([*argv, "--policy", str(policy), "--max-rounds", "6", "--seed", "3", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 1, text
    assert text.startswith("## ❌ ditbench ab: 1 regression")
    b = [json.loads(x) for x in (out / "b" / "results.jsonl").read_text().splitlines()]
    assert b and all(r["status"] == "ok" and r["env"]["torch"] for r in b)
    doc = json.loads((out / "ab.json").read_text())
    ratios = next(iter(doc["ab"]["cells"].values()))["ratios"]
    assert all(1.5 < r < 10 for r in ratios), ratios  # four times the step time, give or take the load
