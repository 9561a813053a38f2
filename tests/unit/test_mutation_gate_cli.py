"""cli/compare.py checked part by part (issue 27, mutation testing): its flags, where the summary
goes ($GITHUB_STEP_SUMMARY appended, --summary replaced), the policy kept beside the baseline, and the
exit codes and JSON of `run` (0 pass, 1 regression, 2 refused with {"result": "refused", ...})."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from synthetic_records import make_record, write_jsonl

from ditbench.cli.compare import POLICY_BESIDE, _policy_path, add_arguments, publish, run
from ditbench.core.errors import UserError
from ditbench.report.gate.env import EnvMismatchError

# ------------------------------------------------------------------------------------------ flags


def parser():
    p = argparse.ArgumentParser(prog="ditbench compare")
    add_arguments(p)
    return p


def test_the_flags_and_their_defaults():
    args = parser().parse_args(["a.jsonl", "b.jsonl"])
    assert vars(args) == {
        "base": "a.jsonl",
        "new": "b.jsonl",
        "policy": None,
        "allow_env_mismatch": False,
        "summary": None,
        "json": False,
    }
    args = parser().parse_args(
        ["a", "b", "--policy", "p.yaml", "--allow-env-mismatch", "--summary", "s.md", "--json"]
    )
    assert (args.policy, args.allow_env_mismatch, args.summary, args.json) == ("p.yaml", True, "s.md", True)


def test_each_flag_is_explained():
    actions = {a.dest: a for a in parser()._actions}
    assert (actions["base"].metavar, actions["base"].help) == (
        "BASE",
        "the baseline results.jsonl (or its run directory)",
    )
    assert (actions["new"].metavar, actions["new"].help) == (
        "NEW",
        "the new results.jsonl (or its run directory)",
    )
    assert actions["policy"].metavar == "POLICY.yaml"
    assert actions["policy"].help == (
        "thresholds per metric, significance level, per-cell overrides, what may go uncompared; default: the "
        "policy.yaml in BASE's folder if there is one (it says how its baseline is gated), else images/s "
        "-5%%, peak allocated +2%%, peak reserved +5%%, FID +2%%, Inception Score -2%%, alpha 0.01"
    )
    assert (
        actions["allow_env_mismatch"].help
        == "compare even when GPU, driver, CUDA or torch differ between the runs"
    )
    assert (actions["summary"].metavar, actions["summary"].help) == (
        "FILE",
        "also write the markdown summary to FILE (e.g. for a pull-request comment)",
    )
    assert actions["json"].help == "print the full comparison as JSON instead of markdown"
    help_text = parser().format_help()
    assert "alpha 0.01" in help_text and "images/s -5%," in help_text
    assert parser().epilog.startswith("exit status: 0 pass or improvement, 1 regression")


# ------------------------------------------------------------------------------------------ publish


def test_without_a_summary_file_or_step_summary_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.chdir(tmp_path)
    publish("# text", None)
    assert list(tmp_path.iterdir()) == []


def test_the_summary_file_is_replaced_and_the_step_summary_appended(tmp_path, monkeypatch):
    summary, step = tmp_path / "s.md", tmp_path / "step.md"
    summary.write_text("old summary\n")
    step.write_text("other step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    publish("# text\n", str(summary))
    assert summary.read_text() == "# text\n"
    assert step.read_text() == "other step\n# text\n\n"


def test_a_summary_file_alone_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    summary = tmp_path / "s.md"
    publish("# text\n", str(summary))
    assert summary.read_text() == "# text\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.md"]


def test_a_step_summary_alone_is_appended(tmp_path, monkeypatch):
    step = tmp_path / "step.md"
    step.write_text("x\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    publish("# t", None)
    assert step.read_text() == "x\n# t\n"


def test_a_summary_file_that_is_the_step_summary_is_appended_once(tmp_path, monkeypatch):
    step = tmp_path / "step.md"
    step.write_text("other step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    monkeypatch.chdir(tmp_path)
    publish("# text", "./step.md")
    assert step.read_text() == "other step\n# text\n"


def test_an_unwritable_summary_is_a_user_error_naming_the_flag(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    (tmp_path / "afile").write_text("")
    target = tmp_path / "afile" / "s.md"  # its folder is a file
    with pytest.raises(UserError) as err:
        publish("# t", str(target))
    assert str(err.value) == (
        f"cannot write the summary to --summary {target}: File exists. Give a writable file path."
    )


def test_an_unwritable_step_summary_is_a_user_error_naming_the_variable(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("")
    step = tmp_path / "afile" / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    summary = tmp_path / "s.md"
    with pytest.raises(UserError) as err:
        publish("# t", str(summary))
    assert str(err.value) == (
        f"cannot write the summary to $GITHUB_STEP_SUMMARY {step}: Not a directory. Give a writable file "
        "path."
    )
    assert summary.read_text() == "# t"  # the summary file was written before


def test_a_long_path_is_cut_in_the_error(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    (tmp_path / "afile").write_text("")
    target = str(tmp_path / "afile" / ("n" * 250))
    with pytest.raises(UserError) as err:
        publish("# t", target)
    shown = target[:199] + f"… ({len(target):,} characters)"
    assert (
        str(err.value)
        == f"cannot write the summary to --summary {shown}: File exists. Give a writable file path."
    )


# ------------------------------------------------------------------------------------------ _policy_path


def ns(base, new="n.jsonl", policy=None, summary=None, json_=False, allow=False):
    return argparse.Namespace(
        base=str(base), new=str(new), policy=policy, summary=summary, json=json_, allow_env_mismatch=allow
    )


def test_a_given_policy_is_used_as_given(tmp_path, capsys):
    (tmp_path / POLICY_BESIDE).write_text("alpha: 0.05\n")
    assert POLICY_BESIDE == "policy.yaml"
    assert _policy_path(ns(tmp_path / "results.jsonl", policy="mine.yaml")) == "mine.yaml"
    assert capsys.readouterr().err == ""


def test_the_policy_beside_the_baseline_file_or_folder_is_used_and_said(tmp_path, capsys):
    beside = tmp_path / "policy.yaml"
    beside.write_text("alpha: 0.05\n")
    said = f"ditbench compare: policy {beside} (beside the baseline; --policy FILE to use another)\n"
    assert _policy_path(ns(tmp_path / "results.jsonl")) == str(beside)
    assert capsys.readouterr().err == said
    assert _policy_path(ns(tmp_path)) == str(beside)
    assert capsys.readouterr().err == said


def test_without_a_policy_beside_the_baseline_the_defaults_apply(tmp_path, capsys):
    assert _policy_path(ns(tmp_path / "results.jsonl")) is None
    (tmp_path / "policy.yaml").mkdir()  # a folder of that name is no policy file
    assert _policy_path(ns(tmp_path)) is None
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------ run


def runs(tmp_path, new_images_per_s=400.0, new_env=None):
    b, n = tmp_path / "base" / "results.jsonl", tmp_path / "new" / "results.jsonl"
    b.parent.mkdir()
    n.parent.mkdir()
    write_jsonl(b, [make_record(images_per_s=400.0)])
    write_jsonl(n, [make_record(images_per_s=new_images_per_s, sample_seed=1, env=new_env)])
    return b, n


def test_a_pass_prints_the_summary_writes_it_and_exits_0(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = runs(tmp_path)
    summary = tmp_path / "s.md"
    assert run(ns(b, n, summary=str(summary))) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"## ✅ ditbench compare: no regression\n\nBase `{b}` vs new `{n}`: 1 cells matched"
    )
    assert summary.read_text() == out


def test_a_regression_exits_1_and_json_prints_the_document(tmp_path, capsys, monkeypatch):
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    b, n = runs(tmp_path, new_images_per_s=300.0)  # -25% against a 5% threshold
    assert run(ns(b, n, json_=True)) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["result"], doc["exit_code"], doc["base"], doc["new"]) == ("regression", 1, str(b), str(n))
    assert step.read_text().startswith("## ❌ ditbench compare: 1 regression\n")


def test_the_policy_beside_the_baseline_decides(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = runs(tmp_path, new_images_per_s=300.0)
    (b.parent / "policy.yaml").write_text("metrics: {images_per_s: 30}\n")  # -25% is within 30%
    assert run(ns(b, n)) == 0
    assert "Policy (" + str(b.parent / "policy.yaml") + "): images/s -30%" in capsys.readouterr().out


def test_a_refusal_is_published_printed_as_json_and_raised(tmp_path, capsys, monkeypatch):
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    b, n = runs(tmp_path, new_env={"gpu_name": "NVIDIA A100", "gpu_count": 1, "torch": "2.5.0"})
    summary = tmp_path / "s.md"
    with pytest.raises(EnvMismatchError) as err:
        run(ns(b, n, summary=str(summary), json_=True))
    assert summary.read_text() == err.value.markdown()
    assert step.read_text() == err.value.markdown() + "\n"
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"result": "refused", "exit_code": 2, "reason": " ".join(str(err.value).split())}


def test_a_refusal_without_json_prints_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = runs(tmp_path, new_env={"gpu_name": "NVIDIA A100", "gpu_count": 1, "torch": "2.5.0"})
    with pytest.raises(EnvMismatchError):
        run(ns(b, n))
    assert capsys.readouterr().out == ""


def test_allowing_the_environment_mismatch_compares(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = runs(tmp_path, new_env={"gpu_name": "NVIDIA A100", "gpu_count": 1, "torch": "2.5.0"})
    assert run(ns(b, n, allow=True)) == 0
    assert (
        "> ⚠️ **Environments differ** (compared anyway, with --allow-env-mismatch)" in capsys.readouterr().out
    )


def test_a_summary_that_is_an_input_is_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = runs(tmp_path)
    before = b.read_text()
    with pytest.raises(UserError) as err:
        run(ns(b, n, summary=str(b)))
    assert re.match(r"--summary '.+ is the input BASE '.+: writing it", str(err.value))
    assert str(err.value).endswith("Give another path for --summary.")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(n))
    with pytest.raises(UserError) as err:
        run(ns(b, n))
    assert re.match(r"\$GITHUB_STEP_SUMMARY '.+ is the input NEW '.+: writing it", str(err.value))
    assert b.read_text() == before


def test_a_step_summary_that_is_a_folder_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    b, n = runs(tmp_path)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))
    with pytest.raises(UserError) as err:
        run(ns(b, n, json_=True))
    assert re.match(r"\$GITHUB_STEP_SUMMARY '.+ is a ", str(err.value))
    assert "the summary is appended to a regular file" in str(err.value)
    assert capsys.readouterr().out == ""  # refused before comparing


def test_a_refusal_as_json_is_indented_by_two(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = runs(tmp_path, new_env={"gpu_name": "NVIDIA A100", "gpu_count": 1, "torch": "2.5.0"})
    with pytest.raises(EnvMismatchError):
        run(ns(b, n, json_=True))
    out = capsys.readouterr().out
    assert out.startswith('{\n  "result": "refused",\n  "exit_code": 2,\n  "reason": "')
    assert out.endswith('"\n}\n')


def test_a_policy_that_is_the_summary_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    b, n = runs(tmp_path)
    policy = tmp_path / "p.yaml"
    policy.write_text("alpha: 0.05\n")
    with pytest.raises(UserError) as err:
        run(ns(b, n, policy=str(policy), summary=str(policy)))
    assert re.match(r"--summary '.+ is the input --policy '.+: writing it", str(err.value))
    assert policy.read_text() == "alpha: 0.05\n"
