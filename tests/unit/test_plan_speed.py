"""The planner's time model (ditbench/plan/speed.py): exact arithmetic, the fit, the shipped calibration.

The arithmetic is checked on hand-made kernel rows; the shipped calibration against a refit of the
committed anchor kernel rows (reports/plan_vs_h200/speed_kernels.json), and those rows against a
fresh trace, so neither the calibration nor the report can go stale unnoticed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from synthetic_records import cell_config

from ditbench.hardware.cards import DATASHEETS, Datasheet
from ditbench.plan import speed

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "reports" / "plan_vs_h200"
REGENERATE = "python benchmarks/speed_vs_h200.py --write"
SHEET = Datasheet(fp32=10.0, tf32=100.0, fp16=200.0, memory_gbs=1000.0, link_gbs=100.0, link="NVLink")
PARAMS = {"matmul_eff": 0.5, "attention_eff": 0.25, "memory_eff": 0.5, "host_us": 10.0, "kernel_us": 2.0,
          "block_us": 100.0, "checkpoint_us": 50.0, "fused_share": 0.25}  # fmt: skip


def bench():
    return load_benchmark("speed_vs_h200")


def test_a_matmul_takes_its_flops_at_the_dtype_peak_times_the_efficiency():
    # 1e12 FLOPs per sample at batch 2 in bf16: 2e12 / (0.5 * 200e12) = 20 ms; bytes are negligible.
    kernels = {("matmul", "bf16", False, 0, 10**12, 0, 1000): 1}
    t = speed.step_time(kernels, 2, SHEET, "bf16", PARAMS)
    assert t.split["matmul"] == pytest.approx(0.020)
    assert t.seconds == pytest.approx(0.020)  # the host's 10 us is hidden under the device's work
    # fp32 matmuls run at the fp32 peak, and at the tf32 peak when the cell's precision is tf32.
    fp32 = {("matmul", "fp32", False, 10**12, 0, 0, 0): 1}
    assert speed.step_time(fp32, 1, SHEET, "fp32", PARAMS).seconds == pytest.approx(0.2)
    assert speed.step_time(fp32, 1, SHEET, "tf32", PARAMS).seconds == pytest.approx(0.02)


def test_memory_bound_kernels_take_their_bytes_and_tiny_ones_the_kernel_minimum():
    # 5e8 bytes at 0.5 * 1000 GB/s = 1 ms each; 3 of them.
    big = {("elementwise", "fp32", False, 0, 0, 5 * 10**8, 0): 3}
    assert speed.step_time(big, 8, SHEET, "fp32", PARAMS).split["elementwise"] == pytest.approx(0.003)
    # 100 tiny kernels (8 ns of bytes each) take the 2 us minimum, and the host needs 10 us to issue
    # each: launch bound, all of it launch overhead but the bytes.
    tiny = {("elementwise", "fp32", False, 0, 0, 4000, 0): 100}
    t = speed.step_time(tiny, 8, SHEET, "fp32", PARAMS)
    assert t.split["elementwise"] == pytest.approx(100 * 8e-9)
    assert t.split["launch_overhead"] == pytest.approx(1e-3 - 100 * 8e-9)
    assert t.seconds == pytest.approx(1e-3)
    # Blocks and checkpointed blocks add host time: 100 kernels + 12 blocks + 12 checkpointed.
    t = speed.step_time(tiny, 8, SHEET, "fp32", PARAMS, blocks=12, ckpt_blocks=12)
    assert t.seconds == pytest.approx((100 * 10 + 12 * 100 + 12 * 50) * 1e-6)
    # On a CPU the host's time adds to the work instead of hiding it.
    t = speed.step_time(tiny, 8, SHEET, "fp32", PARAMS, overlap=False)
    assert t.seconds == pytest.approx(100 * 2e-6 + 100 * 10e-6)
    assert t.split["launch_overhead"] == pytest.approx(100 * (2e-6 - 8e-9) + 100 * 10e-6)


def test_compile_keeps_the_fused_share_of_elementwise_kernels():
    rows = {
        ("elementwise", "bf16", False, 0, 0, 5 * 10**8, 0): 8,
        ("matmul", "bf16", False, 10**12, 0, 0, 0): 1,
    }
    eager = speed.step_time(rows, 1, SHEET, "bf16", PARAMS)
    fused = speed.step_time(rows, 1, SHEET, "bf16", PARAMS, compiled=True)
    assert eager.split["elementwise"] == pytest.approx(0.008)
    assert fused.split["elementwise"] == pytest.approx(0.002)
    assert fused.split["matmul"] == eager.split["matmul"] == pytest.approx(0.01)


def test_ddp_all_reduce_is_hidden_by_the_backward_except_the_last_bucket():
    grad = 4 * 10**9  # 1e9 fp32 gradients; ring over 8 GPUs: 2 * 7/8 * 4e9 B / 100 GB/s = 70 ms
    ring = 2 * 7 / 8 * grad / 100e9
    last = ring * speed.DDP_BUCKET_BYTES / grad
    short = {("matmul", "bf16", True, 10**12, 0, 0, 0): 1}  # 10 ms of backward
    t = speed.step_time(short, 1, SHEET, "bf16", PARAMS, gpus=8, grad_bytes=grad)
    assert t.split["communication"] == pytest.approx(ring - 0.01)
    long = {("matmul", "bf16", True, 10**14, 0, 0, 0): 1}  # 1 s of backward hides all but the last bucket
    t = speed.step_time(long, 1, SHEET, "bf16", PARAMS, gpus=8, grad_bytes=grad)
    assert t.split["communication"] == pytest.approx(last)
    one = speed.step_time(long, 1, SHEET, "bf16", PARAMS, gpus=1, grad_bytes=grad)
    assert one.split["communication"] == 0
    assert sum(t.split.values()) == pytest.approx(t.seconds)


def test_time_to_target_in_days_and_gpu_hours():
    # 400,000 steps at 2 steps/s: 200,000 s = 2.3148 days; on 8 GPUs 444.4 GPU-hours.
    t = speed.time_to_target(2.0, 32, 8, 400_000, None)
    assert t["steps"] == 400_000
    assert t["days"] == pytest.approx(200_000 / 86400)
    assert t["gpu_hours"] == pytest.approx(200_000 * 8 / 3600)
    # 1,000,000 images at a global batch of 256: 3,907 steps (the last one partial).
    assert speed.time_to_target(2.0, 32, 8, 400_000, 1_000_000)["steps"] == 3907


def test_a_small_calibration_fits_one_common_factor():
    kernels = {("matmul", "bf16", False, 10**12, 0, 0, 0): 1}
    predicted = speed.predict(speed.Cell("a", kernels, 1, SHEET, "bf16", False, 1.0), PARAMS)
    cells = [speed.Cell("a", kernels, 1, SHEET, "bf16", False, predicted * 2)]
    cal = speed.calibrate(cells, "one cell", start=PARAMS)
    assert cal.band_pct is None and cal.loo == []
    assert cal.params["matmul_eff"] == pytest.approx(1.0)
    assert cal.params["host_us"] == pytest.approx(5.0)
    assert speed.predict(cells[0], cal.params) == pytest.approx(predicted * 2)


def test_every_card_has_a_datasheet_and_tensor_cores_are_not_slower():
    from ditbench.hardware.cards import CARDS

    assert {c.name for c in CARDS} == set(DATASHEETS)
    for name, sheet in DATASHEETS.items():
        assert sheet.fp32 <= sheet.tf32 <= sheet.fp16, name
        assert sheet.memory_gbs > 0 and sheet.link_gbs > 0, name


@pytest.mark.slow
def test_the_h200_report_is_a_fresh_fit_of_the_committed_kernel_rows():
    b = bench()
    cells = b.load_cells()
    rows = json.loads((REPORT / "speed_rows.json").read_text())
    refit = speed.fit(cells)
    for k, v in rows["calibration"]["params"].items():
        assert refit[k] == pytest.approx(v, rel=1e-3), f"{k}: the report is stale; {REGENERATE}"
    by_name = {r["cell"]: r for r in rows["calibration"]["loo"]}
    # Three pinned cells, each refitted without itself: launch bound, checkpointed, tf32.
    for name in ("DiT-B/8 fp32 ckpt=none b32", "DiT-XL/2 bf16 ckpt=full b128", "DiT-XL/2 tf32 ckpt=none b32"):
        i = next(i for i, c in enumerate(cells) if c.name == name)
        others = speed.fit(cells[:i] + cells[i + 1 :])
        loo = by_name[name]["predicted_steps_per_s"]
        assert speed.predict(cells[i], others) == pytest.approx(loo, rel=1e-3)
    errors = sorted(abs(r["error_pct"]) for r in rows["calibration"]["loo"])
    assert rows["summary"]["worst_abs_error_pct"] == pytest.approx(errors[-1])
    assert rows["summary"]["median_abs_error_pct"] == pytest.approx((errors[10] + errors[11]) / 2)
    # The targets, as committed: median <= 10%, worst <= 25%.
    assert rows["summary"]["median_abs_error_pct"] <= 10 and rows["summary"]["worst_abs_error_pct"] <= 25


@pytest.mark.slow
def test_the_shipped_calibration_is_a_fresh_fit_of_the_h200_anchors_and_the_published_figures():
    published = load_benchmark("speed_vs_published")
    cells = published.calibration_cells()
    shipped = speed.shipped()
    refit = speed.fit(cells)
    for k, v in shipped.params.items():
        assert refit[k] == pytest.approx(v, rel=1e-3), (
            f"{k}: stale; python benchmarks/speed_vs_published.py --write"
        )
    assert shipped.cells == len(cells) and {r["card"] for r in shipped.loo} == {"H200", "A100-80GB"}
    assert shipped.band_pct == round(max(abs(r["error_pct"]) for r in shipped.loo), 1)
    # An A100 figure is predicted by the fit without the A100 (the H200's cells alone).
    a100 = [c for c in cells if c.sheet is DATASHEETS["A100-80GB"]]
    h200_fit = speed.fit([c for c in cells if c.sheet is DATASHEETS["H200"]])
    by_name = {r["cell"]: r for r in shipped.loo}
    assert speed.predict(a100[0], h200_fit) == pytest.approx(by_name[a100[0].name]["predicted_steps_per_s"])


@pytest.mark.slow
def test_the_committed_kernel_rows_are_todays_trace(monkeypatch, tmp_path):
    from ditbench.plan import predict
    from ditbench.plan.emulation import cuda_target

    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(predict, "_CACHE", type(predict._CACHE)())
    committed = {c.name: c for c in bench().load_cells()}["DiT-B/8 fp32 ckpt=none b32"]
    cell = predict.normalize(
        {"model": "DiT-B/8", "precision": "fp32", "batch_size": 32, "zero_grad": "after_forward",
         "optimizer_impl": "foreach"}
    )  # fmt: skip
    target = cuda_target(None)
    fresh = predict.series_trace(predict.trace_knobs(cell, target), target).trace.kernels
    assert fresh == committed.kernels, f"reports/plan_vs_h200/speed_kernels.json is stale; {REGENERATE}"
    # And predict_cell reports the calibrated speed of that trace on an H200.
    p = predict.predict_cell(cell, "H200")
    expected = speed.predict(committed, speed.shipped().params)
    assert p.predicted_steps_per_s == pytest.approx(expected)
    assert p.predicted_images_per_s == pytest.approx(expected * 32)
    assert p.predicted_speed_band_pct == speed.shipped().band_pct
    assert sum(p.step_split_pct.values()) == pytest.approx(100, abs=0.5)
    assert math.isclose(p.time_to_target["days"], 400_000 / expected / 86400)


# ---- the CLI ----------------------------------------------------------------------------------

ONE = ["--models", "DiT-T/2", "--image-size", "64", "--precisions", "bf16", "--grad-ckpt", "none"]
ONE += ["--batches", "8", "--jobs", "1", "--no-tree"]


@pytest.fixture
def plan(capsys, tmp_path_factory, monkeypatch):
    from ditbench.cli import main

    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))

    def run(*argv):  # the grid: --full
        code = main(["plan", *argv, "--full"])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _record(config: dict, steps_per_s: float, gpu: str = "NVIDIA H200", status: str = "ok") -> dict:
    return {
        "schema": "ditbench.result/1",
        "cell_id": "x",
        "cell_name": "x",
        "config": cell_config(**{"image_size": 64, **config}),
        "status": status,
        "metrics": {
            "steps_per_s": steps_per_s,
            "images_per_s": 8 * steps_per_s,
            "step_ms": {"median": 1e3 / steps_per_s},
        },
        "env": {"gpu_name": gpu},
    }


def test_plan_json_has_speed_beside_memory_and_a_time_to_target(plan):
    code, out, _ = plan(*ONE, "--card", "H200", "--json")
    assert code == 0
    doc = json.loads(out)
    (cell,) = doc["cells"]
    assert cell["peak_allocated_gib"] > 0 and cell["predicted_steps_per_s"] > 0
    assert cell["predicted_images_per_s"] == pytest.approx(8 * cell["predicted_steps_per_s"])
    assert cell["predicted_speed_band_pct"] == speed.shipped().band_pct
    assert set(cell["step_split_pct"]) == set(speed.SPLIT)
    assert cell["time_to_target"]["steps"] == 400_000 == doc["target_steps"]
    assert cell["time_to_target"]["days"] == pytest.approx(400_000 / cell["predicted_steps_per_s"] / 86400)
    assert doc["speed_calibration"]["params"] == speed.shipped().params
    # A tiny model is launch bound on an H200.
    assert max(cell["step_split_pct"], key=cell["step_split_pct"].get) == "launch_overhead"
    # 8 GPUs: the same steps/s or slower (communication), 8x the images, the days for 1M images.
    code, out, _ = plan(*ONE, "--card", "H200", "--json", "--gpus", "8", "--target-images", "1000000")
    (ddp,) = json.loads(out)["cells"]
    assert ddp["gpus"] == 8 and ddp["predicted_steps_per_s"] <= cell["predicted_steps_per_s"]
    assert ddp["predicted_images_per_s"] == pytest.approx(64 * ddp["predicted_steps_per_s"])
    assert ddp["time_to_target"]["steps"] == math.ceil(1_000_000 / 64)
    # The text output shows the speed table.
    code, out, _ = plan(*ONE, "--card", "H200")
    assert code == 0 and "Predicted speed (+-" in out and "| DiT-T/2 | bf16 | none | 8 |" in out
    # No card, no datasheet: memory only, no speed.
    code, out, _ = plan(*ONE, "--memory-gib", "24", "--json")
    assert json.loads(out)["cells"][0]["predicted_steps_per_s"] is None


def test_calibrate_on_the_users_records(plan, tmp_path):
    _, out, _ = plan(*ONE, "--card", "H200", "--json")
    shipped = json.loads(out)["cells"][0]["predicted_steps_per_s"]
    config = {"model": "DiT-T/2", "precision": "bf16", "grad_ckpt": "none", "batch_size": 8}
    results = tmp_path / "results.jsonl"
    rows = [_record(config, 2 * shipped), _record(config, 5.0, gpu=None), _record(config, 1.0, status="oom")]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = plan(*ONE, "--card", "H200", "--json", "--calibrate", str(results))
    assert code == 0
    doc = json.loads(out)
    # One usable cell: one common factor, which reproduces its measurement; no band from one cell.
    assert doc["cells"][0]["predicted_steps_per_s"] == pytest.approx(2 * shipped, rel=1e-6)
    assert doc["cells"][0]["predicted_speed_band_pct"] is None
    assert doc["speed_calibration"]["cells"] == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpus", "0"], "--gpus must be an integer from 1"),
        (["--target-steps", "-5"], "--target-steps must be"),
        (["--calibrate", "/nonexistent.jsonl"], "--calibrate /nonexistent.jsonl: no such file"),
    ],
)
def test_bad_speed_flags_are_one_paragraph_and_exit_2(plan, argv, message):
    code, out, err = plan(*ONE, *argv)
    assert code == 2 and out == "" and message in " ".join(err.split()) and "Traceback" not in err


def test_records_that_cannot_calibrate_say_why(plan, tmp_path):
    results = tmp_path / "cpu.jsonl"
    config = {"model": "DiT-T/2", "precision": "bf16", "grad_ckpt": "none", "batch_size": 8}
    results.write_text(json.dumps(_record(config, 3.0, gpu=None)) + "\n")
    code, out, err = plan(*ONE, "--card", "H200", "--calibrate", str(results))
    text = " ".join(err.split())
    assert code == 2 and out == "" and "no record can calibrate" in text and "not run on a GPU" in text


def test_every_published_figure_states_its_conditions_and_source():
    import yaml

    from ditbench.hardware.cards import find_card

    doc = yaml.safe_load((ROOT / "benchmarks" / "published_figures.yaml").read_text())
    keys = {"id", "source", "card", "gpus", "model", "attention", "precision", "grad_ckpt", "batch_size",
            "images", "steps_per_s", "use"}  # fmt: skip
    for f in doc["figures"]:
        assert keys <= set(f), f["id"]
        assert find_card(f["card"]).name == f["card"] and f["use"] in ("calibrate", "holdout")
        assert f["source"].strip() and f["steps_per_s"] > 0
    assert {f["use"] for f in doc["figures"]} == {"calibrate", "holdout"}
    assert all(u["source"] and u["why"] for u in doc["unplannable"])
