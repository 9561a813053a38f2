"""report/gate/quality.py checked function by function (issue 27, mutation testing).

Each expectation is worked out here from quality.py's stated policy: a change counts when
|new - base| > k * sqrt(sb^2 + sn^2); the change's interval is (new - base) +- that bound in percent
of |base|; a crossing whose interval straddles the threshold is inconclusive; an improvement whose
interval's worse end is above -T is noise. The spreads are chosen so that the bound is exact in binary
(hypot(3, 4) = 5, hypot(0, 2) = 2), and every message is written out in full.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from synthetic_records import make_record

from ditbench.records.metrics import table
from ditbench.records.model import Evaluation, Record, check
from ditbench.report.gate.inputs import Row
from ditbench.report.gate.policy import Rule
from ditbench.report.gate.quality import QualityMismatchError, _judge, check_identity, compare_quality
from ditbench.report.quality import (
    IDENTITY,
    SAMPLE_COUNT,
    Noise,
    Quality,
    evaluation_noise,
    noise_rule,
    read_quality,
)

FID = table()["fid"]  # lower is better, non-negative
IS = table()["inception_score"]  # higher is better
KID = table()["kid"]  # any value
SHA = "a" * 64
SAMPLER = {"steps": 250, "name": "ddpm", "cfg_scale": 1.5}
SAMPLER_TEXT = '{"cfg_scale": 1.5, "name": "ddpm", "steps": 250}'  # sorted keys, JSON
UNKNOWN = (
    "noise unknown: neither run recorded a spread or a bootstrap SE (one seed, --bootstrap 0?), so "
    "the threshold alone decided"
)
ONE_SIDE = "only one run recorded a spread; it stands for both"


def q(evs=None, **change):
    """A record's quality section (its JSON: read_quality types it by the record's model)."""
    out = {
        "inception": {"sha256": SHA, "official": True},
        "reference": {"digest": "sha256:ref"},
        "sampler": dict(SAMPLER),
        "samples": 5000,
        "evaluations": [{"step": 10, "metrics": {"fid": 20.0}}] if evs is None else evs,
    }
    out.update(change)
    return out


def refused(quality: dict) -> str | None:
    """What the record model says of a record with this quality section (the gate never sees it)."""
    got, why = check({**make_record(), "quality": quality})
    assert got is None
    return why


def rule(t=2.0, min_abs=0.0):
    return Rule(threshold_pct=t, min_abs=min_abs)


# ------------------------------------------------------------------------------------------ read_quality


def test_a_record_without_quality_has_none_and_no_problem():
    assert read_quality(None) == (None, None)
    assert read_quality(Record.model_validate(make_record()).quality) == (None, None)


def test_a_quality_field_is_read_into_its_identity_and_evaluations():
    e0 = {"step": 0, "metrics": {"fid": 30.0}, "spread": None}
    e1 = {"step": 7, "metrics": {"fid": 20.0}, "spread": {"fid": 0.5}, "bootstrap_se": {"fid": 0.2}}
    got, why = read_quality(q([e1, e0]))
    assert why is None
    assert got == Quality(
        {
            "Inception weights (sha256)": SHA,
            "reference batch (digest)": "sha256:ref",
            "sampler": SAMPLER_TEXT,
            "samples per evaluation": 5000,
        },
        True,
        {7: Evaluation.model_validate(e1), 0: Evaluation.model_validate(e0)},
    )
    assert list(got.identity) == [label for label, _ in IDENTITY]


def test_the_sampler_is_compared_canonically_whatever_its_values():
    got, why = read_quality(q(sampler={"name": "ddim", "path": Path("a/b")}))
    assert why is None
    assert got.identity["sampler"] == '{"name": "ddim", "path": "a/b"}'


@pytest.mark.parametrize(("official", "expected"), [(True, True), (False, False), (None, None)])
def test_the_official_flag_is_kept_only_as_a_boolean(official, expected):
    got, _ = read_quality(q(inception={"sha256": SHA, "official": official}))
    assert got.official is expected
    assert refused(q(inception={"sha256": SHA, "official": "yes"})) == (
        "quality.inception.official is 'yes', not true or false"
    )


def test_one_sample_is_a_positive_sample_count():
    got, why = read_quality(q(samples=1))
    assert why is None and got.identity[SAMPLE_COUNT] == 1


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"sampler": None}, "quality.sampler is None, not an object such as {name, steps, cfg_scale}"),
        ({"sampler": {}}, "quality.sampler is {}, not an object such as {name, steps, cfg_scale}"),
        ({"samples": 0}, "quality.samples is 0, not a positive number of samples"),
        ({"samples": -3}, "quality.samples is -3, not a positive number of samples"),
        ({"samples": None}, "quality.samples is None, not a positive number of samples"),
        ({"inception": {"sha256": ""}}, "quality.inception.sha256 is '', not a non-empty string"),
        ({"inception": {"name": "x"}}, "quality.inception.sha256 is None, not a non-empty string"),
        ({"inception": None}, "quality.inception.sha256 is None, not a non-empty string"),
        ({"reference": {"digest": None}}, "quality.reference.digest is None, not a non-empty string"),
        ({"evaluations": None}, "quality.evaluations is None, not a non-empty list"),
        ({"evaluations": []}, "quality.evaluations is [], not a non-empty list"),
    ],
)
def test_a_broken_identity_or_evaluation_list_is_named_in_full(change, why):
    assert read_quality(q(**change)) == (None, why)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"sampler": "ddpm"}, "quality.sampler is 'ddpm', not an object"),
        ({"samples": True}, "quality.samples is True, not an integer"),
        ({"samples": 5000.0}, "quality.samples is 5000.0, not an integer"),
        ({"inception": {"sha256": 5}}, "quality.inception.sha256 is 5, not a string"),
        ({"inception": [SHA]}, f"quality.inception is ['{SHA}'], not an object"),
        ({"evaluations": {"step": 1}}, "quality.evaluations is {'step': 1}, not a list"),
    ],
)
def test_an_identity_or_evaluation_list_of_the_wrong_type_never_reaches_the_gate(change, why):
    assert refused(q(**change)) == why


GOOD = {"step": 1, "metrics": {}}


@pytest.mark.parametrize(
    ("evaluations", "why"),
    [
        ([GOOD, {"step": 2, "metrics": {}}, GOOD], "quality.evaluations[2].step 1 appears twice"),
        (
            [{"step": 3, "metrics": {}}, {"step": 3, "metrics": {}}],
            "quality.evaluations[1].step 3 appears twice",
        ),
    ],
)
def test_a_step_evaluated_twice_is_named_by_index(evaluations, why):
    assert read_quality(q(evaluations)) == (None, why)


@pytest.mark.parametrize(
    ("evaluations", "why"),
    [
        ([GOOD, 3], "quality.evaluations[1] is 3, not an object"),
        ([{"step": True, "metrics": {}}], "quality.evaluations[0].step is True, not an integer"),
        ([{"step": -1, "metrics": {}}], "quality.evaluations[0].step is -1, not a number >= 0"),
        ([{"step": 2.0, "metrics": {}}], "quality.evaluations[0].step is 2.0, not an integer"),
        ([{"metrics": {}}], "quality.evaluations[0].step is missing"),
        ([GOOD, {"step": 2}], "quality.evaluations[1].metrics is missing"),
        ([{"step": 1, "metrics": [1]}], "quality.evaluations[0].metrics is [1], not an object"),
        ([{"step": 1, "metrics": {}, "spread": [1]}], "quality.evaluations[0].spread is [1], not an object"),
        (
            [{"step": 1, "metrics": {}, "bootstrap_se": 0.5}],
            "quality.evaluations[0].bootstrap_se is 0.5, not an object",
        ),
        # the first problem in the list is the one named
        ([{"step": -1}, 3], "quality.evaluations[0].step is -1, not a number >= 0"),
        (
            [{"step": 1, "metrics": {}, "spread": 1, "bootstrap_se": 2}],
            "quality.evaluations[0].spread is 1, not an object",
        ),
    ],
)
def test_a_broken_evaluation_never_reaches_the_gate_and_is_named_by_index_and_field(evaluations, why):
    assert refused(q(evaluations)) == why


def test_step_zero_and_absent_spreads_are_valid():
    e = {"step": 0, "metrics": {"fid": 1.0}}
    got, why = read_quality(q([e]))
    assert why is None and got.evaluations == {0: Evaluation.model_validate(e)}


# ------------------------------------------------------------------------------------------ identity


def row(side, line, cell_id="c1", name="DiT-S/8 fp32"):
    record = Record.model_validate({**make_record(), "cell_id": cell_id, "cell_name": name})
    return Row(side, f"{side.lower()}.jsonl line {line}", record)


def ident(sha=SHA, digest="sha256:ref", sampler=SAMPLER_TEXT, n=5000):
    values = {"Inception weights (sha256)": sha, "reference batch (digest)": digest, "sampler": sampler}
    return Quality({**values, SAMPLE_COUNT: n}, True, {})


def test_the_same_identity_passes_with_no_note():
    assert check_identity(row("BASE", 1), ident(), row("NEW", 2), ident()) is None


def test_a_different_sample_count_refuses_by_default_and_names_the_policy_key():
    base, new = row("BASE", 3), row("NEW", 4)
    with pytest.raises(QualityMismatchError) as err:
        check_identity(base, ident(), new, ident(n=10000))
    assert err.value.differences == [("samples per evaluation", 5000, 10000)]
    assert str(err.value) == (
        "NEW new.jsonl line 4, cell `DiT-S/8 fp32` (c1) and base.jsonl line 3: the quality metrics were made "
        "differently (samples per evaluation: 5000 (base) vs 10000 (new)). FID, IS and the others depend on "
        "the Inception weights, the reference batch, the sampler and the sample count (FID's upward bias "
        "depends on the number of samples N), so numbers made differently are not comparable and the gate "
        "refuses (exit 2). Evaluate both runs the same way, or turn the quality metrics off in the policy; "
        "to compare different N anyway, set allow_sample_count_mismatch: true in the policy."
    )
    assert err.value.exit_code == 2
    assert err.value.title == "refused, quality measured differently"


def test_a_different_sample_count_allowed_by_policy_is_a_weak_note():
    note = check_identity(row("BASE", 1), ident(), row("NEW", 2), ident(n=10000), allow_n=True)
    assert note == "N 5000 (base) vs 10000 (new): FID's bias depends on N"


def test_allowing_n_does_not_allow_the_other_differences():
    with pytest.raises(QualityMismatchError) as err:
        check_identity(
            row("BASE", 1), ident(), row("NEW", 2), ident(digest="sha256:other", n=10), allow_n=True
        )
    assert err.value.differences == [("reference batch (digest)", "sha256:ref", "sha256:other")]
    assert str(err.value).endswith(
        "(reference batch (digest): 'sha256:ref' (base) vs 'sha256:other' (new)). FID, IS and the others "
        "depend on the Inception weights, the reference batch, the sampler and the sample count (FID's "
        "upward bias depends on the number of samples N), so numbers made differently are not comparable "
        "and the gate refuses (exit 2). Evaluate both runs the same way, or turn the quality metrics off in "
        "the policy."
    )


def test_every_difference_is_listed_in_the_identity_order_and_long_values_are_cut_at_70():
    long_b, long_n = "b" * 100, "n" * 100
    with pytest.raises(QualityMismatchError) as err:
        check_identity(
            row("BASE", 1), ident(sampler=long_b, n=1), row("NEW", 2), ident(sha="f" * 64, sampler=long_n)
        )
    assert err.value.differences == [
        ("Inception weights (sha256)", SHA, "f" * 64),
        ("sampler", long_b, long_n),
        ("samples per evaluation", 1, 5000),
    ]
    # a value's repr (quotes included) cut to 69 characters, an ellipsis and the string's length
    cut_b, cut_n = "'" + "b" * 68 + "… (100 characters)", "'" + "n" * 68 + "… (100 characters)"
    assert (
        f"(Inception weights (sha256): '{SHA}' (base) vs '{'f' * 64}' (new); sampler: {cut_b} (base) vs "
        f"{cut_n} (new); samples per evaluation: 1 (base) vs 5000 (new))."
    ) in str(err.value)
    assert str(err.value).endswith("allow_sample_count_mismatch: true in the policy.")
    assert err.value.markdown() == (
        "## ⛔ ditbench compare: refused, quality measured differently\n\n"
        + " ".join(str(err.value).split())
        + "\n"
    )


# ------------------------------------------------------------------------------------------ noise


@pytest.mark.parametrize(
    ("evaluation", "expected"),
    [
        ({}, (None, None)),
        ({"spread": None, "bootstrap_se": None}, (None, None)),
        ({"spread": {"kid": 1.0}}, (None, None)),
        ({"spread": {"fid": 0.3}}, (0.3, None)),
        ({"bootstrap_se": {"fid": 0.4}}, (0.4, None)),
        ({"spread": {"fid": 0.3}, "bootstrap_se": {"fid": 0.5}}, (0.5, None)),  # the larger of the two
        ({"spread": {"fid": 0.7}, "bootstrap_se": {"fid": 0.5}}, (0.7, None)),
        ({"spread": {"fid": 0}, "bootstrap_se": None}, (0.0, None)),
        ({"spread": {"fid": -0.5}}, (None, "spread.fid is -0.5, not a spread (>= 0)")),
        ({"bootstrap_se": {"fid": -2}}, (None, "bootstrap_se.fid is -2, not a spread (>= 0)")),
        ({"spread": {"fid": math.inf}}, (None, "spread.fid is inf, not a finite number")),
        (
            {"spread": {"fid": -1}, "bootstrap_se": {"fid": "a"}},
            (None, "spread.fid is -1, not a spread (>= 0)"),
        ),
    ],
)
def test_an_evaluations_noise_is_the_larger_recorded_spread(evaluation, expected):
    got = evaluation_noise(evaluation, "fid")
    assert got == expected
    if got[0] is not None:
        assert type(got[0]) is float


def test_a_spread_that_is_no_number_never_reaches_the_gate():
    evaluation = {"step": 0, "metrics": {}, "bootstrap_se": {"fid": "a"}}
    assert refused(q([evaluation])) == "quality.evaluations[0].bootstrap_se.fid is 'a', not a number"


def test_with_no_spread_the_noise_is_unknown():
    assert noise_rule(10.0, 30.0, None, None, 2.0) == Noise(None, None, UNKNOWN)


@pytest.mark.parametrize(("n", "beyond"), [(20.0, False), (20.5, True), (0.0, False), (-0.5, True)])
def test_the_noise_bound_is_k_times_the_root_sum_of_squares(n, beyond):
    # k = 2, spreads 3 and 4: bound 2 x 5 = 10; |n - b| must exceed it
    assert noise_rule(10.0, n, 3.0, 4.0, 2.0) == Noise(10.0, beyond, None)


@pytest.mark.parametrize(("sb", "sn"), [(None, 3.0), (3.0, None)])
def test_a_spread_on_one_side_stands_for_both(sb, sn):
    bound = 2.0 * math.sqrt(3.0**2 + 3.0**2)
    got = noise_rule(0.0, 8.4, sb, sn, 2.0)
    assert got.bound == pytest.approx(bound, rel=1e-12)
    assert got.beyond is False  # 8.4 <= 8.485
    assert got.weak_reason == ONE_SIDE
    assert noise_rule(0.0, 8.5, sb, sn, 2.0).beyond is True


def test_a_bound_beyond_the_float_range_is_infinite_and_nothing_exceeds_it():
    assert noise_rule(0.0, 1e308, 1e308, 1e308, 2.0) == Noise(math.inf, False, None)
    assert noise_rule(0.0, 1.0, math.inf, 0.0, 0.0) == Noise(math.inf, False, None)  # 0 x inf is nan


# ------------------------------------------------------------------------------------------ _judge


def judged(metric, b, n, sb, sn, t=2.0, k=2.0, min_abs=0.0, step=7):
    return _judge(metric, rule(t, min_abs), b, n, sb, sn, k, step)


def test_a_fid_worse_beyond_noise_and_wholly_beyond_the_threshold_is_a_regression():
    d = judged(FID, 100.0, 120.0, 3.0, 4.0)  # bound 10: change +20% +- 10%
    assert (d.metric, d.label, d.base, d.new, d.change_pct, d.threshold_pct) == (
        "fid",
        "FID",
        100.0,
        120.0,
        20.0,
        2.0,
    )
    assert d.verdict == "regression"
    assert d.significance == "beyond noise: |Δ| 20 > 2σ 10 (step 7); change +10.0% to +30.0%"
    assert (d.direction, d.step, d.noise, d.interval_pct) == ("worse", 7, 10.0, [10.0, 30.0])
    assert (d.weak, d.weak_reason, d.p_value, d.interval_level) == (False, None, None, None)


def test_a_fid_worse_within_noise_straddling_the_threshold_is_inconclusive():
    d = judged(FID, 100.0, 105.0, 3.0, 4.0, k=2.5)  # bound 12.5: +5% +- 12.5%
    assert d.significance == "within noise: |Δ| 5 ≤ 2.5σ 12.5 (step 7); change -7.5% to +17.5%"
    assert d.interval_pct == [-7.5, 17.5]
    assert d.verdict == "inconclusive"


def test_an_interval_starting_at_the_threshold_is_inconclusive():
    d = judged(FID, 100.0, 112.0, 3.0, 4.0)  # +12% +- 10%: 2% to 22%, T = 2
    assert d.interval_pct == [2.0, 22.0]
    assert d.verdict == "inconclusive"


def test_an_interval_ending_at_the_threshold_is_no_doubt_about_a_small_change():
    d = judged(FID, 100.0, 101.0, 0.0, 2.0, k=0.5)  # bound 0.5 x 2 = 1: 0% to 2%, T = 2
    assert d.interval_pct == [0.0, 2.0]
    assert (d.verdict, d.direction) == ("unchanged", "worse")


def test_an_uncrossed_change_straddling_the_threshold_is_inconclusive_only_from_min_abs():
    # +1% +- 5% (-4% to +6%) straddles T = 2 without crossing it; |Δ| = 1
    assert judged(FID, 100.0, 101.0, 0.0, 2.0, k=2.5, min_abs=1.0).verdict == "inconclusive"
    assert judged(FID, 100.0, 101.0, 0.0, 2.0, k=2.5, min_abs=1.5).verdict == "unchanged"


def test_a_higher_is_better_metric_lower_beyond_noise_is_a_regression():
    d = judged(IS, 100.0, 80.0, 3.0, 4.0)  # -20% +- 10%: worse by 10% to 30%
    assert (d.verdict, d.direction, d.interval_pct) == ("regression", "worse", [-30.0, -10.0])


def test_a_higher_is_better_metric_higher_within_noise_across_the_threshold_is_inconclusive():
    d = judged(IS, 100.0, 105.0, 3.0, 4.0)  # +5% +- 10%: worse by -15% to +5%, T = 2
    assert (d.verdict, d.direction) == ("inconclusive", "better")


def test_an_improvement_wholly_better_than_the_threshold_stands():
    d = judged(IS, 100.0, 120.0, 3.0, 4.0)  # +10% to +30%
    assert (d.verdict, d.direction) == ("improvement", "better")
    d = judged(FID, 100.0, 88.0, 3.0, 4.0)  # -22% to -2%: its worse end is exactly -T
    assert (d.verdict, d.interval_pct) == ("improvement", [-22.0, -2.0])


def test_an_improvement_beyond_noise_whose_interval_reaches_past_minus_the_threshold_is_noise():
    d = judged(FID, 100.0, 89.0, 3.0, 4.0)  # |Δ| 11 > 10, but -21% to -1%: -1 > -2
    assert d.significance == "beyond noise: |Δ| 11 > 2σ 10 (step 7); change -21.0% to -1.0%"
    assert (d.verdict, d.direction) == ("noise", "better")
    d = judged(IS, 100.0, 111.0, 3.0, 4.0)  # +1% to +21%
    assert d.verdict == "noise"


def test_without_any_spread_the_threshold_decides_and_a_crossing_is_weak():
    d = judged(FID, 100.0, 120.0, None, None)
    assert d.significance == "noise unknown (threshold decides; step 7)"
    assert (d.verdict, d.weak, d.weak_reason) == ("regression", True, UNKNOWN)
    assert (d.noise, d.interval_pct) == (None, None)
    d = judged(FID, 100.0, 101.0, None, None, step=3)  # +1%: not crossed, so not weak
    assert d.significance == "noise unknown (threshold decides; step 3)"
    assert (d.verdict, d.weak, d.weak_reason) == ("unchanged", False, None)


def test_a_one_sided_spread_makes_a_crossing_weak():
    d = judged(FID, 100.0, 120.0, None, 2.5)  # bound 2 x hypot(2.5, 2.5) = 7.07
    assert (d.verdict, d.weak, d.weak_reason) == ("regression", True, ONE_SIDE)
    assert d.noise == pytest.approx(5.0 * math.sqrt(2.0), rel=1e-12)
    d = judged(FID, 100.0, 100.5, 2.5, None, min_abs=1.0)  # -6.6% to +7.6%, but |Δ| < min_abs
    assert (d.verdict, d.weak, d.weak_reason) == ("unchanged", False, None)


def test_from_a_base_of_zero_there_is_no_interval():
    d = judged(KID, 0.0, 0.5, 0.0, 0.125, k=2.0)  # bound 0.25
    assert d.significance == "beyond noise: |Δ| 0.5 > 2σ 0.25 (step 7)"
    assert (d.change_pct, d.interval_pct, d.noise, d.verdict) == (None, None, 0.25, "regression")


def test_an_infinite_bound_gives_neither_interval_nor_noise_figure():
    d = judged(FID, 100.0, 120.0, 1e308, 1e308)
    assert d.significance == "within noise: |Δ| 20 ≤ 2σ inf (step 7)"
    assert (d.interval_pct, d.noise, d.verdict) == (None, None, "noise")


def test_the_difference_is_printed_to_three_significant_figures():
    d = judged(FID, 10.0, 10.123456, 0.0, 0.03125, k=1.0)
    assert d.significance.startswith("beyond noise: |Δ| 0.123 > 1σ 0.0312 (step 7); change ")


# ------------------------------------------------------------------------------------------ compare_quality


def quality(evaluations: dict[int, Evaluation]) -> Quality:
    return Quality({}, True, evaluations)


def ev(metrics, spread=None, bootstrap_se=None) -> Evaluation:
    raw = {"step": 0, "metrics": metrics, "spread": spread, "bootstrap_se": bootstrap_se}
    return Evaluation.model_validate(raw)


GATED = [(FID, rule()), (IS, rule())]


def test_without_a_common_step_every_gated_metric_is_a_problem_of_new():
    qb = quality({2: ev({}), 1: ev({})})
    qn = quality({3: ev({})})
    text = "quality has no evaluation at a training step both runs have (base steps [1, 2], new steps [3])"
    assert compare_quality(qb, qn, GATED, 2.0) == (
        [],
        [],
        [("NEW", "fid", text), ("NEW", "inception_score", text)],
    )


def test_the_last_step_both_runs_have_is_compared():
    qb = quality({1: ev({"fid": 50.0}), 3: ev({"fid": 100.0}, {"fid": 3.0}), 2: ev({"fid": 1.0}), 9: ev({})})
    qn = quality({2: ev({"fid": 9.0}), 3: ev({"fid": 120.0}, {"fid": 4.0}), 4: ev({"fid": 1.0})})
    deltas, not_measured, problems = compare_quality(qb, qn, [(FID, rule())], 2.0)
    assert (not_measured, problems) == ([], [])
    assert len(deltas) == 1
    d = deltas[0]
    assert (d.metric, d.base, d.new, d.step, d.noise, d.verdict) == (
        "fid",
        100.0,
        120.0,
        3,
        10.0,
        "regression",
    )
    assert d.interval_pct == [10.0, 30.0]


def test_the_noise_of_each_side_goes_with_its_own_side():
    # base spread 0, new spread 2, k = 0.5: bound 1, so |Δ| 1.5 is beyond noise (+0.5% to +2.5%)
    qb = quality({5: ev({"fid": 100.0}, {"fid": 0.0})})
    qn = quality({5: ev({"fid": 101.5}, None, {"fid": 2.0})})
    (d,), _, _ = compare_quality(qb, qn, [(FID, rule(t=0.25))], 0.5)
    assert (d.noise, d.weak, d.verdict) == (1.0, False, "regression")


def test_a_metric_neither_run_measured_is_listed_and_one_missing_on_one_side_is_a_problem():
    qb = quality({4: ev({"fid": 10.0})})
    qn = quality({4: ev({"inception_score": 100.0})})
    deltas, not_measured, problems = compare_quality(
        qb, qn, [(FID, rule()), (IS, rule()), (KID, rule())], 2.0
    )
    assert deltas == []
    assert not_measured == ["kid"]
    assert problems == [
        ("NEW", "fid", "quality.evaluations[step 4].metrics.fid is missing"),
        ("BASE", "inception_score", "quality.evaluations[step 4].metrics.inception_score is missing"),
    ]


def test_a_metric_neither_run_measured_does_not_stop_the_next_one():
    qb, qn = quality({4: ev({"fid": 100.0})}), quality({4: ev({"fid": 100.0})})
    (d,), not_measured, problems = compare_quality(qb, qn, [(KID, rule()), (FID, rule())], 2.0)
    assert (d.metric, d.verdict, not_measured, problems) == ("fid", "unchanged", ["kid"], [])


@pytest.mark.parametrize(
    ("eb", "en", "problem"),
    [
        (
            ev({"fid": -1.0}),
            ev({"fid": 1.0}),
            ("BASE", "fid", "quality.evaluations[step 6].metrics.fid is -1, not a non-negative value"),
        ),
        (
            ev({"fid": 1.0}),
            ev({"fid": math.nan}),
            ("NEW", "fid", "quality.evaluations[step 6].metrics.fid is nan, not a finite number"),
        ),
        # both sides bad: the base's problem is the one named
        (
            ev({"fid": -1.0}),
            ev({"fid": math.nan}),
            ("BASE", "fid", "quality.evaluations[step 6].metrics.fid is -1, not a non-negative value"),
        ),
        (
            ev({"fid": 1.0}, {"fid": -0.5}),
            ev({"fid": 1.0}),
            ("BASE", "fid", "quality.evaluations[step 6].spread.fid is -0.5, not a spread (>= 0)"),
        ),
        (
            ev({"fid": 1.0}),
            ev({"fid": 1.0}, None, {"fid": -math.inf}),
            ("NEW", "fid", "quality.evaluations[step 6].bootstrap_se.fid is -inf, not a finite number"),
        ),
        # a bad value and a bad spread: the value is named
        (
            ev({"fid": -2.0}, {"fid": -0.5}),
            ev({"fid": 1.0}),
            ("BASE", "fid", "quality.evaluations[step 6].metrics.fid is -2, not a non-negative value"),
        ),
    ],
)
def test_a_bad_value_or_spread_is_a_problem_of_its_side(eb, en, problem):
    qb, qn = quality({6: eb}), quality({6: en})
    deltas, not_measured, problems = compare_quality(qb, qn, [(FID, rule()), (IS, rule())], 2.0)
    assert problems == [problem]
    assert (deltas, not_measured) == ([], ["inception_score"])  # the next metric is still judged


def test_a_value_of_zero_is_valid_for_a_non_negative_metric():
    qb, qn = quality({1: ev({"fid": 0.0})}), quality({1: ev({"fid": 0.0})})
    (d,), not_measured, problems = compare_quality(qb, qn, [(FID, rule())], 2.0)
    assert (d.base, d.new, d.verdict, not_measured, problems) == (0.0, 0.0, "unchanged", [], [])
