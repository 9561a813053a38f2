"""`ditbench plan`'s own logic pinned by value (issue 27, mutation testing of ditbench/cli/plan.py).

The series are predicted by a stand-in for grid.evaluate (each cell a fixed size), so no model is
traced: these tests check what the command builds, asks for, refuses and prints, each expected text
written out here from the rule it states.
"""

from __future__ import annotations

import argparse
import json

import pytest

from ditbench.cli import main
from ditbench.cli import plan as cli
from ditbench.core.errors import UserError
from ditbench.hardware.cards import find_card
from ditbench.plan import grid, predict, speed


def _cell(config, n, b):
    status = "fits" if b.memory_gib is None or n / 8 < b.memory_gib else "oom"
    return predict.Prediction(
        config["model"], config["precision"], config["grad_ckpt"], n, config["device"], b.card, b.memory_gib,
        status, device_gib=n / 8, config={**config, "batch_size": n},
    )  # fmt: skip


@pytest.fixture
def evaluated(monkeypatch):
    return stand_in(monkeypatch)


def stand_in(monkeypatch):
    """Replace grid.evaluate; record its arguments; each cell fits in (batch / 8) GiB."""
    calls = []

    def fake(series, budgets, jobs=1, progress=None, disk_cache=False, options=None):
        calls.append(
            {"series": series, "budgets": budgets, "jobs": jobs, "disk": disk_cache, "speed": options}
        )
        out = []
        for i, s in enumerate(series):
            rows = []
            for b in budgets:
                rows.append([_cell(s.config, n, b) for n in s.batch_sizes])
            out.append(rows)
            if progress:
                progress(i + 1, len(series), s)
        return out

    monkeypatch.setattr(grid, "evaluate", fake)
    return calls


def plan(capsys, *argv):
    """The grid and tree (`--full`), after the answer where a card is given."""
    code = main(["plan", *argv, "--full"])
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())


GRID = ["--models", "DiT-S/2", "--precisions", "bf16", "--grad-ckpt", "none", "--batches", "16,8"]


# ---- the grid's lists ----------------------------------------------------------------------------


def test_a_list_flag_is_comma_separated_and_repeatable():
    assert cli._list(None, ("a", "b"), "x") == ["a", "b"]
    assert cli._list([], ("a",), "x") == ["a"]
    assert cli._list([" p, q", "r,, "], ("a",), "x") == ["p", "q", "r"]
    with pytest.raises(UserError, match=r"^--models is empty; give a comma-separated list$"):
        cli._list([" , "], ("a",), "models")


def test_integer_flags_are_1_to_2_to_the_20_sorted_without_repeats():
    assert cli._ints(None, (16, 8), "batches") == [8, 16]
    assert cli._ints(["32,8", "8,1", "1048576"], (), "batches") == [1, 8, 32, 1 << 20]
    with pytest.raises(UserError, match=r"^--batches takes positive integers, got 'x'$"):
        cli._ints(["8,x"], (), "batches")
    from ditbench.spec.base import from_flags
    from ditbench.spec.plan import PlanRequest

    for bad in (0, (1 << 20) + 1):  # the knob's bounds, checked by the plan request
        with pytest.raises(UserError, match=rf"^--batches takes integers from 1 to 1048576, got {bad}$"):
            from_flags(PlanRequest, {"batches": cli._ints([str(bad)], (), "batches")})


# ---- what the grid command asks the planner ----------------------------------------------------


def test_the_default_grid_is_traced_in_jobs_with_the_disk_cache_and_the_shipped_calibration(
    capsys, evaluated
):
    code, out, err = plan(capsys, *GRID, "--memory-gib", "24", "--no-tree", "--jobs", "3")
    assert code == 0
    (call,) = evaluated
    (series,) = call["series"]
    assert series.batch_sizes == [8, 16]
    assert {k: series.config[k] for k in ("image_size", "impl", "optimizer_impl", "device")} == {
        "image_size": 256, "impl": "ditbench", "optimizer_impl": "auto", "device": "cuda"}  # fmt: skip
    assert [(b.card, b.memory_gib, b.context_gib) for b in call["budgets"]] == [(None, 24.0, 0.5)]
    assert (call["jobs"], call["disk"]) == (3, True)
    assert call["speed"] == predict.SpeedOptions(None, 1, 400_000, None)
    assert out.splitlines()[0] == (
        "ditbench plan: 2 cells in 1 series for a 24 GiB card; CUDA context 0.5 GiB assumed; traced in 0 s"
    )
    assert "ditbench plan: tracing 1 series (traces on disk are reused)" in err
    plan(
        capsys,
        *GRID,
        "--no-cache",
        "--image-size",
        "64",
        "--impl",
        "diffusers",
        "--optimizer-impl",
        "foreach",
    )
    config = evaluated[1]["series"][0].config
    assert (config["image_size"], config["impl"], config["optimizer_impl"]) == (64, "diffusers", "foreach")
    assert evaluated[1]["disk"] is False and evaluated[1]["jobs"] == grid.default_jobs()


def test_the_tree_plans_every_class_with_the_same_context(capsys, evaluated):
    from ditbench.plan.grid import class_cards

    code, out, _ = plan(capsys, *GRID, "--card", "H200", "--context-gib", "0.75")
    assert code == 0
    budgets = evaluated[0]["budgets"]
    assert [b.card for b in budgets] == ["H200"] + [card.name for _, card in class_cards(find_card("H200"))]
    assert {b.context_gib for b in budgets} == {0.75}
    head = next(line for line in out.splitlines() if line.startswith("ditbench plan: "))
    assert head.startswith("ditbench plan: 2 cells in 1 series for H200 (")
    assert "; CUDA context 0.75 GiB assumed;" in head
    assert "\nDecision tree (its own class on the H200 asked for, each other class on its smallest card; " \
        "the fastest setting, by predicted images/s, that reaches batch 32; days to the target at its " \
        "batch):\n" in out  # fmt: skip
    code, out, _ = plan(capsys, *GRID, "--card", "H200", "--target-batch", "16")
    assert "that reaches batch 16;" in out
    code, out, _ = plan(capsys, *GRID, "--card", "RTX 4090")  # its class is judged on it, not on an L4
    cards = [c.name for _, c in class_cards(find_card("RTX 4090"))]
    assert [b.card for b in evaluated[-1]["budgets"]][1:] == cards and "L4" not in cards
    assert "| 24 GB | RTX 4090 (23.99 GiB) |" in out and "| L4 " not in out
    assert "Decision tree (its own class on the RTX 4090 asked for, each other class on its smallest" in out


def test_the_json_plan_states_its_card_its_goal_and_its_calibration(capsys, evaluated):
    code, out, _ = plan(capsys, *GRID, "--card", "H200", "--json", "--no-tree", "--gpus", "8",
                        "--target-images", "1000")  # fmt: skip
    doc = json.loads(out)
    h200 = predict.budget("H200")
    assert (doc["card"], doc["memory_gib"], doc["context_gib"]) == ("H200", h200.memory_gib, 0.5)
    assert (doc["series"], doc["measured_cells"], doc["gpus"]) == (1, 0, 8)
    assert (doc["target_steps"], doc["target_images"]) == (None, 1000)
    assert doc["tree"] is None and doc["target_batch"] == 32 and isinstance(doc["seconds"], float)
    shipped = {k: v for k, v in speed.shipped().to_dict().items() if k != "loo"}
    assert doc["speed_calibration"] == json.loads(json.dumps(shipped))
    assert "loo" not in doc["speed_calibration"]
    assert evaluated[0]["speed"] == predict.SpeedOptions(None, 8, 400_000, 1000)
    _, out, _ = plan(capsys, *GRID, "--json", "--no-tree", "--target-steps", "5000")
    assert (json.loads(out)["target_steps"], json.loads(out)["target_images"]) == (5000, None)
    assert json.loads(out)["card"] is None and json.loads(out)["memory_gib"] is None


def test_a_plan_without_a_card_says_so(capsys, evaluated):
    _, out, _ = plan(capsys, *GRID, "--no-tree")
    assert " for no card (no fit check); CUDA context 0.5 GiB assumed;" in out.splitlines()[0]
    assert out.splitlines()[1:3] == [
        "",
        "| model | precision | ckpt | bs 8 | bs 16 | largest batch that fits |",
    ]


# ---- what it refuses ---------------------------------------------------------------------------


@pytest.mark.parametrize("argv, message", [
    (["--context-gib", "-0.5"], "--context-gib must be a finite number of GiB >= 0, got -0.5"),
    (["--context-gib", "nan"], "--context-gib must be a finite number of GiB >= 0, got nan"),
    (["--jobs", "0"], "--jobs must be between 1 and 64, got 0"),
    (["--jobs", "65"], "--jobs must be between 1 and 64, got 65"),
    (["--target-batch", "0"], "--target-batch must be a positive integer, got 0"),
    (["--gpus", "0"], "--gpus must be an integer from 1 to 4096, got 0"),
    (["--gpus", "4097"], "--gpus must be an integer from 1 to 4096, got 4097"),
    (["--target-steps", "0"], "--target-steps must be an integer from 1 to 10^12, got 0"),
    (["--target-images", str(10**12 + 1)],
     f"--target-images must be an integer from 1 to 10^12, got {10**12 + 1}"),
    (["--precisions", "fp8"], "--precisions: unknown precision 'fp8'; valid: fp32, tf32, fp16, bf16"),
    (["--image-size", "4"], "--image-size must be a positive multiple of 8, got 4"),
    (["--image-size", "12"], "--image-size must be a positive multiple of 8, got 12"),
    (["--target-batch", "8", "--no-tree", "--card", "T4"],
     "--target-batch sets the batch the decision tree aims for, and --no-tree skips it"),
])  # fmt: skip
def test_bad_flags_are_refused_before_any_trace(capsys, evaluated, argv, message):
    code, out, err = plan(capsys, *GRID, *argv)
    assert code == 2 and out == "" and message in err and evaluated == []


def test_the_largest_flags_are_accepted(capsys, evaluated):
    code, _, _ = plan(capsys, *GRID, "--jobs", "64", "--gpus", "4096", "--target-steps", str(10**12),
                      "--no-tree", "--json", "--image-size", "16", "--context-gib", "0")  # fmt: skip
    assert code == 0 and evaluated[0]["jobs"] == 64 and evaluated[0]["speed"].gpus == 4096
    assert evaluated[0]["speed"].target_steps == 10**12 and evaluated[0]["budgets"][0].context_gib == 0


def test_an_override_without_a_suite_is_refused(capsys, evaluated):
    code, _, err = plan(capsys, "optimizer_impl=foreach", "batch_size=4")
    assert code == 2 and evaluated == []
    assert err.endswith(
        "'optimizer_impl=foreach': KEY=VALUE overrides change a suite; without SUITE the plan is the default "
        "grid, shaped by --models, --precisions, --grad-ckpt, --batches, --image-size, --impl and "
        "--optimizer-impl"
    )


def test_a_grid_larger_than_max_cells_is_refused(capsys, evaluated):
    code, _, err = plan(capsys, *GRID, "--batches", "32", "--max-cells", "2")
    assert code == 2 and "the plan grid" in err and "3" in err and evaluated == []
    assert plan(capsys, *GRID, "--batches", "32", "--max-cells", "3", "--no-tree")[0] == 0


def _ns(**kw):
    base = {"card": None, "memory_gib": None, "target_batch": None, "no_tree": False, "context_gib": None}
    return argparse.Namespace(**{**base, **kw})


def test_the_budget_follows_the_card_the_memory_or_the_suites_card():
    gpu, cpu = [grid.Series({"device": "cuda"}, [8])], [grid.Series({"device": "cpu"}, [8])]
    suite = argparse.Namespace(card=None, gpu_memory_gib=None)
    assert cli._budgets(_ns(), suite, cpu, 0.5) == predict.budget(None, 0.5, device="cpu")
    assert cli._budgets(_ns(card="T4"), None, cpu, 0.25) == predict.budget("T4", 0.25)
    assert cli._budgets(_ns(memory_gib=20.0), None, cpu, 0.25) == predict.budget(20.0, 0.25)
    assert cli._budgets(_ns(card="T4", memory_gib=20.0), None, gpu, 0.5).card == "T4"
    assert cli._budgets(
        _ns(), argparse.Namespace(card="L4", gpu_memory_gib=None), gpu, 0.5
    ) == predict.budget("L4")
    assert cli._budgets(
        _ns(), argparse.Namespace(card=None, gpu_memory_gib=12.0), gpu, 0.5
    ) == predict.budget(12.0)
    assert cli._budgets(_ns(), suite, gpu, 0.5) == predict.budget(None, 0.5)
    assert cli._budgets(_ns(), None, gpu, 0.75) == predict.budget(None, 0.75)
    mixed = gpu + cpu
    assert cli._budgets(_ns(), None, mixed, 0.5).target.device == "cuda"


def test_flags_a_cpu_plan_would_ignore_are_refused():
    cli._refuse_unused(_ns(target_batch=8), True)
    cli._refuse_unused(_ns(context_gib=0.5), True)
    cli._refuse_unused(_ns(no_tree=True), False)
    with pytest.raises(UserError, match=r"and a CPU plan has none \(give --card to plan for a GPU\)$"):
        cli._refuse_unused(_ns(target_batch=8), False)
    with pytest.raises(UserError, match=r"^--target-batch .* and --no-tree skips it$"):
        cli._refuse_unused(_ns(target_batch=8, no_tree=True), True)
    with pytest.raises(UserError) as err:
        cli._refuse_unused(_ns(context_gib=0.5), False)
    assert str(err.value) == (
        "--context-gib is the CUDA context a GPU holds outside the allocator; this plan's cells run on "
        "the CPU, which has none (give --card or --memory-gib to plan them for a GPU)"
    )


def test_results_files_that_cannot_be_read(tmp_path, monkeypatch):
    hint = "give a results.jsonl written by `ditbench run`"
    missing = tmp_path / "none.jsonl"
    with pytest.raises(UserError) as err:
        cli._read_results(missing, "--calibrate")
    assert str(err.value) == f"--calibrate {missing}: no such file ({hint})"
    with pytest.raises(UserError) as err:
        cli._read_results(tmp_path)
    assert str(err.value) == f"--results {tmp_path}: not a regular file ({hint})"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UserError) as err:
        cli._read_results(empty)
    assert str(err.value) == f"--results {empty}: no result records in it ({hint})"
    from ditbench.records import jsonl

    def refuse(path):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(jsonl, "read_records", refuse)
    with pytest.raises(UserError) as err:
        cli._read_results(empty)
    assert str(err.value) == f"--results {empty}: cannot read it (Permission denied)"
    monkeypatch.setattr(jsonl, "read_records", lambda path: [{"a": 1}])
    assert cli._read_results(empty) == [{"a": 1}]


def test_the_text_plan_prints_speeds_reasons_notes_and_what_the_recommended_cell_holds(capsys, monkeypatch):
    def fake(series, budgets, jobs=1, progress=None, disk_cache=False, options=None):
        out = []
        for s in series:
            rows = []
            for b in budgets:
                cell = _cell(s.config, 8, b)
                cell.predicted_steps_per_s, cell.predicted_images_per_s = 2.0, 16.0
                cell.time_to_target, cell.step_split_pct = {"days": 1.0, "gpu_hours": 24.0}, {"matmul": 100.0}
                cell.notes, cell.components = ["b note", "a note"], {"weights": 1.0}
                odd = predict.Prediction(s.config["model"], "fp16", "none", 8, "cuda", b.card, b.memory_gib,
                                         "unsupported", reason="no fp16 here",
                                         config=dict(s.config))  # fmt: skip
                rows.append([cell, odd])
            out.append(rows)
        return out

    monkeypatch.setattr(grid, "evaluate", fake)
    cal = speed.shipped()
    band = f"+-{cal.band_pct:g}%, the calibration's worst leave-one-out error"
    code, out, _ = plan(capsys, *GRID, "--card", "H200", "--gpus", "2", "--target-images", "1000")
    assert code == 0
    assert (
        f"\n\nPredicted speed per GPU x 2 GPUs (DDP) ({band}; calibrated on {cal.source}); days and "
        "GPU-hours to 1,000 images:\n\n| model | precision |" in out
    )
    assert "\n\nn/a: no fp16 here (DiT-S/2 fp16 ckpt=none)\n\nnote: a note\n\nnote: b note\n" in out
    assert "\n\nWhat the recommended cells hold at their peak:\n- 12 GB, DiT-S/2: weights 1.00 GiB\n" in out
    assert (
        "\n| 12 GB | RTX 3060 12GB (11.76 GiB) | DiT-S/2 | bf16, ckpt none | 8 (largest that fits) |" in out
    )
    _, out, _ = plan(capsys, *GRID, "--card", "H200")
    assert (
        f"\n\nPredicted speed ({band}; calibrated on {cal.source}); days and GPU-hours to 400,000 steps:"
        in out
    )


def test_a_plan_with_no_cache_does_not_say_it_reuses_traces(capsys, evaluated):
    _, _, err = plan(capsys, *GRID, "--no-tree", "--no-cache")
    assert "ditbench plan: tracing 1 series" in err and "(traces on disk are reused)" not in err


# ---- the default grid's sizes and a suite's cells --------------------------------------------------


def test_each_grid_flag_is_named_in_its_error_and_the_default_grid_is_counted(capsys, evaluated):
    for i in range(0, len(GRID), 2):
        flag, argv = GRID[i], GRID[:i] + GRID[i + 2 :]
        code, _, err = plan(capsys, *argv, flag, " , ")
        assert code == 2 and f"{flag} is empty; give a comma-separated list" in err
    # 12 paper models x 4 precisions x 3 checkpointing settings x 7 batch sizes = 1,008 cells.
    code, _, err = plan(capsys, "--max-cells", "10")
    assert code == 2 and evaluated == []
    assert err.endswith(
        "the plan grid expands to 1,008 cells (models 12 x precisions 4 x grad-ckpt 3 x batches 7), above "
        "the cap of 10; nothing was expanded or run. Narrow it, or raise the cap with --max-cells 1008 if "
        "you mean to run them all."
    )
    # 8 px passes the multiple-of-8 check; the model then says what it needs.
    code, _, err = plan(capsys, *GRID, "--image-size", "8")
    assert code == 2 and "multiple of 16" in err and "positive multiple of 8" not in err


def _suite(tmp_path, head="device: cpu\n"):
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: s\n{head}defaults: {{image_size: 64}}\n"
        "matrix: {model: [DiT-T/4], precision: [fp32, fp16], batch_size: [4, 8]}\n"
    )
    return str(path)


def test_a_suite_is_planned_with_its_overrides_on_its_device_or_the_cards(capsys, evaluated, tmp_path):
    suite = _suite(tmp_path)
    assert plan(capsys, suite, "batch_size=16", "--json")[0] == 0
    series, budgets = evaluated[0]["series"], evaluated[0]["budgets"]
    assert [(s.config["precision"], s.config["device"], s.batch_sizes) for s in series] == [
        ("fp32", "cpu", [16]), ("fp16", "cpu", [16])]  # fmt: skip
    assert budgets == [predict.budget(None, device="cpu")]
    assert plan(capsys, suite, "--card", "T4", "--no-tree", "--context-gib", "0.25", "--json")[0] == 0
    assert {s.config["device"] for s in evaluated[1]["series"]} == {"cuda"}
    assert evaluated[1]["budgets"] == [predict.budget("T4", 0.25)]
    assert plan(capsys, suite, "--memory-gib", "20", "--no-tree", "--json")[0] == 0
    assert {s.config["device"] for s in evaluated[2]["series"]} == {"cuda"}
    code, _, err = plan(capsys, suite, "--max-cells", "3")
    assert code == 2 and "4 cells" in err and len(evaluated) == 3
    code, _, err = plan(capsys, suite, "--models", "DiT-S/2")
    assert code == 2 and "--models 'DiT-S/2' shapes the default grid and does not apply to a suite" in err


def test_a_suite_that_emulates_a_card_is_planned_on_it(capsys, evaluated, tmp_path):
    suite = _suite(tmp_path, "device: cuda\ncard: L4\n")
    assert plan(capsys, suite, "--no-tree", "--context-gib", "0.25", "--json")[0] == 0
    assert evaluated[0]["budgets"] == [predict.budget("L4", 0.25)]
    assert {s.config["device"] for s in evaluated[0]["series"]} == {"cuda"}


def test_the_progress_line_says_how_many_series_and_whether_traces_are_reused(capsys, monkeypatch):
    import ditbench.core.progress

    monkeypatch.setattr(ditbench.core.progress, "progress", lambda **kw: kw)
    assert cli._progress(3, False) == {"total": 3, "unit": "series", "desc": "traced"}
    assert capsys.readouterr().err == "ditbench plan: tracing 3 series (traces on disk are reused)\n"
    cli._progress(1, True)
    assert capsys.readouterr().err == "ditbench plan: tracing 1 series\n"


def test_speed_options_from_the_smallest_flags_and_a_calibration_file(tmp_path, monkeypatch):
    from ditbench.plan import measured
    from ditbench.records import jsonl
    from ditbench.spec.plan import PlanRequest

    none = {"tflops": None, "mem_bw": None, "memory_gib": None}
    args = argparse.Namespace(calibrate=None, **none)
    request = PlanRequest(gpus=1, target_steps=1, target_images=1)
    assert cli._speed_options(args, request) == predict.SpeedOptions(None, 1, 1, 1)
    records = tmp_path / "cal.jsonl"
    records.write_text("")
    monkeypatch.setattr(jsonl, "read_records", lambda path: [{"path": str(path)}])
    monkeypatch.setattr(measured, "from_records", lambda path, recs: ("fitted", path, recs))
    args = argparse.Namespace(calibrate=records, **none)
    options = cli._speed_options(args, PlanRequest())
    assert options.calibration == ("fitted", records, [{"path": str(records)}])
    assert (options.gpus, options.target_steps, options.target_images) == (1, 400_000, None)
    missing = argparse.Namespace(calibrate=tmp_path / "no", **none)
    with pytest.raises(UserError, match=r"^--calibrate .*no: no such file"):
        cli._speed_options(missing, PlanRequest())
