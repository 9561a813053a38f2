"""The gate's per-metric verdict (report/gate/timing.py `judge`) branch by branch, with the p-value,
the median shift and the step-time ratio interval given, so each expectation follows from the policy
written in timing.py's docstring: the significance text, the verdict, the flags and the interval.
Also the quality metrics' table entries, the sample count's " runs" suffix and sub-unit medians.
Written for the mutation run (reports/mutation/gate.md)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from synthetic_records import H200_ENV, make_record, write_jsonl
from test_gate_quality import evaluation, quality
from test_gate_quality import run as _gate  # records and a policy text to a Comparison

from ditbench.core.errors import UserError
from ditbench.records.metrics import HIGHER, LOWER, QUALITY, Metric, table
from ditbench.report.gate.decide import NothingComparedError
from ditbench.report.gate.policy import Policy, Rule
from ditbench.report.gate.timing import StepTest, _interval_text, judge

STEP = table()["step_ms"]  # a time: lower is better, so the change's interval is the ratio's
RATE = table()["images_per_s"]  # a rate: moves as 1 / step time
MEMORY_METRIC = table()["peak_mem_allocated_gib"]  # no per-step samples


def given(p=None, shift=None, ratio=None, n=(20, 20), unit="steps", alpha=0.01) -> StepTest:
    """A StepTest whose rank test gave (p, shift) and whose bootstrap gave `ratio` (point, low, high).
    Without a ratio the samples are 0 ms (a median of 0 has no ratio)."""
    value = 1.0 if ratio is not None else 0.0
    return StepTest(
        [value] * n[0],
        [value] * n[1],
        Policy(alpha=alpha, min_samples=5),
        unit=unit,
        _result=None if p is None else (p, shift),
        _ratio=ratio,
    )


def verdict(metric, b, n, test, threshold=5.0, min_abs=0.0, weak=None) -> tuple[dict, bool]:
    delta, untested = judge(metric, Rule(threshold_pct=threshold, min_abs=min_abs), b, n, test, weak)
    return asdict(delta), untested


# ---- the table and the small helpers ---------------------------------------------------------


def test_the_table_holds_the_registrys_quality_outputs_as_declared():
    # As the metric modules declare them (fid.py, inception_score.py, kid.py, prdc.py): key, label,
    # which way is better, valid values (non-negative unless said), default threshold (FID and IS: 2%).
    t = table()
    assert t["fid"] == Metric("fid", "fid", LOWER, "FID", QUALITY, "non-negative", threshold_pct=2.0)
    assert t["inception_score"] == Metric(
        "inception_score",
        "inception_score",
        HIGHER,
        "Inception Score",
        QUALITY,
        "non-negative",
        threshold_pct=2.0,
    )
    assert t["kid"] == Metric("kid", "kid", LOWER, "KID", QUALITY, "any")
    assert t["recall"] == Metric("recall", "recall", HIGHER, "Recall", QUALITY, "non-negative")
    assert not t["fid"].timed and t["kid"].threshold_pct is None and not t["kid"].core
    assert list(t)[:2] == ["images_per_s", "images_per_s_per_gpu"]  # the record's metrics first


def test_the_sample_count_names_runs_when_the_samples_are_runs():
    policy = Policy(alpha=0.01, min_samples=5)
    assert StepTest([1.0] * 4, [1.0] * 5, policy, unit="runs").why_not() == "n=4/5 runs < 5"
    assert StepTest([1.0] * 4, [1.0] * 5, policy).why_not() == "n=4/5 < 5"
    strict = Policy(alpha=0.005, min_samples=5)
    assert StepTest([1.0] * 5, [1.0] * 6, strict, unit="runs").why_not() == "n=5/6 runs cannot reach p<0.005"


@pytest.mark.parametrize(
    "base,new,ratio",
    [(0.02, 0.025, 1.25), (0.5, 2.0, 4.0), (2.0, 0.5, 0.25)],  # step times in seconds: medians below 1
)
def test_the_ratio_of_medians_below_one(base, new, ratio):
    # Constant samples: every resample has the same medians, so the interval is the point.
    test = StepTest([base] * 6, [new] * 6, Policy(alpha=0.01, min_samples=5))
    assert test.ratio() == pytest.approx((ratio, ratio, ratio))


def test_the_interval_text():
    assert _interval_text((-3.4, 9.0)) == "95% CI -3.4% to +9.0%"


# ---- judge: metrics without samples, and untested crossings ---------------------------------


def test_a_metric_without_samples_is_decided_by_the_threshold():
    # peak allocated +5% over a 2% threshold; a testable StepTest with a ratio is never used for it
    test = given(p=0.5, shift=0.0, ratio=(1.0, 0.5, 2.0))
    d, untested = verdict(MEMORY_METRIC, 10.0, 10.5, test, threshold=2.0, weak="noisy window")
    assert d["verdict"] == "regression" and d["significance"] == "no per-step samples (threshold decides)"
    assert d["change_pct"] == pytest.approx(5.0) and d["direction"] == "worse" and d["threshold_pct"] == 2.0
    assert d["p_value"] is None and d["interval_pct"] is None and d["interval_level"] is None
    assert d["weak"] is False and d["weak_reason"] is None  # a noisy window weakens timing only
    assert untested is False
    assert (d["metric"], d["label"], d["base"], d["new"]) == (
        "peak_mem_allocated_gib",
        "peak allocated",
        10.0,
        10.5,
    )


def test_a_crossing_without_enough_samples_is_decided_by_the_threshold():
    d, untested = verdict(STEP, 20.0, 22.0, given(n=(3, 4), unit="runs"))
    assert d["verdict"] == "regression" and untested is True
    assert d["significance"] == "not tested (n=3/4 runs < 5; threshold decides)"
    assert d["p_value"] is None and d["interval_pct"] is None


def test_a_timing_verdict_in_a_noisy_window_is_weak():
    d, _ = verdict(STEP, 20.0, 22.0, given(n=(3, 4)), weak="noisy window (spread 12%)")
    assert d["weak"] is True and d["weak_reason"] == "noisy window (spread 12%)"
    d, _ = verdict(STEP, 20.0, 22.0, given(n=(3, 4)))
    assert d["weak"] is False and d["weak_reason"] is None


# ---- judge: within the threshold ------------------------------------------------------------


def test_within_the_threshold_and_untested():
    d, untested = verdict(STEP, 20.0, 20.6, given(n=(3, 3)))  # +3% < 5%
    assert d["verdict"] == "unchanged" and d["significance"] == "within threshold (not tested)"
    assert untested is False and d["interval_pct"] is None and d["p_value"] is None


def test_within_the_threshold_with_enough_samples_that_cannot_reach_alpha_gets_no_interval():
    # n = 5 a side: p_min = 2 / 252 = 0.0079 cannot reach alpha 0.005, so no bootstrap either
    test = given(ratio=(1.03, 0.99, 1.09), n=(5, 5), alpha=0.005)
    d, untested = verdict(STEP, 20.0, 20.6, test)
    assert d["significance"] == "within threshold (not tested)" and d["interval_pct"] is None
    assert d["verdict"] == "unchanged" and untested is False


@pytest.mark.parametrize("min_abs,expected", [(0.5, "inconclusive"), (0.6, "unchanged")])
def test_within_the_threshold_with_an_interval_reaching_beyond_it(min_abs, expected):
    # step time 16 -> 16.5 ms (+3.125%, within 5%); ratio interval 0.99 to 1.09 around 1.03125: the
    # change's interval is (16.5 / 16 x f / 1.03125 - 1) x 100 = -1% to +9%, reaching past +5%. Inconclusive
    # unless min_abs holds the change back (|16.5 - 16| = 0.5 counts at min_abs 0.5, not at 0.6).
    d, untested = verdict(STEP, 16.0, 16.5, given(ratio=(1.03125, 0.99, 1.09)), min_abs=min_abs)
    assert d["verdict"] == expected and untested is False
    assert d["interval_pct"] == pytest.approx([-1.0, 9.0]) and d["interval_level"] == 0.95
    assert d["significance"] == "within threshold; 95% CI -1.0% to +9.0%"
    assert d["p_value"] is None  # no rank test without a crossing


MDE_6_25 = 6.25 / 1.959964 * (1.959964 + 0.841621)  # half-width 6.25 at 95%, 80% power: 8.93%


@pytest.mark.parametrize(
    "threshold,expected",
    [(8.94, "unchanged"), (8.93, "inconclusive"), (6.25, "inconclusive"), (6.0, "inconclusive")],
)
def test_within_the_threshold_the_interval_and_its_mde_decide(threshold, expected):
    # no change (16 -> 16 ms), ratio interval 0.9375 to 1.0625: -6.25% to +6.25% exactly. At T = 6.0 the
    # interval reaches past T; at 6.25 <= T < 8.93 it does not, but its minimum detectable effect (8.93%)
    # does: the data could not have seen a change of T, so that is no pass either.
    d, _ = verdict(STEP, 16.0, 16.0, given(ratio=(1.0, 0.9375, 1.0625)), threshold=threshold)
    assert d["interval_pct"] == pytest.approx([-6.25, 6.25]) and d["verdict"] == expected
    assert d["mde_pct"] == pytest.approx(MDE_6_25, abs=1e-4)


def test_within_the_threshold_a_rates_interval_is_read_the_bad_way():
    # images/s 400 -> 392 (-2%), step time ratio 400 / 392 (0.98 to 1.10): the rate's interval is
    # 392 / 400 x (400 / 392) / f - 1 = 1 / f - 1: -9.09% to +2.04%, whose slow end is beyond -5%
    point = 400 / 392
    d, _ = verdict(RATE, 400.0, 392.0, given(ratio=(point, 0.98, 1.10)))
    low, high = d["interval_pct"]
    assert low == pytest.approx((1 / 1.10 - 1) * 100) and high == pytest.approx((1 / 0.98 - 1) * 100)
    assert d["verdict"] == "inconclusive"


# ---- judge: crossings the rank test decides (no interval) ------------------------------------


@pytest.mark.parametrize(
    "p,shift,expected",
    [
        (0.001, 2.0, "regression"),
        (0.01, 2.0, "noise"),  # p must be below alpha (0.01), not at it
        (0.001, -2.0, "noise"),  # significant, but the steps got faster: contradicts the slower rate
        (0.001, 0.0, "noise"),
    ],
)
def test_a_slowdown_without_an_interval(p, shift, expected):
    # images/s 400 -> 360 (-10%, beyond 5%); step times of 0 ms give no ratio, so no interval
    d, untested = verdict(RATE, 400.0, 360.0, given(p=p, shift=shift))
    assert d["verdict"] == expected and untested is False
    assert d["significance"] == f"p={p:.2g}" and d["p_value"] == p and d["interval_pct"] is None
    assert d["direction"] == "worse" and d["change_pct"] == pytest.approx(-10.0)


@pytest.mark.parametrize(
    "p,shift,expected",
    [(0.001, -3.0, "improvement"), (0.001, 3.0, "noise"), (0.001, 0.0, "noise"), (0.001, 0.5, "noise")],
)
def test_a_speedup_without_an_interval(p, shift, expected):
    d, _ = verdict(STEP, 20.0, 17.0, given(p=p, shift=shift))  # -15%: steps got faster
    assert d["verdict"] == expected and d["direction"] == "better"


def test_a_crossing_from_a_base_of_zero_gets_no_interval():
    # from 0 there is no percentage, so the ratio is not used: the rank test alone decides
    d, _ = verdict(STEP, 0.0, 1.0, given(p=0.001, shift=1.0, ratio=(1.5, 1.2, 1.8)))
    assert d["change_pct"] is None and d["interval_pct"] is None and d["verdict"] == "regression"


def test_the_significance_names_runs_when_the_samples_are_runs():
    d, _ = verdict(RATE, 400.0, 360.0, given(p=0.004, shift=2.0, n=(6, 7), unit="runs"))
    assert d["significance"] == "p=0.004 over 6/7 runs" and d["verdict"] == "regression"


# ---- judge: crossings with an interval --------------------------------------------------------

# step time 16 -> 20 ms (+25%); its interval is (1.25 x f / point - 1) x 100 for the ratio's ends f


@pytest.mark.parametrize(
    "p,shift,expected",
    [(0.001, 1.0, "regression"), (0.01, 1.0, "inconclusive"), (0.02, 1.0, "inconclusive")],
)
def test_a_slowdown_wholly_beyond_the_threshold(p, shift, expected):
    # ratio 1.25 (1.0625 to 1.5): +6.25% to +50%, wholly beyond +5%; a regression only if the rank
    # test shows it (p < alpha), else inconclusive: never a pass
    d, untested = verdict(STEP, 16.0, 20.0, given(p=p, shift=shift, ratio=(1.25, 1.0625, 1.5)))
    assert d["interval_pct"] == pytest.approx([6.25, 50.0]) and d["interval_level"] == 0.95
    assert d["significance"] == f"p={p:.2g}; 95% CI +6.2% to +50.0%"
    assert d["verdict"] == expected and d["p_value"] == p and untested is False


@pytest.mark.parametrize("threshold,expected", [(6.25, "inconclusive"), (6.0, "regression")])
def test_a_slowdown_whose_interval_starts_at_the_threshold(threshold, expected):
    # the low end at the threshold: a change within it fits the data
    d, _ = verdict(
        STEP, 16.0, 20.0, given(p=0.001, shift=1.0, ratio=(1.25, 1.0625, 1.5)), threshold=threshold
    )
    assert d["verdict"] == expected


def test_a_slowdown_whose_interval_straddles_the_threshold():
    # ratio 1.25 (1.0, 1.5): 0% to +50% around +5%: inconclusive however small p is
    d, _ = verdict(STEP, 16.0, 20.0, given(p=1e-6, shift=1.0, ratio=(1.25, 1.0, 1.5)))
    assert d["interval_pct"] == pytest.approx([0.0, 50.0]) and d["verdict"] == "inconclusive"


def test_a_slowdown_whose_interval_lies_within_the_threshold():
    # a bootstrap whose interval misses the recorded change (ratio 1.25, interval 1.0 to 1.03125): the
    # point crossed +5%, the interval (0% to +3.125%) did not; never a regression on that
    d, _ = verdict(STEP, 16.0, 20.0, given(p=1e-6, shift=1.0, ratio=(1.25, 1.0, 1.03125)))
    assert d["interval_pct"] == pytest.approx([0.0, 3.125]) and d["verdict"] == "inconclusive"


# step time 16 -> 12 ms (-25%): an improvement; its interval is (0.75 x f / point - 1) x 100


@pytest.mark.parametrize(
    "p,shift,expected",
    [(0.001, -1.0, "improvement"), (0.02, -1.0, "noise"), (0.001, 1.0, "noise")],
)
def test_a_speedup_wholly_beyond_the_threshold(p, shift, expected):
    # ratio 0.75 (0.5625 to 0.9375): -43.75% to -6.25%, wholly better than -5%
    d, _ = verdict(STEP, 16.0, 12.0, given(p=p, shift=shift, ratio=(0.75, 0.5625, 0.9375)))
    assert d["interval_pct"] == pytest.approx([-43.75, -6.25]) and d["direction"] == "better"
    assert d["significance"] == f"p={p:.2g}; 95% CI -43.8% to -6.2%"
    assert d["verdict"] == expected


@pytest.mark.parametrize("threshold,expected", [(6.25, "noise"), (6.5, "noise"), (6.0, "improvement")])
def test_a_speedup_whose_interval_ends_at_the_threshold(threshold, expected):
    # the interval's better end must pass -T: ending at -6.25% with T = 6.25% is not shown
    d, _ = verdict(
        STEP, 16.0, 12.0, given(p=0.001, shift=-1.0, ratio=(0.75, 0.5625, 0.9375)), threshold=threshold
    )
    assert d["verdict"] == expected


def test_a_speedup_whose_interval_reaches_a_slowdown_beyond_the_threshold():
    # ratio 0.75 (0.5, 1.5): -50% to +50%: a slowdown beyond +5% fits the data as well
    d, _ = verdict(STEP, 16.0, 12.0, given(p=0.001, shift=-1.0, ratio=(0.75, 0.5, 1.5)))
    assert d["interval_pct"] == pytest.approx([-50.0, 50.0]) and d["verdict"] == "inconclusive"


def test_a_speedup_whose_interval_starts_at_a_slowdown_of_the_threshold():
    # step time 16 -> 8 ms (-50%), ratio 0.5 (1.0625 to 1.5): the interval +6.25% to +50% misses the
    # point; with T = 6.25% a slowdown beyond T fits the data: inconclusive, not noise
    d, _ = verdict(STEP, 16.0, 8.0, given(p=0.001, shift=-1.0, ratio=(0.5, 1.0625, 1.5)), threshold=6.25)
    assert d["interval_pct"] == [6.25, 50.0] and d["verdict"] == "inconclusive"


def test_a_speedup_whose_interval_ends_at_a_slowdown_of_the_threshold():
    # ratio 0.5 (0.25 to 1.0625): -75% to +6.25%; a slowdown of exactly T is not beyond it: noise
    d, _ = verdict(STEP, 16.0, 8.0, given(p=0.001, shift=-1.0, ratio=(0.5, 0.25, 1.0625)), threshold=6.25)
    assert d["interval_pct"] == [-75.0, 6.25] and d["verdict"] == "noise"


def test_a_slowdown_whose_interval_is_the_threshold_itself():
    # ratio 1.25 (1.0625 to 1.0625): the interval is +6.25% alone; at T = 6.25% a change of T (not
    # beyond it) fits the data: inconclusive however small p is
    d, _ = verdict(STEP, 16.0, 20.0, given(p=1e-6, shift=1.0, ratio=(1.25, 1.0625, 1.0625)), threshold=6.25)
    assert d["interval_pct"] == [6.25, 6.25] and d["verdict"] == "inconclusive"


def test_a_speedup_whose_interval_reaches_past_the_threshold_but_not_beyond_no_change():
    # ratio 0.75 (0.5, 0.984375): -50% to -1.5625%: not wholly better than -5%, no slowdown: noise
    d, _ = verdict(STEP, 16.0, 12.0, given(p=0.001, shift=-1.0, ratio=(0.75, 0.5, 0.984375)))
    assert d["interval_pct"] == pytest.approx([-50.0, -1.5625]) and d["verdict"] == "noise"


def test_a_rates_improvement_reads_the_interval_the_bad_way():
    # images/s 400 -> 500 (+25%): step time ratio 0.8 (0.5 to 1.0) -> rate interval 0% to +100%
    d, _ = verdict(RATE, 400.0, 500.0, given(p=0.001, shift=-1.0, ratio=(0.8, 0.5, 1.0)))
    assert d["interval_pct"] == pytest.approx([0.0, 100.0]) and d["verdict"] == "noise"  # reaches no change
    d, _ = verdict(RATE, 400.0, 500.0, given(p=0.001, shift=-1.0, ratio=(0.8, 0.625, 0.75)))
    # 1.25 x 0.8 / 0.75 and 1.25 x 0.8 / 0.625: +33.3% to +60%, wholly better than +5%
    assert d["interval_pct"] == pytest.approx([100 / 3, 60.0]) and d["verdict"] == "improvement"


# ---- decide.py: status changes, explicit metrics, refusals that name the policy key -----------


def test_each_status_change_keeps_the_cell_both_statuses_and_the_new_reason(tmp_path):
    changes = {8: ("ok", "oom"), 16: ("ok", "skipped"), 32: ("oom", "ok"), 64: ("oom", "error")}
    base = [make_record(batch_size=bs, status=b, reason=f"base {bs}") for bs, (b, _) in changes.items()]
    new = [make_record(batch_size=bs, status=n, reason=f"new {bs}") for bs, (_, n) in changes.items()]
    compared = make_record(batch_size=4)  # one cell ok on both sides: a gate needs a compared value
    result = _gate(tmp_path, [*base, compared], [*new, make_record(batch_size=4, sample_seed=2)])
    expected = {
        8: ("new failure", "ok", "oom", "new 8"),
        16: ("no longer measured", "ok", "skipped", "new 16"),
        32: ("fixed", "oom", "ok", None),
        64: ("still failing", "oom", "error", "new 64"),
    }
    for rec, cell in zip(new, result.cells[:4], strict=True):
        verdict_, bs, ns, reason = expected[rec["config"]["batch_size"]]
        assert (cell.cell_id, cell.cell_name) == (rec["cell_id"], rec["cell_name"])
        assert (cell.verdict, cell.base_status, cell.new_status, cell.reason) == (verdict_, bs, ns, reason)
        assert cell.metrics == [] and cell.untested is False


@pytest.mark.parametrize(
    "gated,allowed,named,pronoun",
    [
        (
            "energy_j_per_image: 5, energy_j_per_step: 5",
            "[]",
            "energy_j_per_image, energy_j_per_step",
            "them",
        ),
        ("energy_j_per_step: 5", "[]", "energy_j_per_step", "it"),
        ("energy_j_per_image: 5, energy_j_per_step: 5", "[energy_j_per_image]", "energy_j_per_step", "it"),
    ],
)
def test_a_metric_the_policy_names_that_no_cell_measured_refuses(tmp_path, gated, allowed, named, pronoun):
    # the synthetic records have no energy figures (no NVML meter): measured by neither run
    text = f"metrics: {{{gated}}}\nallow_incomparable: {allowed}\n"
    with pytest.raises(NothingComparedError) as err:
        _gate(tmp_path, [make_record()], [make_record(sample_seed=2)], text)
    first = named.split(", ")[0]
    assert str(err.value) == (
        f"policy {tmp_path / 'policy.yaml'} gates {named}, but no cell ok in both runs measured {pronoun} on "
        f"both sides (1 cell(s) had no {first} in either run). The gate cannot check what the policy asks, "
        "so it refuses (exit 2). Remove the metric from the policy, list it under allow_incomparable, or "
        "measure it."
    )


def test_an_allowed_metric_the_policy_names_that_no_cell_measured_passes(tmp_path):
    text = "metrics: {energy_j_per_step: 5}\nallow_incomparable: [energy_j_per_step]\n"
    result = _gate(tmp_path, [make_record()], [make_record(sample_seed=2)], text)
    assert result.cells[0].not_measured == [
        "energy_j_per_step",
        "fid",
        "inception_score",
    ]  # no quality either
    assert result.exit_code == 0


def test_a_value_out_of_range_refuses_and_names_the_policy_key_that_would_allow_it(tmp_path):
    new = make_record(sample_seed=2)
    new["metrics"]["images_per_s"] = -1.0
    with pytest.raises(UserError) as err:
        _gate(tmp_path, [make_record()], [new])
    assert "metrics.images_per_s is -1, not a positive value." in str(err.value)
    assert str(err.value).endswith(
        "If this is expected, list `images_per_s` under `allow_incomparable` in the policy to report it "
        "as not compared instead."
    )


@pytest.mark.parametrize("side", ["BASE", "NEW"])
def test_quality_on_one_side_only_names_the_side_without_it(tmp_path, side):
    with_quality = make_record(sample_seed=1)
    with_quality["quality"] = quality(evaluation(500, 20.0, 50.0))
    without = make_record(sample_seed=2)
    base, new = (without, with_quality) if side == "BASE" else (with_quality, without)
    text = "allow_incomparable: [fid, inception_score]\n"
    (cell,) = _gate(tmp_path, [base], [new], text).cells
    reason = f"{side}: has no quality field, but the other run has one"
    assert cell.not_compared == [
        {"metric": "fid", "reason": reason},
        {"metric": "inception_score", "reason": reason},
    ]


def test_a_cell_ok_on_both_sides_keeps_its_id_name_and_statuses(tmp_path):
    new = make_record(sample_seed=2)
    (cell,) = _gate(tmp_path, [make_record()], [new]).cells
    assert (cell.cell_id, cell.cell_name, cell.verdict) == (new["cell_id"], new["cell_name"], "pass")
    assert (cell.base_status, cell.new_status, cell.reason) == ("ok", "ok", None)
    assert cell.untested is False  # 20 step times a side: images/s was tested


def test_a_quality_verdict_weak_twice_gives_both_reasons(tmp_path):
    # a spread on one side only (it stands for both) and sample counts that differ (allowed)
    base = make_record(sample_seed=1)
    base["quality"] = quality(evaluation(500, 20.0, 50.0, fid_sd=1.0), samples=5000)
    new = make_record(sample_seed=2)
    new["quality"] = quality(evaluation(500, 21.0, 50.0, seeds=(0,)), samples=10_000)
    (cell,) = _gate(tmp_path, [base], [new], "allow_sample_count_mismatch: true\n").cells
    fid = next(d for d in cell.metrics if d.metric == "fid")
    assert fid.weak and fid.weak_reason == (
        "only one run recorded a spread; it stands for both; "
        "N 5000 (base) vs 10000 (new): FID's bias depends on N"
    )


def test_a_core_metric_missing_on_one_side_says_an_ok_record_needs_it(tmp_path):
    new = make_record(sample_seed=2)
    del new["metrics"]["images_per_s"]
    with pytest.raises(UserError) as err:
        _gate(tmp_path, [make_record()], [new])
    assert "metrics.images_per_s is missing (a status ok record needs it)." in str(err.value)


@pytest.mark.parametrize("side", ["BASE", "NEW"])
def test_a_bad_quality_value_is_not_compared_on_its_side_when_allowed(tmp_path, side):
    records = []
    for seed in (1, 2):
        r = make_record(sample_seed=seed)
        r["quality"] = quality(evaluation(500, 20.0, 50.0))
        records.append(r)
    bad = records[0] if side == "BASE" else records[1]
    bad["quality"]["evaluations"][0]["metrics"]["fid"] = -1.0
    (cell,) = _gate(tmp_path, records[:1], records[1:], "allow_incomparable: [fid]\n").cells
    assert cell.not_compared == [
        {
            "metric": "fid",
            "reason": f"{side}: quality.evaluations[step 500].metrics.fid is -1, not a non-negative value",
        }
    ]


def test_with_repeats_on_both_sides_the_repeats_are_the_samples(tmp_path):
    # images/s -10% (beyond 5%); 2 repeats in base, 3 in new: run-level samples, too few to test
    base, new = make_record(images_per_s=400.0), make_record(images_per_s=360.0, sample_seed=2)
    base["metrics"]["repeats"] = {"step_ms": [20.0, 20.2]}
    new["metrics"]["repeats"] = {"step_ms": [22.0, 22.1, 22.3]}
    (cell,) = _gate(tmp_path, [base], [new]).cells
    d = next(d for d in cell.metrics if d.metric == "images_per_s")
    assert d.significance == "not tested (n=2/3 runs < 5; threshold decides)" and d.verdict == "regression"
    assert cell.untested is True


def test_noisy_windows_on_both_sides_give_both_reasons(tmp_path):
    base, new = make_record(), make_record(sample_seed=2)
    for r in (base, new):
        r["metrics"]["noisy"] = True
        del r["metrics"]["noise"]  # the flag alone: no spread figures to quote
    (cell,) = _gate(tmp_path, [base], [new]).cells
    d = next(d for d in cell.metrics if d.metric == "images_per_s")
    assert d.weak and d.weak_reason == "base: noisy measurement window; new: noisy measurement window"


def test_compare_frames_by_default_names_the_sides_and_refuses_other_environments(tmp_path):
    from ditbench.report.gate.decide import compare_frames
    from ditbench.report.gate.env import EnvMismatchError
    from ditbench.report.gate.inputs import load_run

    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, [make_record()])
    write_jsonl(n, [make_record(sample_seed=2)])
    result = compare_frames(load_run(b), load_run(n))
    assert (result.base_path, result.new_path) == ("BASE", "NEW")
    write_jsonl(n, [make_record(sample_seed=2, env=dict(H200_ENV, torch="2.15.0"))])
    with pytest.raises(EnvMismatchError):
        compare_frames(load_run(b), load_run(n))


def test_no_matching_cell_refuses_in_full(tmp_path):
    b, n = str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")
    with pytest.raises(NothingComparedError) as err:
        _gate(tmp_path, [make_record(batch_size=8)], [make_record(batch_size=16), make_record(batch_size=32)])
    assert str(err.value) == (
        f"no cell of {n} matches a cell of {b} (cells match by cell_id, a hash of the whole cell config; 1 "
        "cells vs 2). Are these runs of the same suite, and was the suite file changed since the baseline? "
        "A gate that compares nothing cannot pass; refresh the baseline if the suite changed on purpose."
    )


@pytest.mark.parametrize(
    "policy,gated",
    [
        (None, "images_per_s, peak_mem_allocated_gib, peak_mem_reserved_gib, fid, inception_score"),
        (
            "metrics: {images_per_s: false, peak_mem_allocated_gib: false, peak_mem_reserved_gib: false, "
            "fid: false, inception_score: false}\n",
            "none",
        ),
    ],
)
def test_nothing_compared_refuses_in_full(tmp_path, policy, gated):
    b, n = str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")
    base = [make_record(batch_size=8, status="oom"), make_record(batch_size=16, status="oom")]
    new = [make_record(batch_size=8, status="error"), make_record(batch_size=16, status="oom")]
    with pytest.raises(NothingComparedError) as err:
        _gate(tmp_path, base, new, policy)
    assert str(err.value) == (
        f"{n} vs {b}: no value of any matched cell could be compared (2 still failing; gated metrics: "
        f"{gated}). A gate that compared nothing cannot pass, so it refuses (exit 2). Check that the cells "
        "ran ok in both runs and that the policy gates a metric they measure."
    )
