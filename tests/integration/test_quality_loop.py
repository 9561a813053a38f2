"""A cell's quality phase, in process: evaluations at the listed steps (or the smoke run's end), training
timed apart from sampling and scoring, mean and spread over seeds, the shared grid, failures as the
field's status. The logic runs on a stand-in feature network (milliseconds); one test scores with the
calibrated test Inception end to end."""

import json
import statistics

import numpy as np
import pytest
import torch
from metrics_support import FakeExtractor
from PIL import Image

from ditbench.bench.cell import core as cell_core
from ditbench.files.pretrained import CACHE_ENV
from ditbench.hardware.dist import DistContext
from ditbench.metrics import registry
from ditbench.models import builtin_data
from ditbench.quality import evaluation as grid
from ditbench.quality.loop import run_quality
from ditbench.spec.cell import CellSpec, Steps
from ditbench.spec.knobs import Knobs
from ditbench.spec.quality import QualitySpec, Sampler


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """16 real crops (the built-in reference's first), as an ADM reference npz."""
    root = tmp_path_factory.mktemp("quality")
    with np.load(builtin_data.resolve("builtin:mpl-gray16-ref")) as f:
        images = f["arr_0"][:16]
    np.savez(root / "ref.npz", arr_0=images)
    return root / "ref.npz"


def _spec(reference, smoke_steps=0, **quality):
    knobs = Knobs(
        model="DiT-T/2",
        image_size=64,
        batch_size=4,
        num_classes=2,
        data={"pixels": "builtin:mpl-gray16"},
        ema_decay=0.5,
    )
    settings = dict(samples=6, sampler=Sampler("ddpm", 3, 1.5), at=(0, 5), seeds=(0, 1), grid=4, batch_size=4)
    return CellSpec(
        knobs,
        "cpu",
        Steps(0, 1, 0.0),
        smoke_steps,
        quality=QualitySpec(str(reference), **{**settings, **quality}),
    )


def _run(spec, tmp_path, extractor=None, smoke=None):
    from ditbench.bench.cell.core import build_trainer

    ctx = DistContext(device=torch.device("cpu"))
    return run_quality(
        spec, ctx, build_trainer, smoke=smoke, out_dir=tmp_path, cell_id="c1", extractor=extractor
    )


def test_a_quality_run_evaluates_each_step_with_training_timed_apart(reference, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # the reference is featurised here, once
    fake = FakeExtractor()
    field = _run(_spec(reference), tmp_path, fake)
    assert field["status"] == "ok", field["reason"]
    assert field["reference"]["path"] == str(reference) and field["reference"]["digest"].startswith("sha256:")
    assert field["inception"] == {"name": "fake", "sha256": "f" * 64, "official": False, "recipe": None}
    assert field["sampler"] == {"name": "ddpm", "steps": 3, "cfg_scale": 1.5, "precision": "fp32"}
    assert (field["samples"], field["seeds"], field["at"], field["ranks"]) == (6, [0, 1], [0, 5], 1)
    assert "kid" in field["skipped"]  # 6 samples cannot give subsets of 1000
    assert "is" not in field["skipped"]  # ADM's IS splits (chunks of 5000) take any N from 2
    assert field["decoder"].startswith("pixels") and field["train_steps"] == 5
    first, last = field["evaluations"]
    assert (first["step"], last["step"]) == (0, 5)
    assert first["train_wall_s"] == 0 and last["train_wall_s"] > 0
    assert last["train_gpu_s"] == last["train_wall_s"]  # one process
    assert last["sample_s"] > 0 and last["score_s"] > 0
    for e in field["evaluations"]:
        assert [p["seed"] for p in e["per_seed"]] == [0, 1]
        fids = [p["fid"] for p in e["per_seed"]]
        assert fids[0] != fids[1]  # each seed its own noise
        assert e["metrics"]["fid"] == pytest.approx(statistics.fmean(fids))
        assert e["spread"]["fid"] == pytest.approx(statistics.stdev(fids))
        assert e["metrics"]["kid"] is None and e["spread"]["kid"] is None
        assert set(e["metrics"]) == {o.key for o in registry.quality_outputs()}
    # every sample was featurised once (2 evaluations x 2 seeds, 6 each), the reference once
    assert sorted(n for _, n in fake.calls) == [6] * 4 + [16]
    assert json.loads(json.dumps(field)) == field  # JSON as it is


@pytest.mark.slow
def test_grids_share_noise_and_labels_and_are_written_under_the_run(reference, tmp_path):
    field = _run(_spec(reference), tmp_path, FakeExtractor())
    first, last = field["evaluations"]
    assert first["grid"] == "grids/c1/step0000000.png" and last["grid"] == "grids/c1/step0000005.png"
    image = np.asarray(Image.open(tmp_path / first["grid"]))
    assert image.shape == (
        grid.PAD + 128 + grid.PAD,
        4 * (128 + grid.PAD) + grid.PAD,
        3,
    )  # 4 of 16 px, enlarged 8 times to 128
    again = _run(_spec(reference, seeds=(5,)), tmp_path / "other", FakeExtractor())
    assert np.array_equal(np.asarray(Image.open(tmp_path / "other" / again["evaluations"][0]["grid"])), image)
    assert list(grid.grid_labels(10, 1000)) == [207, 360, 387, 974, 88, 979, 417, 279, 207, 360]
    assert list(grid.grid_labels(5, 2)) == [0, 1, 0, 1, 0]


def test_one_seed_has_no_spread(reference, tmp_path):
    field = _run(_spec(reference, seeds=(3,), at=(0,), grid=0), tmp_path, FakeExtractor())
    (e,) = field["evaluations"]
    assert e["spread"] is None and e["seeds"] == [3] and e["grid"] is None
    # the bootstrap over the seed's samples stands in for the seeds' spread (the gate's noise)
    (seed,) = e["per_seed"]
    assert e["bootstrap_se"] == seed["bootstrap_se"] and e["bootstrap_se"]["fid"] > 0
    assert e["interval"] == seed["interval"]
    low, high = e["interval"]["fid"]
    assert low < e["metrics"]["fid"] < high


@pytest.mark.slow
def test_smoke_end_evaluates_the_smoke_runs_trainer(reference, tmp_path):
    spec = _spec(reference, smoke_steps=3, at="smoke_end")
    measured = cell_core.measure(spec, "c1", lambda: DistContext(device=torch.device("cpu")))
    smoke = cell_core.smoke(spec, measured)
    assert smoke["status"] == "ok" and measured.smoke_trainer is not None
    trainer, wall = measured.smoke_trainer
    assert trainer.step_count == 3 and wall > 0
    field = _run(spec, tmp_path, FakeExtractor(), smoke=measured.smoke_trainer)
    (e,) = field["evaluations"]
    assert (
        field["at"] == "smoke_end" and e["step"] == 3 and e["train_wall_s"] == pytest.approx(wall, abs=1e-3)
    )


@pytest.mark.slow
def test_a_failure_is_the_fields_status_and_the_cell_stands(tmp_path):
    spec = _spec(tmp_path / "missing.npz")
    measured = cell_core.measure(spec, "c1", lambda: DistContext(device=torch.device("cpu")))
    field = cell_core.quality(spec, measured, {"out_dir": str(tmp_path), "cell_id": "c1"})
    assert measured.result["status"] == "ok"
    assert field["status"] == "error" and "missing.npz" in field["reason"] and field["evaluations"] == []
    smoke_end = _run(_spec(tmp_path / "missing.npz", smoke_steps=2, at="smoke_end"), tmp_path)
    assert smoke_end["status"] == "error"


@pytest.mark.slow  # the calibrated network on 2 busy cores: about 2 minutes
def test_the_test_inception_scores_the_samples_end_to_end(reference, tmp_path, monkeypatch):
    spec = _spec(reference, samples=4, at=(0,), inception="test", grid=0)
    field = _run(spec, tmp_path)
    assert field["status"] == "ok", field["reason"]
    assert field["inception"]["name"] == "test" and field["inception"]["official"] is False
    assert field["inception"]["recipe"] == 2  # which calibration of the test network made the numbers
    assert field["banner"] == "not the official Inception: numbers are not comparable with papers"
    (e,) = field["evaluations"]
    assert all(p["fid"] > 0 for p in e["per_seed"]) and e["spread"]["fid"] > 0


RANKS_SCRIPT = """
import json, sys
import torch
sys.path.insert(0, sys.argv[3])  # tests/support: the stand-in feature network
from metrics_support import FakeExtractor
from ditbench.hardware import dist
from ditbench.bench.cell.core import build_trainer
from ditbench.spec.cell import CellSpec, Steps
from ditbench.spec.knobs import Knobs
from ditbench.quality.loop import run_quality
from ditbench.spec.quality import QualitySpec, Sampler

ctx = dist.init("cpu")
knobs = Knobs(model="DiT-T/2", image_size=64, batch_size=4, num_classes=2, gpus=2, strategy=sys.argv[4],
                   data={"pixels": "builtin:mpl-gray16"}, ema_decay=0.5)
q = QualitySpec(sys.argv[1], samples=6, sampler=Sampler("ddpm", 3, 1.5), at=(0, 2), seeds=(0, 1), grid=0,
                batch_size=2)
field = run_quality(CellSpec(knobs, "cpu", Steps(0, 1, 0.0), 0, quality=q), ctx, build_trainer,
                    extractor=FakeExtractor())
if ctx.rank == 0:
    open(sys.argv[2], "w").write(json.dumps(field))
dist.barrier(ctx)
dist.shutdown()
"""


@pytest.mark.slow  # two gloo processes
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_ranks_split_the_samples_and_rank_0_scores_the_same_set(reference, tmp_path, strategy):
    import os
    import sys
    from pathlib import Path

    from ditbench.bench.launch import torchrun as tr

    tests = Path(__file__).resolve().parents[1] / "support"  # metrics_support
    script, out = tmp_path / "ranks.py", tmp_path / "field.json"
    script.write_text(RANKS_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(tests.parents[1]), "DITBENCH_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    res = tr.launch(
        [*cmd, str(reference), str(out), str(tests), strategy], tmp_path / "launch", timeout_s=600, env=env
    )
    assert res.returncode == 0, res.output_tail
    field = json.loads(out.read_text())
    assert field["status"] == "ok", field["reason"]
    assert field["ranks"] == 2 and "rank 0 gathers" in field["split"]
    e0, e2 = field["evaluations"]
    assert e2["train_gpu_s"] == pytest.approx(2 * e2["train_wall_s"], abs=2e-3)
    # step 0 is the initialisation: one process scoring every shard gets the very same numbers
    single = _run(_spec(reference, at=(0,), grid=0, batch_size=2), tmp_path / "one", FakeExtractor())
    assert [p["fid"] for p in e0["per_seed"]] == pytest.approx(
        [p["fid"] for p in single["evaluations"][0]["per_seed"]]
    )
