"""The quality gate: FID and IS from the records' `quality` field, judged against threshold and noise."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from synthetic_records import make_record, write_jsonl

from ditbench.cli import main
from ditbench.core.errors import UserError
from ditbench.report.gate.decide import compare_files
from ditbench.report.gate.policy import load_policy
from ditbench.report.gate.quality import QualityMismatchError
from ditbench.report.gate.summary import summary_markdown

OFFICIAL_SHA = "f58cb9b6ec323ed63459aa4fb441fe750cfe39fafad6da5cb504a16f19e958f4"
METRIC_KEYS = ("fid", "sfid", "inception_score", "precision", "recall", "kid")


def evaluation(step: int, fid: float, inception_score: float, seeds=(0, 1, 2), fid_sd=0.3, is_sd=1.0):
    """One evaluation with per-seed scores spread around the given means (sample std as stated)."""
    k = len(seeds)
    unit = np.array([0.0]) if k == 1 else (np.arange(k) - (k - 1) / 2) / np.std(np.arange(k), ddof=1)
    means = {
        "fid": fid,
        "sfid": fid * 1.5,
        "inception_score": inception_score,
        "precision": 0.6,
        "recall": 0.5,
        "kid": 0.01,
    }
    sds = {
        "fid": fid_sd,
        "sfid": fid_sd,
        "inception_score": is_sd,
        "precision": 0.01,
        "recall": 0.01,
        "kid": 0.001,
    }
    per_seed = [
        {"seed": s, **{m: float(means[m] + sds[m] * unit[i]) for m in METRIC_KEYS}}
        for i, s in enumerate(seeds)
    ]
    return {
        "step": step,
        "train_wall_s": 10.0 * step,
        "train_gpu_s": 10.0 * step,
        "sample_s": 30.0,
        "score_s": 12.0,
        "seeds": list(seeds),
        "per_seed": per_seed,
        "metrics": {m: float(np.mean([p[m] for p in per_seed])) for m in METRIC_KEYS},
        "spread": None
        if k == 1
        else {m: float(np.std([p[m] for p in per_seed], ddof=1)) for m in METRIC_KEYS},
        "grid": f"grids/step{step}.png",
    }


def quality(*evaluations, sha=OFFICIAL_SHA, official=True, digest="sha256:ref1", samples=5000, sampler=None):
    return {
        "reference": {"path": "refs/VIRTUAL_imagenet256_labeled.npz", "digest": digest},
        "inception": {"name": "pt_inception-2015-12-05", "sha256": sha, "official": official},
        "sampler": sampler or {"name": "ddpm", "steps": 250, "cfg_scale": 1.5},
        "samples": samples,
        "evaluations": list(evaluations),
    }


def cell(q=None, seed=1, batch_size=8, **kw):
    r = make_record(
        "DiT-S/8", "fp32", "none", batch_size, images_per_s=400.0, sample_seed=seed, smoke_steps=50, **kw
    )
    r["quality"] = q
    return r


def run(tmp_path, base, new, policy: str | None = None):
    b, n = tmp_path / "base.jsonl", tmp_path / "new.jsonl"
    for path, records in ((b, base), (n, new)):  # NaN and Infinity as a hand edit could leave them
        records = records if isinstance(records, list) else [records]
        path.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in records))
    p = None
    if policy is not None:
        p = tmp_path / "policy.yaml"
        p.write_text(policy)
    return compare_files(b, n, load_policy(p))


def fid_delta(result, metric="fid"):
    return next(d for c in result.cells for d in c.metrics if d.metric == metric)


# ------------------------------------------------------------------------------------------ verdicts


def test_fid_worse_beyond_threshold_and_noise_fails_with_exit_1(tmp_path, capsys, monkeypatch):
    base = cell(quality(evaluation(0, 300.0, 1.5), evaluation(500, 20.0, 50.0)))
    new = cell(
        quality(evaluation(0, 300.0, 1.5), evaluation(500, 23.0, 50.0)), seed=2
    )  # +15%, |Δ| 3 > 2σ 0.85
    result = run(tmp_path, base, new)
    d = fid_delta(result)
    assert (d.verdict, d.step, d.direction) == ("regression", 500, "worse")
    assert d.change_pct == pytest.approx(15.0) and d.noise == pytest.approx(2 * np.hypot(0.3, 0.3))
    assert "beyond noise" in d.significance and not d.weak
    assert result.exit_code == 1
    assert "FID @ step 500" in summary_markdown(result)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert main(["compare", str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")]) == 1
    assert "### Regressions" in capsys.readouterr().out


def test_fid_worse_beyond_threshold_but_within_noise_is_inconclusive(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0, fid_sd=1.5)))
    new = cell(quality(evaluation(500, 21.0, 50.0, fid_sd=1.5)), seed=2)  # +5% > 2%, but |Δ| 1 < 2σ 4.2
    result = run(tmp_path, base, new)
    d = fid_delta(result)
    assert d.verdict == "inconclusive" and d.direction == "worse" and "within noise" in d.significance
    bound = 2 * np.hypot(1.5, 1.5)  # the change +- the noise bound, in percent of the base
    assert d.interval_pct == pytest.approx([(1 - bound) / 20 * 100, (1 + bound) / 20 * 100])
    assert result.exit_code == 3
    text = summary_markdown(result)
    assert "### Inconclusive" in text and "### Regressions" not in text


def test_an_unchanged_fid_with_noise_wider_than_the_threshold_is_inconclusive(tmp_path):
    # 20 -> 20.1 is +0.5%, within 2%; but the noise bound 0.85 (4.2%) allows +4.7%: cannot tell.
    base = cell(quality(evaluation(500, 20.0, 50.0, is_sd=0.1)))
    new = cell(quality(evaluation(500, 20.1, 50.0, is_sd=0.1)), seed=2)
    d = fid_delta(run(tmp_path, base, new))
    assert d.verdict == "inconclusive" and d.interval_pct[1] == pytest.approx(4.7426, abs=1e-3)
    narrow = run(
        tmp_path,
        cell(quality(evaluation(500, 20.0, 50.0, fid_sd=0.1, is_sd=0.1))),
        cell(quality(evaluation(500, 20.1, 50.0, fid_sd=0.1, is_sd=0.1)), seed=2),
    )
    assert fid_delta(narrow).verdict == "unchanged" and narrow.exit_code == 0


def test_different_sample_counts_refuse_unless_the_policy_allows(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0, fid_sd=0.1, is_sd=0.1), samples=5000))
    new = cell(quality(evaluation(500, 23.0, 50.0, fid_sd=0.1, is_sd=0.1), samples=10_000), seed=2)
    with pytest.raises(QualityMismatchError) as err:
        run(tmp_path, base, new)
    text = str(err.value)
    assert "5000 (base) vs 10000 (new)" in text and "allow_sample_count_mismatch" in text
    assert "DiT-S/8" in text and "bias depends on the number of samples N" in text
    result = run(tmp_path, base, new, "allow_sample_count_mismatch: true\n")
    d = fid_delta(result)
    assert d.verdict == "regression" and d.weak and "N 5000 (base) vs 10000 (new)" in d.weak_reason
    assert result.to_json()["policy"]["allow_sample_count_mismatch"] is True


def test_fid_better_beyond_noise_is_an_improvement_listed_apart(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0, is_sd=0.2)))
    new = cell(quality(evaluation(500, 15.0, 50.0, is_sd=0.2)), seed=2)
    result = run(tmp_path, base, new)
    assert fid_delta(result).verdict == "improvement" and result.exit_code == 0
    text = summary_markdown(result)
    improvements = text.split("### Improvements")[1]
    assert "FID @ step 500" in improvements and "### Regressions" not in text and "Worse beyond" not in text


def test_inception_score_lower_is_a_regression(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0)))
    new = cell(quality(evaluation(500, 20.0, 44.0)), seed=2)  # -12%, |Δ| 6 > 2σ 2.8
    result = run(tmp_path, base, new)
    d = fid_delta(result, "inception_score")
    assert d.verdict == "regression" and d.direction == "worse" and result.exit_code == 1


def test_optional_metrics_are_gated_when_the_policy_names_them(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0)))
    worse = copy.deepcopy(base["quality"])
    worse["evaluations"][0]["metrics"]["recall"] = 0.3  # from 0.5, spread 0.01
    result = run(
        tmp_path, base, cell(worse, seed=2), "metrics: {recall: 5, precision: 5, kid: {threshold_pct: 50}}\n"
    )
    assert fid_delta(result, "recall").verdict == "regression"
    assert fid_delta(result, "precision").verdict == "unchanged"
    assert fid_delta(result, "kid").verdict == "unchanged"


def test_the_last_evaluation_both_runs_have_is_compared(tmp_path):
    base = cell(
        quality(
            evaluation(0, 300.0, 1.5),
            evaluation(500, 20.0, 50.0, fid_sd=0.1, is_sd=0.1),
            evaluation(1000, 12.0, 70.0),
        )
    )
    new = cell(quality(evaluation(0, 300.0, 1.5), evaluation(500, 20.1, 50.0, fid_sd=0.1, is_sd=0.1)), seed=2)
    result = run(tmp_path, base, new)
    d = fid_delta(result)
    assert d.step == 500 and d.verdict == "unchanged"
    # the step the new run lacks is never a silent pass: named, and a failure with fail_on_missing
    assert result.cells[0].missing_steps == [1000] and result.exit_code == 0
    text = summary_markdown(result)
    assert "### Quality steps the base evaluated and the new run lacks\n" in text
    assert f"| {base['cell_name']} | 1000 |" in text
    strict = run(tmp_path, base, new, "fail_on_missing: true\n")
    assert strict.exit_code == 1 and strict.cells[0].verdict == "pass"
    assert "lacks (fails the gate: fail_on_missing)" in summary_markdown(strict)
    assert summary_markdown(strict).startswith("## ❌ ditbench compare: cells or quality steps missing")


def test_without_spread_the_threshold_decides_and_the_verdict_is_weak(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0, seeds=(0,))))
    new = cell(quality(evaluation(500, 21.0, 50.0, seeds=(0,))), seed=2)
    result = run(tmp_path, base, new)
    d = fid_delta(result)
    assert d.verdict == "regression" and d.weak and "noise unknown" in d.significance
    assert result.cells[0].weak and result.exit_code == 1
    text = summary_markdown(result)
    assert "⚠️ weak" in text and "**Weak verdicts**" in text and "regression (weak)" in text


def test_a_spread_on_one_side_stands_for_both_and_is_weak(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0, fid_sd=1.0)))
    new = cell(quality(evaluation(500, 21.0, 50.0, seeds=(0,))), seed=2)
    d = fid_delta(run(tmp_path, base, new))
    assert d.noise == pytest.approx(2 * np.hypot(1.0, 1.0)) and d.verdict == "inconclusive" and d.weak


def test_quality_noise_k_sets_the_noise_bound(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0, fid_sd=0.5)))
    new = cell(quality(evaluation(500, 21.5, 50.0, fid_sd=0.5)), seed=2)  # |Δ| 1.5, σ 0.71
    # k = 2: +7.5% +- 7.1% straddles the 2% threshold; k = 1: +7.5% +- 3.5% lies wholly beyond it.
    assert fid_delta(run(tmp_path, base, new)).verdict == "inconclusive"
    assert fid_delta(run(tmp_path, base, new, "quality_noise_k: 1\n")).verdict == "regression"


def test_unofficial_inception_is_compared_with_a_banner(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0), sha="ab" * 32, official=False))
    new = cell(quality(evaluation(500, 20.0, 50.0), sha="ab" * 32, official=False), seed=2)
    result = run(tmp_path, base, new)
    assert result.inception_official is False and result.to_json()["inception_official"] is False
    assert "Not the official Inception weights" in summary_markdown(result)
    official = run(
        tmp_path, cell(quality(evaluation(500, 20.0, 50.0))), cell(quality(evaluation(500, 20.0, 50.0)))
    )
    assert official.inception_official is True and "Not the official" not in summary_markdown(official)


def test_runs_without_quality_are_not_measured_under_the_defaults(tmp_path):
    result = run(tmp_path, cell(None), cell(None, seed=2))
    assert result.exit_code == 0 and result.inception_official is None
    assert set(result.cells[0].not_measured) >= {"fid", "inception_score"}


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "changes, label",
    [
        ({"sha": "cd" * 32, "official": False}, "Inception weights (sha256)"),
        ({"digest": "sha256:ref2"}, "reference batch (digest)"),
        ({"sampler": {"name": "ddim", "steps": 50, "cfg_scale": 1.5}}, "sampler"),
        ({"sampler": {"name": "ddpm", "steps": 250, "cfg_scale": 4.0}}, "sampler"),
        ({"samples": 10_000}, "samples per evaluation"),
    ],
)
def test_quality_made_differently_refuses_with_exit_2(tmp_path, capsys, monkeypatch, changes, label):
    base = cell(quality(evaluation(500, 20.0, 50.0)))
    new = cell(quality(evaluation(500, 20.0, 50.0), **changes), seed=2)
    with pytest.raises(QualityMismatchError) as err:
        run(tmp_path, base, new)
    assert label in str(err.value) and err.value.exit_code == 2
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    summary = tmp_path / "s.md"
    code = main(
        ["compare", str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl"), "--summary", str(summary)]
    )
    stderr = " ".join(capsys.readouterr().err.split())
    assert code == 2 and label in stderr and "Traceback" not in stderr
    assert "quality measured differently" in summary.read_text()


def test_different_weights_are_accepted_when_quality_is_not_gated(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0)))
    new = cell(quality(evaluation(500, 20.0, 50.0), sha="cd" * 32), seed=2)
    result = run(tmp_path, base, new, "metrics: {fid: false, inception_score: false}\n")
    assert result.exit_code == 0 and result.inception_official is None


def _broken(change):
    q = quality(evaluation(0, 300.0, 1.5), evaluation(500, 20.0, 50.0))
    change(q)
    return q


@pytest.mark.parametrize(
    "q, needle",
    [
        (_broken(lambda q: q.update(evaluations=[])), "quality.evaluations is [], not a non-empty list"),
        (
            _broken(lambda q: q.update(evaluations={"step": 1})),
            "quality.evaluations is {'step': 1}, not a list",
        ),
        (_broken(lambda q: q["evaluations"][1].update(step=True)), "evaluations[1].step is True"),
        (_broken(lambda q: q["evaluations"][1].update(step=0)), "step 0 appears twice"),
        (_broken(lambda q: q["evaluations"][1].update(metrics=None)), "evaluations[1].metrics is None"),
        (_broken(lambda q: q["evaluations"][1].update(spread=[0.1])), "spread is [0.1]"),
        (_broken(lambda q: q["inception"].pop("sha256")), "quality.inception.sha256 is None"),
        (_broken(lambda q: q.update(reference="ref.npz")), "quality.reference is 'ref.npz', not an object"),
        (_broken(lambda q: q.update(samples=0)), "quality.samples is 0"),
        (_broken(lambda q: q.update(sampler="ddpm")), "quality.sampler is 'ddpm'"),
        (_broken(lambda q: q["evaluations"][1]["metrics"].update(fid=float("nan"))), "metrics.fid is nan"),
        (_broken(lambda q: q["evaluations"][1]["metrics"].update(fid="low")), "metrics.fid is 'low'"),
        (_broken(lambda q: q["evaluations"][1]["metrics"].update(fid=-3.0)), "not a non-negative value"),
        (_broken(lambda q: q["evaluations"][1]["metrics"].pop("fid")), "metrics.fid is missing"),
        (_broken(lambda q: q["evaluations"][1]["spread"].update(fid=-1.0)), "spread.fid is -1"),
        (_broken(lambda q: q["evaluations"][1]["spread"].update(fid=float("inf"))), "spread.fid is inf"),
        (
            _broken(
                lambda q: (
                    q["evaluations"].pop(1)
                    and q["evaluations"].pop(0)
                    and q["evaluations"].append(evaluation(400, 20.0, 50.0))
                )
            ),
            "no evaluation at a training step both runs have",
        ),
    ],
)
def test_a_broken_quality_field_refuses_naming_file_line_and_cell(tmp_path, q, needle):
    base = cell(quality(evaluation(0, 300.0, 1.5), evaluation(500, 20.0, 50.0)))
    new = cell(q, seed=2)
    with pytest.raises(UserError) as err:
        run(tmp_path, base, new)
    text = str(err.value)
    assert needle in text and "new.jsonl line 1" in text and new["cell_name"] in text


def test_quality_on_one_side_only_refuses_unless_allowed(tmp_path):
    base = cell(quality(evaluation(500, 20.0, 50.0)))
    with pytest.raises(UserError, match="has no quality field, but the other run has one"):
        run(tmp_path, base, cell(None, seed=2))
    result = run(tmp_path, base, cell(None, seed=2), "allow_incomparable: [fid, inception_score]\n")
    assert {m["metric"] for m in result.cells[0].not_compared} == {"fid", "inception_score"}
    assert result.exit_code == 0 and "Not compared" in summary_markdown(result)


def test_a_policy_gating_fid_with_no_quality_anywhere_refuses(tmp_path):
    with pytest.raises(UserError, match="gates fid, but no cell ok in both runs measured it"):
        run(tmp_path, cell(None), cell(None, seed=2), "metrics: {fid: 2}\n")


def test_the_json_carries_the_quality_verdict(tmp_path, capsys, monkeypatch):
    base = cell(quality(evaluation(500, 20.0, 50.0, seeds=(0,))))
    new = cell(quality(evaluation(500, 23.0, 50.0, seeds=(0,))), seed=2)
    write_jsonl(tmp_path / "b.jsonl", [base])
    write_jsonl(tmp_path / "n.jsonl", [new])
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert main(["compare", str(tmp_path / "b.jsonl"), str(tmp_path / "n.jsonl"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    d = next(d for d in data["cells"][0]["metrics"] if d["metric"] == "fid")
    assert d["step"] == 500 and d["weak"] is True and d["noise"] is None and d["verdict"] == "regression"
    assert data["weak_cells"] == 1 and data["inception_official"] is True
