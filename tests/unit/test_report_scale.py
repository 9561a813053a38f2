"""Honest at toy scale (issue 38): a memory comparison whose activations are a sliver of the peak says
"not meaningful at this scale" instead of a saving or a verdict (ditbench.report.memory)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from synthetic_records import make_record, write_jsonl

from ditbench.report import advice
from ditbench.report.analysis import baseline_comparison
from ditbench.report.claim_check import check_claims
from ditbench.report.claims import parse_claims
from ditbench.report.load import load_results
from ditbench.report.memory import activation_share, not_meaningful
from ditbench.report.render import write_report

ROOT = Path(__file__).resolve().parents[2]
S8_STATE = 33_150_000 * 20 / 2**30  # DiT-S/8's training state in the synthetic records: 0.6175 GiB


def frame(tmp_path, records):
    write_jsonl(tmp_path / "results.jsonl", records)
    return load_results([tmp_path / "results.jsonl"])


def toy(precision="fp32", ckpt="none", alloc=0.63, **kw):
    return make_record("DiT-S/8", precision, ckpt, 8, peak_alloc=alloc, **kw)


def test_the_share_is_the_peak_less_20_bytes_a_parameter(tmp_path):
    df = frame(tmp_path, [toy(alloc=0.63), toy("bf16", alloc=1.0), toy("fp16", alloc=0.5)])
    shares = [activation_share(row) for _, row in df.iterrows()]
    assert shares == pytest.approx([(0.63 - S8_STATE) / 0.63, (1.0 - S8_STATE) / 1.0, 0.0])
    assert not_meaningful(df.iloc[0]) == "not meaningful at this scale: activations are 2.0% of the peak"
    assert not_meaningful(df.iloc[1]) is None  # 38% of the peak: a comparison can show


def test_fsdp_shards_the_state_and_the_planner_components_come_first(tmp_path):
    sharded = make_record("DiT-S/8", "fp32", "none", 8, peak_alloc=0.63, gpus=4, strategy="fsdp")
    planned = toy(alloc=0.63)
    planned["metrics"]["prediction"] = {"peak_allocated_gib": 2.0, "components": {"activations": 0.5}}
    df = frame(tmp_path, [sharded, planned])
    assert activation_share(df.iloc[0]) == pytest.approx((0.63 - S8_STATE / 4) / 0.63)
    assert activation_share(df.iloc[1]) == pytest.approx(0.25)


def test_the_advice_is_not_judged_at_toy_scale_and_says_why(tmp_path):
    records = [toy(), toy("fp16", alloc=0.625), toy(ckpt="full", alloc=0.62), toy("fp16", "full", alloc=0.62)]
    checks = {c.key: c for c in advice.advice_checks(frame(tmp_path, records))}
    for key in ("check_fp16_halves", "check_ckpt_tradeoff"):
        assert checks[key].verdict == "not judged"
        assert checks[key].evidence.startswith(
            "not meaningful at this scale: activations are 2.0% of the peak"
        )
        assert "under a tenth of its peak are not judged" in checks[key].rule
    # with a pair at scale beside it, the verdict rests on that pair and names what was set aside
    big = [toy(alloc=4.0, image_size=512), toy("fp16", alloc=2.3, image_size=512)]
    fp16 = advice.check_fp16_halves(frame(tmp_path, records + big))
    assert fp16.verdict == "held" and [n["ratio"] for n in fp16.numbers] == pytest.approx([2.3 / 4.0])
    assert fp16.evidence.endswith(
        "not meaningful at this scale: activations are 2.0% of the peak at DiT-S/8 fp32 ckpt=none bs=8, "
        "the largest share of 2 pair(s) set aside"
    )


def test_a_prediction_gives_the_shown_verdict_where_the_measurement_cannot(tmp_path):
    check = advice.check_fp16_halves(frame(tmp_path, [toy(), toy("fp16", alloc=0.625)]))
    check.predicted = {"verdict": "predicted: not held", "text": "predicted x0.78 at DiT-XL/2", "why": ""}
    assert check.shown_verdict == "predicted: not held"


def test_a_memory_claim_at_toy_scale_is_not_judged(tmp_path):
    doc = {
        "claims": [
            {
                "says": "fp16 halves memory",
                "compare": {"from": {"precision": "fp32"}, "to": {"precision": "fp16"}},
                "metric": "peak_allocated_gib",
                "ratio": 0.5,
                "tolerance_pct": 15,
            }
        ]
    }
    (result,) = check_claims(
        frame(tmp_path, [toy(), toy("fp16", alloc=0.625)]), parse_claims(doc, "t.yaml"), 1
    )
    assert result.verdict == "not judged" and result.measured == "—"
    assert "not meaningful at this scale: activations are 2.0% of the peak" in result.evidence


def test_the_committed_cpu_run_reads_honestly(tmp_path):
    """reports/cpu_smoke: DiT-S/8's peak is its training state (0.1-0.2% activations); DiT-T/4 at
    batch 8 keeps 23% of its peak in activations, and checkpointing saves 19.3% there."""
    df = load_results([ROOT / "reports/cpu_smoke/results.jsonl"])
    cmp = baseline_comparison(df)
    by_name = {row["cell_name"]: label for label, row in df.iterrows()}
    s8 = cmp.loc[by_name["DiT-S/8 fp32 ckpt=full bs=8"]]
    assert s8["mem_note"] == "not meaningful at this scale: activations are 0.2% of the peak"
    assert s8["mem_saved_pct"] != s8["mem_saved_pct"] and s8["speedup"] == pytest.approx(9.9 / 16.0, rel=0.02)
    t4 = cmp.loc[by_name["DiT-T/4 fp32 ckpt=full bs=8"]]
    assert t4["mem_saved_pct"] == pytest.approx(19.3, abs=0.05) and t4["mem_note"] != t4["mem_note"]
    files = write_report(copy.deepcopy(df), tmp_path / "r", sources=["cpu_smoke"])
    text = files["markdown"].read_text()
    assert "0.62x; memory not meaningful at this scale: activations are 0.2% of the peak" in text
    assert "0.45x, +19.3% memory saved" in text
