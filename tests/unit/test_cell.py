"""The cell core on CPU: card emulation (torch.cuda mocked), fits, noisy windows, the summary's marks."""

import pytest
import torch

from ditbench.bench.cell import core as cell_core
from ditbench.bench.cell import memory
from ditbench.bench.cell.window import GAP_BOUND, SPREAD_BOUND, noise
from ditbench.bench.summary import format_line, summary_table
from ditbench.core.errors import UnsupportedError
from ditbench.hardware.dist import DistContext
from ditbench.spec.cell import CellSpec, Steps
from ditbench.spec.knobs import Knobs

GIB = 2**30


def test_allocator_cap_is_the_card_less_the_context():
    assert memory.allocator_cap_gib(23.99, 0.49, 139.8) == pytest.approx(23.5)
    with pytest.raises(UnsupportedError, match="cannot emulate a card of 141 GiB"):
        memory.allocator_cap_gib(141, 0.5, 79.6)
    with pytest.raises(UnsupportedError, match="context alone"):
        memory.allocator_cap_gib(0.4, 0.5, 79.6)


@pytest.fixture
def fake_cuda(monkeypatch):
    """A 139.8 GiB H200 whose context holds 0.52 GiB right after CUDA starts; records the cap set."""
    calls = {}
    total = int(139.8 * GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - int(0.52 * GIB), total))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, device=None: calls.update(fraction=f)
    )
    return calls


def test_apply_emulation_caps_the_allocator_and_says_so(fake_cuda):
    record = memory.apply_emulation(23.99, "RTX 4090", "cuda:0")
    assert record == {
        "card": "RTX 4090",
        "budget_gib": 23.99,
        "context_gib": pytest.approx(0.52, abs=1e-3),
        "allocator_cap_gib": pytest.approx(23.47, abs=1e-3),
        "real_gpu": "NVIDIA H200",
        "real_total_gib": pytest.approx(139.8, abs=1e-3),
        "note": "speeds are the real GPU's, not the emulated card's",
    }
    assert fake_cuda["fraction"] == pytest.approx(23.47 / 139.8, abs=1e-5)
    assert memory.apply_emulation(None, None, "cuda:0") is None


def test_emulation_counts_this_processs_context_not_another_processs_memory(fake_cuda, monkeypatch):
    """A pytest parent that holds a context and cached blocks on the same GPU (1.5 GiB in use in all):
    NVML's count of this process (0.5 GiB) is the context; without NVML, all that is in use is."""
    total = int(139.8 * GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total - int(1.5 * GIB), total))
    monkeypatch.setattr(memory, "nvml_process_mem_gib", lambda: 0.5)
    assert memory.apply_emulation(2, None, "cuda:0")["allocator_cap_gib"] == pytest.approx(1.5)
    monkeypatch.setattr(memory, "nvml_process_mem_gib", lambda: None)
    assert memory.apply_emulation(2, None, "cuda:0")["context_gib"] == pytest.approx(1.5)


def _spec(**settings):
    knobs = Knobs(model="DiT-T/8", image_size=64, batch_size=2)
    return CellSpec(knobs, "cpu", Steps(warmup=1, measure=2, min_seconds=0.0), **settings)


def _cpu():
    return DistContext(device=torch.device("cpu"))


@pytest.mark.slow
def test_an_emulated_cell_records_the_emulation_and_fits_by_completing(fake_cuda, monkeypatch):
    monkeypatch.delenv("DITBENCH_INJECT_FAULT", raising=False)
    spec = _spec(gpu_memory_gib=23.99, card="RTX 4090")
    m = cell_core.measure(spec, "DiT-T/8 bs=2", _cpu).result["metrics"]
    assert m["emulation"]["card"] == "RTX 4090" and m["emulation"]["allocator_cap_gib"] == pytest.approx(
        23.47, 1e-3
    )
    assert m["fits_budget"] is True and "completed" in m["fits_basis"] and "23.47 GiB" in m["fits_basis"]
    monkeypatch.setenv("DITBENCH_INJECT_FAULT", "bs=2=oom@2")
    out = cell_core.measure(spec, "DiT-T/8 bs=2", _cpu).result
    assert out["status"] == "oom" and out["metrics"]["fits_budget"] is False
    assert "ran out of memory under the allocator cap" in out["metrics"]["fits_basis"]


def test_a_plain_cell_fits_nothing_and_is_measured_in_full(monkeypatch):
    monkeypatch.delenv("DITBENCH_INJECT_FAULT", raising=False)
    out = cell_core.measure(_spec(), "DiT-T/8 bs=2", _cpu).result
    m = out["metrics"]
    assert out["status"] == "ok" and m["emulation"] is None and m["fits_budget"] is None
    assert m["fits_basis"].startswith("no card emulated")
    assert m["measured_steps"] == 2 and m["images_per_s"] == pytest.approx(2 * m["steps_per_s"])
    assert set(m["noise"]) == {
        "step_spread",
        "throughput_gap",
        "spread_bound",
        "gap_bound",
        "other_cpu_share",
        "load_bound",
    }
    assert isinstance(m["noisy"], bool)
    assert set(m["load"]) == {"load_1m_start", "load_1m_end", "other_cpu_share", "cpus"}
    assert (
        0.0 <= m["load"]["other_cpu_share"] <= 1.0
        and m["noise"]["other_cpu_share"] == m["load"]["other_cpu_share"]
    )
    # the conftest runs tests at 2 threads; a CPU cell pins its process to 1 unless the knob says otherwise
    assert out["env"]["torch_threads"] == 1 and _spec().model_dump(mode="json")["threads"] is None


def test_the_threads_knob_sets_the_cells_torch_threads(monkeypatch):
    monkeypatch.delenv("DITBENCH_INJECT_FAULT", raising=False)
    spec = CellSpec(
        Knobs(model="DiT-T/8", image_size=64, batch_size=2, threads=2),
        "cpu",
        Steps(warmup=1, measure=2, min_seconds=0.0),
    )
    torch.set_num_threads(1)
    out = cell_core.measure(spec, "DiT-T/8 threads=2", _cpu).result
    assert (
        out["status"] == "ok"
        and out["env"]["torch_threads"] == 2
        and spec.model_dump(mode="json")["threads"] == 2
    )


def test_noise_bounds():
    steady = noise([100.0, 101.0, 99.0, 100.0], rate=10 * 1000 / 100, batch=10)
    assert steady["noisy"] is False and steady["noise"]["step_spread"] < 1.05
    assert steady["noise"]["throughput_gap"] == pytest.approx(0.0, abs=1e-9)
    assert (steady["noise"]["spread_bound"], steady["noise"]["gap_bound"]) == (SPREAD_BOUND, GAP_BOUND)
    spread = noise([100.0, 100.0, 2846.0, 100.0, 2846.0], rate=4 / 0.374, batch=4)
    assert spread["noisy"] is True and spread["noise"]["step_spread"] > SPREAD_BOUND
    gap = noise([100.0] * 5, rate=0.5 * 10 * 1000 / 100, batch=10)  # half the steps' rate
    assert gap["noisy"] is True and gap["noise"]["throughput_gap"] == pytest.approx(0.5)


def test_summary_marks_noisy_cells_and_failed_smoke_runs():
    metrics = {
        "images_per_s": 3.1,
        "step_ms": {"median": 374.0, "p10": 100.0, "p90": 2846.0},
        "cpu_peak_rss_gib": 1.0,
        **noise([100.0, 374.0, 2846.0], 3.1, 4),
    }
    record = {"cell_name": "c", "status": "ok", "metrics": metrics, "duration_s": 3.0, "reason": None}
    record["smoke"] = {"status": "oom", "reason": "out of memory: x", "first_mean": None}
    line = format_line(record)
    assert (
        "noisy (p90/p10 15.19 > 1.5, window vs median-step throughput differ 71%)" in line
        and "smoke oom: out of memory: x" in line
    )
    row = summary_table([record]).splitlines()[-1]
    assert "| ok (noisy) |" in row and "smoke oom" in row
