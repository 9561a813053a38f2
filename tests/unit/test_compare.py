"""`ditbench compare`: every gate decision, from synthetic records with known numbers."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scipy.stats import mannwhitneyu
from synthetic_records import CPU_ENV, H200_ENV, make_matrix, make_record, step_samples, write_jsonl

from ditbench.core.errors import UserError
from ditbench.records.metrics import default_thresholds
from ditbench.report.gate.decide import NothingComparedError, compare_files
from ditbench.report.gate.env import EnvMismatchError
from ditbench.report.gate.policy import Policy, load_policy
from ditbench.report.gate.summary import summary_markdown

ROOT = Path(__file__).resolve().parents[2]
BASE_IMG_S = 400.0  # DiT-S/8 bs 8 -> 20 ms a step


def files(tmp_path, base, new):
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, base)
    write_jsonl(n, new)
    return b, n


def gate(tmp_path, base, new, policy=None, allow=False):
    b, n = files(tmp_path, base, new)
    return compare_files(b, n, policy, allow)


def cell(img_s=BASE_IMG_S, seed=1, **kw):
    return make_record("DiT-S/8", "fp32", "none", 8, images_per_s=img_s, sample_seed=seed, **kw)


def only(result):
    assert len(result.cells) == 1
    return result.cells[0]


def delta(cell_result, metric):
    return next(d for d in cell_result.metrics if d.metric == metric)


def cli(*args, env_extra=None, cwd=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("GITHUB_STEP_SUMMARY", None)
    env.update(env_extra or {})
    proc = subprocess.run(
        [sys.executable, "-m", "ditbench", "compare", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )
    proc.message = " ".join(proc.stderr.split())  # the CLI wraps its error paragraph
    return proc


# ------------------------------------------------------------------------------------ decisions


def test_same_numbers_with_fresh_noise_pass(tmp_path):
    base = make_matrix(models=("DiT-B/8",), batches=(8, 16), precisions=("fp32", "bf16"))
    new = [
        dict(r, run_id="run-b")
        for r in make_matrix(
            models=("DiT-B/8",), batches=(8, 16), precisions=("fp32", "bf16"), sample_seed=99
        )
    ]
    result = gate(tmp_path, base, new)
    assert result.exit_code == 0
    assert {c.verdict for c in result.cells} == {"pass"}
    assert len(result.cells) == 8
    assert "✅ ditbench compare: no regression" in summary_markdown(result)


def test_slower_is_a_regression_with_the_numbers(tmp_path):
    result = gate(tmp_path, [cell(400.0)], [cell(360.0, seed=2)])
    c = only(result)
    assert c.verdict == "regression" and result.exit_code == 1
    d = delta(c, "images_per_s")
    assert d.base == 400.0 and d.new == 360.0
    assert d.change_pct == pytest.approx(-10.0)
    assert d.verdict == "regression" and d.p_value < 0.01
    text = summary_markdown(result)
    assert "### Regressions" in text and "-10.0%" in text and "| -5% |" in text


def test_faster_is_an_improvement_not_a_failure(tmp_path):
    result = gate(tmp_path, [cell(400.0)], [cell(460.0, seed=2)])
    c = only(result)
    assert c.verdict == "improved" and result.exit_code == 0
    assert delta(c, "images_per_s").change_pct == pytest.approx(15.0)
    assert "### Improvements" in summary_markdown(result)


def test_more_memory_beyond_two_percent_regresses(tmp_path):
    base = cell(peak_alloc=10.0, peak_reserved=11.0)
    result = gate(tmp_path, [base], [cell(peak_alloc=10.3, peak_reserved=11.0, seed=2)])
    c = only(result)
    d = delta(c, "peak_mem_allocated_gib")
    assert d.change_pct == pytest.approx(3.0) and d.verdict == "regression"
    assert "no per-step samples" in d.significance  # memory is gated on its threshold alone
    assert result.exit_code == 1
    ok = gate(tmp_path, [base], [cell(peak_alloc=10.15, peak_reserved=11.0, seed=2)])  # +1.5%
    assert only(ok).verdict == "pass" and ok.exit_code == 0


def test_less_memory_is_an_improvement(tmp_path):
    result = gate(tmp_path, [cell(peak_alloc=10.0)], [cell(peak_alloc=8.0, seed=2)])
    assert only(result).verdict == "improved"
    assert delta(only(result), "peak_mem_allocated_gib").change_pct == pytest.approx(-20.0)


@pytest.mark.parametrize("status", ["oom", "error", "timeout", "nan_loss"])
def test_new_failure_is_a_regression(tmp_path, status):
    new = make_record("DiT-S/8", "fp32", "none", 8, status)
    result = gate(tmp_path, [cell()], [new])
    c = only(result)
    assert c.verdict == "new failure" and (c.base_status, c.new_status) == ("ok", status)
    assert result.exit_code == 1
    text = summary_markdown(result)
    assert "### New failures" in text and f"ok → {status}" in text


def other_cell(seed=1):
    """A second, comparable cell: a gate passes only when it compared at least one value."""
    return make_record("DiT-S/8", "fp32", "none", 16, images_per_s=700.0, sample_seed=seed)


def test_fixed_failure_passes_and_is_listed(tmp_path):
    result = gate(
        tmp_path, [make_record("DiT-S/8", "fp32", "none", 8, "oom"), other_cell()], [cell(), other_cell(2)]
    )
    c = result.cells[0]
    assert c.verdict == "fixed" and result.exit_code == 0
    assert "### Fixed" in summary_markdown(result)


@pytest.mark.parametrize("status", ["unsupported", "skipped", "oom", "error"])
def test_a_cell_that_stops_running_fails_unless_the_policy_allows_it(tmp_path, status):
    """ok in the base, not run or failed now: a new OOM skip is exactly what a gate is for."""
    new = [make_record("DiT-S/8", "fp32", "none", 8, status), other_cell(2)]
    result = gate(tmp_path, [cell(), other_cell()], new)
    verdict = "no longer measured" if status in ("unsupported", "skipped") else "new failure"
    assert result.cells[0].verdict == verdict and result.exit_code == 1
    assert summary_markdown(result).startswith("## ❌ ditbench compare: 1 regression\n")
    policy_file = tmp_path / "allow.yaml"
    for allowed in ("[bs=8]", f"[{cell()['cell_id']}]", "true"):
        policy_file.write_text(f"allow_stopped: {allowed}\n")
        result = gate(tmp_path, [cell(), other_cell()], new, load_policy(policy_file))
        assert result.cells[0].verdict == "stopped (allowed)" and result.exit_code == 0, allowed
        assert "### Stopped, allowed by the policy" in summary_markdown(result)
    policy_file.write_text("allow_stopped: [bs=16]\n")  # names another cell
    assert gate(tmp_path, [cell(), other_cell()], new, load_policy(policy_file)).exit_code == 1


@pytest.mark.parametrize("bad", ["allow_stopped: 3", 'allow_stopped: [""]', "allow_stopped: {a: 1}"])
def test_allow_stopped_takes_true_false_or_names(tmp_path, bad):
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(bad + "\n")
    with pytest.raises(
        UserError, match="`allow_stopped` must be true, false or a list of cell-name substrings"
    ):
        load_policy(policy_file)


def test_new_failed_repeats_are_a_new_failure(tmp_path):
    """A cell ok overall whose new run lost repeats (repeat 2 ran out of memory) does not pass."""

    def with_repeats(record, failed):
        record["metrics"]["repeats"] = {"count": 2, "of": 3, "failed": failed, "step_ms": [10.0, 10.1]}
        return record

    base = [with_repeats(cell(), {}), other_cell()]
    new = [with_repeats(cell(seed=2), {"2": "oom"}), other_cell(2)]
    result = gate(tmp_path, base, new)
    assert result.cells[0].verdict == "new failure" and result.exit_code == 1
    assert result.cells[0].reason == "repeats not ok in the new run: #2 oom"


def test_failure_changing_kind_is_still_failing(tmp_path):
    base = [make_record("DiT-S/8", status="oom"), other_cell()]
    result = gate(tmp_path, base, [make_record("DiT-S/8", status="error"), other_cell(2)])
    assert result.cells[0].verdict == "still failing" and result.exit_code == 0


@pytest.mark.parametrize(
    "base_status, new_status",
    [("oom", "ok"), ("oom", "error"), ("skipped", "skipped")],
)
def test_status_changes_alone_compare_nothing_and_refuse(tmp_path, base_status, new_status):
    base = cell() if base_status == "ok" else make_record("DiT-S/8", status=base_status)
    new = cell(seed=2) if new_status == "ok" else make_record("DiT-S/8", status=new_status)
    with pytest.raises(NothingComparedError, match="no value of any matched cell could be compared"):
        gate(tmp_path, [base], [new])


def test_a_new_failure_fails_even_when_nothing_else_compares(tmp_path):
    result = gate(tmp_path, [cell()], [make_record("DiT-S/8", status="oom")])
    assert result.exit_code == 1 and result.compared == 0


def test_missing_cells_on_both_sides_are_listed(tmp_path):
    a = make_record("DiT-S/8", batch_size=8)
    b = make_record("DiT-S/8", batch_size=16)
    c = make_record("DiT-S/8", batch_size=32)
    result = gate(tmp_path, [a, b], [a, c])
    verdicts = {x.cell_name: x.verdict for x in result.cells}
    assert verdicts == {a["cell_name"]: "pass", b["cell_name"]: "only in base", c["cell_name"]: "only in new"}
    assert result.exit_code == 0
    text = summary_markdown(result)
    assert "### Missing from the new run" in text and b["cell_id"] in text
    assert "### New cells (no baseline)" in text and c["cell_id"] in text
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("fail_on_missing: true\n")
    strict = gate(tmp_path, [a, b], [a, c], load_policy(policy_file))
    assert strict.exit_code == 1
    assert "fails the gate" in summary_markdown(strict)


def test_markdown_shows_new_cells_as_new_and_each_reason_once(tmp_path):
    a = make_record("DiT-S/8", batch_size=8)
    b = make_record("DiT-S/8", batch_size=16)
    c = make_record("DiT-S/8", batch_size=32)
    why = "fp16 needs a CUDA device (CPU autocast has no loss-scaled fp16); use bf16 on CPU"
    fp16 = [make_record("DiT-S/8", "fp16", "none", bs, "unsupported", reason=why) for bs in (8, 16)]
    result = gate(tmp_path, [a, b, *fp16], [a, c, *fp16])
    text = summary_markdown(result)
    assert "None" not in text
    assert f"| {c['cell_name']} | new (ok) |" in text and f"| {b['cell_name']} | missing (was ok) |" in text
    assert f"| {fp16[0]['cell_name']} | unsupported | [1] |" in text
    assert f"| {fp16[1]['cell_name']} | unsupported | [1] |" in text
    assert text.count(why) == 1 and f"[1] {why} (2 cells)" in text


def test_no_matching_cell_is_an_input_error(tmp_path):
    with pytest.raises(UserError, match="no cell of .* matches a cell of"):
        gate(tmp_path, [make_record("DiT-S/8", batch_size=8)], [make_record("DiT-S/8", batch_size=16)])


def test_environment_mismatch_is_refused_unless_allowed(tmp_path):
    other = dict(H200_ENV, torch="2.15.0", driver="575.0")
    with pytest.raises(EnvMismatchError) as err:
        gate(tmp_path, [cell()], [cell(seed=2, env=other)])
    assert set(err.value.differences) == {"torch", "driver"}
    assert (
        "2.14.1" in str(err.value) and "2.15.0" in str(err.value) and "--allow-env-mismatch" in str(err.value)
    )
    result = gate(tmp_path, [cell()], [cell(seed=2, env=other)], allow=True)
    assert result.exit_code == 0
    assert "Environments differ" in summary_markdown(result)


def test_different_host_and_git_sha_are_the_same_environment(tmp_path):
    other = dict(H200_ENV, host="gpu-runner-7", git_sha="abcdef0", ditbench="0.2.0", python="3.11.10")
    result = gate(tmp_path, [cell()], [cell(seed=2, env=other)])
    assert result.env_differences == {} and result.exit_code == 0


def test_cpu_runs_compare_the_cpu_model(tmp_path):
    a = cell(env=CPU_ENV, device="cpu")
    b = cell(seed=2, env=dict(CPU_ENV, cpu="Intel Core i7-1185G7"), device="cpu")
    with pytest.raises(EnvMismatchError) as err:
        gate(tmp_path, [a], [b])
    assert list(err.value.differences) == ["cpu"]


def test_too_few_samples_lets_the_threshold_decide_and_says_so(tmp_path):
    result = gate(tmp_path, [cell(400.0, n_samples=3)], [cell(360.0, seed=2, n_samples=3)])
    c = only(result)
    d = delta(c, "images_per_s")
    assert c.verdict == "regression" and result.exit_code == 1
    assert d.p_value is None and d.significance.startswith("not tested (n=3/3 < 5")
    assert c.untested
    assert "Significance not tested" in summary_markdown(result)
    small = gate(tmp_path, [cell(400.0, n_samples=3)], [cell(392.0, seed=2, n_samples=3)])  # -2%
    assert only(small).verdict == "pass"


def test_samples_too_few_to_reach_alpha_are_not_tested(tmp_path):
    # 5 against 5 can at best give p = 2/252 = 0.0079: enough for alpha 0.01, never for 0.002.
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("alpha: 0.002\n")
    result = gate(
        tmp_path, [cell(400.0, n_samples=5)], [cell(360.0, seed=2, n_samples=5)], load_policy(policy_file)
    )
    d = delta(only(result), "images_per_s")
    assert "cannot reach p<0.002" in d.significance and d.verdict == "regression"
    tested = gate(tmp_path, [cell(400.0, n_samples=5)], [cell(360.0, seed=2, n_samples=5)])
    assert delta(only(tested), "images_per_s").p_value == pytest.approx(2 / 252)


def test_threshold_crossed_with_a_straddling_interval_is_inconclusive(tmp_path):
    # The reported throughput fell 8%, but the per-step times of both runs come from one distribution
    # with 20% noise: the interval of the change straddles the 5% threshold, so the gate cannot tell.
    base_s = step_samples(20.0, 20, noise=0.2, seed=1)
    new_s = step_samples(20.0, 20, noise=0.2, seed=2)
    assert mannwhitneyu(new_s, base_s).pvalue > 0.05  # precondition: indistinguishable
    result = gate(tmp_path, [cell(400.0, samples=base_s)], [cell(368.0, samples=new_s)])
    c = only(result)
    d = delta(c, "images_per_s")
    assert d.change_pct == pytest.approx(-8.0) and d.verdict == "inconclusive"
    low, high = d.interval_pct
    assert low < -5.0 < high and d.interval_level == 0.95
    assert c.verdict == "inconclusive" and result.exit_code == 3
    text = summary_markdown(result)
    assert "inconclusive" in text and "### Inconclusive" in text and "95% CI" in text


def test_significant_but_below_threshold_is_not_a_regression(tmp_path):
    base_s = step_samples(20.0, 30, noise=0.001, seed=1)
    new_s = step_samples(20.4, 30, noise=0.001, seed=2)  # 2% slower, unmistakably
    result = gate(tmp_path, [cell(400.0, samples=base_s)], [cell(392.0, samples=new_s)])
    assert mannwhitneyu(new_s, base_s).pvalue < 1e-6  # precondition: a real, significant shift
    d = delta(only(result), "images_per_s")
    assert d.change_pct == pytest.approx(-2.0)
    assert d.verdict == "unchanged" and d.significance.startswith("within threshold; 95% CI -2.")
    assert result.exit_code == 0


def test_significance_must_point_the_same_way(tmp_path):
    # Throughput fell 6% yet the step samples got faster: contradictory, so not a regression. (A
    # record whose rate is further than 10% from its own samples is refused when it is loaded.)
    base_s = step_samples(20.0, 20, noise=0.005, seed=1)
    new_s = step_samples(19.6, 20, noise=0.005, seed=2)
    result = gate(tmp_path, [cell(400.0, samples=base_s)], [cell(376.0, samples=new_s)])
    assert delta(only(result), "images_per_s").verdict == "noise"


def test_step_time_is_lower_is_better_when_enabled(tmp_path):
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text("metrics:\n  step_ms: 5\n  images_per_s: false\n")
    policy = load_policy(policy_file)
    assert "images_per_s" not in policy.rules and policy.rules["step_ms"].threshold_pct == 5
    result = gate(tmp_path, [cell(400.0)], [cell(360.0, seed=2)], policy)
    d = delta(only(result), "step_ms")
    assert d.change_pct > 5 and d.verdict == "regression"
    assert [m.metric for m in only(result).metrics if m.metric == "images_per_s"] == []


def test_null_metrics_are_skipped_not_crashed(tmp_path):
    base, new = cell(), cell(seed=2)
    for r in (base, new):
        r["metrics"]["peak_mem_allocated_gib"] = None
        r["metrics"]["peak_mem_reserved_gib"] = None
        r["metrics"]["mfu"] = None
        r["metrics"]["step_ms"]["samples"] = []
    result = gate(tmp_path, [base], [new])
    assert [d.metric for d in only(result).metrics] == ["images_per_s"]
    assert only(result).verdict == "pass"


# ---------------------------------------------------------------------------------------- policy


def test_policy_file_merges_over_defaults(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_text("""
alpha: 0.05
min_samples: 8
metrics:
  images_per_s: 15
  peak_mem_allocated_gib: {threshold_pct: 1, min_abs: 0.05}
  fid: null
overrides:
  - match: {model: DiT-S/8, precision: fp32}
    metrics: {images_per_s: 30, peak_mem_reserved_gib: false}
""")
    policy = load_policy(p)
    assert policy.alpha == 0.05 and policy.min_samples == 8 and policy.source == str(p)
    assert policy.rules["images_per_s"].threshold_pct == 15
    assert policy.rules["peak_mem_allocated_gib"].min_abs == 0.05
    assert (
        policy.rules["peak_mem_reserved_gib"].threshold_pct == default_thresholds()["peak_mem_reserved_gib"]
    )
    assert "fid" not in policy.rules
    rules = policy.rules_for({"model": "DiT-S/8", "precision": "fp32"})
    assert rules["images_per_s"].threshold_pct == 30 and "peak_mem_reserved_gib" not in rules
    assert policy.rules_for({"model": "DiT-B/8", "precision": "fp32"})["images_per_s"].threshold_pct == 15
    other = gate(tmp_path, [make_record("DiT-B/8")], [make_record("DiT-B/8", sample_seed=3)], policy)
    assert other.unused_overrides == [0] and "No compared cell matched overrides[0]" in summary_markdown(
        other
    )
    # the 10% slowdown is within the override's 30% for this cell
    assert only(gate(tmp_path, [cell(400.0)], [cell(360.0, seed=2)], policy)).verdict == "pass"


def test_min_abs_ignores_tiny_absolute_changes(tmp_path):
    p = tmp_path / "policy.yaml"
    p.write_text("metrics:\n  peak_mem_allocated_gib: {threshold_pct: 2, min_abs: 0.1}\n")
    result = gate(
        tmp_path, [cell(peak_alloc=1.0)], [cell(peak_alloc=1.05, seed=2)], load_policy(p)
    )  # +5%, +0.05
    assert delta(only(result), "peak_mem_allocated_gib").verdict == "unchanged"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("metrics:\n  images_per_sec: 5\n", "images_per_sec` is not a metric"),
        ("metrics:\n  images_per_s: -5\n", "must be a finite number >= 0"),
        ("metrics:\n  images_per_s: .nan\n", "must be a finite number >= 0"),
        ("metrics:\n  images_per_s: {threshold_pct: 5, min_abs: .inf}\n", "min_abs` must be a finite number"),
        ("allow_incomparable: [speed]\n", "`allow_incomparable` must be true, false or a list"),
        ("allow_incomparable: maybe\n", "`allow_incomparable` must be true, false or a list"),
        ("quality_noise_k: -1\n", "`quality_noise_k` must be a finite number >= 0"),
        ("metrics:\n  fid: {threshold_pct: 2, max: 3}\n", "unknown key(s) max"),
        ("metrics:\n  images_per_s: fast\n", "must be a number (threshold in percent)"),
        ("metrics:\n  images_per_s: true\n", "gives no threshold"),
        ("metrics:\n  images_per_s: {threshold: 5}\n", "unknown key(s) threshold"),
        ("metrics: [images_per_s]\n", "must be a mapping of metric name"),
        ("thresholds:\n  images_per_s: 5\n", "unknown key(s) thresholds"),
        ("alpha: 2\n", "`alpha` must be a number between 0 and 1"),
        ("min_samples: 1\n", "`min_samples` must be an integer from 2"),
        ("fail_on_missing: sometimes\n", "`fail_on_missing` must be true or false"),
        (
            "overrides:\n  - metrics: {images_per_s: 5}\n",
            "`overrides[0]` must be a mapping with exactly `match`",
        ),
        ("overrides:\n  - match: {model: DiT-S/8}\n    metrics: {nope: 1}\n", "`overrides[0].metrics.nope`"),
        ("metrics: {images_per_s: 5\n", "not valid YAML"),
        ("- 1\n- 2\n", "must be a YAML mapping"),
    ],
)
def test_policy_errors_name_the_key(tmp_path, text, needle):
    p = tmp_path / "policy.yaml"
    p.write_text(text)
    with pytest.raises(UserError) as err:
        load_policy(p)
    assert needle in str(err.value) and str(p) in str(err.value)


def test_missing_policy_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_policy(tmp_path / "nope.yaml")


def test_default_policy_is_documented_values():
    p = Policy()
    assert {k: r.threshold_pct for k, r in p.rules.items()} == default_thresholds()
    assert (
        default_thresholds()["images_per_s"] == 5.0 and default_thresholds()["peak_mem_allocated_gib"] == 2.0
    )
    assert p.alpha == 0.01 and p.min_samples == 5


# ------------------------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_cli_exit_codes_and_summary_files(tmp_path):
    b, n = files(tmp_path, [cell(400.0)], [cell(401.0, seed=2)])
    step_summary = tmp_path / "step_summary.md"
    step_summary.write_text("earlier step\n")
    ok = cli(b, n, "--summary", tmp_path / "pr.md", env_extra={"GITHUB_STEP_SUMMARY": str(step_summary)})
    assert ok.returncode == 0, ok.stderr
    assert "no regression" in ok.stdout
    assert "no regression" in (tmp_path / "pr.md").read_text()
    assert step_summary.read_text().startswith("earlier step\n")  # appended, not replaced
    assert "no regression" in step_summary.read_text()

    b, n = files(tmp_path, [cell(400.0)], [cell(300.0, seed=2)])
    bad = cli(b, n, "--json")
    assert bad.returncode == 1, bad.stderr
    data = json.loads(bad.stdout)
    assert data["result"] == "regression" and data["exit_code"] == 1
    assert data["counts"]["regression"] == 1
    assert data["cells"][0]["metrics"][0]["change_pct"] == pytest.approx(-25.0)


@pytest.mark.slow
def test_cli_summary_pointing_at_step_summary_is_written_once(tmp_path):
    b, n = files(tmp_path, [cell(400.0)], [cell(401.0, seed=2)])
    step_summary = tmp_path / "step_summary.md"
    proc = cli(b, n, "--summary", step_summary, env_extra={"GITHUB_STEP_SUMMARY": str(step_summary)})
    assert proc.returncode == 0, proc.stderr
    assert step_summary.read_text().count("ditbench compare") == 1


@pytest.mark.slow
def test_cli_refuses_an_environment_mismatch_with_exit_2(tmp_path):
    b, n = files(tmp_path, [cell()], [cell(seed=2, env=dict(H200_ENV, gpu_name="NVIDIA A100-SXM4-80GB"))])
    summary = tmp_path / "s.md"
    refused = cli(b, n, "--summary", summary)
    assert refused.returncode == 2
    assert "different hardware or software" in refused.message and "Traceback" not in refused.message
    assert "refused" in summary.read_text()
    policy = tmp_path / "policy.yaml"
    policy.write_text("metrics:\n  speed: 5\n")
    bad_policy = cli(b, n, "--policy", policy, "--allow-env-mismatch")
    assert bad_policy.returncode == 2 and "`metrics.speed` is not a metric" in bad_policy.message


def test_cli_input_errors_exit_2_in_process(tmp_path, capsys, monkeypatch):
    from ditbench.cli import main

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = files(tmp_path, [cell()], [cell(seed=2, env=dict(H200_ENV, gpu_name="NVIDIA A100-SXM4-80GB"))])
    assert main(["compare", str(b), str(n), "--allow-env-mismatch"]) == 0
    assert main(["compare", str(tmp_path / "nope.jsonl"), str(n)]) == 2
    assert "does not exist" in " ".join(capsys.readouterr().err.split())
    not_results = tmp_path / "config.json"
    not_results.write_text('{"model": "DiT-S/8"}\n')
    assert main(["compare", str(not_results), str(n)]) == 2
    assert "line 1 is not a ditbench result record" in " ".join(capsys.readouterr().err.split())
    with pytest.raises(SystemExit) as usage:  # argparse: a missing NEW is a usage error
        main(["compare", str(b)])
    assert usage.value.code == 2


def test_duplicate_cells_use_the_latest_record(tmp_path):
    old = cell(300.0, started_at="2026-11-29T10:00:00Z")
    newer = cell(400.0, started_at="2026-11-29T11:00:00Z")
    b = tmp_path / "base.jsonl"
    write_jsonl(b, [old, newer])  # within a file the last line wins, as the runner decides
    n = tmp_path / "new.jsonl"
    write_jsonl(n, [cell(400.0, seed=2)])
    result = compare_files(b, n)
    assert delta(only(result), "images_per_s").base == 400.0


def test_large_matrix_gate_counts(tmp_path):
    base = make_matrix(models=("DiT-B/8", "DiT-L/4", "DiT-XL/2"), batches=(8, 16, 32), gpu_memory_gib=24)
    new = copy.deepcopy(base)
    ok_cells = [r for r in new if r["status"] == "ok"]
    fixed = next(r for r in new if r["status"] == "oom")
    slow = ok_cells[0]
    slow["metrics"]["images_per_s"] *= 0.8
    slow["metrics"]["steps_per_s"] *= 0.8  # a record agrees with itself, or it is refused when loaded
    slow["metrics"]["step_ms"]["samples"] = [s / 0.8 for s in slow["metrics"]["step_ms"]["samples"]]
    broken = ok_cells[1]
    broken.update(status="oom", metrics=None, reason="CUDA out of memory")
    fixed.update(make_record(fixed["config"]["model"], config=fixed["config"]))
    result = gate(tmp_path, base, new)
    assert result.count("regression") == 1 and result.count("new failure") == 1 and result.count("fixed") == 1
    assert result.count("pass") == len(base) - 3 - sum(r["status"] != "ok" for r in base) + 1
    assert result.exit_code == 1


def test_shipped_ci_policy_and_workflow_agree():
    from ditbench.report.load import flatten
    from ditbench.spec.suite import load_suite

    policy = load_policy(ROOT / "baselines" / "ci_gate" / "policy.yaml")
    assert policy.fail_on_missing and policy.rules["images_per_s"].threshold_pct == 5
    assert not policy.allow_incomparable
    knobs = [flatten(c.config) for c in load_suite(ROOT / "suites" / "ci_gate.yaml").cells]
    for i in range(len(policy.overrides)):  # an override that matches no cell of the suite is dead
        assert any(i in policy.matching(k) for k in knobs), policy.overrides[i].match
    workflow = (ROOT / ".github" / "workflows" / "gpu-regression.yml").read_text()
    # the GPU gate's compare step is a script (it passes with instructions while no baseline exists)
    step = (ROOT / ".github" / "workflows" / "gpu_gate_compare.sh").read_text()
    assert "bash .github/workflows/gpu_gate_compare.sh" in workflow
    assert (
        "BASE=${BASE:-baselines/ci_gate/results.jsonl}" in step
        and "NEW=${NEW:-runs/ci/results.jsonl}" in step
    )
    assert "POLICY=${POLICY:-baselines/ci_gate/policy.yaml}" in step
    assert 'ditbench compare "$BASE" "$NEW" --policy "$POLICY"' in step
    assert "ditbench run ci_gate --out runs/ci" in workflow
    assert "--benchmark-compare-fail=mean:10%" in workflow


def test_summary_of_a_large_gate_fits_a_pull_request_comment(tmp_path):
    base = [
        make_record("DiT-S/8", batch_size=b, seed=s, sample_seed=s) for b in (1, 2, 4, 8) for s in range(100)
    ]
    new = copy.deepcopy(base)
    new[-1]["metrics"]["peak_mem_allocated_gib"] *= 1.5  # the last cell regresses and must still be shown
    result = gate(tmp_path, base, new)
    text = summary_markdown(result)
    assert len(text) < 65_536
    assert "more cells (all pass)" in text
    assert new[-1]["cell_name"] in text and result.exit_code == 1


def test_long_measurement_windows_are_tested(tmp_path):
    # 700 steps a side: the exact-test bound 2 / C(1400, 700) must not overflow a float
    result = gate(tmp_path, [cell(400.0, n_samples=700)], [cell(360.0, seed=2, n_samples=700)])
    d = delta(only(result), "images_per_s")
    assert d.verdict == "regression" and d.p_value < 1e-10


def test_help_lists_every_metric_a_policy_may_name():
    from ditbench.cli.compare import POLICY_EXAMPLE
    from ditbench.records.metrics import table

    for name in table():
        assert name in POLICY_EXAMPLE


def test_the_policy_example_in_the_help_is_valid(tmp_path):
    from ditbench.cli.compare import POLICY_EXAMPLE

    lines = POLICY_EXAMPLE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("policy file")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("metrics:"))
    p = tmp_path / "example.yaml"
    p.write_text("\n".join(line[2:] for line in lines[start:end]) + "\n")
    policy = load_policy(p)
    assert policy.rules["step_ms"].threshold_pct == 10 and policy.overrides[0].match == {"model": "DiT-S/8"}
    assert policy.allow_incomparable == {"mfu"} and policy.quality_noise_k == 2
    assert {"fid", "inception_score", "step_ms"} <= policy.explicit


def test_help_documents_every_policy_key():
    from ditbench.cli.compare import POLICY_EXAMPLE
    from ditbench.report.gate.policy import STEP_SAMPLES, PolicyFile

    for key in (*PolicyFile.model_fields, STEP_SAMPLES):
        assert key in POLICY_EXAMPLE


# ------------------------------------------------------------------------------------ noisy cells

NOISE = {"step_spread": 28.5, "throughput_gap": 0.41, "spread_bound": 1.5, "gap_bound": 0.1}


def test_a_noisy_cell_still_fails_but_its_timing_verdict_is_weak(tmp_path):
    new = cell(360.0, seed=2)
    new["metrics"].update(noisy=True, noise=NOISE)
    result = gate(tmp_path, [cell(400.0)], [new])
    c = only(result)
    d = delta(c, "images_per_s")
    assert c.verdict == "regression" and result.exit_code == 1  # still gated
    assert (
        d.weak
        and "step spread p90/p10 28.5 (bound 1.5)" in d.weak_reason
        and d.weak_reason.startswith("new:")
    )
    assert c.weak
    mem = delta(c, "peak_mem_allocated_gib")
    assert not mem.weak  # memory does not come from the noisy window
    text = summary_markdown(result)
    assert "⚠️ weak" in text and "**Weak verdicts** in 1 cell(s)" in text and "regression (weak)" in text
    assert result.to_json()["weak_cells"] == 1


def test_a_noisy_baseline_makes_a_pass_weak(tmp_path):
    base = cell(400.0)
    base["metrics"].update(noisy=True, noise=NOISE)
    result = gate(tmp_path, [base], [cell(401.0, seed=2)])
    c = only(result)
    assert (
        c.verdict == "pass"
        and c.weak
        and delta(c, "images_per_s").weak_reason
        == "base: noisy measurement window: step spread p90/p10 28.5 (bound 1.5), throughput gap 0.41 "
        "(bound 0.1)"
    )


def test_noisy_false_is_not_weak(tmp_path):
    new = cell(401.0, seed=2)
    new["metrics"].update(noisy=False, noise=NOISE)
    assert not only(gate(tmp_path, [cell(400.0)], [new])).weak


def test_an_improvement_that_is_not_significant_is_not_listed_with_the_slowdowns(tmp_path):
    # the interval stays clear of a slowdown beyond the threshold (one that reaches it is inconclusive)
    base_s = step_samples(20.0, 20, noise=0.05, seed=1)
    new_s = step_samples(20.0, 20, noise=0.05, seed=2)
    result = gate(tmp_path, [cell(400.0, samples=base_s)], [cell(440.0, samples=new_s)])  # +10%, same steps
    d = delta(only(result), "images_per_s")
    assert d.verdict == "noise" and d.direction == "better" and result.exit_code == 0
    assert d.interval_pct[0] > -5.0  # never a slowdown beyond the threshold: not inconclusive
    text = summary_markdown(result)
    assert "### Better beyond the threshold, but not significant" in text
    assert "Worse beyond" not in text and "### Regressions" not in text


def test_the_cpu_allocator_peak_can_be_gated_and_reads_in_mib(tmp_path):
    base, new = cell(), cell(seed=2)
    base["metrics"]["cpu_peak_alloc_gib"], new["metrics"]["cpu_peak_alloc_gib"] = 0.0079, 0.0098
    assert "cpu_peak_alloc_gib" not in default_thresholds()  # gated only when a policy names it
    assert [d.metric for d in only(gate(tmp_path, [base], [new])).metrics if "cpu" in d.metric] == []
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text("metrics:\n  cpu_peak_alloc_gib: 10\n")
    result = gate(tmp_path, [base], [new], load_policy(policy_file))
    d = delta(only(result), "cpu_peak_alloc_gib")
    assert d.change_pct == pytest.approx(24.05, abs=0.01) and d.verdict == "regression"
    assert "| CPU allocator peak | 8.09 MiB | 10.0 MiB | +24.1% | +10% |" in summary_markdown(result)
