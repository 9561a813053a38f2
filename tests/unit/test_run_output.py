"""What `ditbench run` says (issue 38): a line per cell, each note once with the cells it applies to,
summary.md with every note whole, a refused GPU suite on a CPU, the estimate first, the resume command
on Ctrl-C, and records of cells that never ran, which state no environment."""

from __future__ import annotations

import json
import textwrap

import pytest

from ditbench.bench.cell.window import noise
from ditbench.bench.summary import Notes, closing, format_line, write_summary
from ditbench.cli import main
from ditbench.cli import run as run_cli
from ditbench.records.jsonl import read_records
from ditbench.spec.suite import load_suite

LOAD = (
    "noisy: other processes used more than 25% of the CPUs during the window: rerun on a quiet machine "
    "(a cell with more than one thread also gains from threads=1)"
)
FP16 = "fp16 needs a CUDA device (CPU autocast has no loss-scaled fp16); use bf16 on CPU"


def record(precision: str, batch: int, share: float | None = None) -> dict:
    config = {"model": "DiT-T/8", "precision": precision, "batch_size": batch}
    name = f"DiT-T/8 {precision} ckpt=none bs={batch}"
    if precision == "fp16":
        return {"cell_id": name, "cell_name": name, "config": config, "status": "unsupported", "reason": FP16}
    metrics = {
        "images_per_s": 100.0,
        "step_ms": {"median": 10.0, "p10": 9.9, "p90": 10.1},
        "cpu_peak_alloc_gib": 0.0078125,
        **noise([10.0, 10.0, 10.0], 100.0 * batch, batch, other_cpu_share=share),
    }
    return {"cell_id": name, "cell_name": name, "config": config, "status": "ok", "reason": None,
            "metrics": metrics, "duration_s": 4.0}  # fmt: skip


def test_each_note_is_said_once_with_the_cells_it_applies_to(tmp_path):
    records = [record("fp32", 1, 0.5), record("fp32", 2, 0.9), record("fp16", 1), record("fp16", 2)]
    notes = Notes()
    lines = [format_line(r, notes) for r in records]
    assert lines == [
        "DiT-T/8 fp32 ckpt=none bs=1: ok  100.0 img/s, step 10.0 ms, 8.00 MiB CPU allocator peak, noisy, "
        "4.0 s  [1]",
        "DiT-T/8 fp32 ckpt=none bs=2: ok  100.0 img/s, step 10.0 ms, 8.00 MiB CPU allocator peak, noisy, "
        "4.0 s  [1]",
        "DiT-T/8 fp16 ckpt=none bs=1: UNSUPPORTED  [2]",
        "DiT-T/8 fp16 ckpt=none bs=2: UNSUPPORTED  [2]",
    ]
    # the share of each cell is the verbose line's; the note is the same words for every cell
    assert "other processes used 90% of the CPUs" in format_line(records[1])
    assert closing(records, notes, "in 10 s") == [
        "4 cells in 10 s: 2 ok (2 noisy), 2 unsupported",
        f"[1] {LOAD} (the 2 cells with precision=fp32)",
        f"[2] {FP16} (the 2 cells with precision=fp16)",
    ]
    assert notes.lines([]) == []  # said once
    quiet = record("fp32", 4, 0.1)
    assert format_line(quiet, Notes()).endswith("8.00 MiB CPU allocator peak, 4.0 s")  # no note, no mark


def test_a_note_applies_to_named_cells_or_a_count_when_no_setting_marks_them():
    every = [(f"c{i}", {"batch_size": i, "precision": "fp32" if i % 2 else "bf16"}) for i in range(6)]
    from ditbench.bench.summary import cells_text

    assert cells_text(every, every) == "all 6 cells"
    assert cells_text(every[1::2], every) == "the 3 cells with precision=fp32"
    assert cells_text(every[:2], every) == "c0, c1"
    assert cells_text(every[:4], every) == "4 of 6 cells"


def test_summary_md_keeps_every_note_whole(tmp_path):
    long_reason = "out of memory: " + "x" * 400
    failed = dict(record("fp32", 8), status="oom", reason=long_reason, metrics=None)
    records = [record("fp32", 1, 0.5), failed]
    suite = type("S", (), {"name": "t", "description": "d", "overrides": {}})()
    write_summary(tmp_path / "summary.md", suite, records)
    text = (tmp_path / "summary.md").read_text()
    assert "| DiT-T/8 fp32 ckpt=none bs=8 | oom | - | - | - | - | - | [2] |" in text
    assert long_reason in text and text.count(long_reason) == 1
    assert "noisy: other processes used more than 25% of the CPUs" in text


def gpu_suite(tmp_path, card: str = "card: RTX 4090\n") -> str:
    path = tmp_path / "gpu.yaml"
    path.write_text(
        textwrap.dedent(
            """
            name: gpu
            device: cuda
            defaults: {model: DiT-T/8, image_size: 64, steps: {warmup: 1, measure: 2, min_seconds: 0}}
            matrix: {precision: [bf16, fp16], batch_size: [1, 2]}
            """
        )
        + card
    )
    return str(path)


def test_a_gpu_suite_on_a_cpu_is_refused_before_any_cell_with_what_to_do(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run_cli, "_announce", lambda *a: pytest.fail("estimated a refused run"))
    path, out = gpu_suite(tmp_path), tmp_path / "o"
    assert main(["run", path, "batch_size=[1, 2]", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "none of the 4 selected cells of suite gpu can run on this machine (4 cells: the suite asks " in err
    )
    assert f"`ditbench plan {path} 'batch_size=[1, 2]'` predicts" in err
    # fp16 has no CPU path: 2 of the 4 run on this CPU, and the emulated card must go
    assert f"`ditbench run {path} 'batch_size=[1, 2]' device=cpu card=null` runs 2 of them" in err
    assert "--allow-unsupported" in err and not out.exists()


def test_allowed_unsupported_cells_are_recorded_without_an_environment(tmp_path, capsys):
    path, out = gpu_suite(tmp_path, card=""), tmp_path / "o"
    assert main(["run", path, "--out", str(out), "--allow-unsupported"]) == 3  # nothing was measured
    captured = capsys.readouterr()
    records = read_records(out / "results.jsonl")
    assert [r["status"] for r in records] == ["unsupported"] * 4 and all(r["env"] is None for r in records)
    assert (
        "4 of 4 cells cannot run here and are recorded without running: [1] the suite asks for device "
        in (captured.err)
    )
    assert captured.out.splitlines()[0].startswith("4 cells in ") and "4 unsupported" in captured.out
    assert "the suite asks for device" not in captured.out  # a note is said once, not again at the end


def test_compare_ignores_the_environment_of_cells_that_never_ran(tmp_path, capsys):
    from synthetic_records import CPU_ENV, make_record, write_jsonl

    def run(threads_of_unrun: int) -> list[dict]:
        ok = make_record("DiT-S/8", "fp32", "none", 8, env=dict(CPU_ENV, torch_threads=1), device="cpu")
        unrun = make_record("DiT-S/8", "fp16", "none", 8, env=dict(CPU_ENV, torch_threads=threads_of_unrun),
                            device="cpu", status="unsupported")  # fmt: skip
        return [ok, unrun]

    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(base, run(2))  # an older record: the parent's thread count
    write_jsonl(new, run(1))
    assert main(["compare", str(base), str(new), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env_differences"] == {} and result["env"]["torch_threads"] == "1"


def test_ctrl_c_prints_the_command_that_resumes(tmp_path, capsys, monkeypatch):
    from ditbench.bench import runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_suite", interrupted)
    monkeypatch.setattr(run_cli, "_announce", lambda *a: None)
    path = tmp_path / "t.yaml"
    path.write_text("name: t\ndevice: cpu\ndefaults: {model: DiT-T/8}\nmatrix: {batch_size: [1]}\n")
    out = tmp_path / "my out"
    assert main(["run", str(path), "--force", "--out", str(out), "--label", "a b"]) == 130
    err = capsys.readouterr().err
    assert err == (
        "ditbench: interrupted; the cells recorded so far are kept; this runs only the rest: "
        f"ditbench run {path} --out '{out}' --label 'a b'\n"
    )


def test_the_suite_estimate_is_each_cells_process_builds_and_steps(monkeypatch):
    from ditbench.cli import train as train_cli
    from ditbench.cli.run import suite_seconds
    from ditbench.hardware import environment, walltime

    quiet = json.loads((walltime.CALIBRATIONS / "speed_calibration_cpu.json").read_text())["peak_tflops"]
    measured = [quiet]  # the CPU's rate now: the calibration's quiet CPU, then one twice as slow
    monkeypatch.setattr(walltime, "measure_matmul_tflops", lambda *a, **k: measured[0])
    monkeypatch.setattr(train_cli, "train_step_s", lambda config, device: 0.5)
    walltime.rate.cache_clear()
    suite = load_suite("cpu_smoke", ["model=DiT-T/4", "precision=fp32", "grad_ckpt=none", "batch_size=[4,8]"])
    smoke, plain = suite.cells  # the first has the 500-step smoke run
    build = 0.04 * 18 * 4 * 64**2 / 1e6  # DiT-T: depth 4, width 64
    # warm-up 2, window max(5 x 0.5, 2 s), the allocator peak's 2 profiled steps (as 4)
    assert suite_seconds([plain], "cpu") == pytest.approx(5.5 + 2 * build + 2.5 + (2 + 4) * 0.5)
    assert suite_seconds([smoke], "cpu") == pytest.approx(5.5 + 3 * build + 2.5 + (502 + 4) * 0.5)
    measured[0] = quiet / 2
    walltime.rate.cache_clear()  # a busy CPU: its processes start and build twice as slowly too
    assert suite_seconds([plain], "cpu") == pytest.approx(2 * (5.5 + 2 * build) + 2.5 + 6 * 0.5)
    monkeypatch.setattr(environment, "nvml_gpu", lambda: ("NVIDIA H200", 139.8))  # asked of NVML, not CUDA
    assert suite_seconds([plain], "cuda") == pytest.approx(10.0 + 2.5 + 2 * 0.5)
    monkeypatch.setattr(train_cli, "train_step_s", lambda config, device: None)
    assert suite_seconds([plain], "cpu") is None  # no step estimate: no suite estimate
    walltime.rate.cache_clear()


def test_a_run_estimated_over_30_minutes_on_a_cpu_needs_yes_in_a_terminal(tmp_path, capsys, monkeypatch):
    from ditbench.hardware import walltime

    monkeypatch.setattr(walltime, "is_terminal", lambda stream=None: True)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(run_cli, "suite_seconds", lambda cells, device: 3 * 3600.0)
    path = tmp_path / "t.yaml"
    path.write_text("name: t\ndevice: cpu\ndefaults: {model: DiT-T/8}\nmatrix: {batch_size: [1]}\n")
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("ditbench run: suite t (1 cell): estimated 3 h 00 min at this CPU's ")
    assert "suite t (1 cell) is estimated at 3 h 00 min on this CPU" in err and "Add --yes" in err
    assert f"`ditbench plan {path}`" in err and "--cells SUBSTR" in err
    assert not (tmp_path / "o" / "results.jsonl").exists()  # refused before any cell
