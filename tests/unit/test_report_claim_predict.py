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
