"""`ditbench plan`: the table, the decision tree, JSON, suites, measured overrides and every bad input."""

from __future__ import annotations

import json
import math

import pytest
from synthetic_records import cell_config

from ditbench.cli import main

GRID = ["--models", "DiT-T/4,DiT-T/2", "--image-size", "64", "--precisions", "bf16,fp16"]
GRID += ["--grad-ckpt", "none,full", "--batches", "8,64", "--jobs", "1", "--full"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_grid_table_and_tree_for_a_card(capsys):
    code, out, _ = run(capsys, *GRID, "--card", "rtx 4090")
    assert code == 0
    assert "RTX 4090 (23.99 GiB usable)" in out
    assert "| DiT-T/2 | bf16 | full |" in out and "| bs 8 | bs 64 |" in out
    assert "largest batch that fits" in out
    assert "| 12 GB | RTX 3060 12GB (11.76 GiB) | DiT-T/2 |" in out  # more Gflops than T/4
    assert "| 16 GB | T4 (14.75 GiB) | DiT-T/2 | fp16" in out  # no bf16 before sm80
    assert "| 24 GB | RTX 4090 (23.99 GiB) | DiT-T/2 |" in out and "| L4 " not in out  # the card asked
    assert "weights 1.5 MiB" in out and "context 0.50 GiB" in out


def test_json_is_machine_readable_and_consistent(capsys):
    code, out, _ = run(capsys, *GRID, "--memory-gib", "24", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["memory_gib"] == 24 and plan["card"] is None and plan["series"] == 8
    cells = plan["cells"]
    assert len(cells) == 16 and all(c["fits"] is True for c in cells)
    for c in cells:
        assert math.isclose(c["device_gib"], c["peak_reserved_gib"] + 0.5)
        assert c["peak_allocated_gib"] <= c["peak_reserved_gib"]
        assert set(c["components"]) >= {"weights", "gradients", "optimizer", "ema", "activations", "context"}
    assert {row["batch_size"] for row in plan["largest_batch"]} == {64}
    assert [t["class_gb"] for t in plan["tree"]] == [12, 16, 24, 32, 40, 48, 80, 94, 141]
    assert plan["tight_margin"] == 0.06 and all(c["tight"] is False for c in cells)


def test_a_card_too_small_marks_cells_that_do_not_fit(capsys):
    code, out, _ = run(capsys, *GRID, "--memory-gib", "0.52", "--json", "--no-tree")
    plan = json.loads(out)
    assert code == 0 and plan["tree"] is None
    assert any(c["fits"] is False for c in plan["cells"])
    assert all(c["reason"] and "GiB" in c["reason"] for c in plan["cells"] if c["fits"] is False)


def _suite(tmp_path, extra: str = "") -> str:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\ndevice: cpu\ndefaults: {image_size: 64}\n"
        "matrix: {model: [DiT-T/4], precision: [fp32, fp16], batch_size: [4, 8]}\n" + extra
    )
    return str(path)


def test_cpu_suite_is_planned_for_the_cpu_allocator(capsys, tmp_path):
    code, out, _ = run(capsys, _suite(tmp_path), "--json")
    plan = json.loads(out)
    assert code == 0 and plan["tree"] is None and plan["card"] is None
    by = {(c["precision"], c["batch_size"]): c for c in plan["cells"]}
    assert by[("fp32", 4)]["device"] == "cpu" and by[("fp32", 4)]["status"] == "predicted"
    assert by[("fp16", 8)]["status"] == "unsupported"
    assert by[("fp32", 8)]["peak_allocated_gib"] > by[("fp32", 4)]["peak_allocated_gib"]


def test_a_card_plans_a_cpu_suite_as_gpu_cells(capsys, tmp_path):
    code, out, _ = run(capsys, _suite(tmp_path), "--card", "T4", "--json", "--no-tree")
    plan = json.loads(out)
    assert code == 0 and {c["device"] for c in plan["cells"]} == {"cuda"}
    assert {c["status"] for c in plan["cells"]} == {"fits"}


def _record(config: dict, status: str = "ok", alloc: float = 7.25, reserved: float = 7.5, **extra) -> dict:
    measured = {"images_per_s": 10.0, "step_ms": {"median": 100.0}}  # what an ok record states
    return {
        "schema": "ditbench.result/1",
        "cell_id": "x",
        "cell_name": "x",
        "config": cell_config(**{"image_size": 64, **config}),
        "status": status,
        "metrics": {**measured, "peak_mem_allocated_gib": alloc, "peak_mem_reserved_gib": reserved, **extra},
        "env": {"gpu_name": "NVIDIA H200", "gpu_memory_gib": 139.8},
    }


def test_measured_cells_override_predictions(capsys, tmp_path):
    results = tmp_path / "results.jsonl"
    rows = [
        _record({"model": "DiT-T/2", "precision": "bf16", "grad_ckpt": "none", "batch_size": 64}),
        _record({"model": "DiT-T/2", "precision": "fp16", "grad_ckpt": "full", "batch_size": 64}, "oom"),
        _record(
            {"model": "DiT-T/4", "precision": "bf16", "grad_ckpt": "none", "batch_size": 999}
        ),  # no such cell
    ]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn": ')
    code, out, _ = run(capsys, *GRID, "--card", "RTX 4090", "--results", str(results), "--json", "--no-tree")
    plan = json.loads(out)
    assert code == 0 and plan["measured_cells"] == 2
    by = {(c["model"], c["precision"], c["grad_ckpt"], c["batch_size"]): c for c in plan["cells"]}
    ok = by[("DiT-T/2", "bf16", "none", 64)]
    assert ok["measured"] and ok["peak_allocated_gib"] == 7.25 and ok["status"] == "fits"
    assert ok["device_gib"] == 8.0 and "H200" in ok["reason"]
    oom = by[("DiT-T/2", "fp16", "full", 64)]
    assert oom["measured"] and oom["status"] == "oom"
    assert not by[("DiT-T/2", "bf16", "none", 8)]["measured"]
    code, out, _ = run(capsys, *GRID, "--card", "RTX 4090", "--results", str(results), "--no-tree")
    assert "7.2*" in out or "8.0*" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--card", "RTX 9999"], "unknown card"),
        (["--memory-gib", "nan"], "finite number of GiB"),
        (["--memory-gib", "-3"], "finite number of GiB"),
        (["--context-gib", "inf"], "--context-gib"),
        (["--batches", "8,x"], "--batches takes positive integers"),
        (["--batches", "0"], "from 1 to"),
        (["--models", "DiT-Q/2"], "unknown model"),
        (["--precisions", "fp8"], "unknown precision"),
        (["--grad-ckpt", "sometimes"], "grad_ckpt"),
        (["--image-size", "100"], "multiple of 8"),
        (["--jobs", "0"], "--jobs"),
        (["--results", "/nonexistent/results.jsonl"], "no such file"),
        (["--results", "/"], "not a regular file"),
    ],
)
def test_bad_input_is_one_paragraph_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert message in " ".join(err.split()) and "Traceback" not in err


def test_results_that_are_not_results(capsys, tmp_path):
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"\xff\xfe not json\n[1, 2]\n")
    code, _, err = run(capsys, "--results", str(junk))
    assert code == 2 and "no result records" in " ".join(err.split())


@pytest.mark.parametrize(
    "flag, override",
    [
        (["--optimizer-impl", "foreach"], "optimizer_impl=foreach"),
        (["--impl", "diffusers"], "impl=diffusers"),
        (["--image-size", "128"], "image_size=128"),
        (["--models", "DiT-T/4"], "model=DiT-T/4"),
        (["--batches", "8,16"], "batch_size=[8,16]"),
    ],
)
def test_a_grid_flag_on_a_suite_is_an_error_naming_where_to_set_it(capsys, tmp_path, flag, override):
    suite = _suite(tmp_path)
    code, out, err = run(capsys, suite, *flag)
    text = " ".join(err.split())
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"{flag[0]} " in text and "does not apply to a suite" in text
    assert f"`ditbench plan {suite} {override}`" in text


def test_a_suite_takes_overrides_as_run_does(capsys, tmp_path):
    code, out, _ = run(capsys, _suite(tmp_path), "optimizer_impl=foreach", "batch_size=4", "--json")
    plan = json.loads(out)
    assert code == 0 and {c["config"]["optimizer_impl"] for c in plan["cells"]} == {"foreach"}
    assert {c["batch_size"] for c in plan["cells"]} == {4}
    code, _, err = run(capsys, "optimizer_impl=foreach")  # no suite: the grid has flags for that
    assert code == 2 and "overrides change a suite" in " ".join(err.split())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target-batch", "64"], "a CPU plan has none"),
        (["--context-gib", "0.3"], "run on the CPU"),
    ],
)
def test_a_flag_a_cpu_suite_would_ignore_is_an_error(capsys, tmp_path, argv, message):
    code, out, err = run(capsys, _suite(tmp_path), *argv)
    assert code == 2 and out == "" and message in " ".join(err.split())


def test_target_batch_without_the_tree_is_an_error(capsys):
    code, _, err = run(capsys, *GRID, "--card", "T4", "--no-tree", "--target-batch", "64")
    assert code == 2 and "--no-tree skips it" in " ".join(err.split())


def test_a_suite_that_does_not_exist(capsys, tmp_path):
    code, _, err = run(capsys, str(tmp_path / "missing.yaml"))
    assert code == 2 and "does not exist" in " ".join(err.split())


def test_card_and_memory_are_exclusive(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--card", "T4", "--memory-gib", "16"])
    assert exc.value.code == 2


def test_traces_are_reused_from_disk_and_a_bad_file_is_retraced(capsys, monkeypatch, tmp_path):
    from ditbench.plan import cache, predict

    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path))
    argv = ["--models", "DiT-T/4", "--image-size", "64", "--precisions", "fp32,tf32", "--grad-ckpt", "none"]
    argv += [
        "--batches",
        "8",
        "--jobs",
        "1",
        "--no-tree",
        "--card",
        "L4",
        "--json",
        "--full",
        "--global-batch",
        "8",
    ]
    monkeypatch.setattr(predict, "_CACHE", type(predict._CACHE)())
    first = json.loads(run(capsys, *argv)[1])
    files = list(cache.cache_dir().glob("*.json"))
    assert len(files) == 1  # fp32 and tf32 share one trace
    files[0].write_text('{"trace": "truncated')
    monkeypatch.setattr(predict, "_CACHE", type(predict._CACHE)())
    again = json.loads(run(capsys, *argv)[1])
    assert [c["peak_allocated_gib"] for c in again["cells"]] == [
        c["peak_allocated_gib"] for c in first["cells"]
    ]
    assert json.loads(files[0].read_text())["probe"] > 4096  # rewritten whole
    monkeypatch.setattr(predict, "_CACHE", type(predict._CACHE)())
    monkeypatch.setattr(predict, "trace_series", lambda *a, **k: pytest.fail("traced although cached"))
    cached = json.loads(run(capsys, *argv)[1])
    assert cached["cells"] == first["cells"]


def test_a_card_without_bf16_does_not_hide_bf16_from_the_other_classes(capsys):
    argv = ["--models", "DiT-T/2", "--image-size", "64", "--precisions", "bf16,fp16", "--grad-ckpt", "none"]
    code, out, _ = run(capsys, *argv, "--batches", "8", "--jobs", "1", "--card", "T4", "--full")
    assert code == 0
    assert "| DiT-T/2 | bf16 | none | n/a |" in out  # on the T4 itself
    assert "| 12 GB | RTX 3060 12GB (11.76 GiB) | DiT-T/2 | bf16, ckpt none |" in out
    assert "| 16 GB | T4 (14.75 GiB) | DiT-T/2 | fp16, ckpt none |" in out


def test_an_ambiguous_card_says_what_it_chose_and_tracing_shows_progress(capsys):
    argv = ["--models", "DiT-T/4", "--image-size", "64", "--precisions", "fp32", "--grad-ckpt", "none"]
    code, out, err = run(capsys, *argv, "--batches", "8", "--card", "A100", "--no-tree", "--json", "--full")
    text = " ".join(err.split())
    assert code == 0 and json.loads(out)["card"] == "A100-80GB"
    assert "chose A100-80GB (79.35 GiB usable)" in text and "A100-40GB (39.39 GiB)" in text
    assert "tracing 1 series" in text and "traced: 1/1 series" in text
    code, _, err = run(
        capsys, *argv, "--batches", "8", "--card", "A100-40GB", "--no-tree", "--json", "--full"
    )
    assert code == 0 and "chose" not in err
