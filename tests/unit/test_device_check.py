"""The device check (benchmarks/device_check.py): its pieces here, its dry run in test_device_check_run.py."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import device_cells as dc  # noqa: E402
import device_check  # noqa: E402
import device_predictions as dp  # noqa: E402
import device_publish  # noqa: E402
import device_report  # noqa: E402
import device_steps  # noqa: E402


def _anchor_rows() -> list[dict]:
    lines = (ROOT / "benchmarks" / "h200_official_dit_anchor.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_anchor_figures_are_the_anchor_files():
    rows = _anchor_rows()
    for anchor in (*dc.MATCHED, dc.COMPILED):
        found = [
            r
            for r in rows
            if r.get("kind") == "dit_train"
            and (r["model"], r["precision"], r["batch"], r["compile"])
            == (anchor.model, anchor.precision, anchor.batch_size, anchor.compile)
            and r["ckpt"] == (anchor.grad_ckpt != "none")
            and (r.get("fused_adamw_foreach_ema", False) == anchor.compile)  # the 600 img/s run: fused AdamW
        ]
        assert found, anchor.label
        assert (found[0]["img_per_s"], found[0]["peak_alloc_gib"]) == (anchor.img_s, anchor.peak_alloc_gib)
    matmul = {r["dtype"]: r["tflops"] for r in rows if r.get("kind") == "matmul"}
    assert matmul == dc.MATMUL_TFLOPS
    assert any(r.get("kind") == "inception" and r.get("img_per_s") == dc.INCEPTION_IMG_S for r in rows)


class FakeTime:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_each_part_gets_what_is_left_less_what_later_parts_are_promised():
    now = FakeTime()
    clock = device_check.Clock(480, now)
    parts = {p.name: p for p in device_check.PARTS}
    later = tuple(device_check.PARTS[4:])  # the compiled cell's 150 s are kept from the parts before it
    assert clock.cap(parts["gpu_tests"], later, dry=False) == (120, None)
    now.t += 250  # 230 s left, 150 promised: 72 s (less the margins) for a part of cap 150
    cap, why = clock.cap(parts["matched"], later, dry=False)
    assert cap == pytest.approx(230 - 150 - device_check.MARGIN_S - device_check.GRACE_S) and why is None
    now.t += 60  # 170 s left: the matched cells could not finish, so they do not start
    cap, why = clock.cap(parts["matched"], later, dry=False)
    assert cap is None and "150 s kept for later parts" in why
    cap, _ = clock.cap(parts["compiled"], tuple(device_check.PARTS[7:]), dry=False)
    assert cap == pytest.approx(170 - device_check.MARGIN_S - device_check.GRACE_S)  # all that is left
    now.t += 166  # 4 s left: an in-process part still runs, a spawning one does not
    assert clock.cap(parts["planner"], (), dry=False)[0] == pytest.approx(1.0)
    assert clock.cap(parts["sampling"], (), dry=False)[0] is None


def _record(cell: dict, status="ok", **metrics) -> dict:
    return {
        "cell_name": " ".join(str(v) for v in cell.values()),
        "config": dict(cell),
        "status": status,
        "metrics": metrics,
    }


def test_matched_verdicts_need_both_speed_and_memory():
    a = dc.MATCHED[2]  # DiT-XL/2 bf16 bs32: 276.9 img/s at 26.05 GiB
    met = dc.anchor_verdict(a, _record(a.cell, images_per_s=300.0, peak_mem_allocated_gib=26.05), dry=False)
    assert met["verdict"] == dc.MET and met["speed_ratio"] == pytest.approx(300 / 276.9, abs=1e-3)
    slow = dc.anchor_verdict(a, _record(a.cell, images_per_s=270.0, peak_mem_allocated_gib=20.0), dry=False)
    assert slow["verdict"] == dc.NOT_MET and slow["why"] == "slower"
    fat = dc.anchor_verdict(a, _record(a.cell, images_per_s=300.0, peak_mem_allocated_gib=26.1), dry=False)
    assert fat["verdict"] == dc.NOT_MET and fat["why"] == "more memory"
    for record in (None, _record(a.cell, status="oom"), _record(a.cell, images_per_s=300.0)):
        assert dc.anchor_verdict(a, record, dry=False)["verdict"] == dc.NOT_MEASURED  # never met by default
    c = dc.COMPILED
    assert (
        dc.anchor_verdict(c, _record(c.cell, images_per_s=605.0, peak_mem_allocated_gib=99.0), False)[
            "verdict"
        ]
        == dc.MET
    )  # its target is 600 img/s; memory is reported, not judged
    assert (
        dc.anchor_verdict(c, _record(c.cell, images_per_s=599.0, peak_mem_allocated_gib=90.0), False)[
            "verdict"
        ]
        == dc.NOT_MET
    )


def test_planner_and_24gb_verdicts():
    rec = _record(dc.MATCHED[0].cell, peak_mem_allocated_gib=32.0)
    assert dc.planner_verdict({"peak_allocated_gib": 34.0}, rec)["verdict"] == dc.MET  # 6% off
    off = dc.planner_verdict({"peak_allocated_gib": 36.0}, rec)
    assert off["verdict"] == dc.NOT_MET and off["error_pct"] == pytest.approx(12.5)
    small = _record(dc.MATCHED[0].cell, peak_mem_allocated_gib=2.0)
    assert dc.planner_verdict({"peak_allocated_gib": 2.45}, small)["verdict"] == dc.MET  # within 0.5 GiB
    assert dc.planner_verdict(None, rec)["verdict"] == dc.NOT_MEASURED
    oom = _record(dc.EXPECT_24GB[0][0], status="oom")  # judged on the fit: no peak to compare
    assert dc.planner_verdict({"status": "oom", "peak_allocated_gib": 32.6}, oom)["verdict"] == dc.MET
    wrong = dc.planner_verdict({"status": "fits", "peak_allocated_gib": 20.0}, oom)
    assert wrong["verdict"] == dc.NOT_MET and wrong["fit_agrees"] is False
    cell = dc.EXPECT_24GB[dc.SMOKE_CELL][0]
    ran = _record(cell, fits_budget=True)
    ran["smoke"] = {"steps": 50, "status": "ok", "first_mean": 1.0, "last_mean": 0.5}
    assert dc.expectation_verdict("ok", ran, smoke=True)["verdict"] == dc.MET
    ran["smoke"] = {"steps": 50, "status": "oom"}
    assert dc.expectation_verdict("ok", ran, smoke=True)["why"] == "smoke run did not finish"
    assert dc.expectation_verdict("oom", _record(cell), smoke=False)["why"] == "ended ok"


def test_generated_suites_are_valid_and_hold_the_promised_cells():
    from ditbench.bench.suite import parse_suite

    real = parse_suite(dc.matched_suite(False), "matched")
    assert {(c.config["model"], c.config["precision"], c.config["batch_size"]) for c in real.cells} == {
        (a.model, a.precision, a.batch_size) for a in dc.MATCHED
    } and len(real.cells) == len(dc.MATCHED)
    card = parse_suite(dc.suite_24gb(False), "24gb")
    assert card.card == dc.CARD_24GB and len(card.cells) == len(dc.EXPECT_24GB)
    assert sum(c.config["smoke_steps"] > 0 for c in card.cells) == 1
    compiled = parse_suite(dc.compiled_suite(False), "compiled").cells[0].config
    assert (compiled["compile"], compiled["batch_size"], compiled["optimizer_impl"]) == (True, 256, "fused")
    dry = parse_suite(dc.suite_24gb(True), "dry")
    assert {c.config["device"] for c in dry.cells} == {"cpu"} and dry.card is None
    from ditbench.faults import fault_for

    hit = [c.cell_name for c in dry.cells if fault_for(c.cell_name, dc.DRY_OOM_FAULT)]
    assert hit == ["DiT-T/8 fp32 ckpt=none bs=2"]  # the dry run's one expected out-of-memory
    modes = ["default", "max-autotune", "max-autotune-no-cudagraphs"]
    variants = dc.variant_cells(False, ["efficient", "flash", "math"], modes, "compile_mode")
    assert [v.get("attention") for v in variants[:2]] == ["math", "flash"]  # the advice pair first
    assert variants[2]["optimizer_impl"] == "foreach"
    assert [v.get("compile_mode") for v in variants[4:6]] == ["default", "max-autotune-no-cudagraphs"]
    assert variants[-1]["attention"] == "efficient"
    dry = dc.variant_cells(True, ["math", "flash"], modes, "compile_mode")  # one CPU cell, no compile
    assert [c["attention"] for c in dry] == ["math"] and "optimizer_impl" not in dry[0]


def test_committed_predictions_cover_every_measured_cell():
    table = dp.load()
    assert table["predictions"], "run benchmarks/device_predictions.py"
    for dry in (False, True):
        for config in dp.cells(dry):
            pred = dp.lookup(table, config)
            assert pred is not None, config
            expected = "unsupported" if config["precision"] in ("tf32", "fp16") and dry else None
            assert pred["status"] != "error" and (expected is None or pred["status"] == expected), (
                config,
                pred,
            )
    rtx = dp.lookup(
        table,
        {**dc.EXPECT_24GB[0][0], "device": "cuda", "image_size": 256, "compile": False, "card": "RTX 4090"},
    )
    assert rtx["status"] == "oom"  # DiT-XL/2 fp32 bs32 is predicted not to fit, as it must not


def test_missing_package_makes_its_part_unsupported(tmp_path):
    check = device_check.Check(
        dry=True,
        work=tmp_path,
        out_dir=tmp_path / "out",
        out_env=None,
        clock=device_check.Clock(100),
        runner=device_check.Runner(),
        without={"diffusers"},
    )
    sampling = next(p for p in device_check.PARTS if p.name == "sampling")
    result = device_check.run_part(check, sampling, ())
    assert result["status"] == "unsupported" and "diffusers" in result["reason"]
    assert "pip download" in device_steps.carry_advice(check)


def test_published_files_fit_what_the_device_tool_returns(tmp_path):
    work, out, env_out = tmp_path / "work", tmp_path / "reports", tmp_path / "OUT"
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "matched.log").write_bytes(b"x" * (device_publish.LOG_TAIL_BYTES + 10) + b"END")
    (work / "env.json").write_text("{}")
    a = dc.MATCHED[0]
    records = {"matched": [_record(a.cell, images_per_s=60.0, peak_mem_allocated_gib=32.0)]}
    meta = {"dry_run": False, "started_at": "t", "deadline_s": 480, "elapsed_s": 10.0, "finished": False}
    summary = device_report.build_summary(meta, [{"name": "matched", "status": "ok"}], records, dp.load())
    device_publish.publish(out, env_out, summary, device_report.markdown(summary), records, work)
    for root in (out, env_out):
        assert sorted(p.name for p in root.iterdir()) == sorted(device_publish.OUT_FILES)
        assert device_publish.check_outputs(root) == []
    assert json.loads((env_out / "summary.json").read_text())["targets"]["matched"][0]["verdict"] == dc.MET
    with tarfile.open(env_out / "logs.tgz") as tar:
        log = tar.extractfile("device_check/matched.log").read()
    assert len(log) == device_publish.LOG_TAIL_BYTES and log.endswith(b"END")  # the tail of a long log
    assert "cut short" in (out / "summary.md").read_text()
    (env_out / "a" / "b" / "c").mkdir(parents=True)
    (env_out / "a" / "b" / "c" / "deep.txt").write_text("x")
    (env_out / "bad name").write_text("x")
    for i in range(3):
        (env_out / f"extra{i}").write_text("x")
    problems = " ".join(device_publish.check_outputs(env_out))
    assert "folders deep" in problems and "name outside" in problems and "at most 8" in problems


def test_junit_counts_and_gpu_test_files(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_gpu" name="test_a"/>'
        '<testcase classname="tests.test_gpu" name="test_b"><failure message="boom"/></testcase>'
        '<testcase classname="tests.test_gpu" name="test_c"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = device_steps.junit_counts(xml)
    assert (counts["passed"], counts["failures"], counts["skipped"]) == (1, 1, 1)
    assert counts["failed_tests"] == ["tests.test_gpu::test_b: boom"]
    assert device_steps.junit_counts(tmp_path / "missing.xml") is None
    assert "tests/gpu/test_gpu.py" in device_steps.gpu_test_files(ROOT)
