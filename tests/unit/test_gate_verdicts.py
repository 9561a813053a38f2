"""The gate's four verdicts from the interval of a timing change: regression (wholly beyond the
threshold), improvement, pass, inconclusive (straddling it); the exit codes and the policy's
`inconclusive` mapping, through the CLI too."""

from __future__ import annotations

import json

import pytest
from synthetic_records import make_record, write_jsonl
from test_compare import cli

from ditbench.core.errors import UserError
from ditbench.core.intervals import median_interval, median_ratio_interval
from ditbench.records.metrics import table
from ditbench.report.gate.decide import compare_files
from ditbench.report.gate.policy import load_policy
from ditbench.report.gate.summary import summary_markdown
from ditbench.report.gate.timing import change_interval

BASE_MS = 20.0  # DiT-S/8 at batch 8: 400 images/s


def spread(median_ms: float, n: int = 21, width: float = 0.02) -> list[float]:
    """n evenly spaced step times from median * (1 - width/2) to median * (1 + width/2)."""
    return [median_ms * (1 + width * (i / (n - 1) - 0.5)) for i in range(n)]


def records(tmp_path, base_s, new_s, name=""):
    def rec(samples, run):
        img_s = 8 / (sorted(samples)[len(samples) // 2] / 1000)  # the rate the samples give
        return make_record("DiT-S/8", "fp32", "none", 8, images_per_s=img_s, samples=samples, run_id=run)

    b, n = tmp_path / f"base{name}.jsonl", tmp_path / f"new{name}.jsonl"
    write_jsonl(b, [rec(base_s, "a")])
    write_jsonl(n, [rec(new_s, "b")])
    return b, n


def verdict(tmp_path, base_s, new_s, policy=None):
    result = compare_files(*records(tmp_path, base_s, new_s), policy, False)
    (cell,) = result.cells
    return result, next(d for d in cell.metrics if d.metric == "images_per_s")


def test_the_bootstrap_is_seeded_and_exact_where_there_is_no_spread():
    base, new = spread(20.0), spread(21.0, width=0.1)
    first = median_ratio_interval(base, new)
    assert median_ratio_interval(base, new) == first  # same seed, same interval, to the last bit
    assert median_ratio_interval(base, new, seed=1) != first
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) == median_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert median_interval([3.0] * 5) == (3.0, 3.0)
    point, low, high = first
    assert point == pytest.approx(1.05) and low < 1.05 < high
    # Constant steps: every resample has the same medians, so the interval is the point.
    assert median_ratio_interval([20.0] * 8, [22.0] * 8) == pytest.approx((1.1, 1.1, 1.1))
    images = table()["images_per_s"]  # a rate: 10% longer steps are 1/1.1 - 1 = -9.09% images/s
    assert change_interval(images, 400.0, 400 / 1.1, (1.1, 1.1, 1.1)) == pytest.approx((-100 / 11, -100 / 11))
    step = table()["step_ms"]  # a time: the interval of the ratio, as percent
    assert change_interval(step, 20.0, 22.0, (1.1, 1.05, 1.2)) == pytest.approx((5.0, 20.0))


def test_an_interval_wholly_beyond_the_threshold_is_a_regression(tmp_path):
    result, d = verdict(tmp_path, spread(BASE_MS), spread(BASE_MS * 1.10))  # 10% slower, +-1% spread
    low, high = d.interval_pct
    assert -10.5 < low < high < -8.5 and high < -5.0  # wholly beyond -5%
    assert d.verdict == "regression" and result.exit_code == 1 and result.result == "regression"


def test_an_interval_wholly_better_is_an_improvement(tmp_path):
    result, d = verdict(tmp_path, spread(BASE_MS), spread(BASE_MS * 0.85))
    low, high = d.interval_pct
    assert low > 5.0 and d.verdict == "improvement"
    assert result.cells[0].verdict == "improved" and result.exit_code == 0


def test_an_interval_within_the_threshold_passes(tmp_path):
    result, d = verdict(tmp_path, spread(BASE_MS), spread(BASE_MS * 1.01))  # 1% slower, +-1% spread
    low, high = d.interval_pct
    assert -5.0 < low < high < 0.0
    assert d.verdict == "unchanged" and result.cells[0].verdict == "pass" and result.exit_code == 0


@pytest.mark.parametrize("slower", [1.03, 1.07])  # inside and beyond the 5% threshold, both uncertain
def test_an_interval_straddling_the_threshold_is_inconclusive(tmp_path, slower):
    base_s, new_s = spread(BASE_MS, width=0.4), spread(BASE_MS * slower, width=0.4)  # +-20% steps
    result, d = verdict(tmp_path, base_s, new_s)
    low, high = d.interval_pct
    assert low < -5.0 < high
    assert d.verdict == "inconclusive" and result.cells[0].verdict == "inconclusive"
    assert result.exit_code == 3 and result.result == "inconclusive"
    data = result.to_json()
    assert data["exit_code"] == 3 and data["counts"]["inconclusive"] == 1
    (metric,) = [m for m in data["cells"][0]["metrics"] if m["metric"] == "images_per_s"]
    assert metric["interval_pct"] == [low, high] and metric["interval_level"] == 0.95
    text = summary_markdown(result)
    assert "ditbench compare: 1 inconclusive" in text and "### Inconclusive" in text
    assert "process-level noise" in text  # one run a side: the interval misses it


@pytest.mark.parametrize("mapped,code", [("pass", 0), ("fail", 1), ("inconclusive", 3)])
def test_the_policy_maps_inconclusive(tmp_path, mapped, code):
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"inconclusive: {mapped}\n")
    result, d = verdict(
        tmp_path, spread(BASE_MS, width=0.4), spread(BASE_MS * 1.07, width=0.4), load_policy(policy)
    )
    assert d.verdict == "inconclusive" and result.exit_code == code
    assert result.to_json()["policy"]["inconclusive"] == mapped


def test_a_bad_inconclusive_policy_value_is_one_paragraph(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("inconclusive: maybe\n")
    with pytest.raises(UserError) as err:
        load_policy(policy)
    text = str(err.value)
    assert "`inconclusive`" in text and "maybe" in text and "pass" in text and "fail" in text
    assert "\n\n" not in text and "Input should" not in text


@pytest.mark.slow
def test_the_exit_codes_through_the_cli(tmp_path):
    cases = {
        "pass": (spread(BASE_MS), spread(BASE_MS * 1.01), 0),
        "regression": (spread(BASE_MS), spread(BASE_MS * 1.10), 1),
        "inconclusive": (spread(BASE_MS, width=0.4), spread(BASE_MS * 1.07, width=0.4), 3),
    }
    for name, (base_s, new_s, code) in cases.items():
        b, n = records(tmp_path, base_s, new_s, name)
        proc = cli(b, n, "--json")
        assert proc.returncode == code, proc.stderr
        assert json.loads(proc.stdout)["result"] == name
    policy = tmp_path / "policy.yaml"
    policy.write_text("inconclusive: pass\n")
    b, n = records(tmp_path, *cases["inconclusive"][:2], "inconclusive")
    assert cli(b, n, "--policy", policy).returncode == 0
    policy.write_text("inconclusive: 3\n")
    bad = cli(b, n, "--policy", policy)
    assert bad.returncode == 2 and "inconclusive" in bad.message
