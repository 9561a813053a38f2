"""`ditbench plan`'s flags and whole runs pinned by value (issue 27, mutation testing of
ditbench/cli/plan.py; the rest is in test_mutation_plan_cli.py, whose stand-in for grid.evaluate these
tests share): the help and its stated defaults, the choices, measured records, progress, the text and
JSON of a run, each expected text written out here from the rule it states.
"""

from __future__ import annotations

import argparse
import json

import pytest
from synthetic_records import make_record
from test_mutation_plan_cli import GRID, _cell, _suite, plan, stand_in

from ditbench.cli import main
from ditbench.cli import plan as cli
from ditbench.plan import grid, predict, speed


@pytest.fixture
def evaluated(monkeypatch):
    return stand_in(monkeypatch)


# ---- the flags themselves ----------------------------------------------------------------------


def test_the_help_states_the_defaults_the_command_uses(capsys, monkeypatch):
    from ditbench.plan.grid import (
        DEFAULT_BATCHES,
        DEFAULT_GRAD_CKPT,
        DEFAULT_PRECISIONS,
        DEFAULT_TARGET_BATCH,
        paper_models,
    )
    from ditbench.plan.predict import DEFAULT_CONTEXT_GIB
    from ditbench.plan.speed import DEFAULT_GLOBAL_BATCH, DEFAULT_TARGET_STEPS

    with pytest.raises(SystemExit) as exc:
        main(["plan", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    batches = f"{DEFAULT_BATCHES[0]},{DEFAULT_BATCHES[1]},...,{DEFAULT_BATCHES[-1]}"
    stated = {
        "--models": f"models, comma-separated (default: S/2,B/2,L/2,XL/2; --full: {len(paper_models())})",
        "--precisions": f"precisions (default: the card's fastest; --full: {','.join(DEFAULT_PRECISIONS)})",
        "--grad-ckpt": f"checkpointing (default: {','.join(DEFAULT_GRAD_CKPT)})",
        "--batches": f"per-GPU batch sizes (default: those dividing the global batch; --full: {batches})",
        "--global-batch": f"images per optimizer step, all GPUs ({DEFAULT_GLOBAL_BATCH})",
        "--image-size": "grid image size in pixels (256)",
        "--impl": "grid DiT implementation (ditbench)",
        "--optimizer-impl": "grid AdamW kernel (auto)",
        "--context-gib": f"CUDA context outside the allocator (default: {DEFAULT_CONTEXT_GIB:g}, or measured",
        "--target-batch": f"batch the decision tree aims for ({DEFAULT_TARGET_BATCH})",
        "--target-steps": f"steps to train, for days and GPU-hours ({DEFAULT_TARGET_STEPS})",
        "--gpus": "data-parallel GPUs (default: 1): memory per rank, the collectives over the card's",
        "--shard": "with --gpus: DDP (a replica per GPU, default) or FSDP2",
    }
    for flag, words in stated.items():
        assert f"{flag} " in text and words in text, flag
    assert "--impl {ditbench,diffusers}" in text and "--optimizer-impl {auto,fused,foreach,for-loop}" in text
    assert "[suite] [KEY=VALUE ...]" in text and "--calibrate RESULTS.jsonl" in text
    assert text.startswith("usage: ditbench plan ") and cli.HELP.split(":")[0] in text
    assert "--max-cells N refuse a grid (or --suite matrix) of more than N cells" in text


def test_every_argument_is_documented():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert parser.description == cli.HELP
    # suite, overrides, card, memory_gib, tflops, mem_bw, full, images, global_batch, models, precisions,
    # grad_ckpt, batches, image_size, impl, optimizer_impl, results, context_gib, target_batch, no_tree,
    # gpus, shard, target_steps, target_images, calibrate, jobs, json, max_cells, no_cache
    helps = {a.dest: a.help for a in parser._actions if a.dest != "help"}
    assert len(helps) == 29 and all(isinstance(h, str) and len(h) > 10 for h in helps.values()), helps


@pytest.mark.parametrize("flag, value", [("--impl", "ditbench"), ("--impl", "diffusers"),
    ("--optimizer-impl", "auto"), ("--optimizer-impl", "fused"), ("--optimizer-impl", "foreach"),
    ("--optimizer-impl", "for-loop")])  # fmt: skip
def test_each_choice_is_accepted_and_passed_to_the_grid(capsys, evaluated, flag, value):
    assert plan(capsys, *GRID, flag, value, "--no-tree", "--json")[0] == 0
    assert evaluated[0]["series"][0].config[flag[2:].replace("-", "_")] == value


def test_a_value_outside_the_choices_is_refused_by_the_parser(capsys, evaluated):
    for flag in ("--impl", "--optimizer-impl"):
        with pytest.raises(SystemExit) as exc:
            main(["plan", *GRID, flag, "bogus"])
        assert exc.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
    code, _, err = plan(capsys, *GRID, "--results", "/nonexistent/results.jsonl")
    hint = "give a results.jsonl written by `ditbench run`"
    assert code == 2 and err.endswith(f"--results /nonexistent/results.jsonl: no such file ({hint})")


# ---- a whole run: measured records, progress, the JSON document ----------------------------------


def test_a_run_with_records_counts_the_measured_cells_in_the_plan_and_the_tree(capsys, evaluated, tmp_path):
    record = make_record("DiT-S/2", "bf16", "none", 8, peak_alloc=0.25)  # a record of the first cell
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(record) + "\n")
    code, out, _ = plan(capsys, *GRID, "--card", "H200", "--results", str(results), "--json", "--jobs", "1",
                        "--target-batch", "1")  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["measured_cells"] == 1 and evaluated[0]["jobs"] == 1
    assert [c["measured"] for c in doc["cells"]] == [True, False]
    # Every class is judged on its own card's predictions, measured where a record matches.
    assert [t["setting"]["card"] for t in doc["tree"]] == [b.card for b in evaluated[0]["budgets"][1:]]
    assert all(t["setting"]["batch_size"] == 16 for t in doc["tree"])
    assert out.startswith('{\n "card": "H200",\n')  # indented by 1
    code, out, _ = plan(capsys, *GRID, "--card", "H200", "--results", str(results), "--no-tree")
    assert "cells in 1 series for H200 (139.80 GiB usable); CUDA context 0.5 GiB assumed; traced in 0 s; " \
        "1 cells measured (--results)" in out  # fmt: skip


def evaluated_config():
    return predict.normalize({"model": "DiT-S/2", "precision": "bf16", "grad_ckpt": "none"})


def test_a_run_reports_progress_per_series_and_its_time(capsys, evaluated, monkeypatch):
    import ditbench.core.progress

    updates = []

    class Bar:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            updates.append(n)

    monkeypatch.setattr(ditbench.core.progress, "progress", lambda **kw: Bar())
    clock = iter([100.0, 101.26])
    monkeypatch.setattr(cli.time, "perf_counter", lambda: next(clock))
    code, out, _ = plan(capsys, *GRID, "--precisions", "fp32", "--no-tree", "--json")
    assert code == 0 and updates == [1, 1] and json.loads(out)["seconds"] == 1.3


def test_a_generic_card_name_says_which_card_it_chose(capsys, evaluated, tmp_path):
    from ditbench.hardware.cards import ambiguity

    _, _, err = plan(capsys, *GRID, "--card", "A100", "--no-tree", "--json")
    assert f"ditbench plan: {' '.join(ambiguity('A100').split())}" in err
    _, _, err = plan(capsys, *GRID, "--card", "H200", "--no-tree", "--json")
    assert "chose" not in err


def test_a_run_hides_only_torchs_data_pointer_warning(capsys, evaluated):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert plan(capsys, *GRID, "--no-tree", "--json")[0] == 0
        warnings.warn("Accessing the data pointer of FakeTensor is deprecated", UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]


def test_a_calibration_without_a_band_says_so(capsys, monkeypatch, tmp_path):
    import dataclasses

    from ditbench.plan import measured
    from ditbench.records import jsonl

    mine = dataclasses.replace(speed.shipped(), band_pct=None, source="my.jsonl")
    monkeypatch.setattr(jsonl, "read_records", lambda path: [{}])
    monkeypatch.setattr(measured, "from_records", lambda path, recs: mine)
    cal = tmp_path / "cal.jsonl"
    cal.write_text("")

    def fake(series, budgets, jobs=1, progress=None, disk_cache=False, options=None):
        cell = _cell(series[0].config, 8, budgets[0])
        cell.predicted_steps_per_s, cell.predicted_images_per_s = 2.0, 16.0
        return [[[cell]]]

    monkeypatch.setattr(grid, "evaluate", fake)
    _, out, _ = plan(capsys, *GRID, "--batches", "8", "--no-tree", "--calibrate", str(cal))
    assert (
        "\n\nPredicted speed (no error band: fewer than 3 calibration cells; calibrated on my.jsonl);" in out
    )


def test_a_grid_flag_on_a_suite_names_the_override_to_use_instead(capsys, evaluated, tmp_path):
    suite = _suite(tmp_path)
    code, _, err = plan(capsys, suite, "--batches", "8, 16")
    assert code == 2 and err.endswith(
        "--batches '8,16' shapes the default grid and does not apply to a suite, whose cells bring their own "
        "batch_size (the suite's value would win). Set it in the suite (`batch_size:` under defaults, or a "
        f"matrix axis) or as an override after the suite's name: `ditbench plan {suite} batch_size=[8,16]`."
    )
    code, _, err = plan(capsys, suite, "--optimizer-impl", "foreach")
    assert code == 2 and err.startswith("ditbench: error: --optimizer-impl 'foreach' shapes the default grid")
    assert err.endswith(f"`ditbench plan {suite} optimizer_impl=foreach`.")
    code, _, err = plan(capsys, suite, "--image-size", "128")
    assert err.endswith(f"`ditbench plan {suite} image_size=128`.")
