"""`ditbench sample`: ADM npz shape and dtype, determinism, resumption, torchrun shards."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from metrics_support import npz_digest

from ditbench.cli import sample as cli
from ditbench.core.errors import UserError
from ditbench.sampling import sampler
from ditbench.sampling import shards as plan

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread():
    # One thread, as torchrun gives each rank: the same reduction order in every run of a test,
    # and on a loaded 2-core machine one thread is also several times faster.
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A ditbench checkpoint of a tiny DiT whose EMA weights differ from its raw weights."""
    from ditbench.models import build_model
    from ditbench.models.checkpoint import save_checkpoint

    torch.manual_seed(3)
    model = build_model("DiT-T/2", image_size=32, num_classes=10)
    ema = build_model("DiT-T/2", image_size=32, num_classes=10)
    with torch.no_grad():  # leave adaLN-Zero's zeros behind, so the samples depend on the weights
        for p, q in zip(model.parameters(), ema.parameters(), strict=True):
            p.add_(0.05 * torch.randn_like(p))
            q.copy_(p + 0.01 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("ckpt") / "tiny.pt"
    save_checkpoint(path, model, ema, None, 7, {"model": "DiT-T/2"})
    return path


def _args(ckpt, out, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(
        [
            str(ckpt),
            "--out",
            str(out),
            "--vae",
            "random",
            "--num-samples",
            "6",
            "--batch-size",
            "4",
            "--steps",
            "4",
            "--device",
            "cpu",
            "--no-progress",
            *extra,
        ]
    )


def _arrays(path):
    with np.load(path) as z:
        return z["arr_0"], z["arr_1"]


def test_shard_plan_is_balanced_and_seeds_differ():
    labels = plan.labels_for(50_000, 1000)
    assert np.bincount(labels).tolist() == [50] * 1000
    assert plan.shard_count(50_000, 32) == 1563
    seeds = {plan.shard_seed(0, k) for k in range(1000)} | {plan.shard_seed(1, k) for k in range(1000)}
    assert len(seeds) == 2000 and all(0 <= s < 2**63 for s in seeds)


@pytest.mark.slow
def test_fixed_seed_gives_the_same_adm_npz_twice(checkpoint, tmp_path):
    rec = sampler.sample(_args(checkpoint, tmp_path / "a.npz"))
    sampler.sample(_args(checkpoint, tmp_path / "b.npz"))
    imgs, labels = _arrays(tmp_path / "a.npz")
    assert imgs.shape == (6, 32, 32, 3) and imgs.dtype == np.uint8
    assert labels.dtype == np.int64 and labels.tolist() == [0, 1, 2, 3, 4, 5]
    assert imgs.std() > 0  # real decoded images, not a constant
    assert npz_digest(tmp_path / "a.npz") == npz_digest(tmp_path / "b.npz")
    other = sampler.sample(_args(checkpoint, tmp_path / "c.npz", "--seed", "1"))
    assert npz_digest(tmp_path / "c.npz") != npz_digest(tmp_path / "a.npz")
    assert other["settings"]["seed"] == 1
    # The record next to the npz: speed, settings, and the honest note about random VAE weights.
    saved = json.loads((tmp_path / "a.json").read_text())
    assert saved == json.loads(json.dumps(rec))
    assert saved["settings"]["weights"] == "ema" and saved["settings"]["model"] == "DiT-T/2"
    assert saved["images_per_s"] > 0 and saved["images_generated_this_run"] == 6
    assert "random VAE weights" in saved["warning"] and saved["for_speed_only"] is True
    assert not (tmp_path / "a.npz.shards").exists()


def test_interrupted_run_resumes_to_the_uninterrupted_result(checkpoint, tmp_path, monkeypatch):
    sampler.sample(_args(checkpoint, tmp_path / "full.npz", "--num-samples", "10", "--batch-size", "3"))
    out = tmp_path / "resumed.npz"
    monkeypatch.setenv(sampler.FAIL_AFTER_ENV, "2")
    with pytest.raises(RuntimeError, match="stopping after 2 shards"):
        sampler.sample(_args(checkpoint, out, "--num-samples", "10", "--batch-size", "3"))
    shards = sorted(p.name for p in (tmp_path / "resumed.npz.shards").glob("shard_*.npz"))
    assert shards == ["shard_000000.npz", "shard_000001.npz"] and not out.exists()
    monkeypatch.delenv(sampler.FAIL_AFTER_ENV)
    # Other settings must not mix with the shards on disk.
    with pytest.raises(UserError, match="seed: 0 now 5"):
        sampler.sample(_args(checkpoint, out, "--num-samples", "10", "--batch-size", "3", "--seed", "5"))
    rec = sampler.sample(_args(checkpoint, out, "--num-samples", "10", "--batch-size", "3"))
    assert rec["images_resumed"] == 6 and rec["images_generated_this_run"] == 4
    assert npz_digest(out) == npz_digest(tmp_path / "full.npz")
    # A finished batch is not redone.
    again = sampler.sample(_args(checkpoint, out, "--num-samples", "10", "--batch-size", "3"))
    assert again["finished_at"] == rec["finished_at"]


def test_bad_input_is_a_user_error(checkpoint, tmp_path):
    with pytest.raises(UserError, match="not a file"):
        sampler.sample(_args(tmp_path / "missing.pt", tmp_path / "x.npz"))
    with pytest.raises(UserError, match="--vae .* does not exist"):
        sampler.sample(_args(checkpoint, tmp_path / "x.npz", "--vae", str(tmp_path / "no-vae")))
    with pytest.raises(UserError, match="ending in .npz"):
        sampler.sample(_args(checkpoint, tmp_path / "x.png"))
    with pytest.raises(UserError, match="DiT-T/2 at 32 px"):
        sampler.sample(_args(checkpoint, tmp_path / "x.npz", "--model", "DiT-S/2"))
    (tmp_path / "taken.npz").write_bytes(b"user data")
    with pytest.raises(UserError, match="--overwrite"):
        sampler.sample(_args(checkpoint, tmp_path / "taken.npz"))
    assert (tmp_path / "taken.npz").read_bytes() == b"user data"


@pytest.mark.slow
def test_two_ranks_under_torchrun_write_the_same_npz_as_one(checkpoint, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")  # one thread each, as torchrun gives its ranks
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    common = [
        str(checkpoint),
        "--vae",
        "random",
        "--num-samples",
        "7",
        "--batch-size",
        "2",
        "--steps",
        "3",
        "--device",
        "cpu",
        "--no-progress",
    ]
    one = subprocess.run(
        [sys.executable, "-m", "ditbench", "sample", *common, "--out", str(tmp_path / "one.npz")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "ditbench",
            "sample",
            *common,
            "--out",
            str(tmp_path / "two.npz"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr
    assert "on 2 process(es)" in two.stdout
    rec = json.loads((tmp_path / "two.json").read_text())
    assert rec["world_size"] == 2 and sorted(r["images"] for r in rec["per_rank"]) == [3, 4]
    assert npz_digest(tmp_path / "one.npz") == npz_digest(tmp_path / "two.npz")


@pytest.mark.slow
def test_cli_reports_bad_checkpoint_in_one_paragraph(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ditbench",
            "sample",
            str(bad),
            "--vae",
            "random",
            "--out",
            str(tmp_path / "s.npz"),
            "--device",
            "cpu",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.startswith("ditbench: error:") and "Traceback" not in res.stderr


def test_the_npz_is_read_by_ditbench_fid_unchanged(checkpoint, tmp_path):
    npz_io = pytest.importorskip("ditbench.metrics.npz_io")  # the metrics package's ADM reader
    sampler.sample(_args(checkpoint, tmp_path / "s.npz"))
    source = npz_io.open_images(tmp_path / "s.npz")
    assert (source.count, source.height, source.width) == (6, 32, 32)
    got = np.concatenate(list(source.batches(4)))
    assert np.array_equal(got, _arrays(tmp_path / "s.npz")[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
@pytest.mark.slow
def test_gpu_check_script_says_it_needs_a_gpu(tmp_path):
    out = tmp_path / "dist_sample.json"
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_dist_sample.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "no CUDA device is visible" in res.stderr
    assert not out.exists()


def test_official_bare_state_dict_samples_like_the_ema_it_holds(checkpoint, tmp_path):
    # An official release file is a bare state dict of EMA weights: saved from our checkpoint's EMA,
    # it must give exactly the images the checkpoint gives (which prefers its EMA weights).
    ema = torch.load(checkpoint, weights_only=True)["ema"]
    bare = tmp_path / "DiT-T-2-32x32.pt"
    torch.save(ema, bare)
    rec = sampler.sample(_args(bare, tmp_path / "bare.npz"))
    sampler.sample(_args(checkpoint, tmp_path / "ckpt.npz"))
    assert rec["settings"]["weights"] == "state dict" and rec["settings"]["model"] == "DiT-T/2"
    assert npz_digest(tmp_path / "bare.npz") == npz_digest(tmp_path / "ckpt.npz")


def test_a_failure_before_any_shard_leaves_no_shard_folder(checkpoint, tmp_path, monkeypatch, capsys):
    """Issue 38: a failed run leaves no manifest claiming shards; the estimate is printed first."""

    def fail(*args, **kwargs):
        raise RuntimeError("out of memory in the first shard")

    monkeypatch.setattr(sampler, "make_shard", fail)
    out = tmp_path / "s.npz"
    with pytest.raises(RuntimeError, match="first shard"):
        sampler.sample(_args(checkpoint, out))
    assert not plan.default_paths(out)[0].exists() and not out.exists()
    assert "ditbench sample: 6 images of DiT-T/2, 4 steps each: estimated" in capsys.readouterr().err


def test_ctrl_c_prints_the_command_that_resumes(checkpoint, tmp_path, monkeypatch, capsys):
    from ditbench.cli import main

    real = sampler.make_shard
    calls = []

    def interrupt_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sampler, "make_shard", interrupt_second)
    out = tmp_path / "my samples.npz"
    argv = ["sample", str(checkpoint), "--out", str(out), "--vae", "random", "--num-samples", "6",
            "--batch-size", "4", "--steps", "4", "--device", "cpu", "--no-progress"]  # fmt: skip
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "the shards written so far are kept" in err
    assert f"ditbench sample {checkpoint} --out '{out}' --vae random" in err
    assert [p.name for p in plan.default_paths(out)[0].glob("shard_*.npz")] == ["shard_000000.npz"]
    monkeypatch.setattr(sampler, "make_shard", real)
    assert main(argv) == 0  # the printed command resumes: only the missing shard is made
    assert _arrays(out)[0].shape == (6, 32, 32, 3)
