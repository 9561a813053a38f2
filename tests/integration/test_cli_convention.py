"""Every command follows one flag convention (ditbench/cli/options.py); plain progress lines in logs."""

from __future__ import annotations

import argparse
import importlib
import io
import json
import subprocess
import sys

import pytest

from ditbench.cli import COMMANDS, _build_parser, main
from ditbench.hardware.precision import PRECISIONS

# commands that compute on a device take --device; commands that print a result take --json
DEVICE_COMMANDS = {"train", "extract-latents", "sample", "fid", "env"}
OUT_KINDS = {
    "run": "DIR",
    "ab": "DIR",
    "report": "DIR",
    "sample": "FILE.npz",
    "extract-latents": "FILE.npz",
    "fid": "FILE.json",
}


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = _build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_follows_the_flag_convention(name):
    p = _subparser(name)
    text = p.format_help()
    flags = {s: a for a in p._actions for s in a.option_strings}
    for action in p._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        help_text = p._get_formatter()._expand_help(action) if action.help else ""
        assert help_text, f"{name} {action.option_strings[0]} has no help"
        assert "(default " not in help_text, f"{name} {action.option_strings[0]}: say (default: X)"
        flag_default = action.default
        if flag_default is not None and flag_default is not False and flag_default != argparse.SUPPRESS:
            assert "(default: " in help_text, f"{name} {action.option_strings[0]} hides its default"
    assert "--json" in flags, f"{name} prints a result but has no --json"
    if name in DEVICE_COMMANDS:
        device = flags["--device"]
        assert device.default == "auto" and device.metavar == "{auto,cpu,cuda}"
    if "--precision" in flags:
        assert flags["--precision"].metavar == "{" + ",".join(PRECISIONS) + "}"
    if "--out" in flags:
        assert flags["--out"].metavar == OUT_KINDS[name], f"{name} --out"
    if "--no-progress" in flags:
        assert "plain lines" in flags["--no-progress"].help
    assert "usage: ditbench " + name in text


def test_ditbench_help_lists_each_command_once(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name in COMMANDS:
        lines = [
            line for line in out.splitlines() if line.startswith(f"    {name} ") or line == f"    {name}"
        ]
        assert len(lines) == 1, (name, lines)


@pytest.mark.parametrize("argv", [["train"], ["sample", "random", "--vae", "random"], ["env"]])
def test_a_bad_precision_is_one_clean_error(capsys, argv):
    assert main([*argv, "--precision", "fp64"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--precision 'fp64' is not known; valid precisions are fp32, tf32, fp16, bf16" in err


@pytest.mark.parametrize("name", sorted(DEVICE_COMMANDS - {"sample", "fid", "extract-latents"}))
def test_a_bad_device_is_one_clean_error(capsys, name):
    assert main([name, "--device", "tpu"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "device 'tpu' is not valid; use auto, cpu, cuda or cuda:N" in err and "Traceback" not in err


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or __import__("torch").cuda.is_available(),
    reason="needs no GPU",
)
@pytest.mark.parametrize("argv", [["env", "--device", "cuda"], ["train", "--device", "cuda", "--steps", "1"]])
def test_cuda_without_a_gpu_is_a_clean_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no CUDA device is visible" in err and "Traceback" not in err


@pytest.mark.slow
def test_train_json_is_the_only_stdout(tmp_path):
    argv = ["train", "--model", "DiT-T/4", "--image-size", "32", "--batch-size", "2", "--steps", "3"]
    proc = subprocess.run(
        [sys.executable, "-m", "ditbench", *argv, "--json", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "ok" and result["steps"] == 3 and result["params"] > 0
    assert result["config"]["model"] == "DiT-T/4" and result["images_per_s"] > 0
    assert "\r" not in proc.stderr  # not a terminal: plain lines, no redrawn bar
    assert "step      3  loss" in proc.stderr


def test_plain_progress_lines(monkeypatch, capsys):
    from ditbench.core import progress as progress_mod

    monkeypatch.setenv(progress_mod.EVERY_ENV, "0")
    bar = progress_mod.progress(total=4, unit="img", desc="encoding")
    assert isinstance(bar, progress_mod.PlainProgress)  # pytest's stderr is not a terminal
    bar.update(2)
    bar.set_postfix(loss="0.5")
    bar.update(2)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("encoding: 2/4 img (50%)") and "loss=0.5" in lines[-1]
    assert list(progress_mod.progress([1, 2, 3], desc="x", plain=False)) == [1, 2, 3]
    assert capsys.readouterr().err == ""  # plain=False: the caller prints its own lines


def test_a_terminal_gets_tqdm(monkeypatch):
    from ditbench.core import progress as progress_mod

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    bar = progress_mod.progress(total=2, desc="x")
    assert type(bar).__module__.startswith("tqdm")
    bar.close()


def test_env_says_why_nvml_figures_are_null(monkeypatch):
    from ditbench.hardware import environment

    assert environment.nvml_status(False) == "not used (no GPU)"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as when nvidia-ml-py is absent
    assert environment.nvml_status(True).startswith(environment.NVML_MISSING)


def test_env_measure_peak_on_a_cpu_is_bounded_and_says_what_it_skipped(capsys):
    from ditbench.cli.env import measure_peaks

    out = measure_peaks("cpu")
    tflops, how = out["measured_matmul_tflops"], out["measured_matmul"]
    assert set(tflops) == {"fp32", "bf16"} and all(v > 0 for v in tflops.values())
    assert set(how["skipped"]) == {"tf32", "fp16"}
    assert all(128 <= side <= 2048 for side in how["side"].values())


def test_the_report_says_why_nvml_figures_are_empty(tmp_path):
    from synthetic_records import make_record, write_jsonl

    from ditbench.hardware.environment import NVML_MISSING

    record = make_record("DiT-S/8")
    record["env"] = {
        **record["env"],
        "driver": None,
        "nvml": f"{NVML_MISSING}: driver and device memory are null",
    }
    write_jsonl(tmp_path / "results.jsonl", [record])
    assert main(["report", str(tmp_path / "results.jsonl"), "--out", str(tmp_path / "rep")]) == 0
    text = " ".join((tmp_path / "rep" / "report.md").read_text().split())
    assert "nvidia-ml-py was not installed" in text and "ditbench[gpu]" in text
