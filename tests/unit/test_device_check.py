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


def test_each_part_gets_its_cap_and_variants_what_the_others_leave():
    now = FakeTime()
    clock = device_check.Clock(device_check.DEADLINE_S[False], now)
    parts = {p.name: p for p in device_check.PARTS}
    names = list(device_check.PART_NAMES)
    after = {n: tuple(device_check.PARTS[names.index(n) + 1 :]) for n in names}
    assert clock.cap(parts["gpu_tests"], after["gpu_tests"], dry=False) == (90, None)
    # variants has no cap of its own: what is left, less the planner's cap, its publish and the margin
    now.t += 410
    cap, why = clock.cap(parts["variants"], after["variants"], dry=False)
    assert why is None and cap == pytest.approx(160 - 2 - device_check.PUBLISH_S - device_check.MARGIN_S)
    now.t += 140  # 20 s left: too little for a variants cell
    cap, why = clock.cap(parts["variants"], after["variants"], dry=False)
    assert cap is None and "2 s kept for later parts" in why and "at least 25 s" in why
    assert clock.cap(parts["planner"], (), dry=False) == (2, None)
    now.t += 15  # 5 s left: a part that could not finish does not start
    assert clock.cap(parts["compiled"], (), dry=False)[0] is None


def test_the_real_plan_fits_its_deadline_with_every_cap_above_the_expected_time():
    total, over = device_check.budget(device_check.PARTS, device_check.DEADLINE_S[False], dry=False)
    fixed = [p for p in device_check.PARTS if p.cap_s[False] is not None]
    assert over is None and total == sum(p.cap_s[False] for p in fixed) + 11 * 0.5 + 3.0 == 560.5 <= 570
    for p in fixed[:-1]:  # what a part may run before its stop: 10% above the slow end of the H200's time
        assert p.cap_s[False] - device_check.GRACE_S >= round(1.1 * p.expected_s[1], 6), p.name
    assert (
        fixed[-1].name == "planner" and fixed[-1].cap_s[False] >= 1.1 * fixed[-1].expected_s[1]
    )  # in process
    # variants runs after sampling, before the in-process planner
    assert device_check.PART_NAMES[-3:] == ("sampling", "variants", "planner")
    total, over = device_check.budget(device_check.PARTS, 480, dry=False)
    assert "add up to 560.5 s, over the 480 s deadline" in over and "compiled 134" in over


def _check(tmp_path, **kw) -> device_check.Check:
    class NoProcess:
        def run(self, *a, **k):
            raise AssertionError("the preflight started a process it should have refused first")

    kw.setdefault("runner", NoProcess())
    kw.setdefault("clock", device_check.Clock(100))
    return device_check.Check(
        dry=True, work=tmp_path, out_dir=tmp_path / "out", out_env=None, without=set(), **kw
    )


def test_preflight_refuses_stale_predictions_and_an_oversized_plan_before_any_process(tmp_path):
    stale = tmp_path / "predictions.json"
    stale.write_text(json.dumps({**dp.load(), "fingerprint": "0123456789abcdef"}))
    check = _check(tmp_path, predictions=stale)
    result = device_steps.step_preflight(check, 40)
    assert result["status"] == "failed" and check.stop_reason
    assert "made for planner code 0123456789abcdef" in result["reason"]
    assert f"regenerate it with `{dp.REGENERATE}`" in result["reason"]
    assert dp.REGENERATE == "python benchmarks/device_predictions.py"
    assert result["figures"]["gates"]["budget"]["problem"] is None
    empty = _check(tmp_path, predictions=tmp_path / "none.json")
    assert "missing or holds no predictions" in device_steps.step_preflight(empty, 40)["reason"]
    big = _check(tmp_path, plan_deadline_s=400)  # the real file, a plan over its deadline
    result = device_steps.step_preflight(big, 40)
    assert result["status"] == "failed" and "over the 400 s deadline" in result["reason"]
    assert result["figures"]["gates"]["predictions"]["problem"] is None  # the committed file is current


def test_the_check_refuses_stale_predictions_in_preflight_and_says_how_to_remake_them(
    tmp_path, capsys, monkeypatch
):
    """The whole driver, in process: a tampered fingerprint stops it at preflight (no part runs), and the
    printed reason holds the command that regenerates the file."""
    monkeypatch.delenv("OUT", raising=False)  # a device call's $OUT is not this test's to write
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({**dp.load(), "fingerprint": "feedfacefeedface"}))
    args = ["--dry-run", "--work-dir", str(tmp_path / "w"), "--predictions", str(stale)]
    assert device_check.main([*args, "--parts", "matched,planner"]) == 1
    out = capsys.readouterr().out
    assert "budget of the real run: caps 131.5 s of its 570 s deadline" in out  # 13 + 112 + 2, 3 x 0.5, 3
    assert "=== preflight: failed" in out and dp.REGENERATE in out
    summary = json.loads((tmp_path / "w" / "report" / "summary.json").read_text())
    assert [(p["name"], p["status"]) for p in summary["parts"]] == [
        ("preflight", "failed"),
        ("matched", "not_run"),
        ("planner", "not_run"),
    ]
    # the real run: refused the same way, before its preflight process (no CUDA is asked for), exit 2
    real = ["--work-dir", str(tmp_path / "r"), "--out-dir", str(tmp_path / "r" / "out")]
    assert device_check.main([*real, "--predictions", str(stale), "--parts", "planner"]) == 2
    assert dp.REGENERATE in capsys.readouterr().out


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
    # The time model's steps/s beside the memory verdict: error and whether it is inside the band.
    timed = _record(dc.MATCHED[0].cell, peak_mem_allocated_gib=32.0, steps_per_s=2.0)
    fast = dc.planner_verdict(
        {"peak_allocated_gib": 32.0, "predicted_steps_per_s": 2.5, "predicted_speed_band_pct": 18.3}, timed
    )
    assert fast["verdict"] == dc.MET and fast["speed_error_pct"] == 25.0
    assert fast["speed_within_band"] is False
    assert fast["measured_steps_per_s"] == 2.0 and fast["predicted_steps_per_s"] == 2.5
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
    from ditbench.spec.suite import parse_suite

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
    from ditbench.core.faults import fault_for

    hit = [c.cell_name for c in dry.cells if fault_for(c.cell_name, dc.DRY_OOM_FAULT)]
    assert hit == ["DiT-T/8 fp32 ckpt=none bs=2"]  # the dry run's one expected out-of-memory
    modes = ["default", "max-autotune", "max-autotune-no-cudagraphs"]
    variants = dc.variant_cells(False, ["efficient", "flash", "math", "cudnn"], modes, "compile_mode")
    assert [v.get("attention") for v in variants[:2]] == ["math", "flash"]  # the advice pair first
    assert variants[2]["optimizer_impl"] == "foreach"
    assert [v.get("attention") for v in variants[3:5]] == ["efficient", "cudnn"]
    assert [(v["model"], v.get("compile_mode")) for v in variants[5:]] == [
        ("DiT-S/2", None),
        ("DiT-S/2", "default"),
    ]
    assert not [v for v in variants if "autotune" in str(v.get("compile_mode"))]  # gpu_speed.yaml has those
    dry = dc.variant_cells(True, ["math", "flash"], modes, "compile_mode")  # one CPU cell, no compile
    assert [c["attention"] for c in dry] == ["math"] and "optimizer_impl" not in dry[0]


def test_committed_predictions_cover_every_measured_cell_and_match_the_code():
    table = dp.load()
    assert dp.staleness(table) is None, dp.staleness(table)  # the message says how to remake them
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


def test_a_real_part_states_the_h200_time_expected_of_it(tmp_path, monkeypatch):
    monkeypatch.setitem(device_steps.STEPS, "ddp", lambda check, cap: {"status": "ok", "cap_seen": cap})
    ddp = next(p for p in device_check.PARTS if p.name == "ddp")
    check = _check(tmp_path, clock=device_check.Clock(570))
    check.dry = False
    result = device_check.run_part(check, ddp, ())
    assert (result["status"], result["cap_seen"], result["expected_s"]) == ("ok", 41, [25, 35])
    check.dry = True  # the dry run's CPU seconds are not compared with an H200's
    assert "expected_s" not in device_check.run_part(check, ddp, ())


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
    part = {"name": "matched", "status": "ok", "seconds": 90.0, "expected_s": [75, 100], "cap_s": 112}
    summary = device_report.build_summary(meta, [part], records, dp.load())
    device_publish.publish(out, env_out, summary, device_report.markdown(summary), records, work)
    for root in (out, env_out):
        assert sorted(p.name for p in root.iterdir()) == sorted(device_publish.OUT_FILES)
        assert device_publish.check_outputs(root) == []
    assert json.loads((env_out / "summary.json").read_text())["targets"]["matched"][0]["verdict"] == dc.MET
    with tarfile.open(env_out / "logs.tgz") as tar:
        log = tar.extractfile("device_check/matched.log").read()
    assert len(log) == device_publish.LOG_TAIL_BYTES and log.endswith(b"END")  # the tail of a long log
    assert "cut short" in (out / "summary.md").read_text()
    assert "| matched | ok | 90.0 | 75-100 | 112 |" in (out / "summary.md").read_text()  # vs the H200's
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


def test_each_gpu_test_file_runs_in_a_pytest_process_of_its_own(tmp_path):
    files = device_steps.gpu_test_files(ROOT)
    assert {"tests/unit/test_plan_allocator.py", "tests/unit/test_plan_accuracy.py"} <= set(files)
    assert "tests/integration/test_runner.py" in files and "tests/unit/test_device_check.py" not in files
    commands = device_steps.gpu_test_commands("py", files, tmp_path)
    assert [name for name, _, _ in commands] == files
    for name, cmd, xml in commands:
        assert cmd[:5] == ["py", "-m", "pytest", "-m", "gpu"] and cmd[-1] == name
        assert [c for c in cmd if c.startswith("tests/")] == [name]  # one file per process
        assert f"--junitxml={xml}" in cmd
    assert len({xml for _, _, xml in commands}) == len(files)


def test_gpu_tests_part_runs_the_files_one_by_one_and_adds_their_counts(tmp_path):
    ran = []

    class OneFileRunner:
        def run(self, cmd, cap, log, **kw):
            ran.append(cmd)
            xml = Path(next(c for c in cmd if c.startswith("--junitxml=")).split("=", 1)[1])
            bad = '<failure message="boom"/>' if cmd[-1].endswith("test_runner.py") else ""
            xml.write_text(
                f'<testsuite tests="2" failures="{int(bool(bad))}" errors="0" skipped="0">'
                f'<testcase classname="c" name="a"/><testcase classname="c" name="b">{bad}</testcase>'
                "</testsuite>"
            )
            return 1 if bad else 0

    check = _check(tmp_path, runner=OneFileRunner())
    check.dry = False  # the real run: every file (the dry run runs the first two)
    result = device_steps.step_gpu_tests(check, 300)
    files = device_steps.gpu_test_files(ROOT)
    assert [cmd[-1] for cmd in ran] == files
    assert result["status"] == "failed" and result["figures"]["tests"] == 2 * len(files)
    assert result["reason"] == f"{2 * len(files) - 1} passed, 1 failed, 0 skipped"
    assert (
        result["figures"]["per_file"]["tests/integration/test_runner.py"] == "1 passed, 1 failed, 0 skipped"
    )


def test_a_cells_gpu_window_is_printed_and_in_the_summary():
    record = {
        "cell_name": "DiT-XL/2 bf16 bs256",
        "status": "ok",
        "metrics": {
            "noisy": True,
            "noise": {"gpu_throttle": ["sw_power_cap"]},
            "gpu_window": {
                "sm_clock_mhz": {"min": 1755, "median": 1980, "max": 1980},
                "power_w": {"min": 400.0, "median": 650.5, "max": 700.0},
                "temperature_c": {"min": 50, "median": 60, "max": 71},
                "clock_event_reasons": {"sw_power_cap": 0.4},
                "samples": 20,
            },
            "energy_j": 1200.0,
            "energy_j_per_image": 2.5,
        },
    }
    cell = device_steps.cell_figures(record)
    assert cell["gpu"] == {
        "sm_clock_mhz_median": 1980,
        "power_w_median": 650.5,
        "temperature_c_max": 71,
        "clock_event_reasons": {"sw_power_cap": 0.4},
        "energy_j": 1200.0,
        "energy_j_per_image": 2.5,
        "throttled": ["sw_power_cap"],
    }
    assert device_report.gpu_line(cell) == (
        "DiT-XL/2 bf16 bs256: SM 1980 MHz, power 650.5 W, max 71 C, energy 2.5 J/image, "
        "clock-event reasons sw_power_cap 40%, NOISY: throttled (sw_power_cap)"
    )
    cpu = device_steps.cell_figures({"cell_name": "cpu", "metrics": {"noisy": False}})
    assert "gpu" not in cpu and device_report.gpu_line(cpu) is None  # nothing measured, nothing said
