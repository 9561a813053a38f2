"""Suite files: expansion (product - exclude + include), stable cell ids, and errors that name the key."""

import textwrap

import pytest

from ditbench.cli import main
from ditbench.core.errors import UserError
from ditbench.spec.suite import cell_id, load_suite, parse_suite

BASE = """
name: demo
device: cpu
defaults:
  image_size: 64
  steps: {warmup: 1, measure: 2, min_seconds: 0}
matrix:
  model: [DiT-T/8]
  precision: [fp32, bf16]
  grad_ckpt: [none, full]
  batch_size: [2, 4]
"""


def write(tmp_path, text, name="suite.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_expansion_is_the_cartesian_product(tmp_path):
    suite = load_suite(write(tmp_path, BASE))
    assert len(suite.cells) == 8
    combos = {(c.config["precision"], c.config["grad_ckpt"], c.config["batch_size"]) for c in suite.cells}
    assert len(combos) == 8
    cell = suite.cells[0]
    assert cell.config["image_size"] == 64 and cell.config["device"] == "cpu"
    assert cell.config["steps"] == {"warmup": 1, "measure": 2, "min_seconds": 0.0}
    assert cell.config["global_batch"] == cell.config["batch_size"]
    assert cell.cell_name == "DiT-T/8 fp32 ckpt=none bs=2"
    assert len({c.cell_id for c in suite.cells}) == 8 and len({c.cell_name for c in suite.cells}) == 8


def test_exclude_is_a_partial_match_and_include_is_completed_from_defaults(tmp_path):
    text = (
        BASE
        + """
exclude:
  - {precision: bf16, grad_ckpt: full}
  - {precision: fp32, batch_size: 4, grad_ckpt: none}
include:
  - {model: DiT-T/4, precision: bf16, batch_size: 3}
"""
    )
    suite = load_suite(write(tmp_path, text))
    names = [c.cell_name for c in suite.cells]
    assert len(names) == 8 - 2 - 1 + 1
    assert not any("bf16 ckpt=full" in n for n in names)
    assert "DiT-T/8 fp32 ckpt=none bs=4" not in names
    added = suite.cells[-1].config
    # knobs the include leaves out come from `defaults`, then the built-in defaults
    assert (added["model"], added["precision"], added["batch_size"]) == ("DiT-T/4", "bf16", 3)
    assert added["grad_ckpt"] == "none" and added["image_size"] == 64 and added["steps"]["measure"] == 2


def test_include_repeating_a_matrix_cell_runs_once(tmp_path):
    text = BASE + "include:\n  - {model: DiT-T/8, precision: fp32, grad_ckpt: none, batch_size: 2}\n"
    assert len(load_suite(write(tmp_path, text)).cells) == 8


def test_cell_id_is_stable_and_depends_on_every_knob(tmp_path):
    a = load_suite(write(tmp_path, BASE, "a.yaml"))
    reordered = """
    device: cpu
    name: other-name
    matrix:
      batch_size: [2, 4]
      grad_ckpt: [none, full]
      precision: [fp32, bf16]
      model: [DiT-T/8]
    defaults:
      steps: {min_seconds: 0.0, measure: 2, warmup: 1}
      image_size: 64
    """
    b = load_suite(write(tmp_path, reordered, "b.yaml"))
    assert {c.cell_id for c in a.cells} == {c.cell_id for c in b.cells}
    spec = a.cells[0].spec
    assert cell_id(spec) == a.cells[0].cell_id
    assert cell_id(spec.replace(knobs=spec.knobs.replace(seed=1))) != cell_id(spec)
    assert cell_id(spec.replace(smoke_steps=3)) != cell_id(spec)


def test_cell_id_hashes_only_what_differs_from_the_defaults(tmp_path):
    # Writing a default out, or leaving it implicit, is the same cell; so a knob added later (at its
    # default) leaves every existing id unchanged.
    implicit = load_suite(write(tmp_path, BASE, "a.yaml"))
    explicit = load_suite(
        write(
            tmp_path, BASE.replace("image_size: 64", "image_size: 64\n  seed: 0\n  attention: sdpa"), "b.yaml"
        )
    )
    assert [c.cell_id for c in implicit.cells] == [c.cell_id for c in explicit.cells]
    spellings = load_suite(write(tmp_path, BASE.replace("[none, full]", "[off, on]"), "c.yaml"))
    assert [c.cell_id for c in spellings.cells] == [c.cell_id for c in implicit.cells]
    assert {c.config["grad_ckpt"] for c in spellings.cells} == {"none", "full"}


def test_smoke_cells(tmp_path):
    text = BASE.replace(
        "steps: {",
        "smoke: {steps: 7, cells: [{precision: bf16, grad_ckpt: full, batch_size: 2}]}\n  steps: {",
    )
    suite = load_suite(write(tmp_path, text))
    smoked = [c.cell_name for c in suite.cells if c.config["smoke_steps"]]
    assert smoked == ["DiT-T/8 bf16 ckpt=full bs=2"]
    assert suite.cells[-1].config["smoke_steps"] in (0, 7)
    text = BASE.replace("steps: {", "smoke: {steps: 5, cells: baseline}\n  steps: {") + (
        "baseline: {precision: fp32, grad_ckpt: none, batch_size: 2}\n"
    )
    suite = load_suite(write(tmp_path, text))
    assert [c.cell_name for c in suite.cells if c.config["smoke_steps"] == 5] == [
        "DiT-T/8 fp32 ckpt=none bs=2"
    ]
    assert suite.baseline == {"precision": "fp32", "grad_ckpt": "none", "batch_size": 2}


def test_scalar_matrix_value_and_names_show_varying_knobs(tmp_path):
    text = """
    name: s
    defaults: {model: DiT-T/8}
    matrix: {batch_size: 2, image_size: [64, 128], compile: [false]}
    """
    suite = load_suite(write(tmp_path, text))
    assert [c.cell_name for c in suite.cells] == [
        "DiT-T/8 fp32 ckpt=none bs=2 64px",
        "DiT-T/8 fp32 ckpt=none bs=2 128px",
    ]


BAD = [
    # (suite text, substrings the message must contain)
    ("name: x\nmatirx: {batch_size: [1]}\n", ["`matirx`", "Did you mean `matrix`"]),
    (
        "name: x\nmatrix: {model: [DiT-T/8], precison: [fp32]}\n",
        ["matrix.precison", "Did you mean `precision`"],
    ),
    ("name: x\nmatrix: {model: [DiT-XXL/2]}\n", ["matrix.model[0]", "'DiT-XXL/2'", "DiT-XL/2", "DiT-S/8"]),
    (
        "name: x\nmatrix: {model: [DiT-T/8], precision: [fp32, bf16, fp8]}\n",
        ["matrix.precision[2]", "'fp8'", "bf16"],
    ),
    ("name: x\nmatrix: {model: [DiT-T/8], batch_size: [4, 0]}\n", ["matrix.batch_size[1]", "from 1"]),
    ("name: x\nmatrix: {model: [DiT-T/8], batch_size: [-8]}\n", ["matrix.batch_size[0]", "-8"]),
    ("name: x\nmatrix: {model: [DiT-T/8], batch_size: ['16']}\n", ["matrix.batch_size[0]", "a string"]),
    ("name: x\nmatrix: {}\n", ["`matrix`", "empty"]),
    ("name: x\nmatrix: {model: []}\n", ["matrix.model", "empty list"]),
    ("name: x\n", ["`matrix`", "needs a `matrix`"]),
    ("matrix: {model: [DiT-T/8]}\n", ["`name`"]),
    ("name: x\ndevice: tpu\nmatrix: {model: [DiT-T/8]}\n", ["`device`", "'tpu'", "cuda, cpu, auto"]),
    (
        "name: x\ndevice: cuda\ngpu_memory_gb: 24\nmatrix: {model: [DiT-T/8]}\n",
        ["unknown key `gpu_memory_gb`", "Did you mean `gpu_memory_gib`"],
    ),
    ("name: x\ndevice: cuda\ngpu_memory_gib: 0\nmatrix: {model: [DiT-T/8]}\n", ["gpu_memory_gib", "than 0"]),
    ("name: x\ndevice: cuda\ncard: RTX 9090\nmatrix: {model: [DiT-T/8]}\n", ["`card`", "unknown card"]),
    (
        "name: x\ndevice: cuda\ncard: L4\ngpu_memory_gib: 20\nmatrix: {model: [DiT-T/8]}\n",
        ["not both"],
    ),
    ("name: x\ndevice: cpu\ncard: L4\nmatrix: {model: [DiT-T/8]}\n", ["`card`", "runs on the cpu"]),
    ("name: x\nmatrix: {model: [DiT-T/8], lr: [.nan]}\n", ["matrix.lr[0]", "finite"]),
    ("name: x\ndefaults: {timeout_s: .inf}\nmatrix: {model: [DiT-T/8]}\n", ["defaults.timeout_s", "finite"]),
    ("name: x\ndefaults: {steps: {min_seconds: -.inf}}\nmatrix: {model: [DiT-T/8]}\n", ["min_seconds"]),
    ("name: x\nmatrix: {model: [DiT-T/8], seed: [18446744073709551616]}\n", ["matrix.seed[0]", "9,223,372"]),
    ("name: x\nmatrix: {model: [DiT-T/8], seed: [-1]}\n", ["matrix.seed[0]", "from 0"]),
    ("name: x\nmatrix: {model: [DiT-T/8], ema_decay: [1.0]}\n", ["matrix.ema_decay[0]", "[0, 1)"]),
    ("name: x\nmatrix: {model: [DiT-T/8], attention: [xformers]}\n", ["matrix.attention[0]", "sdpa"]),
    ("name: x\nmatrix: {model: [DiT-T/8], optimizer: [lion]}\n", ["matrix.optimizer[0]", "adamw"]),
    ("name: x\nmatrix: {model: [DiT-T/8], grad_ckpt: [all]}\n", ["matrix.grad_ckpt[0]", "every_K"]),
    (
        "name: x\nmatrix: {model: [DiT-T/8], impl: [diffusers], grad_ckpt: [every_2]}\n",
        ["`matrix`", "impl diffusers"],
    ),
    ("name: x\nmatrix: {model: [DiT-T/8], data: [{latents: [1, 2]}]}\n", ["matrix.data[0]", "path"]),
    ("name: x\nmatrix: {model: [DiT-T/8], batch_size: [2000000]}\n", ["matrix.batch_size[0]", "1,048,576"]),
    (
        "name: x\ndefaults: {steps: {measure: 0}}\nmatrix: {model: [DiT-T/8]}\n",
        ["defaults.steps.measure", "from 1"],
    ),
    (
        "name: x\ndefaults: {steps: {warmpu: 3}}\nmatrix: {model: [DiT-T/8]}\n",
        ["defaults.steps.warmpu", "`warmup`"],
    ),
    (
        "name: x\ndefaults: {compile: 'yes'}\nmatrix: {model: [DiT-T/8]}\n",
        ["defaults.compile", "true or false"],
    ),
    (
        "name: x\ndefaults: {smoke: {cells: baseline}}\nmatrix: {model: [DiT-T/8]}\n",
        ["defaults.smoke.cells", "baseline"],
    ),
    (
        "name: x\ndefaults: {smoke: {cells: some}}\nmatrix: {model: [DiT-T/8]}\n",
        ["defaults.smoke.cells", "'some'"],
    ),
    (
        "name: x\nmatrix: {model: [DiT-T/8]}\nexclude: [{precison: fp32}]\n",
        ["exclude[0].precison", "`precision`"],
    ),
    ("name: x\nmatrix: {model: [DiT-T/8]}\ninclude: [{model: DiT-Q/2}]\n", ["include[0].model", "'DiT-Q/2'"]),
    ("name: x\nmatrix: {model: [DiT-T/8]}\nexclude: [{model: DiT-T/8}]\n", ["`exclude`", "every cell"]),
    ("name: x\nmatrix: {model: [DiT-T/8], image_size: [72]}\n", ["patch size 8", "multiple of 64"]),
    ("name: x\nmatrix: {batch_size: [2]}\n", ["no model given", "DiT-XL/2"]),
    ("name: x\nmatrix: {model: [DiT-T/8], grad_ckpt: [some]}\n", ["matrix.grad_ckpt[0]", "every_K"]),
    ("name: x\nmatrix: {model: [DiT-T/8]}\nbaseline: {batch: 2}\n", ["baseline.batch", "`batch_size`"]),
    ("- just a list\n", ["expected a mapping"]),
    ("name: x\nmatrix: {model: [DiT-T/8]\n", ["not valid YAML"]),
]


@pytest.mark.parametrize("text,expected", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_suites_name_the_file_and_the_key(tmp_path, text, expected):
    path = write(tmp_path, text, "bad.yaml")
    with pytest.raises(UserError) as info:
        load_suite(path)
    message = str(info.value)
    assert str(path) in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_missing_file_and_cli_exit_code(tmp_path, capsys):
    with pytest.raises(UserError, match="does not exist"):
        load_suite(tmp_path / "nope.yaml")
    path = write(tmp_path, "name: x\nmatrix: {model: [DiT-T/8], precision: [fp64]}\n", "bad.yaml")
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "matrix.precision[0]" in err and "Traceback" not in err


def test_every_ready_suite_validates():
    from pathlib import Path

    suites = sorted((Path(__file__).parents[2] / "suites").glob("*.yaml"))
    assert {p.name for p in suites} >= {
        "cpu_smoke.yaml",
        "single_12gb.yaml",
        "single_24gb.yaml",
        "single_48gb.yaml",
        "ci_gate.yaml",
    }
    for path in suites:
        suite = load_suite(path)
        assert suite.cells, path


def test_single_24gb_has_the_required_cells():
    from pathlib import Path

    suite = load_suite(Path(__file__).parents[2] / "suites" / "single_24gb.yaml")
    assert (suite.card, suite.gpu_memory_gib) == ("RTX 4090", 23.99)
    assert suite.cells[0].config["card"] == "RTX 4090" and "gpu_memory_gb" not in suite.cells[0].config
    have = {
        (c.config["model"], c.config["precision"], c.config["grad_ckpt"], c.config["batch_size"])
        for c in suite.cells
    }
    for precision in ("fp32", "fp16"):
        for ckpt in ("none", "full"):
            for bs in (16, 32):
                assert ("DiT-L/4", precision, ckpt, bs) in have
    models = {m for m, *_ in have}
    assert {"DiT-B/8", "DiT-XL/2"} <= models


def test_cpu_smoke_shape():
    from pathlib import Path

    suite = load_suite(Path(__file__).parents[2] / "suites" / "cpu_smoke.yaml")
    configs = [c.config for c in suite.cells]
    assert suite.device == "cpu"
    assert {"fp32", "bf16", "fp16"} <= {c["precision"] for c in configs}
    assert {"none", "full"} <= {c["grad_ckpt"] for c in configs}
    assert len({c["batch_size"] for c in configs}) >= 2
    smoke = [c for c in configs if c["smoke_steps"]]
    assert len(smoke) == 1 and smoke[0]["smoke_steps"] == 500 and smoke[0]["precision"] != "fp16"


def test_parse_suite_accepts_a_dict():
    suite = parse_suite({"name": "d", "matrix": {"model": ["DiT-T/8"], "batch_size": [1, 2]}})
    assert [c.config["batch_size"] for c in suite.cells] == [1, 2]
