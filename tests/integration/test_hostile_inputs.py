"""The hostile-input battery for run, resume files, train, extract-latents, sample and checkpoints.

Every case in CASES is a command line (and the files it names, built in `tmp`) that must end in
one clean error: exit 2, one paragraph starting `ditbench: error:`, no traceback, naming the
option, file or value at fault, and leaving nothing behind it should not. The tests after CASES
are hostile inputs a command must survive with correct statuses instead (garbage next to the
results, a killed run's leftovers). fid, compare, report, suites and records have their own
batteries (test_metrics_hostile, test_gate_hostile, test_report, test_suite, test_yamlio,
test_records); the README counts them together.
"""

from __future__ import annotations

import json
import os
import pickle
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ditbench.bench import inflight
from ditbench.cli import main
from ditbench.files.outlock import OutputLock
from ditbench.records.jsonl import read_records
from ditbench.spec.suite import load_suite

SUITE = """
name: hostile
device: cpu
defaults:
  model: DiT-T/8
  image_size: 64
  steps: {warmup: 1, measure: 2, min_seconds: 0}
matrix: {precision: [PRECISION]}
"""


def suite(tmp: Path, precision: str = "fp32") -> Path:
    path = tmp / "suite.yaml"
    path.write_text(textwrap.dedent(SUITE).replace("PRECISION", precision))
    return path


def run(tmp: Path, out: Path | str, *extra: str) -> list[str]:
    return ["run", str(suite(tmp)), "--out", str(out), "--no-progress", *extra]


def out_holding(tmp: Path, name: str, kind: str) -> Path:
    out = tmp / "out"
    out.mkdir()
    if kind == "dir":
        (out / name).mkdir()
    elif kind == "fifo":
        os.mkfifo(out / name)
    elif kind == "dangling":
        (out / name).symlink_to(tmp / "nowhere")
    else:
        (out / name).write_text("x")
    return out


def a_file(tmp: Path, name: str = "afile", data: bytes = b"x") -> Path:
    (tmp / name).write_bytes(data)
    return tmp / name


def unwritable(tmp: Path) -> Path:
    """A folder this process cannot create anything in (as root, a path under /proc)."""
    if os.geteuid() == 0:
        return Path("/proc/ditbench-hostile/out")
    folder = tmp / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    return folder / "out"


def images(tmp: Path) -> Path:
    folder = tmp / "imgs" / "cat"
    folder.mkdir(parents=True)
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(folder / "a.png")
    return tmp / "imgs"


def extract(tmp: Path, *extra: str, out: str = "lat.npz") -> list[str]:
    argv = ["extract-latents", str(images(tmp)), "--vae", "random", "--out", str(tmp / out)]
    return [*argv, "--image-size", "64", "--device", "cpu", "--no-progress", *extra]


def sample(tmp: Path, *extra: str, checkpoint: str = "random", out: str = "s.npz") -> list[str]:
    argv = ["sample", checkpoint, "--vae", "random", "--out", str(tmp / out), "--device", "cpu"]
    return [*argv, "--model", "DiT-T/8", "--image-size", "64", "--num-samples", "2", "--no-progress", *extra]


def train(*extra: str) -> list[str]:
    return [
        "train",
        "--model",
        "DiT-T/8",
        "--image-size",
        "64",
        "--batch-size",
        "1",
        "--device",
        "cpu",
        *extra,
    ]


class Payload:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def payload_checkpoint(tmp: Path) -> Path:
    path = tmp / "payload.pt"
    torch.save({"model": {"x_embedder.proj.weight": torch.zeros(1)}, "args": Payload(tmp / "ran")}, path)
    return path


def truncated_checkpoint(tmp: Path) -> Path:
    path = tmp / "cut.pt"
    torch.save({"model": {"w": torch.zeros(1000)}}, path)
    path.write_bytes(path.read_bytes()[:300])
    return path


def payload_latents(tmp: Path) -> Path:
    path = tmp / "lat.pt"
    torch.save({"latents": torch.zeros(2, 4, 8, 8), "labels": Payload(tmp / "ran")}, path)
    return path


def parts_with_progress(tmp: Path, data: bytes) -> None:
    (tmp / "lat.npz.parts").mkdir()
    (tmp / "lat.npz.parts" / "progress.json").write_bytes(data)


# Each case: tmp -> (argv, environment variables, words the message must contain).
CASES = {
    # ditbench run: the output folder
    "run --out is a file": lambda t: (run(t, a_file(t)), {}, ["--out", "afile", "is a file"]),
    "run --out goes through a file": lambda t: (run(t, a_file(t) / "o"), {}, ["afile", "is a file"]),
    "run --out cannot be created": lambda t: (run(t, unwritable(t)), {}, ["--out", "cannot be created"]),
    "run results.jsonl is a folder": lambda t: (
        run(t, out_holding(t, "results.jsonl", "dir")),
        {},
        ["results.jsonl", "a folder"],
    ),
    "run --dry-run results.jsonl is a folder": lambda t: (
        run(t, out_holding(t, "results.jsonl", "dir"), "--dry-run"),
        {},
        ["results.jsonl", "a folder"],
    ),
    "run results.jsonl is a FIFO": lambda t: (
        run(t, out_holding(t, "results.jsonl", "fifo")),
        {},
        ["results.jsonl", "not a regular file"],
    ),
    "run results.jsonl is a broken link": lambda t: (
        run(t, out_holding(t, "results.jsonl", "dangling")),
        {},
        ["results.jsonl", "symbolic link"],
    ),
    "run summary.md is a folder": lambda t: (
        run(t, out_holding(t, "summary.md", "dir")),
        {},
        ["summary.md", "a folder"],
    ),
    "run logs is a file": lambda t: (run(t, out_holding(t, "logs", "file")), {}, ["logs", "not a folder"]),
    "run .inflight is a file": lambda t: (
        run(t, out_holding(t, ".inflight", "file")),
        {},
        [".inflight", "not a folder"],
    ),
    "run lock file is a folder": lambda t: (
        run(t, out_holding(t, ".ditbench.lock", "dir")),
        {},
        [".ditbench.lock", "lock"],
    ),
    # ditbench run: options and the environment
    "run --timeout-s 0": lambda t: (run(t, t / "o", "--timeout-s", "0"), {}, ["--timeout-s", "0"]),
    "run --timeout-s beyond a week": lambda t: (run(t, t / "o", "--timeout-s", "1e9"), {}, ["a week"]),
    "run --cells empty": lambda t: (run(t, t / "o", "--cells", " "), {}, ["--cells", "non-empty"]),
    "run --nnodes 0": lambda t: (run(t, t / "o", "--nnodes", "0"), {}, ["--nnodes 0"]),
    "run --node-rank beyond --nnodes": lambda t: (run(t, t / "o", "--node-rank", "3"), {}, ["--node-rank 3"]),
    "run --nnodes 2 without endpoint": lambda t: (run(t, t / "o", "--nnodes", "2"), {}, ["--rdzv-endpoint"]),
    "run --rdzv-endpoint without port": lambda t: (
        run(t, t / "o", "--nnodes", "2", "--rdzv-endpoint", "node0"),
        {},
        ["HOST:PORT"],
    ),
    "run fault with no cell substring": lambda t: (
        run(t, t / "o"),
        {"DITBENCH_INJECT_FAULT": "=raise"},
        ["DITBENCH_INJECT_FAULT", "'=raise'"],
    ),
    "run fault at step 0": lambda t: (
        run(t, t / "o"),
        {"DITBENCH_INJECT_FAULT": "bs=1=oom@0"},
        ["DITBENCH_INJECT_FAULT", "positive integer"],
    ),
    "run fault rank not a number": lambda t: (
        run(t, t / "o"),
        {"DITBENCH_INJECT_FAULT_RANK": "first"},
        ["DITBENCH_INJECT_FAULT_RANK", "'first'"],
    ),
    "run suite is /dev/zero": lambda t: (
        ["run", "/dev/zero", "--out", str(t / "o")],
        {},
        ["/dev/zero", "not a regular file"],
    ),
    # ditbench train
    "train --save is a folder": lambda t: (train("--save", str(t)), {}, ["--save", "is a folder"]),
    "train --save under a file": lambda t: (
        train("--save", str(a_file(t) / "c.pt")),
        {},
        ["--save", "afile", "is a file"],
    ),
    "train --save names another format": lambda t: (
        train("--save", str(t / "c.npz")),
        {},
        ["--save", "c.npz", "ending in .pt or .pth"],
    ),
    "train --steps absurd": lambda t: (train("--steps", str(2**70)), {}, ["--steps", "1,000,000,000"]),
    "train --data pickle payload": lambda t: (
        train("--steps", "1", "--data", str(payload_latents(t))),
        {},
        ["lat.pt"],
    ),
    # ditbench extract-latents
    "extract --device cuda without a GPU": lambda t: (
        extract(t, "--device", "cuda"),
        {},
        ["cuda", "no CUDA"],
    ),
    "extract --device cuda:99": lambda t: (extract(t, "--device", "cuda:99"), {}, ["cuda:99"]),
    "extract --device tpu": lambda t: (extract(t, "--device", "tpu"), {}, ["tpu", "auto, cpu, cuda"]),
    "extract --seed negative": lambda t: (extract(t, "--seed", "-1"), {}, ["--seed", "-1"]),
    "extract --seed beyond 64 bits": lambda t: (extract(t, "--seed", str(2**70)), {}, ["--seed"]),
    "extract --workers negative": lambda t: (extract(t, "--workers", "-1"), {}, ["--workers", "-1"]),
    "extract --image-size absurd": lambda t: (extract(t, "--image-size", "10000000"), {}, ["--image-size"]),
    "extract --shard-size 0": lambda t: (extract(t, "--shard-size", "0"), {}, ["--shard-size", "0"]),
    "extract --out not .npz": lambda t: (extract(t, out="lat.png"), {}, ["lat.png", ".npz"]),
    "extract --out under a file": lambda t: (
        extract(t, out=f"{a_file(t).name}/lat.npz"),
        {},
        ["afile", "is a file"],
    ),
    "extract .parts is a file": lambda t: (
        a_file(t, "lat.npz.parts") and extract(t),
        {},
        ["lat.npz.parts", "in the way"],
    ),
    "extract progress file not UTF-8": lambda t: (
        parts_with_progress(t, b"\xff\xfe\x00") or extract(t),
        {},
        ["progress.json", "delete"],
    ),
    "extract progress done list garbage": lambda t: (
        parts_with_progress(t, b'{"job": {}, "done": ["x", -1]}') or extract(t),
        {},
        ["progress.json", "delete"],
    ),
    "extract VAE file that is not weights": lambda t: (
        extract(t, "--vae", str(a_file(t, "vae.pt", b"\x00garbage"))),  # the last --vae counts
        {},
        ["vae.pt"],
    ),
    # ditbench sample
    "sample --cfg-scale nan": lambda t: (sample(t, "--cfg-scale", "nan"), {}, ["--cfg-scale", "finite"]),
    "sample --cfg-scale inf": lambda t: (sample(t, "--cfg-scale", "inf"), {}, ["--cfg-scale", "finite"]),
    "sample --seed negative": lambda t: (sample(t, "--seed", "-1"), {}, ["--seed -1"]),
    "sample --seed beyond 64 bits": lambda t: (sample(t, "--seed", str(2**64)), {}, ["--seed"]),
    "sample --guidance-channels 0": lambda t: (sample(t, "--guidance-channels", "0"), {}, ["from 1 to 4"]),
    "sample --guidance-channels 5": lambda t: (sample(t, "--guidance-channels", "5"), {}, ["from 1 to 4"]),
    "sample --num-classes absurd": lambda t: (sample(t, "--num-classes", str(2**40)), {}, ["--num-classes"]),
    "sample --image-size absurd": lambda t: (sample(t, "--image-size", "1000000"), {}, ["--image-size"]),
    "sample --out names another format": lambda t: (
        sample(t, out="s.json"),
        {},
        ["s.json", "ending in .npz"],
    ),
    "sample --out under a file": lambda t: (sample(t, out=f"{a_file(t).name}/s.npz"), {}, ["afile"]),
    "sample --out is a folder": lambda t: (
        (t / "dir.npz").mkdir() or sample(t, out="dir.npz"),
        {},
        ["dir.npz", "is a folder"],
    ),
    # checkpoints through the commands that read them
    "sample checkpoint pickle payload": lambda t: (
        sample(t, checkpoint=str(payload_checkpoint(t))),
        {},
        ["payload.pt", "weights_only"],
    ),
    "sample checkpoint truncated": lambda t: (
        sample(t, checkpoint=str(truncated_checkpoint(t))),
        {},
        ["cut.pt"],
    ),
    "sample checkpoint empty": lambda t: (sample(t, checkpoint=str(a_file(t, "e.pt", b""))), {}, ["e.pt"]),
    "sample checkpoint is a folder": lambda t: (sample(t, checkpoint=str(t)), {}, ["not a file"]),
    "sample checkpoint is a FIFO": lambda t: (
        os.mkfifo(t / "f.pt") or sample(t, checkpoint=str(t / "f.pt")),
        {},
        ["f.pt", "not a file"],
    ),
}


def listing(folder: Path) -> list[Path]:
    """Every path under `folder` but lock files (an output folder keeps its lock file: see outlock)."""
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.name != ".ditbench.lock")


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input_is_one_clean_error(case, tmp_path, capsys, monkeypatch):
    for name in ("DITBENCH_INJECT_FAULT", "DITBENCH_INJECT_FAULT_RANK"):
        monkeypatch.delenv(name, raising=False)
    argv, env, words = CASES[case](tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = listing(tmp_path)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, f"{case}: exit {code}\n{err}"
    message = err[err.index("ditbench: error:") :] if "ditbench: error:" in err else ""
    assert message, f"{case}: no clean error:\n{err}"
    assert "Traceback" not in err and "\n\n" not in message.strip(), err
    flat = " ".join(message.split())
    for word in words:
        assert word in flat, f"{case}: {word!r} not in {flat!r}"
    after = listing(tmp_path)
    assert after == before, f"{case}: left behind {set(after) - set(before)}"  # nothing created, nothing lost
    assert not (tmp_path / "ran").exists(), "a pickle payload was executed"


def test_the_battery_is_large():
    assert len(CASES) >= 50


def test_the_pickle_payload_is_live(tmp_path):
    """The payload cases can fail: unpickling this payload does run its command."""
    pickle.loads(pickle.dumps(Payload(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()


def test_an_unforeseen_file_system_refusal_is_one_paragraph(tmp_path, capsys, monkeypatch):
    from ditbench.bench import runner

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "somewhere"))

    monkeypatch.setattr(runner, "run_suite", refuse)
    assert main(run(tmp_path, tmp_path / "o")) == 2
    err = capsys.readouterr().err
    assert err.startswith("ditbench: error: Permission denied") and "somewhere" in err
    assert "Traceback" not in err and "DITBENCH_TRACEBACK=1" in " ".join(err.split())
    monkeypatch.setenv("DITBENCH_TRACEBACK", "1")
    with pytest.raises(PermissionError):
        main(run(tmp_path, tmp_path / "o"))


def test_a_second_extraction_into_the_same_out_is_refused_naming_the_first(tmp_path, capsys):
    argv = extract(tmp_path, "--vae", "random")
    (tmp_path / "lat.npz.parts").mkdir()
    with OutputLock(tmp_path / "lat.npz.parts", command="ditbench extract-latents first"):
        assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"PID {os.getpid()}" in err and "extract-latents first" in err


# ---- hostile files next to the results: the run goes on, with correct statuses --------------------


def ok_record(cell, **kw):
    context = {
        "suite": "hostile",
        "run_id": "20260101T000000Z-aaaaaa",
        "cell_id": cell.cell_id,
        "cell_name": cell.cell_name,
        "suite_baseline": {},
        "suite_overrides": {},
        "config": cell.config,
        "env": {},
        "started_at": "2026-01-01T00:00:00Z",
    }
    result = {"status": "ok", "metrics": {"images_per_s": 5.0, "step_ms": {"median": 200.0}}, **kw}
    return inflight.make_record(context, result, 3.0)


def test_garbage_in_every_file_a_run_keeps_does_not_stop_a_resume(tmp_path, capsys):
    path = suite(tmp_path)
    (cell,) = load_suite(path).cells
    out = tmp_path / "out"
    (out / ".inflight").mkdir(parents=True)
    odd = {  # optional fields a hand edit turned into other types: not a record (issue 34, class 6)
        "mfu": {"value": "high"},
        "noisy": "yes",
        "noise": 3,
        "emulation": {"card": None},
        "cpu_peak_rss_gib": "lots",
        "world_size": "2",
    }
    record = ok_record(cell, smoke={"first_mean": 1.0, "last_mean": None})
    record["metrics"].update(odd)
    record["duration_s"] = "long"
    lines = [b"\xff\xfe binary", b'{"cell_id": [1, 2]}', b"[" * 20000, json.dumps(record).encode()]
    (out / "results.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (out / ".ditbench.lock").write_bytes(b"\x00 not a holder record")
    (out / ".inflight" / "x.ticket.json").write_bytes(b"\xff")
    (out / ".inflight" / "stray.result.json").write_text("{}")
    with pytest.warns(UserWarning) as caught:
        assert main(["run", str(path), "--out", str(out), "--no-progress"]) == 0
    said = " ".join(str(w.message) for w in caught)
    assert "lines 1, 2, 3, 4" in said and "unreadable ticket" in said
    assert "[1/1] DiT-T/8 fp32 ckpt=none bs=32: ok" in capsys.readouterr().err  # measured again (stderr)
    with pytest.warns(UserWarning, match="skipped 4 lines"):
        assert len(read_records(out / "results.jsonl")) == 1  # the new record; nothing lost
    assert (out / "results.jsonl").read_bytes().startswith(b"\n".join(lines))
    assert list((out / ".inflight").iterdir()) == []
    assert "| DiT-T/8 fp32 ckpt=none bs=32 | ok" in (out / "summary.md").read_text()


def test_a_cell_that_cannot_run_here_is_recorded_unsupported_without_starting(tmp_path, capsys):
    path = suite(tmp_path, precision="fp16")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_bytes(b'{"schema": "ditbench.result/1", "status": "ok"}')  # no newline
    with pytest.warns(UserWarning):
        argv = ["run", str(path), "--out", str(out), "--no-progress", "--allow-unsupported"]
        assert main(argv) == 3  # nothing measured
    data = (out / "results.jsonl").read_bytes().split(b"\n")
    assert data[0] == b'{"schema": "ditbench.result/1", "status": "ok"}'  # terminated, not cut
    with pytest.warns(UserWarning, match="skipped 1 line"):
        (record,) = read_records(out / "results.jsonl")
    assert record["status"] == "unsupported" and "fp16" in record["reason"]
    assert list((out / "logs").iterdir()) == []  # no process was started for it


def test_nodes_of_a_multi_node_run_sharing_one_out_are_told_to_give_each_its_own(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    argv = run(tmp_path, out, "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:29500")
    with OutputLock(out, command="ditbench run (node 0)"):
        assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"PID {os.getpid()}" in err and "every node needs its own --out" in err


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks --device auto on a machine without a GPU")
def test_extract_with_device_auto_and_no_gpu_encodes_on_the_cpu(tmp_path, capsys):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    tiny = AutoencoderKL(
        block_out_channels=(8, 8, 16, 16),
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
    )
    tiny.save_pretrained(tmp_path / "vae")
    argv = extract(tmp_path, "--vae", str(tmp_path / "vae"), "--device", "auto", "--image-size", "32")
    assert main(argv) == 0, capsys.readouterr().err
    with np.load(tmp_path / "lat.npz") as f:
        assert f["latents"].shape == (1, 4, 4, 4)
    assert not (tmp_path / "lat.npz.parts").exists()


# ------------------------------------------------------------------ links inside an output folder (issue 21)


def planted(tmp: Path, where: str, kind: str = "dir") -> Path:
    """A link at `where` (relative to tmp) to an outside folder holding a file, or to an outside file
    whose last line is torn (what results.jsonl's tail repair would truncate)."""
    target = tmp / "outside"
    if kind == "dir":
        target.mkdir()
        (target / "precious.txt").write_text("keep me")
    else:
        target.write_bytes(b'{"keep": 1}\n{"torn')
    link = tmp / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=kind == "dir")
    return link


LINK_CASES = {
    "run: out/.inflight links to a folder (issue example)": lambda t: (
        planted(t, "out/.inflight"),
        run(t, t / "out"),
    ),
    "run: out/results.jsonl links to a file": lambda t: (
        planted(t, "out/results.jsonl", "file"),
        run(t, t / "out"),
    ),
    "run: out/.ditbench.lock links to a file": lambda t: (
        planted(t, "out/.ditbench.lock", "file"),
        run(t, t / "out"),
    ),
    "run: out/.ditbench.lock.held links to a file": lambda t: (
        planted(t, "out/.ditbench.lock.held", "file"),
        run(t, t / "out"),
    ),
    "run: out/logs links to a folder": lambda t: (planted(t, "out/logs"), run(t, t / "out")),
    "run: a cell log in out/logs links to a file": lambda t: (
        planted(t, "out/logs/x.log", "file"),
        run(t, t / "out"),
    ),
    "run: out/summary.md links to a file": lambda t: (
        planted(t, "out/summary.md", "file"),
        run(t, t / "out"),
    ),
    "run: out/.jobs links to a folder": lambda t: (planted(t, "out/.jobs"), run(t, t / "out")),
    "run --dry-run: out/.inflight links to a folder": lambda t: (
        planted(t, "out/.inflight"),
        run(t, t / "out", "--dry-run"),
    ),
    "extract-latents: OUT.parts links to a folder": lambda t: (planted(t, "lat.npz.parts"), extract(t)),
    "sample: OUT.shards links to a folder": lambda t: (planted(t, "s.npz.shards"), sample(t)),
}


def contents(folder: Path) -> dict[str, bytes | str]:
    """Every entry under `folder` (links not followed) with its bytes, or where a link points."""
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        if path.name == ".ditbench.lock" and not path.is_symlink():
            continue
        key = str(path.relative_to(folder))
        out[key] = (
            f"-> {os.readlink(path)}" if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
        )
    return out


@pytest.mark.parametrize("case", list(LINK_CASES))
def test_a_link_where_ditbench_keeps_its_files_is_refused_and_nothing_is_touched(case, tmp_path, capsys):
    link, argv = LINK_CASES[case](tmp_path)
    images_ok = contents(tmp_path)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, f"{case}: exit {code}\n{err}"
    assert "Traceback" not in err
    flat = " ".join(err.split())
    assert "symbolic link" in flat and link.name in flat, flat
    assert contents(tmp_path) == images_ok  # the link's target is whole, nothing was created through it


# ------------------------------------------------------------------ an output that is an input (issue 21)


def _results_named(path: Path) -> Path:
    from synthetic_records import make_record, write_jsonl

    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, [make_record("DiT-S/8", "fp32", "none", 8)])
    return path


OUTPUT_IS_INPUT = {
    "run: the suite file is where --out keeps summary.md": lambda t: (
        (t / "out").mkdir() or (t / "out" / "summary.md").write_text(suite(t).read_text()) and None,
        ["run", str(t / "out" / "summary.md"), "--out", str(t / "out"), "--no-progress"],
        t / "out" / "summary.md",
    ),
    "train: --save is the --data file": lambda t: (
        a_file(t, "lat.npz"),
        train("--data", str(t / "lat.npz"), "--save", str(t / "lat.npz")),
        t / "lat.npz",
    ),
    "sample: the record next to --out is the checkpoint": lambda t: (
        a_file(t, "s.json"),
        sample(t, checkpoint=str(t / "s.json")),
        t / "s.json",
    ),
    "extract-latents: --out is the --vae file": lambda t: (
        a_file(t, "lat.npz"),
        [x if x != "random" else str(t / "lat.npz") for x in extract(t)],
        t / "lat.npz",
    ),
    "report: --out's results.csv is the results file": lambda t: (
        _results_named(t / "rep" / "results.csv"),
        ["report", str(t / "rep" / "results.csv"), "--out", str(t / "rep")],
        t / "rep" / "results.csv",
    ),
    "report: --claims is --out's report.md": lambda t: (
        _results_named(t / "results.jsonl") and a_file(t, "report.md", b"claims: []\n"),
        ["report", str(t / "results.jsonl"), "--out", str(t), "--claims", str(t / "report.md")],
        t / "report.md",
    ),
}


@pytest.mark.parametrize("case", list(OUTPUT_IS_INPUT))
def test_an_output_that_is_an_input_is_refused_before_any_work(case, tmp_path, capsys):
    _, argv, victim = OUTPUT_IS_INPUT[case](tmp_path)
    before = victim.read_bytes()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, f"{case}: exit {code}\n{err}"
    flat = " ".join(err.split())
    assert "Traceback" not in err and "would replace what this command reads" in flat, flat
    assert victim.read_bytes() == before


# ------------------------------------------- bytes that are not text, files that are not files (issue 21)


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A few hundred bytes that declare width x height pixels (a decompression bomb's header)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)))
    return path


def _bad_image(t: Path, name: str, make) -> list[str]:
    argv = extract(t)  # makes imgs/cat/a.png
    make(t / "imgs" / "cat" / name)
    return argv


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


NOT_TEXT_NOT_FILES = {
    "run: an override with a non-UTF-8 byte (issue example)": lambda t: (
        run(t, t / "out", b"model=DiT-T/4\xff".decode("utf-8", "surrogateescape")),
        {},
        ["argument", "not UTF-8"],
    ),
    "report: a results path with a non-UTF-8 byte": lambda t: (
        ["report", str(t / b"r\xfe.jsonl".decode("utf-8", "surrogateescape")), "--out", str(t / "rep")],
        {},
        ["argument 2", "not UTF-8"],
    ),
    "report: a FIFO as the results file": lambda t: (
        ["report", str(_fifo(t / "r.jsonl")), "--out", str(t / "rep")],
        {},
        ["r.jsonl", "is a FIFO"],
    ),
    "report: /dev/null as the results file": lambda t: (
        ["report", "/dev/null", "--out", str(t / "rep")],
        {},
        ["/dev/null", "is a device"],
    ),
    "train: a FIFO as the --data latent file": lambda t: (
        train("--data", str(_fifo(t / "lat.npz"))),
        {},
        ["lat.npz", "is a FIFO"],
    ),
    "sample: a FIFO as the checkpoint": lambda t: (
        sample(t, checkpoint=str(_fifo(t / "c.pt"))),
        {},
        ["c.pt", "not a file"],
    ),
    "extract-latents: a PNG over PIL's decompression-bomb limit (issue example)": lambda t: (
        _bad_image(t, "bomb.png", lambda p: png_header_only(p, 100_000, 100_000)),
        {},
        ["bomb.png", "pixels"],
    ),
    "extract-latents: a PNG between PIL's warning and its error": lambda t: (
        _bad_image(t, "big.png", lambda p: png_header_only(p, 10_000, 10_000)),
        {},
        ["big.png", "10,000 x 10,000 pixels", "89,478,485"],
    ),
    "extract-latents: a truncated PNG": lambda t: (
        _bad_image(t, "cut.png", lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\0\0")),
        {},
        ["cut.png", "not a readable image"],
    ),
    "sample: a damaged shard manifest on resume (issue example)": lambda t: (
        (t / "s.npz.shards").mkdir()
        or (t / "s.npz.shards" / "manifest.json").write_text("{not json")
        and None,
        sample(t),
        ["manifest.json", "damaged", "--overwrite"],
    )[1:],
    "sample: a FIFO as the shard manifest": lambda t: (
        (t / "s.npz.shards").mkdir() or _fifo(t / "s.npz.shards" / "manifest.json") and None,
        sample(t),
        ["manifest.json", "damaged"],
    )[1:],
}


def _not_text_case(make):
    def case(t):
        argv, *rest = make(t)
        return (argv, *rest) if len(rest) == 2 else (argv, {}, rest[0])

    return case


@pytest.mark.parametrize("case", list(NOT_TEXT_NOT_FILES))
def test_bytes_that_are_not_text_and_files_that_are_not_files(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(CASES, case, _not_text_case(NOT_TEXT_NOT_FILES[case]))
    test_hostile_input_is_one_clean_error(case, tmp_path, capsys, monkeypatch)


# ----------------------------------------------------------------------------- refuse early (issue 21)


def latents_with(tmp: Path, name: str = "lat.npz", latents=None, labels=None) -> Path:
    rng = np.random.default_rng(0)
    lat = rng.standard_normal((4, 4, 8, 8)).astype(np.float32) if latents is None else latents
    lab = np.arange(4) % 2 if labels is None else labels
    if name.endswith(".pt"):
        torch.save({"latents": torch.as_tensor(lat), "labels": torch.as_tensor(lab)}, tmp / name)
    else:
        np.savez(tmp / name, latents=lat, labels=lab)
    return tmp / name


def _nan_at(index: int, value: float = float("nan")):
    lat = np.random.default_rng(0).standard_normal((4, 4, 8, 8)).astype(np.float32)
    lat[index, 0, 0, 0] = value
    return lat


REFUSE_EARLY = {
    "train --data with NaN latents (issue example)": lambda t: (
        train("--steps", "5", "--data", str(latents_with(t, latents=_nan_at(2)))),
        {},
        ["lat.npz", "1 NaN or infinite", "latent 2"],
    ),
    "train --data with an infinite latent in a .pt file": lambda t: (
        train("--steps", "5", "--data", str(latents_with(t, "lat.pt", latents=_nan_at(0, float("inf"))))),
        {},
        ["lat.pt", "NaN or infinite", "latent 0"],
    ),
    "train --data with fractional labels": lambda t: (
        train("--steps", "5", "--data", str(latents_with(t, labels=np.array([0.0, 1.5, 0.0, 1.0])))),
        {},
        ["lat.npz", "whole class numbers"],
    ),
    "train --data with a negative label": lambda t: (
        train("--steps", "5", "--data", str(latents_with(t, labels=np.array([0, -1, 0, 1])))),
        {},
        ["lat.npz", "from 0", "-1"],
    ),
    "run --dry-run checks --cluster keys (issue example)": lambda t: (
        run(t, t / "out", "--dry-run", "--executor", "slurm", "--cluster", "nosuchkey=1"),
        {},
        ["--cluster nosuchkey", "unknown key"],
    ),
    "run --dry-run checks --cluster values": lambda t: (
        run(t, t / "out", "--dry-run", "--executor", "slurm", "--cluster", "time_limit_min=-5"),
        {},
        ["time_limit_min", "-5"],
    ),
    "run --dry-run --executor local refuses SLURM options": lambda t: (
        run(t, t / "out", "--dry-run", "--executor", "local", "--cluster", "partition=gpu"),
        {},
        ["--executor local does not use"],
    ),
}


@pytest.mark.parametrize("case", list(REFUSE_EARLY))
def test_what_would_fail_later_is_refused_before_any_work(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(CASES, case, REFUSE_EARLY[case])
    test_hostile_input_is_one_clean_error(case, tmp_path, capsys, monkeypatch)
