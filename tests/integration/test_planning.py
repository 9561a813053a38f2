"""The planner in runs: a suite's `plan` option (predictions recorded, predicted OOMs skipped, largest
batch first per series) and the CPU allocator's peak every CPU cell records."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from ditbench.bench import runner
from ditbench.bench.runner import RunOptions, run_suite
from ditbench.core.errors import UserError
from ditbench.spec.suite import parse_suite

REPO = Path(__file__).resolve().parents[2]


def _suite(**top):
    raw = {
        "name": "p",
        "device": "cpu",
        "defaults": {
            "model": "DiT-T/2",
            "image_size": 64,
            "steps": {"warmup": 1, "measure": 2, "min_seconds": 0},
        },
        "matrix": {"batch_size": [2, 4]},
        **top,
    }
    return parse_suite(raw, "p.yaml")


def test_the_plan_option_is_checked_like_every_suite_key():
    assert _suite().plan is None
    assert _suite(plan={}).plan.skip_predicted_oom is False
    assert _suite(plan={"skip_predicted_oom": True}).plan.skip_predicted_oom is True
    for bad, where in (
        ({"skip_predicted_oom": "yes"}, "`plan.skip_predicted_oom`"),
        ({"skip_oom": True}, "`plan.skip_oom`"),
        ([1], "`plan`"),
    ):
        with pytest.raises(UserError, match="p.yaml") as err:
            _suite(plan=bad)
        assert where in str(err.value)


RUN = """
import json, sys
from pathlib import Path
from ditbench.bench.runner import RunOptions, run_suite
from ditbench.spec.suite import load_suite
records = run_suite(load_suite(sys.argv[1]), RunOptions(out=Path(sys.argv[2]), progress=False), echo=print)
loaded = sorted(m for m in sys.modules if m.startswith("ditbench.plan"))
print("RESULT " + json.dumps({"loaded": loaded, "order": [r["config"]["batch_size"] for r in records]}))
"""


def _run(tmp_path: Path, name: str, matrix: str, plan: str) -> tuple[dict, list[dict]]:
    text = f"""
    name: {name}
    device: cpu
    defaults:
      model: DiT-T/2
      image_size: 64
      steps: {{warmup: 1, measure: 2, min_seconds: 0}}
      timeout_s: 600
    matrix: {matrix}
    {plan}
    """
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-c", RUN, str(path), str(out)], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    lines = (out / "results.jsonl").read_text().splitlines()
    return result, [json.loads(line) for line in lines]


@pytest.mark.slow
def test_cpu_cells_record_the_allocator_peak_and_the_plan_option_its_prediction(tmp_path):
    plain, records = _run(tmp_path, "plain", "{batch_size: [2]}", "")
    # A suite without `plan` never loads the planner in the runner (its cells use the light meter only).
    assert not [m for m in plain["loaded"] if m != "ditbench.plan"], plain["loaded"]
    m = records[0]["metrics"]
    assert records[0]["status"] == "ok" and m["cpu_peak_alloc_gib"] > 0 and "predicted_peak_gib" not in m
    assert "after the timed window" in m["cpu_peak_alloc_basis"]

    planned, records = _run(tmp_path, "planned", "{grad_ckpt: [none, full], batch_size: [2, 8]}", "plan: {}")
    assert "ditbench.plan.predict" in planned["loaded"]
    written = [(r["config"]["grad_ckpt"], r["config"]["batch_size"]) for r in records]
    assert written == [("none", 8), ("none", 2), ("full", 8), ("full", 2)]  # largest batch first per series
    for r in records:
        m, pred = r["metrics"], r["metrics"]["prediction"]
        assert pred["status"] == "predicted" and pred["card"] is None  # a CPU: no card to fit
        assert set(pred["components"]) >= {"weights", "gradients", "optimizer", "ema", "activations"}
        # the runner's prediction against the cell's own measurement: the planner's CPU accuracy bound
        assert m["predicted_peak_gib"] == pytest.approx(m["cpu_peak_alloc_gib"], rel=0.05), r["cell_name"]
    peak = {
        (r["config"]["grad_ckpt"], r["config"]["batch_size"]): r["metrics"]["cpu_peak_alloc_gib"]
        for r in records
    }
    assert (
        peak[("none", 8)] > peak[("none", 2)] and peak[("full", 8)] < peak[("none", 8)]
    )  # RSS shows neither


def _card_suite():
    """Three GPU cells on an emulated 2 GiB card: batch 4 fits, 16 and 64 are predicted not to."""
    raw = {
        "name": "card",
        "device": "cuda",
        "gpu_memory_gib": 2,
        "plan": {"skip_predicted_oom": True},
        "defaults": {"model": "DiT-S/2", "precision": "fp32"},
        "matrix": {"batch_size": [4, 16, 64]},
    }
    return parse_suite(raw, "card.yaml")


@pytest.mark.slow
def test_cells_predicted_not_to_fit_are_skipped_and_the_rest_run_largest_first(tmp_path, monkeypatch):
    """On a CPU machine the GPU cells are faked at launch; the planning around them is real."""
    suite = _card_suite()
    launched = []

    def fake_run(spec, about, timeout, spec_path, result_path, log):
        launched.append(spec.knobs.batch_size)
        metrics = {"images_per_s": 1.0, "step_ms": {"median": 1.0, "p10": 1.0, "p90": 1.0}}
        result = {"status": "ok", "reason": None, "metrics": metrics, "smoke": None, "env": None}
        result_path.write_text(json.dumps(result))

    monkeypatch.setattr(runner, "precheck", lambda *a, **k: None)
    monkeypatch.setattr(runner, "launcher_for", lambda spec: SimpleNamespace(launch=fake_run))
    records = run_suite(suite, RunOptions(out=tmp_path / "out", progress=False), echo=lambda line: None)
    by_batch = {r["config"]["batch_size"]: r for r in records}
    assert launched == [4]  # 64 and 16 are predicted not to fit 2 GiB (less the context): never started
    for batch in (16, 64):
        r = by_batch[batch]
        assert r["status"] == "skipped"
        assert r["reason"].startswith("predicted not to fit the 2 GiB card: needs"), r["reason"]
        assert r["metrics"]["prediction"]["status"] == "oom" and r["metrics"]["predicted_peak_gib"] > 1.5
    fit = by_batch[4]["metrics"]
    assert fit["prediction"]["status"] == "fits" and 0.5 < fit["predicted_peak_gib"] < 1.5
    assert fit["prediction"]["components"]["context"] == 0.5 and fit["images_per_s"] == 1.0


@pytest.mark.slow
def test_under_an_executor_cells_predicted_not_to_fit_are_skipped_before_submission(tmp_path, monkeypatch):
    """`run --executor` plans as the local runner does: the same records, nothing submitted that the
    planner says would not fit. The executor is faked (each submitted cell writes its result at once)."""
    pytest.importorskip("submitit")
    from ditbench.bench import jobs
    from ditbench.bench.launch import executors
    from ditbench.bench.launch.files import read_spec

    suite = _card_suite()
    submitted = []

    def fake_submit(executor, kind, params, calls):
        out = []
        for spec_path, result_path, _log, _timeout in calls:
            submitted.append(read_spec(spec_path)[0].knobs.batch_size)
            metrics = {"images_per_s": 1.0, "step_ms": {"median": 1.0, "p10": 1.0, "p90": 1.0}}
            result = {"status": "ok", "reason": None, "metrics": metrics, "smoke": None, "env": None}
            Path(result_path).write_text(json.dumps(result))
            out.append((None, executors.JobRef(kind, str(len(submitted)), str(tmp_path / "submitit"))))
        return out

    monkeypatch.setattr(jobs, "cell_verdict", lambda *a, **k: None)
    monkeypatch.setattr(executors, "make_executor", lambda *a, **k: object())
    monkeypatch.setattr(executors, "submit_cells", fake_submit)
    monkeypatch.setattr(executors, "is_active", lambda *a, **k: False)
    options = RunOptions(out=tmp_path / "out", progress=False)
    records = jobs.submit_suite(suite, options, "local", echo=lambda line: None, poll_s=0)
    assert submitted == [4]  # 64 and 16 are predicted not to fit 2 GiB: recorded, never submitted
    by_batch = {r["config"]["batch_size"]: r for r in records}
    assert [by_batch[b]["status"] for b in (4, 16, 64)] == ["ok", "skipped", "skipped"]
    assert by_batch[64]["reason"].startswith("predicted not to fit the 2 GiB card: needs")
    assert by_batch[4]["metrics"]["prediction"]["status"] == "fits"  # the prediction is in the record


def test_reports_show_the_cpu_allocator_peak_with_the_prediction_beside_it(tmp_path):
    from synthetic_records import CPU_ENV, make_record, write_jsonl

    from ditbench.report.load import load_results
    from ditbench.report.render import write_report

    records = []
    for ckpt, alloc, predicted in (("none", 0.80, 0.82), ("full", 0.30, 0.31)):
        r = make_record("DiT-S/8", "fp32", ckpt, 8, env=CPU_ENV, device="cpu")
        r["metrics"].update(cpu_peak_rss_gib=0.69, cpu_peak_alloc_gib=alloc, predicted_peak_gib=predicted)
        records.append(r)
    unplanned = make_record("DiT-S/8", "bf16", "none", 8, env=CPU_ENV, device="cpu")
    unplanned["metrics"].update(cpu_peak_rss_gib=0.69, cpu_peak_alloc_gib=0.5)
    unplanned["metrics"]["prediction"] = {"status": "unsupported", "reason": "r"}
    write_jsonl(tmp_path / "r.jsonl", [*records, unplanned])
    write_report(load_results(tmp_path / "r.jsonl"), tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| CPU allocator peak |" in md and "| predicted peak |" in md
    # below 1 GiB in MiB: 0.80 GiB is 819 MiB
    assert "819 MiB (predicted 840 MiB)" in md and "| 307 MiB | 317 MiB |" in md  # measured, then predicted
    assert "not predicted (unsupported)" in md
    assert "0.69" not in md and "707 MiB" not in md  # RSS, flat across settings, is not what the tables show
