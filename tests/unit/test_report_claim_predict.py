"""`report --claims --predict`: claims the run did not measure get the planner's verdict, with a band."""

from __future__ import annotations

import pytest
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
            {"says": "small", "cell": TINY, "metric": "peak_memory_gib", "at_most": memory * 1.01},
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
    assert got["fits a 3060"].predicted["verdict"] == "predicted: held"
    assert got["fits a 3060"].predicted["value"] == "fits RTX 3060 12GB"
    assert got["open"].predicted["verdict"] is None and "leaves knobs open" in got["open"].predicted["why"]
    assert got["ratio"].predicted["verdict"] is None
    # Measured wins: the verdict is the measurement's, the prediction shown beside it.
    measured = got["B/8 measured"]
    assert measured.verdict == "held" and measured.measured == "2.50 GiB"
    assert "; predicted: " in measured.evidence
    assert counts(list(got.values())) == {"predicted: held": 3, "predicted: not held": 1}
    assert got["fast"].as_dict()["predicted"]["verdict"] == "predicted: held"


def test_predict_without_claims_is_an_error(capsys, tmp_path):
    from ditbench.cli import main

    write_jsonl(tmp_path / "r.jsonl", [cell("DiT-L/4", "fp16", "none", 16, reserved=10.8, steps_per_s=1.0)])
    code = main(["report", str(tmp_path / "r.jsonl"), "--json", "--predict"])
    _, err = capsys.readouterr()
    assert code == 2 and "--predict judges the claims" in err
