"""`report --claims --predict`: claims the run did not measure get the planner's verdict, with a band."""

from __future__ import annotations

import pytest
from planner_stub import Planner
from report_support import cell, emulated
from synthetic_records import write_jsonl

from ditbench.plan import predict_cell
from ditbench.report.claim_check import check_claims
from ditbench.report.claim_predict import counts, predict_claims
from ditbench.report.claims import parse_claims
from ditbench.report.load import load_results

TINY = {"model": "DiT-T/2", "image_size": 64, "precision": "bf16", "grad_ckpt": "none", "batch_size": 8}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def results(tmp_path, doc, records):
    write_jsonl(tmp_path / "r.jsonl", records)
    df = load_results(tmp_path / "r.jsonl")
    out = check_claims(df, parse_claims(doc, "t.yaml"), 400_000)
    predict_claims(out, doc.get("card"), 400_000)
    return {r.claim.says: r for r in out}


@pytest.mark.slow
def test_unmeasured_claims_get_a_predicted_verdict_and_measured_ones_keep_theirs(tmp_path):
    pred = predict_cell(TINY, "RTX 4090")
    speed, memory = pred.predicted_steps_per_s, pred.device_gib
    doc = {
        "card": "RTX 4090",
        "claims": [
            {"says": "fast", "cell": TINY, "metric": "steps_per_s", "at_least": speed / 2},
            {"says": "too fast", "cell": TINY, "metric": "steps_per_s", "at_least": speed * 2},
            {"says": "small", "cell": TINY, "metric": "peak_memory_gib", "at_most": memory * 1.07},
            {"says": "tight", "cell": TINY, "metric": "peak_memory_gib", "at_most": memory * 1.01},
            {"says": "fits a 3060", "cell": TINY, "fits": "RTX 3060 12GB"},
            {"says": "open", "cell": {"model": "DiT-T/2"}, "metric": "peak_memory_gib", "value": 1},
            {"says": "ratio", "compare": {"from": {"precision": "fp32"}, "to": {"precision": "bf16"}},
             "metric": "peak_memory_gib", "ratio": 0.5},
            {"says": "B/8 measured", "cell": {"model": "DiT-B/8", "precision": "fp32", "batch_size": 8},
             "metric": "peak_memory_gib", "value": 2.5, "tolerance_pct": 10},
        ],
    }  # fmt: skip
    records = [emulated(cell("DiT-B/8", "fp32", "none", 8, reserved=2.0, steps_per_s=12.0))]
    got = results(tmp_path, doc, records)
    fast = got["fast"]
    assert fast.verdict == "not measured" and fast.predicted["verdict"] == "predicted: held"
    assert fast.predicted["band_pct"] == pred.predicted_speed_band_pct
    assert fast.predicted["card"] == "RTX 4090"
    assert fast.evidence.startswith("predicted: held (") and "by ditbench plan" in fast.evidence
    assert fast.measured.startswith("— (") and "predicted)" in fast.measured
    assert got["too fast"].predicted["verdict"] == "predicted: not held"
    assert got["small"].predicted == {
        "verdict": "predicted: held", "value": f"{memory:.2f} GiB", "band_pct": 6.0, "card": "RTX 4090"
    }  # fmt: skip
    # +-6% around the prediction reaches above 1.01 x it: the band spans the claim (issue 22's rule)
    assert got["tight"].predicted["verdict"] == "predicted: inconclusive"
    assert got["fits a 3060"].predicted["verdict"] == "predicted: held"
    assert got["fits a 3060"].predicted["value"] == "fits RTX 3060 12GB"
    assert got["open"].predicted["verdict"] is None and "leaves knobs open" in got["open"].predicted["why"]
    assert got["ratio"].predicted["verdict"] is None
    # Measured wins: the verdict is the measurement's, the prediction shown beside it.
    measured = got["B/8 measured"]
    assert measured.verdict == "held" and measured.measured == "2.50 GiB"
    assert "; predicted: " in measured.evidence
    assert counts(list(got.values())) == {
        "predicted: held": 3, "predicted: not held": 1, "predicted: inconclusive": 1
    }  # fmt: skip
    assert got["fast"].as_dict()["predicted"]["verdict"] == "predicted: held"


def mocked(tmp_path, monkeypatch, claims, table):
    Planner(monkeypatch, table)
    return results(tmp_path, {"card": "RTX 4090", "claims": claims}, [cell("DiT-B/8", "fp32", "none", 8)])


L4 = {"model": "DiT-L/4", "precision": "fp16", "batch_size": 16}


@pytest.mark.parametrize(
    ("claim", "verdict"),
    [
        (
            {"metric": "peak_memory_gib", "value": 11, "tolerance_pct": 10},
            "predicted: inconclusive",
        ),  # 9.9-12.1 against 9.4-10.6
        ({"metric": "peak_memory_gib", "value": 12, "tolerance_pct": 25}, "predicted: held"),  # 9.0-15.0
        ({"metric": "peak_memory_gib", "at_most": 9.0}, "predicted: not held"),
        # 1 / (2 steps/s +-10%) = 0.455-0.556 s against 0.5 s and below: spans
        ({"metric": "step_time", "at_most": 0.5}, "predicted: inconclusive"),
        ({"metric": "step_time", "at_most": 0.56}, "predicted: held"),
        ({"metric": "steps_per_s", "at_least": 2.21}, "predicted: not held"),  # 1.8-2.2
        ({"fits": "RTX 4090"}, "predicted: held"),  # 10 GiB +6% fits 23.99
        ({"fits": "RTX 3060 12GB"}, "predicted: inconclusive"),  # 11.2 GiB +6% = 11.87 is above 11.76: tight
    ],
)
def test_a_predicted_claim_whose_band_spans_the_claim_is_inconclusive(tmp_path, monkeypatch, claim, verdict):
    table = {("DiT-L/4", "fp16", "none"): ("fits", 9.5, 10.0, 2.0, 10.0)}
    if claim.get("fits") == "RTX 3060 12GB":
        table = {("DiT-L/4", "fp16", "none"): ("fits", 10.5, 11.2, 2.0, 10.0)}
    got = mocked(tmp_path, monkeypatch, [{"says": "c", "cell": L4, **claim}], table)["c"]
    assert got.verdict == "not measured" and got.predicted["verdict"] == verdict
    assert got.evidence.startswith(verdict + " (")


def test_the_claims_section_counts_the_predicted_verdicts_apart(tmp_path, monkeypatch):
    from ditbench.report.sections import claims_section

    claims = [
        {"says": "a", "cell": L4, "metric": "peak_memory_gib", "at_most": 9.0},
        {"says": "b", "cell": L4, "metric": "peak_memory_gib", "at_most": 12.0},
        {"says": "c", "cell": L4, "metric": "peak_memory_gib", "at_most": 10.3},
    ]
    got = mocked(tmp_path, monkeypatch, claims, {("DiT-L/4", "fp16", "none"): ("fits", 9.5, 10.0, 2.0, 10.0)})
    intro = claims_section(list(got.values()), "t.yaml", None, "RTX 4090")[1].text
    assert intro.startswith(
        "3 claims from `t.yaml`: 0 held, 0 not held, 3 not measured, 0 inconclusive, 0 not judged; of those "
        "not measured, 1 predicted: held, 1 predicted: not held, 1 predicted: inconclusive. The claims'"
    )


# ------------------------------------------------------- the run's cells: compare pairs, open fits

# (status, allocated GiB, device GiB, steps/s, speed band %) per (model, precision, grad_ckpt)
B8 = {
    ("DiT-B/8", "fp32", "none"): ("fits", 3.0, 4.0, 10.0, 10.0),
    ("DiT-B/8", "fp16", "none"): ("fits", 2.0, 2.6, 12.0, 10.0),
    ("DiT-B/8", "fp32", "full"): ("fits", 1.5, 2.0, 8.0, 10.0),
    ("DiT-B/8", "fp16", "full"): ("fits", 1.2, 1.4, 9.0, 10.0),
}
FP16 = {"compare": {"from": {"precision": "fp32"}, "to": {"precision": "fp16"}}, "metric": "peak_memory_gib"}
CKPT = {"compare": {"from": {"grad_ckpt": "none"}, "to": {"grad_ckpt": "full"}}}


def unmeasured_run(tmp_path, monkeypatch, claims, table=B8):
    """A run of B/8's four cells at batch 8 that measured nothing (fp16 and ckpt on a CPU, say)."""
    planner = Planner(monkeypatch, table)
    records = [
        cell("DiT-B/8", p, c, 8, status="unsupported") for p in ("fp32", "fp16") for c in ("none", "full")
    ]
    write_jsonl(tmp_path / "r.jsonl", records)
    out = check_claims(
        load_results(tmp_path / "r.jsonl"),
        parse_claims({"card": "RTX 4090", "claims": claims}, "t.yaml"),
        400_000,
    )
    predict_claims(out, "RTX 4090", 400_000)
    return {r.claim.says: r for r in out}, planner  # fmt: skip


@pytest.mark.parametrize(
    ("accepted", "verdict"),
    [
        ({"ratio": 0.5, "tolerance_pct": 15}, "predicted: not held"),  # 0.599-0.761 above 0.425-0.575
        ({"ratio_range": [0.5, 0.8]}, "predicted: held"),
        ({"ratio_range": [0.5, 0.7]}, "predicted: inconclusive"),
    ],
)
def test_a_compare_claim_predicts_the_runs_pairs_and_judges_the_median_ratio(
    tmp_path, monkeypatch, accepted, verdict
):
    got, planner = unmeasured_run(tmp_path, monkeypatch, [{"says": "fp16", **FP16, **accepted}])
    p = got["fp16"].predicted
    # fp32 -> fp16 at ckpt none: 2.6 / 4.0 = 0.65, each cell +-6%: 2.444 / 4.24 to 2.756 / 3.76;
    # at ckpt full: 1.4 / 2.0 = 0.70, 1.316 / 2.12 to 1.484 / 1.88; the median of two is their mean
    assert [(x["from"], x["to"]) for x in p["pairs"]] == [
        ("DiT-B/8 fp32 ckpt=none bs=8", "DiT-B/8 fp16 ckpt=none bs=8"),
        ("DiT-B/8 fp32 ckpt=full bs=8", "DiT-B/8 fp16 ckpt=full bs=8"),
    ]
    assert [x["ratio"] for x in p["pairs"]] == pytest.approx([0.65, 0.70])
    assert p["pairs"][0]["interval"] == pytest.approx([2.444 / 4.24, 2.756 / 3.76])
    assert p["ratio"] == pytest.approx(0.675)
    assert p["interval"] == pytest.approx(
        [(2.444 / 4.24 + 1.316 / 2.12) / 2, (2.756 / 3.76 + 1.484 / 1.88) / 2]
    )
    assert p["verdict"] == verdict and p["band_pct"] == 6.0 and p["card"] == "RTX 4090"
    assert p["value"] == "×0.68, median of 2 pairs, ×0.60–×0.76 with each cell's +-6%"
    r = got["fp16"]
    assert r.verdict == "not measured" and r.measured == f"— ({p['value']} predicted)"
    assert r.evidence.startswith(
        f"{verdict} (×0.68, median of 2 pairs, ×0.60–×0.76 with each cell's +-6% on RTX 4090: "
        "DiT-B/8 fp32 ckpt=none bs=8 → DiT-B/8 fp16 ckpt=none bs=8: ×0.65; "
        "DiT-B/8 fp32 ckpt=full bs=8 → DiT-B/8 fp16 ckpt=full bs=8: ×0.70, by ditbench plan); "
    )
    # each cell on the claims file's card, once, as the run had it (batch 8)
    assert sorted(planner.calls) == sorted((k, "RTX 4090", 8) for k in B8)


def test_a_speed_compare_takes_each_cells_speed_band(tmp_path, monkeypatch):
    claims = [
        {"says": "costs time", **CKPT, "metric": "step_time", "ratio_range": [1.2, 1.3]},
        {"says": "costs much", **CKPT, "metric": "step_time", "ratio_range": [1.6, 2.0]},
        {"says": "saves half", **CKPT, "metric": "peak_memory_gib", "ratio": 0.5, "tolerance_pct": 20},
    ]
    got, planner = unmeasured_run(tmp_path, monkeypatch, claims)
    p = got["costs time"].predicted
    # step time none -> full, each steps/s +-10%: fp32 10 -> 8 steps/s is x1.25, from
    # 1/(10 x 1.1) .. 1/(10 x 0.9) to 1/(8 x 1.1) .. 1/(8 x 0.9): x(9/8.8) .. x(11/7.2);
    # fp16 12 -> 9 steps/s: x(10.8/9.9) .. x(13.2/8.1)
    assert [x["ratio"] for x in p["pairs"]] == pytest.approx([1.25, 12 / 9])
    assert p["pairs"][0]["interval"] == pytest.approx([9 / 8.8, 11 / 7.2])
    assert p["interval"] == pytest.approx([(9 / 8.8 + 10.8 / 9.9) / 2, (11 / 7.2 + 13.2 / 8.1) / 2])
    assert p["band_pct"] == 10.0 and p["verdict"] == "predicted: inconclusive"  # 1.057-1.579 spans 1.2-1.3
    assert got["costs much"].predicted["verdict"] == "predicted: not held"  # 1.579 < 1.6
    saves = got["saves half"].predicted  # 2.0/4.0 and 1.4/2.6, +-6% each: 0.460-0.586 inside 0.4-0.6
    assert saves["ratio"] == pytest.approx((0.5 + 1.4 / 2.6) / 2)
    assert saves["interval"] == pytest.approx(
        [(1.88 / 4.24 + 1.316 / 2.756) / 2, (2.12 / 3.76 + 1.484 / 2.444) / 2]
    )
    assert saves["verdict"] == "predicted: held"
    assert len(planner.calls) == 4  # the three claims share the run's four cells
    assert counts(list(got.values())) == {
        "predicted: held": 1, "predicted: not held": 1, "predicted: inconclusive": 1
    }  # fmt: skip


@pytest.mark.parametrize(
    ("devices", "verdict", "value"),
    [
        ((2.6, 1.4), "predicted: held", "2 of 2 run cell(s) fit RTX 3060 12GB"),
        ((13.0, 12.6), "predicted: not held", "0 of 2 run cell(s) fit RTX 3060 12GB"),  # -6%: 12.22, 11.84
        ((13.0, 11.5), "predicted: inconclusive", "0 of 2 run cell(s) fit RTX 3060 12GB"),  # 11.5 +6% > 11.76
    ],
)
def test_a_fits_claim_with_open_knobs_predicts_the_runs_matching_cells(
    tmp_path, monkeypatch, devices, verdict, value
):
    table = dict(B8)
    for ckpt, device in zip(("none", "full"), devices, strict=True):
        status = "fits" if device <= 11.76 else "oom"
        table["DiT-B/8", "fp16", ckpt] = (status, device - 0.5, device, 10.0, 10.0)
    claims = [{"says": "12 GB", "cell": {"model": "DiT-B/8", "precision": "fp16"}, "fits": "RTX 3060 12GB"}]
    got, planner = unmeasured_run(tmp_path, monkeypatch, claims, table)
    p = got["12 GB"].predicted
    assert p["verdict"] == verdict and p["value"] == value and p["card"] == "RTX 3060 12GB"
    assert [(x["cell"], x["device_gib"]) for x in p["cells"]] == [
        ("DiT-B/8 fp16 ckpt=none bs=8", devices[0]),
        ("DiT-B/8 fp16 ckpt=full bs=8", devices[1]),
    ]
    assert got["12 GB"].measured == f"— ({value} +-6% predicted)"
    assert sorted(planner.calls) == [
        (("DiT-B/8", "fp16", c), "RTX 3060 12GB", 8) for c in ("full", "none")
    ]  # fmt: skip


def test_what_the_run_cannot_decide_stays_unpredicted_and_says_why(tmp_path, monkeypatch):
    claims = [
        {"says": "XL", "cell": {"model": "DiT-XL/2"}, "fits": "RTX A6000"},
        {"says": "bf16", "compare": {"from": {"precision": "fp32"}, "to": {"precision": "bf16"}},
         "metric": "peak_memory_gib", "ratio": 0.5},
        {"says": "flash", "compare": {"from": {"attention": "math"}, "to": {"attention": "flash"}},
         "metric": "steps_per_s", "ratio_range": [2, 4]},
    ]  # fmt: skip
    got, planner = unmeasured_run(tmp_path, monkeypatch, claims)
    assert got["XL"].predicted == {
        "verdict": None,
        "why": "not predicted: the claim's cell leaves knobs open and no cell of the run matches it",
    }
    assert got["bf16"].predicted == {
        "verdict": None, "why": "not predicted: the run has no pair of cells that differ as claimed"
    }  # fmt: skip
    assert "cannot tell flash from math" in got["flash"].predicted["why"]
    assert planner.calls == [] and all(r.evidence and "predicted" not in r.evidence for r in got.values())


def test_a_flash_pair_in_the_run_is_not_predicted(tmp_path, monkeypatch):
    planner = Planner(monkeypatch, {("DiT-B/8", "bf16", "none"): ("fits", 2.0, 2.5, 10.0, 10.0)})
    records = [
        cell("DiT-B/8", "bf16", "none", 8, status="unsupported", attention=a) for a in ("math", "flash")
    ]
    claim = {"says": "flash", "compare": {"from": {"attention": "math"}, "to": {"attention": "flash"}},
             "metric": "steps_per_s", "ratio_range": [2, 4]}  # fmt: skip
    write_jsonl(tmp_path / "r.jsonl", records)
    out = check_claims(
        load_results(tmp_path / "r.jsonl"), parse_claims({"claims": [claim]}, "t.yaml"), 400_000
    )
    assert len(out[0].pairs) == 1  # the checker found the pair; the planner cannot tell its cells apart
    predict_claims(out, "RTX 4090", 400_000)
    assert out[0].predicted["verdict"] is None and planner.calls == []
    assert out[0].predicted["why"].startswith("not predicted: the planner traces attention")


def test_a_measured_compare_keeps_its_verdict_with_the_prediction_beside_it(tmp_path, monkeypatch):
    Planner(monkeypatch, B8)
    records = [
        cell("DiT-B/8", p, "none", 8, reserved=r, steps_per_s=5.0) for p, r in (("fp32", 4.0), ("fp16", 2.0))
    ]
    claim = {"says": "fp16", **FP16, "ratio": 0.5, "tolerance_pct": 15}
    write_jsonl(tmp_path / "r.jsonl", records)
    out = check_claims(
        load_results(tmp_path / "r.jsonl"), parse_claims({"claims": [claim]}, "t.yaml"), 400_000
    )
    predict_claims(out, "RTX 4090", 400_000)
    r = out[0]
    assert r.verdict == "held" and r.measured.startswith("×0.5")
    assert r.predicted["verdict"] == "predicted: not held"  # 2.6/4.0: 0.576-0.733, above 0.575
    assert "; predicted: not held (×0.65, ×0.58–×0.73 with each cell's +-6% on RTX 4090: " in r.evidence
    assert counts(out) == {"predicted: held": 0, "predicted: not held": 0, "predicted: inconclusive": 0}


def test_a_speed_compare_without_a_calibrated_band_judges_the_ratio_itself(tmp_path, monkeypatch):
    table = {k: (*v[:4], None) for k, v in B8.items()}  # no speed band: no calibration for the card
    claims = [{"says": "t", **CKPT, "metric": "step_time", "ratio_range": [1.2, 1.3]}]
    p = unmeasured_run(tmp_path, monkeypatch, claims, table)[0]["t"].predicted
    # step time x1.25 (fp32 10 -> 8 steps/s) and x1.33 (fp16 12 -> 9): the median x1.29 is inside
    assert p["ratio"] == pytest.approx((1.25 + 12 / 9) / 2) and p["interval"] == pytest.approx(
        [p["ratio"]] * 2
    )
    assert p["verdict"] == "predicted: held" and p["band_pct"] is None
    assert p["value"] == "×1.29, median of 2 pairs"


def test_the_report_and_plan_answer_the_same_question_alike(capsys, tmp_path, monkeypatch):
    """`report --predict` asks the planner for the claim's own cell and card: the figures and bands
    `ditbench plan` gives for that cell."""
    import json

    from ditbench.cli import main
    from ditbench.report.claim_predict import fit_verdict, memory_band_pct, predict

    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path))
    cell = {"model": "DiT-S/2", "precision": "bf16", "batch_size": 32}
    pred, why = predict(cell, "RTX 4090")
    argv = ["--card", "RTX 4090", "--models", "DiT-S/2", "--precisions", "bf16", "--grad-ckpt", "none"]
    assert why is None and main(["plan", *argv, "--batches", "32", "--full", "--json", "--no-tree"]) == 0
    (planned,) = json.loads(capsys.readouterr().out)["cells"]
    assert planned["device_gib"] == pred.device_gib and planned["fits"] == pred.fits
    assert planned["predicted_images_per_s"] == pred.predicted_images_per_s
    assert planned["predicted_speed_band_pct"] == pred.predicted_speed_band_pct
    assert planned["tight"] == (fit_verdict(pred) == "predicted: inconclusive")
    main(["plan", *argv, "--batches", "32", "--full", "--json", "--no-tree"])
    assert json.loads(capsys.readouterr().out)["tight_margin"] * 100 == memory_band_pct()
