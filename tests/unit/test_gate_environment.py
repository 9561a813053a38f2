"""What `compare` does when the two runs come from different machines or torch builds: refuses by
default, compares and names the differences under a policy that says `environment: may_differ`, names
a CPU cell's torch build (CPU or CUDA wheel of one release) without gating it, and finds the policy
kept beside a baseline."""

from __future__ import annotations

import copy
import json

from synthetic_records import CPU_ENV, make_record, write_jsonl

from ditbench.cli import main


def cpu_cells(torch="2.14.1+cu130", cpu="AMD EPYC 7B13", run_id="a"):
    env = dict(CPU_ENV, torch=torch, cpu=cpu, cuda="13.0" if "+cu" in torch else None)
    cells = [
        make_record("DiT-S/8", "fp32", "none", b, images_per_s=400.0, env=env, device="cpu") for b in (8, 16)
    ]
    return [dict(copy.deepcopy(r), run_id=run_id) for r in cells]


def run(tmp_path, capsys, base, new, *args, folder="base"):
    (tmp_path / folder).mkdir(exist_ok=True)
    b, n = tmp_path / folder / "results.jsonl", tmp_path / "new.jsonl"
    write_jsonl(b, base)
    write_jsonl(n, new)
    code = main(["compare", str(b), str(n), "--json", *args])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else None), out.err


def test_a_cpu_cells_torch_build_is_named_not_gated(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    code, result, err = run(tmp_path, capsys, cpu_cells(), cpu_cells("2.14.1+cpu", run_id="b"))
    assert code == 0, err
    assert result["env_differences"] == {}
    assert result["env_notes"] == {
        "cuda": {"base": ["13.0"], "new": ["None"]},
        "torch build": {"base": ["cu130"], "new": ["cpu"]},
    }
    # Another release is another code path: refused.
    code, _, err = run(tmp_path, capsys, cpu_cells(), cpu_cells("2.13.0+cpu", run_id="b"))
    assert code == 2 and "torch: 2.14.1 (base) vs 2.13.0 (new)" in " ".join(err.split())


def test_may_differ_compares_other_machines_and_names_them(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    base, new = cpu_cells(), cpu_cells(cpu="Intel Xeon", run_id="b")
    code, _, err = run(tmp_path, capsys, base, new)
    assert code == 2 and "environment: may_differ" in " ".join(err.split())
    policy = tmp_path / "p.yaml"
    policy.write_text("environment: may_differ\n")
    code, result, err = run(tmp_path, capsys, base, new, "--policy", str(policy))
    assert code == 0, err
    assert result["env_differences"] == {"cpu": {"base": ["AMD EPYC 7B13"], "new": ["Intel Xeon"]}}
    assert result["policy"]["environment"] == "may_differ"
    policy.write_text("environment: sometimes\n")
    code, _, err = run(tmp_path, capsys, base, new, "--policy", str(policy))
    assert code == 2 and "must_match" in err and "may_differ" in err and "Traceback" not in err


def test_the_policy_beside_the_baseline_is_used_and_said(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    base, new = cpu_cells(), cpu_cells(cpu="Intel Xeon", run_id="b")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "policy.yaml").write_text("environment: may_differ\nmetrics: {images_per_s: 7}\n")
    code, result, err = run(tmp_path, capsys, base, new)
    assert code == 0, err
    beside = str(tmp_path / "base" / "policy.yaml")
    assert result["policy"]["source"] == beside and f"policy {beside} (beside the baseline" in err
    assert result["policy"]["thresholds_pct"]["images_per_s"] == 7
    # --policy wins over the file beside the baseline.
    other = tmp_path / "other.yaml"
    other.write_text("metrics: {images_per_s: 9}\n")
    code, result, err = run(tmp_path, capsys, base, cpu_cells(run_id="b"), "--policy", str(other))
    assert code == 0 and result["policy"]["source"] == str(other) and "beside" not in err


def test_the_shipped_cpu_baseline_compares_with_one_command(tmp_path, capsys, monkeypatch):
    """The quick start's command: the CPU baseline with its own policy, against a run of another CPU
    with torch's CPU wheel (the hosted runner's), passes without further flags."""
    from pathlib import Path

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    base = Path(__file__).resolve().parents[2] / "baselines" / "cpu_smoke" / "results.jsonl"
    records = [json.loads(line) for line in base.read_text().splitlines()]
    for r in records:
        r["run_id"] = "runner"
        r["env"] = dict(
            r["env"],
            cuda=None,
            cpu="AMD EPYC 7763 64-Core Processor",
            torch=r["env"]["torch"].split("+")[0] + "+cpu",
        )
    new = tmp_path / "new.jsonl"
    write_jsonl(new, records)
    code = main(["compare", str(base), str(new), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    assert result["policy"]["source"].endswith("baselines/cpu_smoke/policy.yaml")
    assert "cpu" in result["env_differences"] and result["compared_metrics"] > 0
