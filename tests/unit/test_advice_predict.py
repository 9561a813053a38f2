"""`report --predict`: the advice checks the run did not measure get the planner's verdict, with a band.

The planner is replaced by known numbers (except in the one slow test), so each verdict, its band and
the precedence of a measured verdict are checked exactly.
"""

from __future__ import annotations

import json

import pytest
from planner_stub import Planner
from synthetic_records import make_record, write_jsonl

from ditbench.report import advice
from ditbench.report.blocks import to_markdown
from ditbench.report.load import load_results
from ditbench.report.predict import (
    class_card,
    predict_advice,
    predict_ckpt_tradeoff,
    predict_fit,
    predict_fp16_halves,
)
from ditbench.report.sections import advice_section

L4_24 = {"model": "DiT-L/4", "precision": "fp16", "grad_ckpt": "full", "batch_size": 32}


def xl2(fp32, fp16=None, full=None):
    """The DiT-XL/2 cells the ratio checks predict: (allocated GiB, steps/s, band) each."""
    table = {("DiT-XL/2", "fp32", "none"): ("fits", fp32[0], fp32[0] + 2, fp32[1], fp32[2])}
    if fp16:
        table[("DiT-XL/2", "fp16", "none")] = ("fits", fp16[0], fp16[0] + 2, fp16[1], fp16[2])
    if full:
        table[("DiT-XL/2", "fp32", "full")] = ("fits", full[0], full[0] + 2, full[1], full[2])
    return table


@pytest.mark.parametrize(
    ("fp16_gib", "verdict", "interval"),
    [
        (5.0, "predicted: held", (5 * 0.94 / 10.6, 5 * 1.06 / 9.4)),  # 0.443-0.564: wholly <= 60%
        (6.0, "predicted: inconclusive", (6 * 0.94 / 10.6, 6 * 1.06 / 9.4)),  # 0.532-0.677: spans 60%
        (8.0, "predicted: not held", (8 * 0.94 / 10.6, 8 * 1.06 / 9.4)),  # 0.709-0.902: wholly above
    ],
)
def test_fp16_halves_is_predicted_on_the_h200_with_both_cells_bands(monkeypatch, fp16_gib, verdict, interval):
    planner = Planner(monkeypatch, xl2(fp32=(10.0, 2.0, 18.3), fp16=(fp16_gib, 3.0, 18.3)))
    got = predict_fp16_halves()
    assert got["verdict"] == verdict and got["card"] == "H200"
    assert got["values"]["ratio"] == pytest.approx(fp16_gib / 10)
    assert got["values"]["interval"] == pytest.approx(list(interval))
    assert got["values"]["memory_band_pct"] == 6.0
    assert sorted(planner.calls) == [(("DiT-XL/2", "fp16", "none"), "H200", 32),
                                     (("DiT-XL/2", "fp32", "none"), "H200", 32)]  # fmt: skip


def test_fp16_halves_text_names_the_cells_the_band_and_the_card(monkeypatch):
    Planner(monkeypatch, xl2(fp32=(10.0, 2.0, 18.3), fp16=(8.0, 3.0, 18.3)))
    assert predict_fp16_halves()["text"] == (
        "predicted: not held (fp16/fp32 peak allocated 0.80, 0.71 to 0.90 with each cell's +-6%: "
        "DiT-XL/2 bs=32 10.00 -> 8.00 GiB on the H200, by ditbench plan)"
    )


@pytest.mark.parametrize(
    ("full", "speed_band", "verdict"),
    [
        # saved 60% (54.9-64.5%), extra time 25% (20.1-30.1% with +-2%): both inside the rule
        ((4.0, 1.6), 2.0, "predicted: held"),
        # the same cells with the shipped calibration's +-18.3%: extra time -13.7% to 81.0% spans 35%
        ((4.0, 1.6), 18.3, "predicted: inconclusive"),
        # saved 10% (at most 20.2%): below 40% whatever the time
        ((9.0, 1.6), 18.3, "predicted: not held"),
    ],
)
def test_checkpointing_needs_both_intervals_to_decide(monkeypatch, full, speed_band, verdict):
    Planner(monkeypatch, xl2(fp32=(10.0, 2.0, speed_band), full=(full[0], full[1], speed_band)))
    got = predict_ckpt_tradeoff()
    assert got["verdict"] == verdict
    values = got["values"]
    r_lo, r_hi = full[0] * 0.94 / 10.6, full[0] * 1.06 / 9.4
    assert values["saving"] == pytest.approx(1 - full[0] / 10)
    assert values["saving_interval"] == pytest.approx([1 - r_hi, 1 - r_lo])
    b = speed_band / 100
    assert values["extra_time"] == pytest.approx(2.0 / full[1] - 1)
    assert values["extra_time_interval"] == pytest.approx(
        [2.0 * (1 - b) / (full[1] * (1 + b)) - 1, 2.0 * (1 + b) / (full[1] * (1 - b)) - 1]
    )
    assert values["speed_band_pct"] == speed_band


def test_checkpointing_text(monkeypatch):
    Planner(monkeypatch, xl2(fp32=(10.0, 2.0, 18.3), full=(4.0, 1.6, 18.3)))
    assert predict_ckpt_tradeoff()["text"] == (
        "predicted: inconclusive (memory saved 60%, 55% to 65% with each cell's +-6%; extra time 25%, "
        "-14% to 81% with each cell's +-18.3%: DiT-XL/2 fp32 bs=32 10.00 -> 4.00 GiB, 2.00 -> 1.60 "
        "steps/s on the H200, by ditbench plan)"
    )


def test_the_card_of_a_class_is_the_one_with_the_most_memory():
    assert [class_card(gb) for gb in (12, 24, 48)] == ["RTX 4070 12GB", "RTX 4090", "RTX A6000"]


@pytest.mark.parametrize(
    ("status", "device_gib", "verdict"),
    [
        ("fits", 20.0, "predicted: held"),  # 21.2 with +6% fits 23.99
        ("fits", 23.0, "predicted: inconclusive"),  # 24.38 with +6%: plan's "tight"
        ("oom", 30.0, "predicted: not held"),  # 28.2 with -6% still above 23.99
        ("oom", 25.0, "predicted: inconclusive"),  # 23.5 with -6% would fit
    ],
)
def test_a_fit_check_is_held_to_the_memory_band(monkeypatch, status, device_gib, verdict):
    planner = Planner(
        monkeypatch, {("DiT-L/4", "fp16", "full"): (status, device_gib - 1, device_gib, 2.0, 18.3)}
    )
    got = predict_fit(L4_24, 24)
    assert got["verdict"] == verdict and got["card"] == "RTX 4090"
    assert got["values"] == {"device_gib": device_gib, "card_gib": 23.99, "memory_band_pct": 6.0,
                             "images_per_s": 64.0, "speed_band_pct": 18.3}  # fmt: skip
    assert planner.calls == [(("DiT-L/4", "fp16", "full"), "RTX 4090", 32)]


def test_a_fit_checks_text(monkeypatch):
    Planner(monkeypatch, {("DiT-L/4", "fp16", "full"): ("fits", 19.0, 20.0, 2.0, 18.3)})
    assert predict_fit(L4_24, 24)["text"] == (
        "predicted: held (DiT-L/4 fp16 ckpt=full bs=32 needs 20.00 GiB +-6% of the RTX 4090's 23.99, "
        "64 images/s +-18.3%, by ditbench plan)"
    )


def test_a_cell_the_planner_refuses_is_not_predicted_and_says_why(monkeypatch):
    Planner(monkeypatch, {("DiT-L/4", "fp16", "full"): ("unsupported", None, None, None, None)})
    assert predict_fit(L4_24, 24) == {"verdict": None, "why": "not predicted: unsupported here"}
    assert predict_fp16_halves() == {
        "verdict": None,
        "why": "not predicted: no such cell ('DiT-XL/2', 'fp16', 'none')",
    }


def cpu_run(tmp_path):
    write_jsonl(tmp_path / "r.jsonl", [make_record("DiT-S/8", "fp32", "none", 4, device="cpu")])
    return load_results(tmp_path / "r.jsonl")


def every_cell(monkeypatch):
    return Planner(
        monkeypatch,
        {
            **xl2(fp32=(10.0, 2.0, 18.3), fp16=(8.0, 3.0, 18.3), full=(4.0, 1.6, 18.3)),
            ("DiT-L/4", "fp16", "full"): ("fits", 19.0, 20.0, 2.0, 18.3),
            ("DiT-B/8", "fp16", "none"): ("oom", 14.0, 15.0, 10.0, 18.3),
        },
    )


def test_unmeasured_checks_show_the_prediction_as_their_verdict(monkeypatch, tmp_path):
    every_cell(monkeypatch)
    checks = advice.advice_checks(cpu_run(tmp_path))
    predict_advice(checks)
    by_key = {c.key: c for c in checks}
    assert {c.verdict for c in checks} == {"not measured"}  # the measured verdict is untouched
    assert {k: c.shown_verdict for k, c in by_key.items()} == {
        "check_fp16_halves": "predicted: not held",
        "check_ckpt_tradeoff": "predicted: inconclusive",
        "check_24gb_l4": "predicted: held",
        "check_12gb_b8": "predicted: not held",  # 15 GiB -6% is above the RTX 4070's 11.99
        "check_48gb_xl2": "predicted: held",  # 12 GiB on the RTX A6000
        "check_flash_speedup": "not measured",
        "check_quality_unchanged": "not measured",
    }
    l4 = by_key["check_24gb_l4"]
    assert l4.shown_evidence == l4.predicted["text"] + "; no such cell (single GPU) in this run"
    flash = by_key["check_flash_speedup"]
    why = (
        "the planner traces attention with its default kernel, so its time model cannot tell flash from math"
    )
    assert flash.predicted == {"verdict": None, "why": "not predicted: " + why}
    assert flash.shown_evidence == flash.evidence + "; " + flash.predicted["why"]
    quality = by_key["check_quality_unchanged"]
    assert quality.shown_evidence.endswith(
        "; not predicted: the planner predicts memory and speed, not sample quality"
    )
    blocks = advice_section(cpu_run(tmp_path), checks)
    table = next(b for b in blocks if hasattr(b, "rows"))
    assert [row[1] for row in table.rows] == [c.shown_verdict for c in checks]
    assert table.css[2][1] == "held" and table.css[0][1] == "not-held" and table.css[1][1] == "not-measured"
    md = to_markdown(blocks)
    assert (
        "| fp16 halves memory | predicted: not held | predicted: not held (fp16/fp32 peak allocated 0.80"
        in md
    )
    assert "Predicted (--predict): DiT-XL/2 at batch 32, fp16 against fp32, on the H200;" in md


def test_a_measured_verdict_wins_and_the_prediction_is_shown_beside_it(monkeypatch, tmp_path):
    every_cell(monkeypatch)
    write_jsonl(
        tmp_path / "r.jsonl",
        [
            make_record("DiT-L/4", "fp32", "none", 32, images_per_s=200.0, peak_alloc=20.0, device_mem=21.0),
            make_record("DiT-L/4", "fp16", "none", 32, images_per_s=500.0, peak_alloc=11.0, device_mem=12.0),
        ],
    )
    checks = advice.advice_checks(load_results(tmp_path / "r.jsonl"))
    measured = checks[0].evidence
    predict_advice(checks)
    fp16 = checks[0]
    assert fp16.verdict == fp16.shown_verdict == "held"  # measured 0.55; predicted 0.80 (not held)
    assert fp16.predicted["verdict"] == "predicted: not held"
    assert fp16.shown_evidence == measured + "; " + fp16.predicted["text"]


def test_report_predict_without_claims_predicts_the_advice(monkeypatch, tmp_path, capsys):
    from ditbench.cli import main

    every_cell(monkeypatch)
    write_jsonl(tmp_path / "r.jsonl", [make_record("DiT-S/8", "fp32", "none", 4, device="cpu")])
    assert main(["report", str(tmp_path / "r.jsonl"), "--predict", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)["advice"][0]
    assert first["verdict"] == "not measured" and first["predicted"]["verdict"] == "predicted: not held"
    assert first["predicted"]["card"] == "H200"
    assert first["predicted"]["values"]["ratio"] == pytest.approx(0.8)
    # without --predict nothing is predicted
    assert main(["report", str(tmp_path / "r.jsonl"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["advice"][0]["predicted"] is None


@pytest.mark.slow
def test_a_real_prediction_of_the_12_gb_check():
    from ditbench.plan import predict_cell

    got = predict_fit({"model": "DiT-B/8", "precision": "fp16", "batch_size": 32}, 12)
    pred = predict_cell({"model": "DiT-B/8", "precision": "fp16", "grad_ckpt": "none", "batch_size": 32},
                        "RTX 4070 12GB")  # fmt: skip
    assert got["card"] == "RTX 4070 12GB" and got["values"]["card_gib"] == 11.99
    assert got["values"]["device_gib"] == pred.device_gib and pred.status == "fits"
    assert got["values"]["speed_band_pct"] == pred.predicted_speed_band_pct > 0
    # B/8 at 32 needs a few GiB: +6% is far inside 11.99
    assert 1.0 < pred.device_gib * 1.06 < 11.99 and got["verdict"] == "predicted: held"
