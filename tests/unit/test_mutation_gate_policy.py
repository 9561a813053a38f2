"""The gate's policy file read by value (report/gate/policy.py) and the `compare --json` document
(report/gate/result.py), every field checked against what the policy file and the document's format
state; and what decide.py's compare_frames keeps from several cells (the environment refusal's files,
the unmeasured count, the Inception flag, the environment). Written for the mutation runs
(reports/mutation/gate.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from synthetic_records import H200_ENV, make_record
from test_gate_quality import cell as quality_cell
from test_gate_quality import evaluation, quality
from test_gate_quality import run as _gate  # records and a policy text to a Comparison

from ditbench.core.errors import UserError
from ditbench.records.metrics import table
from ditbench.report.gate.decide import NothingComparedError
from ditbench.report.gate.env import EnvMismatchError
from ditbench.report.gate.policy import Override, Policy, Rule, load_policy
from ditbench.report.gate.result import CellResult, Comparison, MetricDelta, to_json_text

# The default policy as metrics.py and the metric registry declare it: images/s -5%, peak allocated +2%,
# peak reserved +5% (metrics.py's table); FID and Inception Score 2% (fid.py, inception_score.py).
DEFAULT_RULES = {
    "images_per_s": Rule(threshold_pct=5.0),
    "peak_mem_allocated_gib": Rule(threshold_pct=2.0),
    "peak_mem_reserved_gib": Rule(threshold_pct=5.0),
    "fid": Rule(threshold_pct=2.0),
    "inception_score": Rule(threshold_pct=2.0),
}
POLICY_KEYS = (  # PolicyFile's keys in the order it declares them
    "alpha, min_samples, fail_on_missing, allow_incomparable, allow_stopped, quality_noise_k, inconclusive, "
    "allow_sample_count_mismatch, environment, metrics, overrides"
)

FULL = """\
alpha: 0.05
min_samples: 8
fail_on_missing: true
allow_incomparable: [fid, step_samples]
quality_noise_k: 3.5
inconclusive: fail
allow_sample_count_mismatch: true
environment: may_differ
metrics:
  images_per_s: 7
  peak_mem_reserved_gib: false
  kid: null            # not gated by default: turning it off is no error
  step_ms: {threshold_pct: 3, min_abs: 0.5}
overrides:
  - match: {model: DiT-S/8, optimizer: {lr: 0.001}}
    metrics: {images_per_s: 12, fid: false}
  - match: {precision: fp16}
    metrics: {recall: 4, kid: false}
"""


def write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refusal(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_policy(path)
    return str(err.value).replace(str(path), "P")


# ---- load_policy -----------------------------------------------------------------------------


def test_without_a_file_the_policy_is_the_default():
    policy = load_policy(None)
    assert policy.rules == DEFAULT_RULES and policy.source == "defaults"
    assert (policy.alpha, policy.min_samples, policy.fail_on_missing, policy.quality_noise_k) == (
        0.01,
        5,
        False,
        2.0,
    )
    assert (policy.inconclusive, policy.environment, policy.allow_sample_count_mismatch) == (
        "inconclusive",
        "must_match",
        False,
    )
    assert (
        policy.allow_incomparable == frozenset() and policy.overrides == [] and policy.explicit == frozenset()
    )


def test_an_empty_file_is_the_default_policy_named_by_its_file(tmp_path):
    path = write(tmp_path, "# nothing set\n")
    assert load_policy(path) == Policy(source=str(path))


def test_every_key_of_a_policy_file_is_read_by_value(tmp_path):
    path = write(tmp_path, FULL)
    policy = load_policy(path)
    assert policy.source == str(path)
    assert policy.alpha == 0.05 and policy.min_samples == 8 and policy.fail_on_missing is True
    assert policy.allow_incomparable == frozenset({"fid", "step_samples"}) and policy.quality_noise_k == 3.5
    assert policy.inconclusive == "fail" and policy.allow_sample_count_mismatch is True
    assert policy.environment == "may_differ"
    # Merged over the defaults: images/s replaced, peak reserved turned off, step ms added with min_abs.
    assert policy.rules == {
        "images_per_s": Rule(threshold_pct=7.0),
        "peak_mem_allocated_gib": Rule(threshold_pct=2.0),
        "fid": Rule(threshold_pct=2.0),
        "inception_score": Rule(threshold_pct=2.0),
        "step_ms": Rule(threshold_pct=3.0, min_abs=0.5),
    }
    # An override's match is flattened to the knobs' dotted keys; false turns a metric off there.
    assert policy.overrides == [
        Override(
            {"model": "DiT-S/8", "optimizer.lr": 0.001},
            {"images_per_s": Rule(threshold_pct=12.0), "fid": None},
        ),
        Override({"precision": "fp16"}, {"recall": Rule(threshold_pct=4.0), "kid": None}),
    ]
    # What the file gives a threshold (at the top or in an override), not what it turns off.
    assert policy.explicit == frozenset({"images_per_s", "step_ms", "recall"})


def test_overrides_apply_to_the_cells_they_match_in_order(tmp_path):
    policy = load_policy(write(tmp_path, FULL))
    both = {"model": "DiT-S/8", "optimizer.lr": 0.001, "precision": "fp16"}
    assert policy.matching(both) == [0, 1]
    assert policy.rules_for(both) == {
        "images_per_s": Rule(threshold_pct=12.0),
        "peak_mem_allocated_gib": Rule(threshold_pct=2.0),
        "inception_score": Rule(threshold_pct=2.0),
        "step_ms": Rule(threshold_pct=3.0, min_abs=0.5),
        "recall": Rule(threshold_pct=4.0),  # and kid, gated nowhere, turned off without complaint
    }
    other_lr = {"model": "DiT-S/8", "optimizer.lr": 0.002, "precision": "fp32"}
    assert policy.matching(other_lr) == [] and policy.rules_for(other_lr) == policy.rules


def test_an_override_turning_off_a_metric_the_top_level_does_not_gate(tmp_path):
    policy = load_policy(
        write(tmp_path, "overrides:\n  - match: {model: DiT-S/8}\n    metrics: {kid: false}\n")
    )
    assert policy.rules_for({"model": "DiT-S/8"}) == DEFAULT_RULES and policy.explicit == frozenset()


@pytest.mark.parametrize("off", ["false", "null"])
def test_false_or_null_turns_a_default_metric_off(tmp_path, off):
    policy = load_policy(write(tmp_path, f"metrics: {{fid: {off}, images_per_s: 6.5}}\n"))
    assert policy.rules == {
        **{k: r for k, r in DEFAULT_RULES.items() if k != "fid"},
        "images_per_s": Rule(threshold_pct=6.5),
    }
    assert policy.explicit == frozenset({"images_per_s"})


def test_a_file_that_is_not_a_mapping_names_the_keys(tmp_path):
    assert refusal(tmp_path, "- alpha\n- 0.05\n") == (
        f"policy file P must be a YAML mapping with keys {POLICY_KEYS}; got a list."
    )


def test_a_policy_path_that_is_no_file_is_named_as_a_policy(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(UserError) as err:
        load_policy(missing)
    assert str(err.value) == f"policy {missing} does not exist."
    with pytest.raises(UserError) as err:
        load_policy(tmp_path)
    assert str(err.value) == f"policy {tmp_path} is a directory; give the path of a policy file."


def test_a_long_policy_path_is_cut_to_200_characters_unquoted(tmp_path):
    # shorten(path, 200, quote=False): a 201-character path keeps 199 and an ellipsis, then its length.
    name = "p" * (201 - len(str(tmp_path)) - 1 - len(".yaml")) + ".yaml"
    path = write(tmp_path, "7\n", name)
    assert len(str(path)) == 201
    with pytest.raises(UserError) as err:
        load_policy(path)
    assert str(err.value) == (
        f"policy file {str(path)[:199]}… (201 characters) must be a YAML mapping with keys {POLICY_KEYS}; "
        "got a int."
    )


def test_a_threshold_of_true_asks_for_a_percentage(tmp_path):
    assert refusal(tmp_path, "metrics: {fid: true}\n") == (
        "policy file P: `metrics.fid: true` gives no threshold; write a percentage such as `fid: 5`, or "
        "`false` to turn the metric off."
    )


def test_a_threshold_in_an_override_is_named_by_its_path(tmp_path):
    text = "overrides:\n  - match: {model: DiT-S/8}\n    metrics: {step_ms: fast}\n"
    assert refusal(tmp_path, text) == (
        "policy file P: `overrides[0].metrics.step_ms` must be a number (threshold in percent), a mapping "
        "with threshold_pct and optional min_abs, or false; got 'fast'."
    )


def test_an_unknown_metric_lists_the_metrics_the_gate_compares(tmp_path):
    valid = ", ".join(table())  # the record's metrics, then the registry's quality outputs
    assert refusal(tmp_path, "metrics: {'fid score': 2}\n") == (
        f"policy file P: `metrics.fid score` is not a metric ditbench compares; valid metrics: {valid}."
    )
    assert refusal(tmp_path, "metrics: {fid: 2, images_per_sec: 5}\n").startswith(
        "policy file P: `metrics.images_per_sec` is not a metric"
    )


def test_a_metrics_value_that_is_no_mapping_is_refused(tmp_path):
    assert refusal(tmp_path, "metrics: [fid]\n").startswith("policy file P: `metrics` must be ")


# ---- the compare --json document ----------------------------------------------------------------


def delta(metric, base, new, change, threshold, verdict, **more) -> dict:
    """A MetricDelta's fields as the document writes them, defaults included."""
    return {
        "metric": metric,
        "label": table()[metric].label,
        "base": base,
        "new": new,
        "change_pct": change,
        "threshold_pct": threshold,
        "verdict": verdict,
        "significance": more.pop("significance", "p=0.0012"),
        "p_value": None,
        "direction": "same",
        "weak": False,
        "weak_reason": None,
        "step": None,
        "noise": None,
        "interval_pct": None,
        "interval_level": None,
        "mde_pct": None,
        **more,
    }


def cell(cell_id, verdict, base_status="ok", new_status="ok", metrics=(), **more) -> dict:
    """A CellResult's fields as the document writes them, defaults included."""
    return {
        "cell_id": cell_id,
        "cell_name": f"DiT-S/8 {cell_id}",
        "verdict": verdict,
        "base_status": base_status,
        "new_status": new_status,
        "reason": None,
        "metrics": list(metrics),
        "untested": False,
        "weak": False,
        "not_compared": [],
        "not_measured": [],
        "missing_steps": [],
        **more,
    }


def built(c: dict) -> CellResult:
    return CellResult(**{**c, "metrics": [MetricDelta(**m) for m in c["metrics"]]})


SLOWER = delta(
    "images_per_s",
    400.0,
    360.0,
    -10.0,
    4.0,
    "regression",
    p_value=0.0012,
    direction="worse",
    interval_pct=[-12.5, -7.5],
    interval_level=0.95,
    mde_pct=3.57,
)
FASTER = delta("images_per_s", 400.0, 440.0, 10.0, 4.0, "improvement", p_value=0.003, direction="better")
LESS_MEMORY = delta(
    "peak_mem_allocated_gib", 2.0, 1.5, -25.0, 2.0, "improvement", direction="better", significance="-"
)
FID_SAME = delta(
    "fid",
    20.0,
    20.0,
    0.0,
    1.5,
    "unchanged",
    significance="within noise (+-0.6)",
    weak=True,
    weak_reason="base: noisy window",
    step=400,
    noise=0.6,
)
CELLS = [
    cell("c1", "regression", metrics=[SLOWER], untested=True, not_measured=["kid"]),
    cell(
        "c2",
        "improved",
        metrics=[FASTER, LESS_MEMORY],
        not_compared=[{"metric": "fid", "reason": "BASE: fid is nan"}],
    ),
    cell("c3", "pass", metrics=[FID_SAME], weak=True),
    cell("c4", "only in base", new_status=None),
    cell("c5", "new failure", new_status="oom", reason="out of memory"),
    cell("c6", "still failing", base_status="error", new_status="timeout", weak=True),
]


def comparison(cells=CELLS, **policy) -> Comparison:
    rules = {"images_per_s": Rule(threshold_pct=4.0), "fid": Rule(threshold_pct=1.5, min_abs=0.1)}
    return Comparison(
        "runs/base.jsonl",
        "runs/new.jsonl",
        [built(c) for c in cells],
        {"gpu_name": (["NVIDIA H200"], ["NVIDIA A100"]), "torch": (["2.14.1"], ["2.14.1", "2.15.0"])},
        Policy(**{"rules": rules, "source": "ci/policy.yaml", **policy}),
        {"gpu_name": "NVIDIA A100", "torch": "2.15.0"},
        inception_official=False,
        unused_overrides=[1, 3],
        env_notes={"driver": (["560.1"], ["570.2"])},
    )


POLICY = dict(
    alpha=0.02,
    min_samples=7,
    fail_on_missing=True,
    allow_incomparable=frozenset({"step_samples", "fid"}),
    allow_stopped=frozenset({"c4", "bs=64"}),
    quality_noise_k=3.0,
    inconclusive="pass",
    allow_sample_count_mismatch=True,
    environment="may_differ",
)


def test_the_json_document_holds_every_field_by_value():
    doc = comparison(**POLICY).to_json()
    assert doc == {
        "result": "regression",  # c1 regressed and c5 is a new failure: exit 1
        "exit_code": 1,
        "base": "runs/base.jsonl",
        "new": "runs/new.jsonl",
        "counts": {
            "regression": 1,
            "new failure": 1,
            "inconclusive": 0,
            "improved": 1,
            "pass": 1,
            "fixed": 0,
            "still failing": 1,
            "no longer measured": 0,
            "stopped (allowed)": 0,
            "only in base": 1,
            "only in new": 0,
        },
        "compared_metrics": 4,  # 1 + 2 + 1 deltas
        "weak_cells": 2,  # c3 and c6
        "largest_mde_pct": 3.57,  # c1's images/s
        "inception_official": False,
        "env": {"gpu_name": "NVIDIA A100", "torch": "2.15.0"},
        "env_differences": {
            "gpu_name": {"base": ["NVIDIA H200"], "new": ["NVIDIA A100"]},
            "torch": {"base": ["2.14.1"], "new": ["2.14.1", "2.15.0"]},
        },
        "env_notes": {"driver": {"base": ["560.1"], "new": ["570.2"]}},
        "policy": {
            "source": "ci/policy.yaml",
            "alpha": 0.02,
            "min_samples": 7,
            "fail_on_missing": True,
            "allow_incomparable": ["fid", "step_samples"],  # sorted
            "allow_stopped": ["bs=64", "c4"],  # sorted
            "quality_noise_k": 3.0,
            "inconclusive": "pass",
            "allow_sample_count_mismatch": True,
            "environment": "may_differ",
            "thresholds_pct": {"images_per_s": 4.0, "fid": 1.5},
            "unused_overrides": [1, 3],
        },
        "cells": CELLS,
    }
    assert list(doc) == [
        "result", "exit_code", "base", "new", "counts", "compared_metrics", "weak_cells",
        "largest_mde_pct", "inception_official", "env", "env_differences", "env_notes", "policy", "cells",
    ]  # fmt: skip
    assert list(doc["counts"]) == [
        "regression", "new failure", "inconclusive", "improved", "pass", "fixed", "still failing",
        "no longer measured", "stopped (allowed)", "only in base", "only in new",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "inconclusive,code,result",
    [("inconclusive", 3, "inconclusive"), ("pass", 0, "pass"), ("fail", 1, "regression")],
)
def test_the_document_reports_an_inconclusive_gate_as_the_policy_maps_it(inconclusive, code, result):
    cells = [
        cell("c1", "inconclusive", metrics=[{**SLOWER, "verdict": "inconclusive"}]),
        cell("c2", "only in base", new_status=None),  # fails the gate only with fail_on_missing
    ]
    doc = comparison(cells, inconclusive=inconclusive, fail_on_missing=False).to_json()
    assert (doc["exit_code"], doc["result"]) == (code, result)
    assert doc["counts"]["inconclusive"] == 1 and doc["counts"]["only in base"] == 1
    assert doc["weak_cells"] == 0 and doc["compared_metrics"] == 1


def test_a_missing_cell_fails_the_document_when_the_policy_says_so():
    cells = [cell("c1", "pass", metrics=[FASTER]), cell("c2", "only in base", new_status=None)]
    assert comparison(cells, fail_on_missing=True).to_json()["result"] == "regression"
    assert comparison(cells, fail_on_missing=False).to_json()["exit_code"] == 0


def test_the_json_text_is_two_space_indented_strict_json():
    c = comparison(**POLICY)
    text = to_json_text(c)
    assert json.loads(text) == c.to_json()
    assert text.startswith('{\n  "result": "regression",\n  "exit_code": 1,\n  "base": "runs/base.jsonl",\n')
    assert '\n    "regression": 1,\n' in text  # the counts, one level down


def test_the_json_text_writes_a_path_as_its_text():
    c = comparison(**POLICY)
    c.base_path = Path("runs") / "base.jsonl"  # default=str: not a TypeError
    assert json.loads(to_json_text(c))["base"] == "runs/base.jsonl"


def test_the_json_text_refuses_a_nan_rather_than_write_invalid_json():
    c = comparison(**POLICY)
    c.cells[0].metrics[0].new = math.nan
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        to_json_text(c)


# ---- decide.py's compare_frames: what the whole comparison keeps from its cells --------------------


def test_the_environment_refusal_names_both_files(tmp_path):
    newer = dict(H200_ENV, torch="2.15.0")
    with pytest.raises(EnvMismatchError) as err:
        _gate(tmp_path, [make_record()], [make_record(sample_seed=2, env=newer)])
    base, new = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    assert (err.value.base_path, err.value.new_path) == (str(base), str(new))
    assert str(err.value).startswith(
        f"{base} and {new} were measured on different hardware or software (torch: "
    )


def test_the_unmeasured_count_counts_every_cell_without_the_metric(tmp_path):
    # The synthetic records have no energy figures (no NVML meter): two cells measured by neither run.
    base = [make_record(batch_size=8), make_record(batch_size=16)]
    new = [make_record(batch_size=8, sample_seed=2), make_record(batch_size=16, sample_seed=2)]
    with pytest.raises(NothingComparedError) as err:
        _gate(tmp_path, base, new, "metrics: {energy_j_per_step: 5}\n")
    assert "(2 cell(s) had no energy_j_per_step in either run)" in str(err.value)


def test_unofficial_inception_weights_in_any_cell_mark_the_comparison_unofficial(tmp_path):
    def two(official_first: bool, seed: int) -> list[dict]:
        first = quality(evaluation(500, 20.0, 50.0), sha="ab" * 32, official=False)
        second = quality(evaluation(500, 20.0, 50.0))
        if official_first:
            first, second = second, first
        return [
            quality_cell(first, seed=seed, batch_size=8),
            quality_cell(second, seed=seed, batch_size=16),
        ]

    for official_first in (False, True):  # the unofficial cell compared first, then last
        result = _gate(tmp_path, two(official_first, 1), two(official_first, 2))
        assert result.compared == 2 * len(DEFAULT_RULES)  # each default metric in each cell
        assert result.inception_official is False


def test_the_comparison_keeps_the_new_runs_environment_without_unset_fields(tmp_path):
    # No driver recorded on either side: the fingerprint's "None" is left out, not written as a value.
    env = dict(H200_ENV, driver=None)
    result = _gate(tmp_path, [make_record(env=env)], [make_record(sample_seed=2, env=env)])
    assert result.env == {
        "gpu_name": "NVIDIA H200",
        "gpu_count": "1",
        "cuda": "12.8",
        "torch": "2.14.1",
        "torch_threads": "16",
    }


def test_a_refusal_for_nothing_compared_lists_each_verdict_with_its_count(tmp_path):
    base = [
        make_record(batch_size=8, status="oom"),
        make_record(batch_size=16, status="skipped"),
        make_record(batch_size=32, status="unsupported"),
    ]
    new = [make_record(batch_size=8, status="error"), make_record(batch_size=16), make_record(batch_size=32)]
    with pytest.raises(NothingComparedError) as err:
        _gate(tmp_path, base, new)
    # In VERDICTS' order, joined by ", ": one failure changed kind, two cells run now that did not before.
    assert "could be compared (2 fixed, 1 still failing; gated metrics: " in str(err.value)
