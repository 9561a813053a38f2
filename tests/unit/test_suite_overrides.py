"""Shipped suites by name (`ditbench run cpu_smoke`, `ditbench suites`) and `key=value` overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ditbench.cli import main
from ditbench.core.errors import UserError
from ditbench.spec.suite import SUITES_DIR, load_suite, resolve_suite, shipped_suites

ROOT = Path(__file__).resolve().parents[2]


def err_text(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


def test_the_repository_suites_folder_is_the_package_folder():
    assert (ROOT / "suites").resolve() == SUITES_DIR.resolve() == (ROOT / "ditbench" / "suites").resolve()
    names = set(shipped_suites())
    assert {"cpu_smoke", "cpu_multi", "multi_node", "single_24gb", "ci_gate"} <= names
    pyproject = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11+; the package supports 3.10
    shipped = (
        'ditbench = ["suites/*.yaml", "claims/*.yaml", "plan/speed_calibration.json", '
        '"plan/speed_calibration_cpu.json", "plan/traces.json.xz"]'
    )
    assert "[tool.setuptools.package-data]\n" + shipped in pyproject


def test_a_name_or_a_path(tmp_path, monkeypatch):
    assert resolve_suite("cpu_smoke") == SUITES_DIR / "cpu_smoke.yaml"
    assert resolve_suite("cpu_smoke.yaml") == SUITES_DIR / "cpu_smoke.yaml"
    own = tmp_path / "cpu_smoke"  # an existing file wins over a shipped name
    own.write_text("name: mine\nmatrix: {model: [DiT-T/4]}\ndevice: cpu\n")
    monkeypatch.chdir(tmp_path)
    assert load_suite("cpu_smoke").name == "mine"
    with pytest.raises(UserError, match="no shipped suite of that name.*cpu_smoke"):
        resolve_suite("no_such_suite")
    with pytest.raises(UserError, match="does not exist"):
        resolve_suite(tmp_path / "sub" / "cpu_smoke.yaml")  # a path is never looked up by name


def test_a_folder_named_like_a_shipped_suite_does_not_hide_it(tmp_path, monkeypatch):
    (tmp_path / "cpu_smoke").mkdir()  # e.g. `ditbench run cpu_smoke --out cpu_smoke`, then the same again
    monkeypatch.chdir(tmp_path)
    assert resolve_suite("cpu_smoke") == SUITES_DIR / "cpu_smoke.yaml"
    assert resolve_suite("./cpu_smoke") == Path("./cpu_smoke")  # a path stays the path it names


def test_suites_command_lists_every_shipped_suite(capsys):
    assert main(["suites", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(shipped_suites())
    smoke = next(r for r in rows if r["name"] == "cpu_smoke")
    assert smoke["cells"] == 24 and smoke["device"] == "cpu" and "CPU demo" in smoke["description"]


def test_overrides_land_in_matrix_defaults_and_nested_keys():
    suite = load_suite(
        "cpu_smoke", ["model=DiT-T/4", "batch_size=[2, 3]", "image_size=64", "steps.measure=3", "lr=2e-4"]
    )
    configs = [c.config for c in suite.cells]
    assert {c["model"] for c in configs} == {"DiT-T/4"}  # a single value replaces the axis
    assert {c["batch_size"] for c in configs} == {2, 3}  # a list is the axis
    assert {c["image_size"] for c in configs} == {64}  # a default
    assert {c["steps"]["measure"] for c in configs} == {3}
    assert {c["lr"] for c in configs} == {2e-4}
    assert len(suite.cells) == 3 * 2 * 2  # precision x grad_ckpt x batch
    assert suite.overrides == {
        "model": "DiT-T/4",
        "batch_size": [2, 3],
        "image_size": 64,
        "steps.measure": 3,
        "lr": 2e-4,
    }
    assert load_suite("cpu_smoke").overrides == {}


def test_card_and_gpu_memory_replace_each_other():
    suite = load_suite("single_24gb", ["gpu_memory_gib=22.5", "device=cuda"])
    assert suite.gpu_memory_gib == 22.5 and suite.card is None
    suite = load_suite("single_24gb", ["card=H100-80GB", "device=cuda"])
    assert suite.card and "H100" in suite.card


@pytest.mark.parametrize(
    "override, expected",
    [
        ("batch_size=[16,x]", ["matrix.batch_size[1]", "set by the override `batch_size=[16,x]`", "integer"]),
        ("precision=fp64", ["matrix.precision[0]", "`precision=fp64`", "bf16"]),
        ("seed=-1", ["defaults.seed", "`seed=-1`"]),
        ("model=DiT-Q/9", ["`model=DiT-Q/9`", "DiT-S/8"]),
        ("lr=.nan", ["`lr=.nan`", "finite"]),
        ("foo=1", ["override 'foo=1'", "unknown key `foo`", "batch_size"]),
        ("batch_size", ["not `key=value`"]),
        ("=3", ["not `key=value`"]),
        ("seed=", ["has no value"]),
        ("batch_size=[1, 2", ["not valid YAML"]),
        ("steps.measure.x=1", ["`defaults.steps.measure`", "not a mapping"]),
        ("steps.bogus=1", ["defaults.steps.bogus", "`steps.bogus=1`"]),
        ("device=tpu", ["`device=tpu`", "auto"]),
        ("gpu_memory_gib=-1", ["`gpu_memory_gib=-1`"]),
        ("card=NoSuchCard", ["`card=NoSuchCard`"]),
        ("timeout_s=0", ["defaults.timeout_s", "`timeout_s=0`"]),
        ("seed=[&a [*a]]", ["override"]),  # a YAML alias loop is refused by the bounded parser
    ],
)
def test_bad_overrides_are_one_paragraph_errors_naming_the_override(capsys, override, expected):
    assert main(["run", "cpu_smoke", override, "--dry-run"]) == 2
    err = err_text(capsys)
    assert err.startswith("ditbench: error:") and "Traceback" not in err
    for part in expected:
        assert part in err, f"{part!r} not in {err!r}"


def test_an_override_given_twice_is_refused(capsys):
    assert main(["run", "cpu_smoke", "seed=1", "seed=2"]) == 2
    assert "both set `seed`" in err_text(capsys)


def test_overrides_after_options_and_an_unknown_option(capsys, tmp_path):
    assert main(["run", "cpu_smoke", "--dry-run", "--out", str(tmp_path / "o"), "batch_size=[2]"]) == 0
    out = capsys.readouterr().out
    assert "overrides: batch_size=[2]" in out and "bs=4" not in out and "bs=2" in out
    with pytest.raises(SystemExit) as exc:
        main(["run", "cpu_smoke", "--no-such-flag"])
    assert exc.value.code == 2


@pytest.mark.parametrize("executor", [[], ["--executor", "local"]])
def test_overrides_are_recorded_in_each_record_and_the_summary(capsys, tmp_path, executor):
    # fp16 on a CPU is decided `unsupported` before any process starts: the record path, cheaply
    out = tmp_path / "run"
    argv = ["run", "cpu_smoke", "model=DiT-T/4", "precision=fp16", "grad_ckpt=none", "batch_size=4"]
    allow = ["--allow-unsupported"]  # else refused before any cell: none can run here
    assert main([*argv, *executor, *allow, "--out", str(out), "--no-progress"]) == 3  # nothing measured
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["status"] == "unsupported"
    assert records[0]["suite_overrides"] == {
        "model": "DiT-T/4",
        "precision": "fp16",
        "grad_ckpt": "none",
        "batch_size": 4,
    }
    assert records[0]["config"]["precision"] == "fp16"
    summary = (out / "summary.md").read_text()
    assert 'Overrides given on the command line: `model="DiT-T/4"`' in summary


# ------------------------------------------------------------ unbounded expansion (issue 21), counted first


def _huge_suite(tmp_path) -> Path:
    """A few kilobytes whose matrix multiplies to 4x10^9 cells (the issue's example)."""
    path = tmp_path / "huge.yaml"
    seeds = ",".join(str(i) for i in range(1000))
    batches = ",".join(str(i) for i in range(1, 1001))
    accum = ",".join(str(i) for i in range(1, 4001))
    path.write_text(
        "name: huge\ndevice: cpu\ndefaults: {model: DiT-T/8, image_size: 64}\n"
        f"matrix: {{seed: [{seeds}], batch_size: [{batches}], grad_accum: [{accum}]}}\n"
    )
    return path


def test_a_matrix_of_4e9_cells_is_refused_with_its_count_before_expanding(tmp_path, capsys):
    code = main(["run", str(_huge_suite(tmp_path)), "--dry-run", "--out", str(tmp_path / "o")])
    text = err_text(capsys)
    assert code == 2 and "Traceback" not in text
    assert "4,000,000,000 cells" in text and "seed 1,000 x batch_size 1,000 x grad_accum 4,000" in text
    assert "--max-cells" in text and "huge.yaml" in text


def test_overrides_that_multiply_to_a_million_cells_are_refused(tmp_path, capsys):
    seeds = "[" + ",".join(str(i) for i in range(1000)) + "]"
    batches = "[" + ",".join(str(i) for i in range(1, 1001)) + "]"
    code = main(
        ["run", "cpu_smoke", f"seed={seeds}", f"batch_size={batches}", "--dry-run", "--out", str(tmp_path)]
    )
    text = err_text(capsys)
    assert code == 2 and "cells" in text and "above the cap of 10,000" in text
    assert "seed 1,000" in text and "batch_size 1,000" in text


def test_includes_count_towards_the_cap_and_the_cap_is_raisable(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: s\ndevice: cpu\ndefaults: {model: DiT-T/8, image_size: 64}\n"
        "matrix: {batch_size: [1, 2, 3, 4, 5]}\ninclude: [{batch_size: 6}, {batch_size: 7}]\n"
    )
    with pytest.raises(UserError, match=r"7 cells \(batch_size 5 \+ 2 include\), above the cap of 6"):
        load_suite(path, max_cells=6)
    assert len(load_suite(path, max_cells=7).cells) == 7
    with pytest.raises(UserError, match="--max-cells must be a positive integer"):
        load_suite(path, max_cells=0)


def test_a_plan_grid_is_counted_before_it_is_traced(tmp_path, capsys):
    batches = ",".join(str(i) for i in range(1, 3001))
    argv = ["--card", "RTX 4090", "--batches", batches, "--no-cache", "--max-cells", "5000", "--full"]
    code = main(["plan", *argv])
    text = err_text(capsys)
    assert code == 2 and "the plan grid expands to" in text and "batches 3,000" in text, text
