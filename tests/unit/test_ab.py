"""`ditbench ab` end to end with a stand-in for the cell process (fast, exact): the order of the
rounds, the sequential stop, what each outcome exits with, what it writes, and its refusals. The
processes' step times come from a seeded model: 10 ms x (1 + the side's slow:F) x lognormal noise."""

from __future__ import annotations

import json
import os
import random
import re
import sys

import pytest

from ditbench.ab import rounds as rounds_module
from ditbench.ab import sides as sides_module
from ditbench.bench.launch.files import write_result
from ditbench.cli import main
from ditbench.core.faults import FAULT_ENV

SUITE = """\
name: abtest
device: cpu
defaults: {image_size: 32, data: synthetic, steps: {warmup: 1, measure: 5, min_seconds: 0}}
matrix: {model: [DiT-T/4], precision: [fp32], grad_ckpt: [none, full], batch_size: [8]}
"""
ENV = {"cpu": "test cpu", "torch": "2.14.1", "torch_threads": 1, "gpu_name": None, "gpu_count": 0}


class Fake:
    """Stands in for FreshProcess: writes the result a cell process would, and logs each launch."""

    launches: list[tuple[str, str, frozenset | None]] = []
    noise = 0.01
    rng = random.Random(0)
    broken: dict[tuple[str, int], dict] = {}  # (side's fault text, its n-th launch) -> result

    def __init__(self, module, python, env=None, cpus=None):
        self.env, self.cpus = dict(env or {}), cpus

    def launch(self, spec, about, timeout_s, spec_path, result_path, log_path):
        fault = self.env.get(FAULT_ENV, "")
        Fake.launches.append((about["cell_name"], fault, self.cpus))
        slow = float(fault.rpartition("slow:")[2]) if "slow:" in fault else 0.0
        step = 10.0 * (1 + slow) * Fake.rng.lognormvariate(0, Fake.noise)
        result = {"status": "ok", "metrics": {"images_per_s": 8000 / step, "step_ms": {"median": step}}}
        result["env"] = ENV
        nth = sum(f == fault for _, f, _ in Fake.launches)
        write_result(result_path, Fake.broken.get((fault, nth), result))


@pytest.fixture
def ab(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rounds_module, "FreshProcess", Fake)
    monkeypatch.setattr(sides_module, "probe", lambda side, specs: side)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    Fake.launches, Fake.noise, Fake.rng, Fake.broken = [], 0.01, random.Random(0), {}
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    policy = tmp_path / "policy.yaml"
    policy.write_text("alpha: 0.05\n")

    def run(*args: str, out: str = "out") -> tuple[int, str, str]:
        argv = ["ab", str(suite), "--out", str(tmp_path / out), "--policy", str(policy), "--seed", "7"]
        code = main([*argv, *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    run.out = tmp_path / "out"
    return run


def slow(fraction: float) -> str:
    return f"--b-env={FAULT_ENV}=DiT=slow:{fraction}"


def test_a_a_passes_once_every_cell_is_decided(ab):
    code, out, err = ab("--max-rounds", "20")
    assert code == 0 and out.startswith("## ✅ ditbench ab: no regression")
    assert "seed 7 (--seed 7 repeats the order); interleaved; 2 cells, 20 rounds at most" in err
    doc = json.loads((ab.out / "ab.json").read_text())
    rounds = doc["ab"]["rounds"]
    assert doc["ab"]["stopped"] == "every cell decided" and rounds < 20
    assert {c["verdict"] for c in doc["cells"]} == {"pass"}
    mdes = [m["mde_pct"] for c in doc["cells"] for m in c["metrics"]]
    assert all(0 < m <= 5.0 for m in mdes) and doc["largest_mde_pct"] == max(mdes)
    for side in ("a", "b"):  # each process's record, a round a repeat
        records = [json.loads(x) for x in (ab.out / side / "results.jsonl").read_text().splitlines()]
        assert len(records) == sum(c["rounds"] for c in doc["ab"]["cells"].values())
        assert {r["label"] for r in records} == {f"ab side {side.upper()}"}
    assert (ab.out / "summary.md").read_text() == out
    assert "How it ran: interleaved" in out and "| A | /" in out and "could see timing changes of" in out


def test_a_slowdown_is_a_regression_before_the_last_round(ab):
    code, out, _ = ab("--max-rounds", "20", slow(0.10))
    assert code == 1 and out.startswith("## ❌ ditbench ab: 2 regressions")
    doc = json.loads((ab.out / "ab.json").read_text())
    assert all(c["verdict"] == "regression" for c in doc["cells"])
    change = [m["change_pct"] for c in doc["cells"] for m in c["metrics"]]
    assert all(-10.5 < x < -8.0 for x in change)  # images/s: 1 / 1.1 - 1 = -9.1%
    assert doc["ab"]["rounds"] < 20


def test_each_round_runs_a_cells_two_processes_back_to_back_in_a_drawn_order(ab):
    ab("--max-rounds", "8", slow(0.5))
    pairs = [Fake.launches[i : i + 2] for i in range(0, len(Fake.launches), 2)]
    assert all(a[0] == b[0] and {a[1], b[1]} == {"", "DiT=slow:0.5"} for a, b in pairs)
    firsts = {a[1] for a, _ in pairs}
    assert firsts == {"", "DiT=slow:0.5"}  # neither side always first
    first = list(Fake.launches)
    Fake.launches, Fake.rng = [], random.Random(0)
    ab("--max-rounds", "8", slow(0.5), out="again")
    assert Fake.launches == first  # --seed repeats the order


def test_noise_beyond_the_budget_is_inconclusive_with_its_mde(ab):
    Fake.noise = 0.3
    code, out, _ = ab("--max-rounds", "6")
    assert code == 3 and out.startswith("## ❔ ditbench ab: ")
    doc = json.loads((ab.out / "ab.json").read_text())
    assert doc["ab"]["stopped"] == "6 rounds run" and doc["largest_mde_pct"] > 5.0
    assert "could see timing changes of" in out


def test_a_side_that_fails_is_a_new_failure_and_stops_running(ab):
    Fake.broken[("DiT=slow:0.01", 4)] = {"status": "oom", "reason": "out of memory: injected"}
    code, out, _ = ab("--max-rounds", "20", slow(0.01))
    assert code == 1 and "### New failures (ok before)" in out
    doc = json.loads((ab.out / "ab.json").read_text())
    failed = [c for c in doc["cells"] if c["verdict"] == "new failure"]
    assert len(failed) == 1 and failed[0]["reason"] == "repeats not ok in the new run: #2 oom"
    assert doc["ab"]["cells"][failed[0]["cell_name"]]["rounds"] == 2  # no round after the failure


def test_the_time_budget_ends_the_run_after_its_round(ab):
    code, out, _ = ab("--max-rounds", "20", "--budget-min", "0.0001")
    doc = json.loads((ab.out / "ab.json").read_text())
    assert doc["ab"]["rounds"] == 1 and doc["ab"]["stopped"].startswith("the next round would end after")
    assert code == 3  # one round decides nothing


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="duet needs 2 CPUs")
def test_duet_gives_each_side_its_own_cpus_drawn_per_pair(ab):
    code, out, err = ab("--max-rounds", "8", "--duet", slow(0.5))
    assert code == 1 and "; duet;" in err and "How it ran: duet" in out
    by_side = {}
    for _, fault, cpus in Fake.launches:
        assert cpus is not None and len(cpus) >= 1
        by_side.setdefault(fault, set()).add(cpus)
    assert by_side[""] == by_side["DiT=slow:0.5"] and len(by_side[""]) == 2  # both halves, both sides
    cpus = [c for _, _, c in Fake.launches]
    assert all(not (cpus[i] & cpus[i + 1]) for i in range(0, len(cpus), 2))  # disjoint within a pair


def test_a_side_writing_records_this_gate_cannot_read_is_refused_by_name(ab):
    Fake.broken[("DiT=slow:0.01", 2)] = {"status": "ok", "metrics": {"images_per_s": 800.0}}
    code, out, err = ab(slow(0.01))
    assert code == 2 and "side B's record" in err and "metrics.step_ms.median missing" in err


@pytest.mark.parametrize(
    ("broken", "key"),
    [
        ({"images_per_s": "800", "step_ms": {"median": 10.0}}, "metrics.images_per_s is '800', not a number"),
        (
            {"images_per_s": 800.0, "step_ms": {"median": 10.0, "samples": "x"}},
            "metrics.step_ms.samples is 'x'",
        ),
        ({"images_per_s": 800.0, "step_ms": 10.0}, "metrics.step_ms is 10.0, not an object"),
    ],
)
def test_a_side_whose_result_holds_a_wrong_type_is_refused_by_name(ab, broken, key):
    """Issue 34, class 6: the record a side's result makes is validated where it is made."""
    Fake.broken[("DiT=slow:0.01", 2)] = {"status": "ok", "metrics": broken, "env": ENV}
    code, out, err = ab(slow(0.01))
    text = " ".join(err.split())
    assert code == 2 and "Traceback" not in err and "side B's result for cell DiT-T/4" in text and key in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-rounds", "4"], "--max-rounds 4: give 6 to 1000"),
        (["--a-env", "1X=2"], "--a-env '1X=2' is not KEY=VALUE"),
        (["--b", "/no/such/python"], "--b '/no/such/python' is not an executable Python interpreter"),
        (["--budget-min", "nan"], "--budget-min nan: give a number of minutes above 0"),
        (["--timeout-s", "-1"], "--timeout-s -1.0: give a number of seconds above 0"),
        (["--seed", "-1"], "--seed -1: give a whole number from 0"),
        (["--cells", "nothing-matches"], "--cells nothing-matches matches none of the 2 cells"),
    ],
)
def test_bad_arguments_are_one_paragraph_and_exit_2(ab, args, message):
    code, out, err = ab(*args)
    assert code == 2 and message in " ".join(err.split()) and "Traceback" not in err


def test_a_side_whose_ditbench_cannot_read_the_spec_is_refused_by_name(tmp_path, monkeypatch):
    """An older ditbench (here: one without launch.files.read_spec) is named before anything runs."""
    fake = tmp_path / "old" / "ditbench"
    (fake / "bench" / "launch").mkdir(parents=True)
    for init in (fake, fake / "bench", fake / "bench" / "launch"):
        (init / "__init__.py").write_text("__version__ = '0.0.1'\n" if init == fake else "")
    (fake / "bench" / "launch" / "files.py").write_text("def write_spec(*a): pass\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={fake.parent} exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    side = sides_module.Side("B", str(python))
    with pytest.raises(sides_module.UserError) as err:
        sides_module.probe(side, [])
    text = str(err.value)
    assert text.startswith(f"side B (--b {python}) cannot run this suite's cells: ImportError: cannot import")
    assert "read the cell spec this ditbench writes" in text


def test_a_venv_folder_names_its_interpreter_and_keeps_the_link(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    assert sides_module.interpreter("--a", str(venv)) == str(venv / "bin" / "python")
    with pytest.raises(sides_module.UserError, match=re.escape("is a folder without bin/python")):
        sides_module.interpreter("--a", str(tmp_path))


def test_the_probe_reads_every_spec_with_the_sides_own_ditbench(tmp_path):
    from ditbench.bench.launch.files import write_spec
    from ditbench.spec.suite import load_suite

    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE)
    cell = load_suite(suite).cells[0]
    good, bad = tmp_path / "good.spec.json", tmp_path / "bad.spec.json"
    write_spec(good, cell.spec, cell_id=cell.cell_id, cell_name=cell.cell_name)
    doc = json.loads(good.read_text())
    doc["config"]["a_knob_from_the_future"] = 1  # what a newer ditbench's spec could hold
    bad.write_text(json.dumps(doc))
    side = sides_module.probe(sides_module.Side("A", sys.executable, (("X", "1"),)), [good])
    assert side.info["ditbench"] and side.info["torch"] and side.about()["env"] == {"X": "1"}
    with pytest.raises(sides_module.UserError, match="side A .* cannot run this suite's cells: UserError: "):
        sides_module.probe(side, [good, bad])


def test_a_sides_environment_is_inert_in_the_summary(ab):
    code, out, _ = ab("--max-rounds", "20", "--b-env", "X=<img src=x>|[a](http://b)\nY")
    row = next(line for line in out.splitlines() if line.startswith("| B |"))
    assert "X=&lt;img src=x>\\|\\[a](http://b) Y" in row and code == 0
