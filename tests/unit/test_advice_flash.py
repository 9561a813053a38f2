"""The advice check "Flash attention makes DiT training 2-4x faster", from cells that differ in attention."""

from __future__ import annotations

import pytest
from synthetic_records import make_record, write_jsonl

from ditbench.report import advice
from ditbench.report.load import load_results

CLAIM = "Flash attention makes DiT training 2-4x faster"


def _check(tmp_path, records):
    path = tmp_path / "results.jsonl"
    write_jsonl(path, records)
    checks = {c.claim: c for c in advice.advice_checks(load_results(path))}
    return checks[CLAIM]


def _pair(model, math_ips, flash_ips, device="cuda", **kw):
    return [
        make_record(model, "bf16", "none", 32, images_per_s=math_ips, attention="math", device=device, **kw),
        make_record(
            model, "bf16", "none", 32, images_per_s=flash_ips, attention="flash", device=device, **kw
        ),
        make_record(model, "bf16", "none", 32, images_per_s=flash_ips, attention="sdpa", device=device, **kw),
    ]


def test_held_within_the_range(tmp_path):
    check = _check(tmp_path, _pair("DiT-XL/2", 100.0, 300.0, image_size=512) + _pair("DiT-B/4", 200.0, 500.0))
    assert check.verdict == "held"
    assert sorted(n["speedup"] for n in check.numbers) == pytest.approx([2.5, 3.0])
    assert "median 2.75x over 2 pair(s)" in check.evidence and "1024 tokens" in check.evidence


def test_not_held_below_the_range_says_what_share_attention_has(tmp_path):
    check = _check(tmp_path, _pair("DiT-XL/2", 277.0, 300.0))
    assert check.verdict == "not held"
    assert check.numbers[0]["speedup"] == pytest.approx(300 / 277)
    # 256 tokens, width 1152: 2*256 / (12*1152 + 2*256) = 3.6% of the FLOPs
    assert "256 tokens the attention products are 4% of" in check.evidence
    assert _check(tmp_path, _pair("DiT-S/2", 10.0, 50.0)).verdict == "not held"  # 5x: beyond the claim


def test_not_measured_without_a_gpu_pair(tmp_path):
    check = _check(tmp_path, _pair("DiT-S/2", 10.0, 12.0, device="cpu"))
    assert check.verdict == "not measured" and "on a CPU flash ran 1.20x math" in check.evidence
    refused = make_record(
        "DiT-S/2", "fp32", "none", 32, "unsupported", attention="flash", reason="attention flash cannot run"
    )
    check = _check(tmp_path, [make_record("DiT-S/2", "fp32", "none", 32, attention="math"), refused])
    assert (
        check.verdict == "not measured"
        and "flash was unsupported: attention flash cannot run" in check.evidence
    )
    assert _check(tmp_path, [make_record("DiT-S/2")]).verdict == "not measured"  # no attention axis


def test_pairs_whose_median_interval_spans_an_end_are_inconclusive(tmp_path):
    # 1.5x and 3x: the median 2.25x is inside 2-4x, but the bootstrap interval of the median of two
    # pairs runs from 1.5x to 3x, across the lower end: the data do not say which side it is on.
    check = _check(tmp_path, _pair("DiT-XL/2", 200.0, 300.0, image_size=512) + _pair("DiT-B/4", 100.0, 300.0))
    assert check.verdict == "inconclusive"
    assert "median 2.25x over 2 pair(s)" in check.evidence
    assert "the median's 95% interval 1.50-3.00x spans an end of 2-4x" in check.evidence
