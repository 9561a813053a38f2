"""Claims files: parsing and validation, and verdicts (held / not held / not measured) on known records."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from report_support import A6000_ENV, RTX4090_ENV, cell, emulated, on_card
from synthetic_records import CPU_ENV, make_record, write_jsonl

from ditbench.core.errors import UserError
from ditbench.report.claim_check import check_claims
from ditbench.report.claims import CLAIMS_DIR, load_claims, parse_claims, resolve_claims
from ditbench.report.load import load_results
from ditbench.spec.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "claims" / "dit_resource_guide.yaml"
STEPS = 400_000


def frame(tmp_path, records, name="results.jsonl"):
    write_jsonl(tmp_path / name, records)
    return load_results(tmp_path / name)


def verdicts(df, doc, steps=STEPS):
    claims = parse_claims(doc, "test.yaml")
    return {r.claim.says: r for r in check_claims(df, claims, steps)}


# ------------------------------------------------------------------------------------------ parse


def test_the_shipped_claims_parse():
    claims = load_claims(SHIPPED)
    assert claims.card == "RTX 4090" and len(claims.claims) == 20
    kinds = {c.kind for c in claims.claims}
    assert kinds == {"cell", "compare", "fits"}
    by_says = {c.says: c for c in claims.claims}
    l4 = by_says["DiT-L/4 in fp32 at batch 16 uses 22 GB"]
    assert l4.low == pytest.approx(22 * 0.85) and l4.high == pytest.approx(22 * 1.15)
    assert by_says["checkpointing costs 20-30% more time"].expect == "ratio_range"
    assert by_says["24 GB: DiT-L/4 with fp16 and checkpointing, batch 32"].fits_gib == 23.99


def test_the_shipped_suite_runs_exactly_the_cells_the_claims_name():
    suite = load_suite(ROOT / "suites" / "dit_resource_guide.yaml")
    assert suite.gpu_memory_gib == 23.99  # an RTX 4090's usable memory
    names = {c.cell_name for c in suite.cells}
    selected = set()
    for claim in load_claims(SHIPPED).claims:
        if claim.kind == "cell" or (claim.kind == "fits" and "batch_size" in claim.cell):
            hits = {
                c.cell_name for c in suite.cells if all(c.config.get(k) == v for k, v in claim.cell.items())
            }
            assert len(hits) == 1, (claim.says, hits)  # one cell per statement about one cell
            selected |= hits
        if claim.kind == "compare" and "attention" not in claim.change_from:
            twins = [
                c
                for c in suite.cells
                if all(c.config.get(k) == v for k, v in claim.change_from.items())
                and any(
                    all(d.config.get(k) == v for k, v in claim.change_to.items())
                    and {k: v for k, v in d.config.items() if k not in claim.change_to}
                    == {k: v for k, v in c.config.items() if k not in claim.change_to}
                    for d in suite.cells
                )
            ]
            assert twins, claim.says
            selected |= {c.cell_name for c in twins}
    assert selected == names  # no cell the claims do not use


BAD = [
    ("claims: []", "at `claims`: expected a non-empty list"),
    ("[1, 2]", "expected a mapping"),
    ("claims: [{says: x, cell: {model: DiT-L/4}, metric: steps_per_s, valu: 3}]", "Did you mean `value`?"),
    (
        "claims: [{cell: {model: DiT-L/4}, metric: steps_per_s, value: 3}]",
        "at `claims[0]`: a claim needs `says`",
    ),
    ("claims: [{says: x, metric: steps_per_s, value: 3, at_most: 4}]", "exactly one expectation"),
    ("claims: [{says: x, metric: steps_per_s}]", "exactly one expectation"),
    ("claims: [{says: x, metric: step_time, ratio: 1.2}]", "at `claims[0].ratio`: `ratio` compares cells"),
    ("claims: [{says: x, metric: stepz_per_s, value: 1}]", "Did you mean `steps_per_s`?"),
    ("claims: [{says: x, cell: {model: DiT-L/5}, metric: steps_per_s, value: 1}]", "claims[0].cell.model"),
    ("claims: [{says: x, cell: {precision: fp8}, metric: steps_per_s, value: 1}]", "unknown precision"),
    (
        "claims: [{says: x, cell: {batch_size: 1.5}, metric: steps_per_s, value: 1}]",
        "batch_size must be an integer from 1",
    ),
    ("claims: [{says: x, cell: {modle: DiT-L/4}, metric: steps_per_s, value: 1}]", "Did you mean `model`?"),
    (
        "claims: [{says: x, cell: {model: []}, metric: steps_per_s, value: 1}]",
        "an empty list matches no cell",
    ),
    ("claims: [{says: x, metric: steps_per_s, value: .nan}]", "claims[0].value`: expected a finite number"),
    ("claims: [{says: x, metric: steps_per_s, at_least: .inf}]", "expected a finite number"),
    ("claims: [{says: x, metric: steps_per_s, value: -1}]", "greater than 0"),
    ("claims: [{says: x, metric: steps_per_s, range: [3, 1]}]", "low 3 is above high 1"),
    ("claims: [{says: x, metric: steps_per_s, range: 3}]", "expected [low, high]"),
    ("claims: [{says: x, metric: steps_per_s, range: [1, 3], tolerance_pct: 5}]", "with `value` or `ratio`"),
    ("claims: [{says: x, metric: steps_per_s, value: 1, tolerance_pct: 100}]", "from 0 to below 100"),
    ("claims: [{says: x, cell: {model: DiT-L/4}, fits: RTX 9999}]", "claims[0].fits`: unknown card"),
    ("claims: [{says: x, fits: 12, metric: peak_memory_gib}]", "leave `metric` out"),
    ("claims: [{says: x, fits: true}]", "a card name (e.g. RTX 4090) or a number of GiB"),
    ("claims: [{says: x, fits: .inf}]", "expected a finite number"),
    ("claims: [{says: x, compare: {from: {precision: fp32}}, metric: step_time, ratio: 1}]", "needs `to`"),
    (
        "claims: [{says: x, compare: {from: {grad_ckpt: none}, to: {grad_ckpt: none}}, "
        "metric: step_time, ratio: 1}]",
        "the same cells",
    ),
    ("claims: [{says: x, compare: {from: {a: 1}, to: {b: 2}}, metric: step_time, value: 1}]", "`ratio` or"),
    ("card: RTX 9999\nclaims: [{says: x, metric: steps_per_s, value: 1}]", "at `card`: unknown card"),
    ("claims: [{says: '', metric: steps_per_s, value: 1}]", "expected non-empty text"),
]


@pytest.mark.parametrize("text, needle", BAD)
def test_a_bad_claims_file_names_the_key(tmp_path, text, needle):
    path = tmp_path / "c.yaml"
    path.write_text(text + "\n")
    with pytest.raises(UserError) as err:
        load_claims(path)
    message = str(err.value)
    assert needle in message and message.startswith("claims ") and str(path) in message
    assert "\n" not in message


def test_claims_files_go_through_the_bounded_reader(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("claims: []\nclaims: []\n")
    with pytest.raises(UserError, match="duplicate key 'claims'"):
        load_claims(dup)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("source: caf\xe9\nclaims: []\n".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        load_claims(latin)
    with pytest.raises(UserError, match="is a directory"):
        load_claims(tmp_path)
    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    bomb.write_text("\n".join(lines) + "\nclaims: *a11\n")
    with pytest.raises(UserError, match="aliases"):
        load_claims(bomb)


# --------------------------------------------------------------------------------- cell claims

VALUE_DOC = {
    "claims": [
        {
            "says": "L/4 fp16 uses 11 GB",
            "cell": {"model": "DiT-L/4", "precision": "fp16"},
            "metric": "peak_memory_gib",
            "value": 11,
            "tolerance_pct": 10,
        },
        {
            "says": "L/4 fp32 uses 9 GB",
            "cell": {"model": "DiT-L/4", "precision": "fp32"},
            "metric": "peak_memory_gib",
            "at_most": 9,
        },
        {
            "says": "XL/2 fp32 uses 22 GB",
            "cell": {"model": "DiT-XL/2", "precision": "fp32"},
            "metric": "peak_memory_gib",
            "value": 22,
            "tolerance_pct": 5,
        },
        {
            "says": "XL/2 fp32 uses 40 GB",
            "cell": {"model": "DiT-XL/2", "precision": "fp32"},
            "metric": "peak_memory_gib",
            "value": 40,
        },
        {"says": "B/8 uses 2 GB", "cell": {"model": "DiT-B/8"}, "metric": "peak_memory_gib", "value": 2},
        {
            "says": "L/4 fp16 at 0.5 steps/s",
            "cell": {"model": "DiT-L/4", "precision": "fp16"},
            "metric": "steps_per_s",
            "range": [0.4, 0.6],
        },
    ]
}


def emulated_run():
    """A 24 GiB card (RTX 4090) emulated on an H200; fit memory = reserved + 0.5 GiB context."""
    return [
        emulated(cell("DiT-L/4", "fp16", "none", 16, reserved=10.8, steps_per_s=12.0)),  # 11.3 GiB
        emulated(cell("DiT-L/4", "fp32", "none", 16, reserved=11.0, steps_per_s=13.0)),  # 11.5 GiB
        emulated(cell("DiT-XL/2", "fp32", "none", 16, status="oom")),  # needs more than 23.99
    ]


def test_value_claims_held_not_held_and_not_measured(tmp_path):
    got = verdicts(frame(tmp_path, emulated_run()), VALUE_DOC)
    held = got["L/4 fp16 uses 11 GB"]
    assert held.verdict == "held" and held.measured == "11.30 GiB"
    assert "peak reserved + CUDA context" in held.evidence and held.cells == ["DiT-L/4 fp16 ckpt=none bs=16"]
    assert (
        got["L/4 fp32 uses 9 GB"].verdict == "not held" and got["L/4 fp32 uses 9 GB"].measured == "11.50 GiB"
    )
    # out of memory under a 23.99 GiB cap: it needs more than 23.99, so "22 +- 5%" (up to 23.1) fails ...
    oom = got["XL/2 fp32 uses 22 GB"]
    assert (
        oom.verdict == "not held"
        and "needs more than 23.99 GiB" in oom.evidence
        and oom.measured == "> 23.99 GiB"
    )
    # ... while "40 +- 10%" cannot be told from it
    unknown = got["XL/2 fp32 uses 40 GB"]
    assert (
        unknown.verdict == "not measured" and "out of memory, needs more than 23.99 GiB" in unknown.evidence
    )
    nothing = got["B/8 uses 2 GB"]
    assert nothing.verdict == "not measured" and "no cell in this run has model = DiT-B/8" in nothing.evidence
    assert "DiT-L/4" in nothing.evidence  # it names the models the run has


def test_a_speed_is_judged_only_on_the_card_the_claim_is_about(tmp_path):
    doc = dict(VALUE_DOC, card="RTX 4090")
    emul = verdicts(frame(tmp_path, emulated_run()), doc)["L/4 fp16 at 0.5 steps/s"]
    assert emul.verdict == "not measured"
    assert (
        "measured 12 steps/s" in emul.evidence
        and "the NVIDIA H200's speed, not an RTX 4090's" in emul.evidence
    )
    real = [on_card(cell("DiT-L/4", "fp16", "none", 16, reserved=10.8, steps_per_s=0.5), RTX4090_ENV)]
    ok = verdicts(frame(tmp_path, real, "real.jsonl"), doc)["L/4 fp16 at 0.5 steps/s"]
    assert ok.verdict == "held" and ok.measured == "0.5 steps/s"
    slow = [on_card(cell("DiT-L/4", "fp16", "none", 16, reserved=10.8, steps_per_s=0.3), RTX4090_ENV)]
    assert verdicts(frame(tmp_path, slow, "slow.jsonl"), doc)["L/4 fp16 at 0.5 steps/s"].verdict == "not held"
    other = [on_card(cell("DiT-L/4", "fp16", "none", 16, reserved=10.8, steps_per_s=0.5), A6000_ENV)]
    elsewhere = verdicts(frame(tmp_path, other, "a6000.jsonl"), doc)["L/4 fp16 at 0.5 steps/s"]
    assert (
        elsewhere.verdict == "not measured"
        and "ran on NVIDIA RTX A6000, not on an RTX 4090" in elsewhere.evidence
    )
    # without a card the speed is judged where it was measured, and the evidence says where
    free = verdicts(frame(tmp_path, emulated_run(), "free.jsonl"), VALUE_DOC)["L/4 fp16 at 0.5 steps/s"]
    assert (
        free.verdict == "not held"
        and "speeds measured on NVIDIA H200 (139.8 GiB) capped to 23.99 GiB" in free.evidence
    )


def test_a_cpu_run_has_no_gpu_memory_to_judge(tmp_path):
    rec = make_record("DiT-L/4", "fp16", "none", 16, device="cpu", env=CPU_ENV)
    got = verdicts(frame(tmp_path, [rec]), VALUE_DOC)["L/4 fp16 uses 11 GB"]
    assert got.verdict == "not measured" and "a CPU cell has no GPU memory figure" in got.evidence


# ------------------------------------------------------------------------------ compare claims

COMPARE_DOC = {
    "claims": [
        {
            "says": "fp16 halves memory",
            "compare": {"from": {"precision": "fp32"}, "to": {"precision": "fp16"}},
            "metric": "peak_memory_gib",
            "ratio": 0.5,
            "tolerance_pct": 15,
        },
        {
            "says": "ckpt costs 20-30% time",
            "compare": {"from": {"grad_ckpt": "none"}, "to": {"grad_ckpt": "full"}},
            "metric": "step_time",
            "ratio_range": [1.2, 1.3],
        },
        {
            "says": "ckpt on B/8 only",
            "cell": {"model": "DiT-B/8"},
            "compare": {"from": {"grad_ckpt": "none"}, "to": {"grad_ckpt": "full"}},
            "metric": "step_time",
            "ratio_range": [1.2, 1.3],
        },
        {
            "says": "flash is 2-4x faster",
            "compare": {"from": {"attention": "math"}, "to": {"attention": "flash"}},
            "metric": "steps_per_s",
            "ratio_range": [2, 4],
        },
    ]
}


def test_ratio_claims_use_the_median_over_twins(tmp_path):
    records = [
        # fp32 -> fp16: 20 -> 10 (0.5) and 25 -> 15 (0.6): median 0.55, inside 0.425-0.575
        on_card(cell("DiT-L/4", "fp32", "none", 16, reserved=20.0, device_mem=20.0), A6000_ENV),
        on_card(cell("DiT-L/4", "fp16", "none", 16, reserved=10.0, device_mem=10.0), A6000_ENV),
        on_card(cell("DiT-XL/2", "fp32", "none", 16, reserved=25.0, device_mem=25.0), A6000_ENV),
        on_card(cell("DiT-XL/2", "fp16", "none", 16, reserved=15.0, device_mem=15.0), A6000_ENV),
        # none -> full at 1.0 -> 0.8 steps/s: step time x1.25
        on_card(cell("DiT-L/4", "fp16", "full", 16, reserved=5.0, steps_per_s=0.8), A6000_ENV),
    ]
    records[1] = on_card(
        cell("DiT-L/4", "fp16", "none", 16, reserved=10.0, device_mem=10.0, steps_per_s=1.0), A6000_ENV
    )
    got = verdicts(frame(tmp_path, records), COMPARE_DOC)
    halves = got["fp16 halves memory"]
    # Two pairs: the median's bootstrap interval (0.50-0.60) spans the claim's end 0.575.
    assert halves.verdict == "inconclusive"
    assert halves.measured == "×0.55 (median of 2, ×0.50–×0.60); 95% CI of the median ×0.50–×0.60"
    assert [n["ratio"] for n in halves.numbers] == pytest.approx([0.5, 0.6])
    assert "DiT-L/4 fp32 ckpt=none bs=16 → DiT-L/4 fp16 ckpt=none bs=16: ×0.50" in halves.evidence
    ckpt = got["ckpt costs 20-30% time"]
    assert ckpt.verdict == "held" and ckpt.numbers[0]["ratio"] == pytest.approx(1.25, rel=0.02)
    assert got["ckpt on B/8 only"].verdict == "not measured"
    flash = got["flash is 2-4x faster"]
    assert (
        flash.verdict == "not measured"
        and "no cell in this run has attention = math (it has sdpa)" in flash.evidence
    )


def test_a_ratio_claim_is_held_or_not_only_when_the_interval_says_so(tmp_path):
    def pairs(ratios):
        records = []
        for model, r in zip(("DiT-L/4", "DiT-XL/2", "DiT-B/4"), ratios, strict=True):
            records.append(on_card(cell(model, "fp32", "none", 16, reserved=20.0), A6000_ENV))
            records.append(on_card(cell(model, "fp16", "none", 16, reserved=20.0 * r), A6000_ENV))
        return verdicts(frame(tmp_path, records), COMPARE_DOC)["fp16 halves memory"]

    held = pairs([0.49, 0.5, 0.51])  # every resampled median lies inside 0.425-0.575
    assert held.verdict == "held" and "95% CI of the median ×0.50–×0.52" in held.measured  # peak alloc
    assert pairs([0.7, 0.75, 0.8]).verdict == "not held"  # wholly above the claim
    assert pairs([0.4, 0.5, 0.6]).verdict == "inconclusive"  # spans both ends


def test_cpu_speeds_are_not_judged_for_a_claim_about_a_card(tmp_path):
    records = [
        make_record("DiT-L/4", "fp16", g, 16, images_per_s=v, device="cpu", env=CPU_ENV)
        for g, v in (("none", 40.0), ("full", 32.0))
    ]
    doc = {"card": "RTX 4090", "claims": [COMPARE_DOC["claims"][1]]}
    (result,) = check_claims(frame(tmp_path, records), parse_claims(doc, "claims.yaml"), STEPS)
    assert result.verdict == "not judged" and result.measured == "—"
    assert (
        result.evidence.startswith("not judged: ") and "ran on a CPU, not on an RTX 4090" in result.evidence
    )
    # Without a card the claim is about no machine in particular: the CPU ratio is judged.
    plain = verdicts(frame(tmp_path, records), COMPARE_DOC)["ckpt costs 20-30% time"]
    assert plain.verdict == "held"


def test_ratio_claims_that_do_not_hold(tmp_path):
    records = [
        emulated(cell("DiT-L/4", "fp16", "none", 16, reserved=10.6, steps_per_s=12.5)),
        emulated(cell("DiT-L/4", "fp16", "full", 16, reserved=10.3, steps_per_s=8.1)),
        emulated(cell("DiT-L/4", "fp32", "none", 16, reserved=10.5, steps_per_s=13.6)),
    ]
    got = verdicts(frame(tmp_path, records), COMPARE_DOC)
    halves = got["fp16 halves memory"]
    assert halves.verdict == "not held" and halves.numbers[0]["ratio"] == pytest.approx(11.1 / 11.0)
    ckpt = got["ckpt costs 20-30% time"]
    assert ckpt.verdict == "not held" and ckpt.numbers[0]["ratio"] == pytest.approx(12.5 / 8.1, rel=0.02)
    assert "speeds measured on NVIDIA H200" in ckpt.evidence


def test_an_out_of_memory_twin_bounds_a_memory_ratio(tmp_path):
    records = [
        emulated(cell("DiT-XL/2", "fp32", "none", 16, status="oom")),  # needs more than 23.99
        emulated(cell("DiT-XL/2", "fp16", "none", 16, reserved=9.5)),  # 10.0: ratio below 10 / 23.99 = 0.42
    ]
    got = verdicts(frame(tmp_path, records), COMPARE_DOC)["fp16 halves memory"]
    assert got.verdict == "not held" and "ratio below ×0.42" in got.evidence


# --------------------------------------------------------------------------------- fits claims

FITS_DOC = {
    "claims": [
        {
            "says": "24 GB: L/4 fp16 ckpt bs32",
            "cell": {"model": "DiT-L/4", "precision": "fp16", "grad_ckpt": "full", "batch_size": 32},
            "fits": "RTX 4090",
        },
        {
            "says": "12 GB: L/4 fp16",
            "cell": {"model": "DiT-L/4", "precision": "fp16"},
            "fits": "RTX 3060 12GB",
        },
        {"says": "48 GB: XL/2", "cell": {"model": "DiT-XL/2"}, "fits": 47.99},
        {"says": "24 GB: XL/2 fp32", "cell": {"model": "DiT-XL/2", "precision": "fp32"}, "fits": 24},
    ]
}


def test_fits_claims_held(tmp_path):
    records = [
        emulated(cell("DiT-L/4", "fp16", "full", 32, reserved=14.0)),
        emulated(cell("DiT-XL/2", "fp32", "none", 16, status="oom")),
        emulated(cell("DiT-XL/2", "fp16", "none", 16, reserved=19.5)),
    ]
    got = verdicts(frame(tmp_path, records), FITS_DOC)
    fit = got["24 GB: L/4 fp16 ckpt bs32"]
    assert (
        fit.verdict == "held" and fit.claimed == "fits RTX 4090 (23.99 GiB)" and fit.measured == "14.50 GiB"
    )
    assert fit.cells == ["DiT-L/4 fp16 ckpt=full bs=32"]
    xl = got["48 GB: XL/2"]  # one XL/2 cell fits 24 GiB, so it fits 48: the claim is about some cell
    assert xl.verdict == "held" and xl.cells == ["DiT-XL/2 fp16 ckpt=none bs=16"]
    assert "1 of 2 matching cell(s) fit" in xl.evidence


def test_fits_claims_not_held_and_not_measured(tmp_path):
    records = [
        emulated(cell("DiT-L/4", "fp16", "full", 32, reserved=14.0)),
        emulated(cell("DiT-L/4", "fp16", "none", 16, reserved=12.0)),
        emulated(cell("DiT-L/4", "fp16", "none", 32, status="oom")),
        emulated(cell("DiT-XL/2", "fp32", "none", 16, status="oom")),
    ]
    got = verdicts(frame(tmp_path, records), FITS_DOC)
    small = got["12 GB: L/4 fp16"]
    assert small.verdict == "not held" and small.measured == "does not fit"
    assert "12.50 GiB peak reserved + CUDA context" in small.evidence
    assert "out of memory, needs more than 23.99 GiB" in small.evidence
    # an out-of-memory cell under a 23.99 GiB cap says nothing about 47.99 GiB ...
    assert got["48 GB: XL/2"].verdict == "not measured"
    # ... but it does about 24 GiB (the same card within 51 MiB)
    assert got["24 GB: XL/2 fp32"].verdict == "not held"


# ------------------------------------------------------------------------- the shipped file, a run


def guide_run():
    """What suites/dit_resource_guide.yaml would record on an H200 capped to an RTX 4090 (numbers
    shaped like the H200 anchors: weights and Adam state dominate at batch 16)."""
    return [
        emulated(cell("DiT-B/8", "fp32", "none", 16, reserved=3.0, steps_per_s=60.0)),  # 3.50 GiB
        emulated(cell("DiT-B/8", "fp16", "none", 16, reserved=3.2, steps_per_s=70.0)),  # 3.70
        emulated(cell("DiT-L/4", "fp32", "none", 16, reserved=11.0, steps_per_s=13.6)),  # 11.50
        emulated(cell("DiT-L/4", "fp16", "none", 16, reserved=11.1, steps_per_s=12.5)),  # 11.60
        emulated(cell("DiT-XL/2", "fp32", "none", 16, status="oom")),
        emulated(cell("DiT-XL/2", "fp16", "none", 16, reserved=19.8, steps_per_s=10.0)),  # 20.30
        emulated(cell("DiT-L/4", "fp16", "full", 16, reserved=10.8, steps_per_s=8.1)),  # 11.30
        emulated(cell("DiT-L/4", "fp16", "full", 32, reserved=11.6, steps_per_s=4.5)),  # 12.10
    ]


EXPECTED = {
    "DiT-B/8 needs 12 GB in fp32": ("not held", "3.50 GiB"),
    "DiT-B/8 needs 6 GB in fp16": ("not held", "3.70 GiB"),
    "DiT-L/4 needs 24 GB in fp32": ("not held", "11.50 GiB"),
    "DiT-L/4 needs 12 GB in fp16": ("held", "11.60 GiB"),
    "DiT-XL/2 needs 48 GB in fp32": ("not measured", "—"),  # out of memory at 23.99: "more than 24"
    "DiT-XL/2 needs 24 GB in fp16": ("held", "20.30 GiB"),
    # 11.6/11.5; DiT-B/8's pair is not judged: 2.7 GiB allocated of which 2.44 are the training state
    "fp16 halves memory": ("not held", "×1.01"),
    "checkpointing saves about 50% memory": ("not held", "×0.97"),
    "checkpointing costs 20-30% more time": ("not held", "×1.54"),
    "DiT-L/4 in fp32 at batch 16 uses 22 GB": ("not held", "11.50 GiB"),
    "DiT-L/4 in fp32 at batch 16 trains at 0.3 steps/s": ("not measured", "—"),  # an H200's speed
    "DiT-L/4 in fp16 at batch 16 uses 11 GB": ("held", "11.60 GiB"),
    "DiT-L/4 in fp16 at batch 16 trains at 0.5 steps/s": ("not measured", "—"),
    "with checkpointing, DiT-L/4 at batch 16 uses 8 GB": ("not held", "11.30 GiB"),
    "with checkpointing, DiT-L/4 at batch 16 trains at 0.4 steps/s": ("not measured", "—"),
    "with checkpointing, DiT-L/4 at batch 32 trains at 0.6 steps/s": ("not measured", "—"),
    "Flash attention is 2-4x faster": ("not measured", "—"),
    "12 GB: DiT-B/8 with fp16": ("held", "3.70 GiB"),
    "24 GB: DiT-L/4 with fp16 and checkpointing, batch 32": ("held", "12.10 GiB"),
    "48 GB: DiT-XL/2 (with several GPUs)": ("held", "20.30 GiB"),
}


def test_the_shipped_claims_get_verdicts_on_an_emulated_run(tmp_path):
    results = check_claims(frame(tmp_path, guide_run()), load_claims(SHIPPED), STEPS)
    got = {r.claim.says: (r.verdict, r.measured) for r in results}
    assert got == EXPECTED
    speed = next(r for r in results if r.claim.says.endswith("trains at 0.3 steps/s"))
    assert (
        "measured 13.6 steps/s, but it ran on NVIDIA H200 (139.8 GiB) capped to 23.99 GiB" in speed.evidence
    )


def run_cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "ditbench", "report", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=cwd,
    )


@pytest.mark.slow
def test_report_cli_claims_section_and_json(tmp_path):
    write_jsonl(tmp_path / "results.jsonl", guide_run())
    out = tmp_path / "report"
    proc = run_cli(tmp_path / "results.jsonl", "--claims", SHIPPED, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "claims: 6 held, 8 not held, 6 not measured" in proc.stdout
    md = (out / "report.md").read_text()
    assert "## Claims checked against this run" in md
    row = "| DiT-L/4 in fp16 at batch 16 uses 11 GB | held | 11.00 GiB ± 15% (9.35–12.65 GiB) | 11.60 GiB |"
    assert row in md
    assert "The claims' speeds are about an RTX 4090" in md
    assert "Time to 400K steps (default: the DiT paper's checkpoint for its model table)" in md
    assert '<td class="not-held">not held</td>' in (out / "report.html").read_text()
    # --json alone: the same verdicts on stdout, no files; a shipped claims file by its name
    js = run_cli(tmp_path / "results.jsonl", "--claims", "dit_resource_guide", "--json")
    assert js.returncode == 0, js.stderr
    doc = json.loads(js.stdout)
    assert Path(doc["claims"]["file"]) == CLAIMS_DIR / "dit_resource_guide.yaml"
    assert doc["files"] == {} and doc["cells"] == 8 and doc["target_steps"]["steps"] == 400_000
    got = {r["says"]: (r["verdict"], r["measured"]) for r in doc["claims"]["results"]}
    assert got == EXPECTED and doc["claims"]["card"] == "RTX 4090"
    first = doc["claims"]["results"][0]
    assert first["accepted"] == pytest.approx([9.0, 15.0]) and first["cells"] == [
        "DiT-B/8 fp32 ckpt=none bs=16"
    ]
    flash = next(r for r in doc["claims"]["results"] if r["says"].startswith("Flash"))
    assert flash["accepted"] == [2.0, 4.0] and flash["compare"]["to"] == {"attention": "flash"}
    at_most = [r for r in doc["claims"]["results"] if r["expect"] == "fits"]
    assert all(r["accepted"][0] is None for r in at_most)  # -inf is written as null, not -Infinity
    assert {a["verdict"] for a in doc["advice"]} <= {"held", "not held", "not measured"}


@pytest.mark.slow
def test_report_cli_refuses_a_bad_claims_file_before_any_work(tmp_path):
    write_jsonl(tmp_path / "results.jsonl", guide_run())
    bad = tmp_path / "bad.yaml"
    bad.write_text("claims:\n  - says: x\n    metric: peak_memory\n    value: 3\n")
    out = tmp_path / "never"
    proc = run_cli(tmp_path / "results.jsonl", "--claims", bad, "--out", out)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    err = " ".join(proc.stderr.split())  # the CLI wraps the paragraph
    assert "claims[0].metric" in err and "Did you mean `peak_memory_gb`?" in err
    assert not out.exists()
    neither = run_cli(tmp_path / "results.jsonl")
    assert neither.returncode == 2 and "give --out DIR" in neither.stderr
    steps = run_cli(tmp_path / "results.jsonl", "--json", "--target-steps", "0")
    assert steps.returncode == 2 and "positive number of steps" in steps.stderr


# ----------------------------------------------- every shipped claim: held, not held, not measured

BASE = {"model": "DiT-B/8", "precision": "fp32", "grad_ckpt": "none", "batch_size": 16}


def _record(knobs, *, memory=None, steps_per_s=None, status="ok", card=None, budget=23.99):
    """One cell: memory as the fit figure (reserved + 0.5 GiB context, on an emulated card), or a
    speed measured on a real RTX 4090 (the card the shipped claims name)."""
    knobs = dict(knobs)
    model, precision, ckpt, bs = (knobs.pop(k) for k in ("model", "precision", "grad_ckpt", "batch_size"))
    if status != "ok":
        return emulated(cell(model, precision, ckpt, bs, status=status, **knobs), card=card, budget=budget)
    rec = cell(
        model,
        precision,
        ckpt,
        bs,
        reserved=memory - 0.5 if memory else 5.0,
        steps_per_s=steps_per_s or 1.0,
        **knobs,
    )
    return emulated(rec) if memory is not None else on_card(rec, RTX4090_ENV)


def records_for(claim, inside: bool) -> list[dict]:
    """Records whose values put the claim inside (held) or outside (not held) its interval."""
    one = {k: (v[0] if isinstance(v, list) else v) for k, v in claim.cell.items()}
    knobs = {**BASE, **one}
    if claim.kind == "fits":
        if inside:
            return [_record(knobs, memory=claim.fits_gib / 2)]
        card = claim.fits_card or "RTX 4090"
        return [_record(knobs, status="oom", card=card, budget=claim.fits_gib)]  # over its own card
    finite = [x for x in (claim.low, claim.high) if x != float("inf") and x != float("-inf")]
    target = sum(finite) / len(finite) if inside else max(finite) * 2
    memory = claim.metric.startswith("peak_")
    if claim.kind == "cell":
        value = {"steps_per_s": target, "step_time": 1 / target}.get(claim.metric, target)
        return [_record(knobs, memory=value) if memory else _record(knobs, steps_per_s=value)]
    a, b = {**knobs, **claim.change_from}, {**knobs, **claim.change_to}
    if memory:
        return [_record(a, memory=10.0), _record(b, memory=10.0 * target)]
    if claim.metric == "step_time":  # step time ratio to/from = steps/s from/to
        return [_record(a, steps_per_s=2.0), _record(b, steps_per_s=2.0 / target)]
    return [_record(a, steps_per_s=2.0), _record(b, steps_per_s=2.0 * target)]


@pytest.mark.parametrize("says", [c.says for c in load_claims(SHIPPED).claims])
def test_each_shipped_claim_can_hold_fail_and_go_unmeasured(tmp_path, says):
    claims = load_claims(SHIPPED)
    (claim,) = [c for c in claims.claims if c.says == says]
    one = dataclasses.replace(claims, claims=[claim])  # a file holding this claim alone
    for inside, verdict in ((True, "held"), (False, "not held")):
        df = frame(tmp_path, records_for(claim, inside), f"{inside}.jsonl")
        (result,) = check_claims(df, one, STEPS)
        assert result.verdict == verdict, (inside, result.evidence)
        assert result.cells and result.measured != "—"
    elsewhere = frame(tmp_path, [make_record("DiT-S/8")], "other.jsonl")
    (result,) = check_claims(elsewhere, one, STEPS)
    assert result.verdict == "not measured" and result.measured == "—"


def test_a_claim_may_name_a_quality_metric_of_the_registry(tmp_path):
    """FID and the other quality outputs come from the cell's last evaluation, on any card."""

    def evaluated(precision, fids):
        r = make_record("DiT-S/8", precision, "none", 8, device="cpu")
        r["quality"] = {"evaluations": [{"step": s, "metrics": {"fid": f}} for s, f in enumerate(fids)]}
        return r

    df = frame(tmp_path, [evaluated("fp32", [90.0, 30.0]), evaluated("bf16", [95.0, 33.0])])
    doc = {
        "card": "RTX 4090",  # quality is not a speed: where it ran does not matter
        "claims": [
            {"says": "fp32 reaches FID 32", "cell": {"precision": "fp32"}, "metric": "fid", "at_most": 32},
            {"says": "bf16 reaches FID 32", "cell": {"precision": "bf16"}, "metric": "fid", "at_most": 32},
            {
                "says": "bf16 costs 10% FID",
                "compare": {"from": {"precision": "fp32"}, "to": {"precision": "bf16"}},
                "metric": "fid",
                "ratio": 1.1,
            },
            {"says": "IS above 2", "cell": {"precision": "fp32"}, "metric": "inception_score", "at_least": 2},
        ],
    }
    got = verdicts(df, doc)
    assert got["fp32 reaches FID 32"].verdict == "held" and got["fp32 reaches FID 32"].measured == "30.0000"
    assert got["bf16 reaches FID 32"].verdict == "not held"
    assert got["bf16 costs 10% FID"].verdict == "held" and got["bf16 costs 10% FID"].measured == "×1.10"
    assert got["IS above 2"].verdict == "not measured"
    assert "no quality evaluation of the record has inception_score" in got["IS above 2"].evidence
    with pytest.raises(UserError, match="Did you mean `fid`"):
        parse_claims({"claims": [{"says": "x", "metric": "fdi", "value": 3}]}, "c.yaml")


def test_shipped_claims_resolve_by_name_like_suites(tmp_path, monkeypatch):
    shipped = CLAIMS_DIR / "dit_resource_guide.yaml"
    assert SHIPPED.resolve() == shipped  # the repository's claims/ links to the package's
    monkeypatch.chdir(tmp_path)
    assert resolve_claims("dit_resource_guide") == resolve_claims("dit_resource_guide.yaml") == shipped
    (tmp_path / "dit_resource_guide.yaml").write_text("claims: []\n")  # a file of that name wins
    assert resolve_claims("dit_resource_guide.yaml") == Path("dit_resource_guide.yaml")
    with pytest.raises(UserError, match="no shipped claims file of that name.*dit_resource_guide"):
        resolve_claims("dit_resource_gide")
    with pytest.raises(UserError, match="no shipped claims file"):
        resolve_claims("sub/dit_resource_guide")  # a path is a path, never a name
