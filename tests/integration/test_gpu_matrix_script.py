import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_train_matrix.py"


def _load():
    return load_benchmark("gpu_train_matrix")


def test_plan_covers_anchors_and_every_paper_config():
    mod = _load()
    cells = mod.plan("default")
    keys = {mod.cell_key(c) for c in cells}
    assert set(mod.ANCHORS) <= keys
    assert {c["model"] for c in cells} >= set(mod.PAPER_MODELS)
    xl = [c for c in cells if mod.cell_key(c) == ("DiT-XL/2", "bf16", "none", 256, True)]
    assert xl and xl[0]["optimizer_impl"] == "fused"
    assert len(cells) <= 30  # keeps the default run near 6 minutes on one H200


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_script_fails_gracefully_without_cuda(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "m.json").exists()


@pytest.mark.slow
def test_a_cell_without_a_flop_count_keeps_its_measurement(monkeypatch):
    from ditbench.bench.cell import mfu

    mod = _load()
    monkeypatch.setattr(mfu, "model_flops_per_image", lambda *a, **k: None)
    c = mod.cell("DiT-T/8", "fp32", batch=2)
    out = mod.run_cell(c, "cpu", warmup=1, measure=2, min_seconds=0.0)
    assert out["status"] == "ok", out
    assert out["model_tflops_per_s"] is None and out["images_per_s"] > 0 and out["steps"] == 2
    xl = dict(mod.cell("DiT-XL/2", "bf16", batch=256, compile=True), status="ok", images_per_s=610.0)
    assert "no FLOP count" in mod.compare([out, xl])[-1]  # the summary line survives a missing count
