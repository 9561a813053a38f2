"""The runner: isolated cells and their statuses, resume, --force (kills, recovery: test_runner_recovery)."""

import json
import re
import textwrap

import pytest

from ditbench.bench.runner import RunOptions, run_suite
from ditbench.cli import main
from ditbench.core.units import memory_text
from ditbench.records.jsonl import read_records
from ditbench.spec.suite import load_suite


def make_suite(tmp_path, matrix, extra="", name="t", timeout_s=120, smoke=0):
    text = f"""
    name: {name}
    device: cpu
    defaults:
      model: DiT-T/8
      image_size: 64
      steps: {{warmup: 1, measure: 2, min_seconds: 0}}
      smoke: {{steps: {smoke}, cells: all}}
      timeout_s: {timeout_s}
    matrix: {matrix}
    """
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text) + textwrap.dedent(extra))
    return load_suite(path), path


def run(suite, out, **kw):
    lines = []
    records = run_suite(suite, RunOptions(out=out, progress=False, **kw), echo=lines.append)
    return {r["cell_name"]: r for r in records}, lines


@pytest.mark.slow
def test_faults_get_their_status_and_the_other_cells_finish(tmp_path, monkeypatch):
    suite, _ = make_suite(
        tmp_path,
        "{grad_ckpt: [none, full], batch_size: [1, 2, 3]}",
        extra="include:\n  - {precision: fp16, batch_size: 1}\n  - {gpus: 2, batch_size: 1}\n",
        timeout_s=900,  # no cell here hangs (see the next test): a loaded machine must not make one time out
    )
    monkeypatch.setenv(
        "DITBENCH_INJECT_FAULT",
        "ckpt=none bs=1=raise,ckpt=none bs=2=oom,ckpt=full bs=1=nan@2,ckpt=full bs=2=raise@3",
    )
    out = tmp_path / "out"
    by_name, lines = run(suite, out)
    status = {name: r["status"] for name, r in by_name.items()}
    assert status == {
        "DiT-T/8 fp32 ckpt=none bs=1": "error",
        "DiT-T/8 fp32 ckpt=none bs=2": "oom",
        "DiT-T/8 fp32 ckpt=none bs=3": "skipped",
        "DiT-T/8 fp32 ckpt=full bs=1": "nan_loss",
        "DiT-T/8 fp32 ckpt=full bs=2": "error",
        "DiT-T/8 fp32 ckpt=full bs=3": "ok",
        "DiT-T/8 fp16 ckpt=none bs=1": "unsupported",
        "DiT-T/8 fp32 ckpt=none bs=1 gpus=2": "error",  # 2 gloo processes through torchrun
    }, status
    error = by_name["DiT-T/8 fp32 ckpt=none bs=1"]
    assert "injected fault" in error["reason"] and "Traceback" in error["traceback"]
    assert "injected fault" in error["traceback"].splitlines()[-1]
    assert "out of memory" in by_name["DiT-T/8 fp32 ckpt=none bs=2"]["reason"]
    assert "bs=2 ran out of memory at batch 2" in by_name["DiT-T/8 fp32 ckpt=none bs=3"]["reason"]
    assert "step 2" in by_name["DiT-T/8 fp32 ckpt=full bs=1"]["reason"]
    assert "raise at step 3" in by_name["DiT-T/8 fp32 ckpt=full bs=2"]["reason"]
    assert "fp16" in by_name["DiT-T/8 fp16 ckpt=none bs=1"]["reason"]
    two = by_name["DiT-T/8 fp32 ckpt=none bs=1 gpus=2"]["reason"]
    assert re.match(r"rank [01]: RuntimeError: injected fault", two)
    # the ok cell is a full record
    ok = by_name["DiT-T/8 fp32 ckpt=full bs=3"]
    m = ok["metrics"]
    assert m["images_per_s"] == pytest.approx(m["steps_per_s"] * 3)
    assert m["mfu"] is None and m["model_flops_per_image"] > 0 and m["tflops_per_s"] > 0
    assert m["cpu_peak_rss_gib"] > 0.05 and m["peak_mem_allocated_gib"] is None
    assert len(m["step_ms"]["samples"]) == m["measured_steps"] >= 2
    assert ok["env"]["torch"] and ok["schema"] == "ditbench.result/1" and ok["duration_s"] > 0
    # the cell that cannot run here is said first, in one line; every other cell has its own line
    assert lines[0].startswith("1 of 8 cells cannot run here and are recorded without running: [1] fp16 ")
    assert len(lines) == 8 and [line.split(" ")[0] for line in lines[1:]] == [f"[{i}/7]" for i in range(1, 8)]
    summary = (out / "summary.md").read_text()
    assert "| DiT-T/8 fp32 ckpt=full bs=2 | error |" in summary
    assert (out / "logs").is_dir()


@pytest.mark.slow
def test_a_hung_cell_is_killed_at_its_timeout(tmp_path, monkeypatch):
    # Whether the timeout hits while the cell starts or while it hangs, it is a timeout: no wall-clock bound
    suite, _ = make_suite(tmp_path, "{batch_size: [1]}", timeout_s=8)
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "bs=1=hang")
    by_name, _ = run(suite, tmp_path / "out")
    (record,) = by_name.values()
    assert record["status"] == "timeout" and "8 s" in record["reason"]
    assert "| DiT-T/8 fp32 ckpt=none bs=1 | timeout |" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.slow
def test_a_failed_smoke_run_is_the_smoke_fields_and_the_cell_stays_ok(tmp_path, monkeypatch):
    # warm-up 1 + measured 2 steps, then the smoke run: step 5 is its second step
    suite, _ = make_suite(tmp_path, "{batch_size: [1, 2]}", smoke=3)
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "bs=1=oom@5")
    by_name, lines = run(suite, tmp_path / "out")
    small, big = by_name["DiT-T/8 fp32 ckpt=none bs=1"], by_name["DiT-T/8 fp32 ckpt=none bs=2"]
    assert small["status"] == "ok" and small["metrics"]["measured_steps"] == 2
    assert small["smoke"]["status"] == "oom" and "out of memory" in small["smoke"]["reason"]
    assert small["smoke"]["loss"] == [] and small["smoke"]["steps"] == 3
    assert big["status"] == "ok" and big["smoke"]["status"] == "ok"  # the series was not OOM-skipped
    assert len(big["smoke"]["loss"]) == 3
    assert "smoke oom" in lines[0]


def test_bad_fault_injection_and_timeouts_are_refused_before_any_cell(tmp_path, monkeypatch):
    suite, path = make_suite(tmp_path, "{batch_size: [1]}")
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "bs=1=boom")
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    monkeypatch.delenv("DITBENCH_INJECT_FAULT")
    for bad in ("nan", "inf", "-1"):
        assert main(["run", str(path), "--out", str(tmp_path / "o"), "--timeout-s", bad]) == 2
    assert not (tmp_path / "o" / "results.jsonl").exists()


@pytest.mark.slow
def test_resume_skips_ok_cells_and_force_reruns_them(tmp_path, monkeypatch):
    suite, _ = make_suite(tmp_path, "{batch_size: [1, 2]}")
    out = tmp_path / "out"
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "bs=2=raise")
    by_name, _ = run(suite, out)
    assert [r["status"] for r in by_name.values()] == ["ok", "error"]
    first = read_records(out / "results.jsonl")
    assert len(first) == 2

    monkeypatch.delenv("DITBENCH_INJECT_FAULT")
    by_name, lines = run(suite, out)  # resume: only the failed cell runs again
    assert lines[0].startswith("resuming") and len(lines) == 2
    records = read_records(out / "results.jsonl")
    assert len(records) == 3 and records[:2] == first
    assert records[2]["cell_name"] == "DiT-T/8 fp32 ckpt=none bs=2" and records[2]["status"] == "ok"
    assert [r["status"] for r in by_name.values()] == ["ok", "ok"]
    assert by_name["DiT-T/8 fp32 ckpt=none bs=1"]["run_id"] == first[0]["run_id"]  # the kept record

    by_name, lines = run(suite, out)  # nothing left to do
    assert len(read_records(out / "results.jsonl")) == 3

    by_name, lines = run(suite, out, force=True)
    records = read_records(out / "results.jsonl")
    assert len(records) == 5 and {r["run_id"] for r in records[3:]} != {records[0]["run_id"]}


def test_dry_run_lists_cells_and_writes_nothing(tmp_path, capsys):
    _, path = make_suite(tmp_path, "{precision: [fp32, fp16], batch_size: [1, 2]}")
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "4 cells" in text and "DiT-T/8 fp16 ckpt=none bs=2" in text
    lines = text.splitlines()
    assert "  unsupported [1]  " in next(x for x in lines if x.endswith("DiT-T/8 fp16 ckpt=none bs=1"))
    assert "  run  " in next(x for x in lines if x.endswith("DiT-T/8 fp32 ckpt=none bs=1"))
    # each reason once, under the table, with the cells it covers
    assert (
        "[1] fp16 needs a CUDA device (CPU autocast has no loss-scaled fp16); use bf16 on CPU (the 2 cells "
        "with precision=fp16)" in text
    )
    assert "nothing would be measured" not in text
    assert main(["run", str(path), "--out", str(out), "--dry-run", "--json"]) == 0
    cells = {c["cell_name"]: c for c in json.loads(capsys.readouterr().out)["cells"]}
    assert cells["DiT-T/8 fp16 ckpt=none bs=2"]["plan"] == "unsupported"
    assert cells["DiT-T/8 fp16 ckpt=none bs=2"]["reason"].startswith("fp16 needs a CUDA device")
    assert (
        cells["DiT-T/8 fp32 ckpt=none bs=2"]["plan"] == "run"
        and cells["DiT-T/8 fp32 ckpt=none bs=2"]["reason"] is None
    )
    assert not out.exists()
    assert main(["run", str(path), "--out", str(out), "--cells", "no-such-cell"]) == 2
    assert "matches none" in capsys.readouterr().err


def test_results_lines_are_complete_json(tmp_path):
    # every record line parses on its own and carries the contract's top-level keys
    suite, _ = make_suite(tmp_path, "{precision: [fp16]}")
    out = tmp_path / "out"
    run(suite, out)  # an unsupported cell: recorded without starting a process
    (line,) = (out / "results.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert set(record) >= {
        "schema",
        "suite",
        "run_id",
        "cell_id",
        "cell_name",
        "suite_baseline",
        "config",
        "status",
        "reason",
        "metrics",
        "smoke",
        "env",
        "started_at",
        "duration_s",
    }
    assert record["status"] == "unsupported" and record["metrics"] is None
    run(suite, out)  # resume: unsupported here for the same reason, so no new line
    assert len(read_records(out / "results.jsonl")) == 1
    run(suite, out, force=True)
    assert len(read_records(out / "results.jsonl")) == 2


@pytest.mark.gpu
def test_cuda_cells_record_allocator_peaks_and_a_real_oom_under_the_cap(tmp_path):
    text = """
    name: gpu_cap
    device: cuda
    gpu_memory_gib: 2
    defaults:
      image_size: 256
      steps: {warmup: 2, measure: 5, min_seconds: 0.5}
      smoke: {steps: 20, cells: [{model: DiT-S/8, precision: fp16}]}
    matrix:
      model: [DiT-S/8, DiT-XL/2]
      precision: [fp16]
      batch_size: [8, 16]
    """
    path = tmp_path / "gpu.yaml"
    path.write_text(textwrap.dedent(text))
    by_name, _ = run(load_suite(path), tmp_path / "out")
    small = by_name["DiT-S/8 fp16 ckpt=none bs=8"]
    assert small["status"] == "ok", small["reason"]
    m = small["metrics"]
    assert m["timing"] == "cuda_events" and m["peak_mem_allocated_gib"] > 0
    assert m["peak_mem_reserved_gib"] >= m["peak_mem_allocated_gib"] and m["fits_budget"] is not None
    assert small["smoke"]["steps"] == 20 and small["smoke"]["scaler_skips"] >= 0
    # DiT-XL/2's weights, gradients and AdamW state alone are ~10 GiB: a real OOM under a 2 GiB cap
    big = by_name["DiT-XL/2 fp16 ckpt=none bs=8"]
    assert big["status"] == "oom" and big["metrics"]["fits_budget"] is False
    assert by_name["DiT-XL/2 fp16 ckpt=none bs=16"]["status"] == "skipped"


def test_precheck_and_run_order():
    from ditbench.bench.runner import Visible, precheck, run_order
    from ditbench.spec.suite import parse_suite

    def cells(device, matrix):
        suite = parse_suite(
            {"name": "p", "device": device, "defaults": {"model": "DiT-T/8"}, "matrix": matrix}
        )
        return {c.cell_name: c for c in suite.cells}

    cpu = Visible(cuda=False, gpu_count=0)
    one_gpu = Visible(cuda=True, gpu_count=1)
    c = cells("cpu", {"precision": ["fp32", "bf16", "fp16", "tf32"]})
    assert precheck(c["DiT-T/8 fp32 ckpt=none bs=32"], cpu) is None
    assert precheck(c["DiT-T/8 bf16 ckpt=none bs=32"], cpu) is None
    assert precheck(c["DiT-T/8 fp16 ckpt=none bs=32"], cpu)[0] == "unsupported"
    assert "tf32" in precheck(c["DiT-T/8 tf32 ckpt=none bs=32"], cpu)[1]
    g = cells("cuda", {"gpus": [1, 4], "batch_size": [64, 8]})
    assert "no CUDA device" in precheck(g["DiT-T/8 fp32 ckpt=none bs=8"], cpu)[1]
    assert precheck(g["DiT-T/8 fp32 ckpt=none bs=8"], one_gpu) is None
    assert "gpus=4 but 1 CUDA device" in precheck(g["DiT-T/8 fp32 ckpt=none bs=8 gpus=4"], one_gpu)[1]
    # within a series (same cell but the batch), smaller batches run first so an OOM can skip the rest
    order = [x.cell_name for x in run_order(list(g.values()))]
    assert order == [
        "DiT-T/8 fp32 ckpt=none bs=8",
        "DiT-T/8 fp32 ckpt=none bs=64",
        "DiT-T/8 fp32 ckpt=none bs=8 gpus=4",
        "DiT-T/8 fp32 ckpt=none bs=64 gpus=4",
    ]


@pytest.mark.slow
def test_a_run_shows_progress_on_a_log_and_each_cell_logs_its_own_output(tmp_path, monkeypatch, capfd):
    # stderr under capfd is a file, not a terminal: the plain lines a CI log gets
    _, path = make_suite(
        tmp_path, "{batch_size: [1, 2]}", smoke=4, extra="include: [{precision: fp16, batch_size: 1}]\n"
    )
    monkeypatch.setenv("DITBENCH_PROGRESS_EVERY_S", "0.2")
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "bs=2=raise@2")
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--verbose"]) == 0
    captured = capfd.readouterr()
    err = captured.err.splitlines()
    assert err[0].startswith("ditbench run: suite t (2 cells): estimated ")  # the estimate first
    assert err[1].startswith("DiT-T/8 fp16 ckpt=none bs=1: UNSUPPORTED  fp16 needs")  # in full
    starts = [line for line in err if line.startswith("cell ") and "running for" not in line]
    assert starts[0] == "cell 1/2: DiT-T/8 fp32 ckpt=none bs=1; suite ETA after the first cell"
    assert re.fullmatch(
        r"cell 2/2: DiT-T/8 fp32 ckpt=none bs=2; suite ETA \d+ s \(mean \d+ s over 1 cell run\)", starts[1]
    )
    assert any(
        re.match(r"cell 1/2 running for \d+ s: DiT-T/8 fp32 ckpt=none bs=1; 0 of 2 done", ln) for ln in err
    )
    assert "| DiT-T/8 fp32 ckpt=none bs=2 | error |" in captured.out  # --verbose: the table too
    records = {r["cell_name"]: r for r in read_records(out / "results.jsonl")}
    ok = (out / "logs" / f"{records['DiT-T/8 fp32 ckpt=none bs=1']['cell_id']}.log").read_text()
    for text in ("building the trainer on cpu", "warm-up: 1 steps", "window: at least 2 steps",
                 "window: 2 steps in", "measured: ", "smoke run: 4 steps", "smoke: 4/4 step (100%)",
                 "smoke run: loss "):  # fmt: skip
        assert text in ok, text
    failed = (out / "logs" / f"{records['DiT-T/8 fp32 ckpt=none bs=2']['cell_id']}.log").read_text()
    assert "the measurement failed: error: RuntimeError: injected fault" in failed
    assert "Traceback (most recent call last)" in failed and failed.count("Traceback") == 1


def test_a_run_in_which_no_cell_can_run_is_refused_unless_allowed_then_exits_3(tmp_path, capsys):
    _, path = make_suite(tmp_path, "{precision: [fp16], batch_size: [1, 2]}")
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    assert "nothing would be measured: none of the 2 cells would run here" in capsys.readouterr().out
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2  # refused before any cell
    err = " ".join(capsys.readouterr().err.split())
    assert "none of the 2 selected cells of suite t can run on this machine (2 cells: fp16 needs" in err
    assert "--allow-unsupported" in err and not (tmp_path / "o").exists()
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--allow-unsupported"]) == 3
    captured = capsys.readouterr()
    assert "2 of 2 cells cannot run here and are recorded without running: [1] fp16 needs" in captured.err
    assert "2 cells in " in captured.out and ": 2 unsupported" in captured.out
    assert "nothing was measured: all 2 selected cells are unsupported" in captured.err
    assert "--allow-empty" in captured.err
    args = ["--allow-unsupported", "--allow-empty", "--json"]
    assert main(["run", str(path), "--out", str(tmp_path / "o"), *args]) == 0
    captured = capsys.readouterr()
    assert [r["status"] for r in json.loads(captured.out)] == [
        "unsupported",
        "unsupported",
    ]  # stdout: JSON only
    assert "nothing was measured" in captured.err


@pytest.mark.slow
def test_a_dry_run_of_a_planned_suite_shows_each_cells_predicted_peak(tmp_path, capsys):
    _, path = make_suite(tmp_path, "{batch_size: [1, 2]}", extra="plan: {skip_predicted_oom: true}\n")
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--dry-run", "--json"]) == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    peaks = [c["predicted_peak_gib"] for c in cells]
    assert all(0 < p < 1 for p in peaks) and [c["plan"] for c in cells] == ["run", "run"]
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "predicted peak" in text.splitlines()[1]
    assert f"{memory_text(peaks[0])}  DiT-T/8 fp32 ckpt=none bs=1" in text and "MiB" in memory_text(peaks[0])
