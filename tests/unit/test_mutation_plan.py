"""The planner's arithmetic pinned by value (issue 27, mutation testing of ditbench/plan/).

Each expected number is worked out here from the rule it checks (the time model's max of compute,
memory and kernel minimum; the fit's common factor; the caching allocator's rounding and segments;
the budget's capacity), on hand-made kernel rows and hand-made traces, so no test traces a model and
the file runs in about a second. reports/mutation/plan.md lists the mutants each test was added for.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import pytest
import torch

from ditbench.core.errors import UnsupportedError, UserError
from ditbench.hardware.cards import DATASHEETS, Datasheet, find_card
from ditbench.plan import allocator, grid, kernels, measured, predict, speed
from ditbench.plan.emulation import CPU, cuda_target
from ditbench.plan.trace import SeriesTrace, Trace, _is_prime, probe_batch, trace_series
from ditbench.spec.knobs import Knobs

MiB, GiB = 1 << 20, 1 << 30
SHEET = Datasheet(fp32=10.0, tf32=100.0, fp16=200.0, memory_gbs=1000.0, link_gbs=100.0, link="NVLink")
PARAMS = {"matmul_eff": 0.5, "attention_eff": 0.25, "memory_eff": 0.5, "host_us": 10.0, "kernel_us": 2.0,
          "block_us": 100.0, "checkpoint_us": 50.0, "fused_share": 0.25}  # fmt: skip


# ---- speed.py: the time model ------------------------------------------------------------------


def test_each_kernel_runs_at_its_dtypes_peak_and_its_categorys_efficiency():
    tf = 10**12
    # fp16 like bf16 runs on the tensor cores: 1e12 / (0.5 * 200e12) = 10 ms.
    assert speed.step_time({("matmul", "fp16", False, tf, 0, 0, 0): 1}, 1, SHEET, "fp16", PARAMS).seconds == (
        pytest.approx(0.01)
    )
    # Attention takes the attention efficiency: 1e12 / (0.25 * 200e12) = 20 ms in bf16.
    t = speed.step_time({("attention", "bf16", False, tf, 0, 0, 0): 1}, 1, SHEET, "bf16", PARAMS)
    assert t.split["attention"] == pytest.approx(0.02) and t.split["matmul"] == 0
    # tf32 speeds up matmuls only: fp32 attention under tf32 runs at the fp32 peak, 1e12 / (0.25 * 10e12).
    t = speed.step_time({("attention", "fp32", False, tf, 0, 0, 0): 1}, 1, SHEET, "tf32", PARAMS)
    assert t.seconds == pytest.approx(0.4)
    # An fp32 elementwise kernel under tf32: the fp32 peak with the matmul efficiency, 1e12 / (0.5 * 10e12).
    t = speed.step_time({("elementwise", "fp32", False, tf, 0, 0, 0): 1}, 1, SHEET, "tf32", PARAMS)
    assert t.split["elementwise"] == pytest.approx(0.2)


def test_flops_and_bytes_are_a_constant_plus_a_per_sample_part():
    # FLOPs 1e12 + 3 * 1e12 at batch 3 = 4e12 -> 4e12 / 100e12 = 40 ms; bytes 1e9 + 3 * 1e9 = 4e9 at
    # 500 GB/s = 8 ms, less than the compute: the kernel is compute bound.
    row = ("matmul", "bf16", False, 10**12, 10**12, 10**9, 10**9)
    assert speed.step_time({row: 1}, 3, SHEET, "bf16", PARAMS).seconds == pytest.approx(0.04)
    # Bytes alone: 1e9 + 3e9 at 500 GB/s = 8 ms.
    row = ("elementwise", "bf16", False, 0, 0, 10**9, 10**9)
    t = speed.step_time({row: 2}, 3, SHEET, "bf16", PARAMS)
    assert t.split["elementwise"] == pytest.approx(0.016)
    assert t.kernels == 2 and t.steps_per_s == pytest.approx(1 / 0.016)


def test_fused_launches_count_a_share_of_the_elementwise_kernels():
    rows = {("elementwise", "bf16", False, 0, 0, 1000, 0): 8, ("matmul", "bf16", False, 0, 0, 1000, 0): 3}
    assert speed.step_time(rows, 1, SHEET, "bf16", PARAMS).kernels == 11
    # 8 * 0.25 = 2 elementwise launches left, matmuls untouched; each takes the 2 us minimum and the
    # host 10 us to issue: 5 launches, 50 us of host time.
    t = speed.step_time(rows, 1, SHEET, "bf16", PARAMS, compiled=True)
    assert t.kernels == 5
    assert t.seconds == pytest.approx(50e-6)


def test_the_backward_that_hides_the_all_reduce_includes_its_kernels_latency():
    # 1000 backward kernels of 8 ns of bytes: each is busy 8 ns and waits 2 us - 8 ns: 2 ms of backward.
    rows = {("elementwise", "fp32", True, 0, 0, 4000, 0): 1000}
    grad = 10**9
    ring = 2 * (2 - 1) / 2 * grad / 100e9  # 10 ms over 2 GPUs
    t = speed.step_time(rows, 1, SHEET, "fp32", PARAMS, gpus=2, grad_bytes=grad, overlap=False)
    assert t.split["communication"] == pytest.approx(ring - 1000 * 2e-6)
    # Gradients smaller than one DDP bucket: the whole all-reduce is the last bucket, none hidden.
    small = 10**6
    t = speed.step_time({("matmul", "bf16", True, 10**14, 0, 0, 0): 1}, 1, SHEET, "bf16", PARAMS, gpus=2,
                        grad_bytes=small)  # fmt: skip
    assert t.split["communication"] == pytest.approx(small / 100e9)
    # A 'card' without an interconnect (a CPU) has no all-reduce to time.
    cpu = speed.cpu_datasheet(1000.0)
    t = speed.step_time(rows, 1, cpu, "fp32", PARAMS, gpus=2, grad_bytes=grad)
    assert t.split["communication"] == 0


def test_the_units_are_tera_and_giga_to_the_last_digit():
    # 1e12 FLOPs at 0.5 * 200 TFLOPS: 10 ms; 5e8 bytes at 0.5 * 1000 GB/s: 1 ms (to 12 digits).
    t = speed.step_time({("matmul", "bf16", False, 10**12, 0, 0, 0): 1}, 1, SHEET, "bf16", PARAMS)
    assert t.split["matmul"] == pytest.approx(0.01, rel=1e-14, abs=0)
    t = speed.step_time({("elementwise", "bf16", False, 0, 0, 5 * 10**8, 0): 1}, 1, SHEET, "bf16", PARAMS)
    assert t.split["elementwise"] == pytest.approx(0.001, rel=1e-14, abs=0)


def test_any_interconnect_carries_the_all_reduce_at_its_gb_per_s():
    # 1 MB of gradients over 2 GPUs: the ring moves 1 MB, at 0.5 GB/s 2 ms, at 100 GB/s 10 us (exact units).
    slow = Datasheet(fp32=10.0, tf32=100.0, fp16=200.0, memory_gbs=1000.0, link_gbs=0.5, link="slow")
    rows = {("matmul", "bf16", False, 10**12, 0, 0, 0): 1}
    t = speed.step_time(rows, 1, slow, "bf16", PARAMS, gpus=2, grad_bytes=10**6)
    assert t.split["communication"] == pytest.approx(2e-3, rel=1e-12)
    t = speed.step_time(rows, 1, SHEET, "bf16", PARAMS, gpus=2, grad_bytes=10**6)
    assert t.split["communication"] == pytest.approx(1e-5, rel=1e-12)


def test_one_gpu_and_no_gradients_are_the_defaults():
    rows = {("matmul", "bf16", False, 10**12, 0, 0, 0): 1}
    assert speed.step_time(rows, 1, SHEET, "bf16", PARAMS, grad_bytes=4 * 10**9).split["communication"] == 0
    assert speed.step_time(rows, 1, SHEET, "bf16", PARAMS, gpus=2).split["communication"] == 0


def test_each_kernel_row_adds_to_its_part_its_latency_and_the_backward():
    # Two backward matmuls of 10 and 20 ms: 30 ms of matmul and of backward; the 40 ms ring over 2
    # GPUs (4 GB of gradients at 100 GB/s) is exposed for 10 ms.
    rows = {("matmul", "bf16", True, 10**12, 0, 0, 0): 1, ("matmul", "bf16", True, 2 * 10**12, 0, 0, 0): 1}
    t = speed.step_time(rows, 1, SHEET, "bf16", PARAMS, gpus=2, grad_bytes=4 * 10**9)
    assert t.split["matmul"] == pytest.approx(0.03)
    assert t.split["communication"] == pytest.approx(0.01)
    # Two rows of 10 tiny kernels (8 ns busy each): both rows' waits to the 2 us minimum, plus the
    # host's 20 * 10 us added on a CPU.
    tiny = {
        ("elementwise", "fp32", False, 0, 0, 4000, 0): 10,
        ("optimizer", "fp32", False, 0, 0, 4000, 0): 10,
    }
    t = speed.step_time(tiny, 1, SHEET, "fp32", PARAMS, overlap=False)
    assert t.split["launch_overhead"] == pytest.approx(20 * (2e-6 - 8e-9) + 200e-6)


def test_the_exposed_last_bucket_is_ddps_default_25_mib():
    # 1 s of backward hides the ring but its last 25 MiB bucket: 2 * 7/8 * 25 MiB / 100 GB/s over 8 GPUs.
    long = {("matmul", "bf16", True, 10**14, 0, 0, 0): 1}
    t = speed.step_time(long, 1, SHEET, "bf16", PARAMS, gpus=8, grad_bytes=4 * 10**9)
    assert t.split["communication"] == pytest.approx(2 * 7 / 8 * 25 * 2**20 / 100e9)


def test_a_cpu_datasheet_is_its_measured_peak_at_every_dtype():
    assert speed.cpu_datasheet(2500.0) == Datasheet(2.5, 2.5, 2.5, 20.0, 0.0, "none")
    assert speed.cpu_datasheet(500.0, 50.0) == Datasheet(0.5, 0.5, 0.5, 50.0, 0.0, "none")
    assert speed.datasheet("H200") is DATASHEETS["H200"]
    assert (
        speed.datasheet(None) is None and speed.datasheet("") is None and speed.datasheet("no card") is None
    )


def test_split_shares_are_percent_to_one_decimal():
    assert speed.split_shares({"matmul": 1.0, "attention": 2.0}) == {"matmul": 33.3, "attention": 66.7}
    assert speed.split_shares({"matmul": 0.0, "attention": 0.0}) == {"matmul": 0.0, "attention": 0.0}


def test_blocks_counts_every_kth_block_from_block_0():
    assert speed.blocks("DiT-XL/2", "none") == (28, 0)
    assert speed.blocks("DiT-XL/2", "full") == (28, 28)
    assert speed.blocks("DiT-XL/2", "every_3") == (28, 10)  # blocks 0, 3, ..., 27
    assert speed.blocks("DiT-T/2", "every_2") == (4, 2)


def test_the_shipped_calibration_is_the_files_content():
    data = json.loads(speed.SHIPPED.read_text())
    cal = speed.shipped()
    assert cal.to_dict() == {k: data.get(k, []) for k in ("params", "band_pct", "source", "cells", "loo")}
    assert cal.cells == data["cells"] > 0 and len(cal.loo) == cal.cells


def _cells(ratios, params=PARAMS, **kw):
    """Cells whose measured speed is `ratio` times what `params` predict (matmul rows of different sizes)."""
    out = []
    for i, r in enumerate(ratios):
        kernels = {("matmul", "bf16", False, 10**12 * (i + 1), 0, 10**6, 0): 1 + i}
        cell = speed.Cell(f"c{i}", kernels, 1, SHEET, "bf16", False, 1.0, **kw)
        out.append(
            speed.Cell(f"c{i}", kernels, 1, SHEET, "bf16", False, speed.predict(cell, params) * r, **kw)
        )
    return out


def test_predict_passes_every_field_of_the_cell():
    rows = {("elementwise", "fp32", True, 0, 0, 4000, 0): 100}
    cell = speed.Cell("x", rows, 1, SHEET, "fp32", True, 1.0, gpus=2, grad_bytes=10**9, overlap=False,
                      blocks=3, ckpt_blocks=2)  # fmt: skip
    # 25 fused launches of 2 us (of them 8 ns busy) + host 25 * 10 + 3 * 100 + 2 * 50 us; the all-reduce
    # 10 ms less the 50 us backward.
    seconds = 25 * 2e-6 + (25 * 10 + 300 + 100) * 1e-6 + (0.01 - 25 * 2e-6)
    assert speed.predict(cell, PARAMS) == pytest.approx(1 / seconds)


def test_predict_runs_the_cell_at_its_precision():
    # An fp32 matmul of 1e12 FLOPs at tf32 (100 TFLOPS) with efficiency 0.5: 20 ms.
    cell = speed.Cell("tf32", {("matmul", "fp32", False, 10**12, 0, 0, 0): 1}, 1, SHEET, "tf32", False, 1.0)
    assert speed.predict(cell, PARAMS) == pytest.approx(50.0)


def test_too_few_cells_fit_one_common_factor_and_three_give_a_leave_one_out_band():
    # Measured at 1, 2 and 4 times the prediction: the factor is their geometric mean, 2.
    cells = _cells([1.0, 2.0, 4.0])
    cal = speed.calibrate(cells, "three", start=PARAMS)
    assert cal.params == pytest.approx(speed.scaled(PARAMS, 2.0))
    assert (cal.source, cal.cells) == ("three", 3)
    # Each cell predicted by the other two: factors 2**1.5, 2**1 and 2**0.5.
    errors = [100 * (2**1.5 - 1), 0.0, 100 * (2**0.5 / 4 - 1)]
    assert [r["cell"] for r in cal.loo] == ["c0", "c1", "c2"]
    assert [r["error_pct"] for r in cal.loo] == pytest.approx(errors, abs=1e-9)
    assert [r["measured_steps_per_s"] for r in cal.loo] == [c.measured_steps_per_s for c in cells]
    assert [r["predicted_steps_per_s"] for r in cal.loo] == pytest.approx(
        [c.measured_steps_per_s * (1 + e / 100) for c, e in zip(cells, errors, strict=True)]
    )
    assert cal.band_pct == round(100 * (2**1.5 - 1), 1) == 182.8
    # Two cells: no band; with no start, the shipped defaults are scaled.
    defaults = {k: v[0] for k, v in speed.PARAMS.items()}
    two = speed.calibrate(_cells([2.0, 8.0], defaults), "two")
    assert two.band_pct is None and two.loo == []
    assert two.params == pytest.approx(speed.scaled(defaults, 4.0))
    with pytest.raises(UserError) as err:
        speed.calibrate([], "none")
    assert str(err.value) == "no measured cells to calibrate the speed model on"


def test_the_leave_one_out_fits_start_where_the_full_fit_does():
    # A launch-bound cell (50 tiny kernels: the host's 500 us) between two compute-bound ones: from the
    # start given, every cell scales with the common factor, so the errors are the factors' alone.
    cells = _cells([1.0, 2.0, 4.0])
    launch = {("elementwise", "bf16", False, 0, 0, 1000, 0): 50}
    measured = speed.predict(speed.Cell("c1", launch, 1, SHEET, "bf16", False, 1.0), PARAMS) * 2.0
    cells[1] = speed.Cell("c1", launch, 1, SHEET, "bf16", False, measured)
    cal = speed.calibrate(cells, "mixed", start=PARAMS)
    errors = [100 * (2**1.5 - 1), 0.0, 100 * (2**0.5 / 4 - 1)]
    assert [r["error_pct"] for r in cal.loo] == pytest.approx(errors, abs=1e-9)


def test_scaled_divides_every_time_and_keeps_the_fused_share():
    out = speed.scaled(PARAMS, 4.0)
    want = {"matmul_eff": 2.0, "attention_eff": 1.0, "memory_eff": 2.0, "host_us": 2.5, "kernel_us": 0.5}
    want.update({"block_us": 25.0, "checkpoint_us": 12.5, "fused_share": 0.25})
    assert out == want
    assert PARAMS["matmul_eff"] == 0.5  # the input is left alone


def test_the_fit_frees_only_the_parameters_some_cell_informs():
    # Six plain cells: six free parameters (no compiled cell, no checkpointed block) -> the common factor,
    # which scales checkpoint_us too.
    six = speed.fit(_cells([1.5] * 6), PARAMS)
    assert six == pytest.approx(speed.scaled(PARAMS, 1.5))
    # Seven: least squares over the six; checkpoint_us and fused_share keep their start, and the fit
    # reproduces every measured cell.
    cells = _cells([1.5] * 7)
    seven = speed.fit(cells, PARAMS)
    assert seven["checkpoint_us"] == PARAMS["checkpoint_us"] and seven["fused_share"] == PARAMS["fused_share"]
    for cell in cells:
        assert speed.predict(cell, seven) == pytest.approx(cell.measured_steps_per_s, rel=1e-3)
    # Seven checkpointed cells: seven free parameters, so the common factor again.
    ckpt = speed.fit(_cells([1.5] * 7, ckpt_blocks=1), PARAMS)
    assert ckpt == pytest.approx(speed.scaled(PARAMS, 1.5))


def test_a_fit_whose_start_already_matches_every_cell_keeps_the_start():
    # Seven cells measured exactly as the start predicts: the first start (the given one, unclipped
    # inside the bounds) has zero residuals, and no later start can beat it. host_us 0.6 sits within
    # one e-fold of its lower bound (0.5), matmul_eff 0.9 within one of its upper (1.0).
    start = {**PARAMS, "host_us": 0.6, "matmul_eff": 0.9}
    fitted = speed.fit(_cells([1.0] * 7, start), start)
    assert fitted == pytest.approx(start, rel=1e-9)


def test_the_fit_keeps_every_parameter_within_its_bounds():
    # Seven compute-bound cells measured 3x faster than a matmul efficiency of 0.5 allows would need
    # 1.5, past the bound of 1.0: the fit stops at the bound.
    fitted = speed.fit(_cells([3.0] * 7), PARAMS)
    assert fitted["matmul_eff"] == pytest.approx(1.0, rel=1e-6)
    for name, (_, low, high) in speed.PARAMS.items():
        assert low <= fitted[name] <= high, name


# ---- predict.py: budgets, the cache and the fill of a prediction ---------------------------------


def test_a_budget_from_each_kind_of_card_argument():
    h200 = find_card("H200")
    assert predict.budget("H200") == predict.Budget("H200", h200.usable_gib, 0.5, cuda_target("H200"))
    assert predict.budget(h200, 1.0) == predict.Budget("H200", h200.usable_gib, 1.0, cuda_target("H200"))
    assert predict.budget(12) == predict.Budget(None, 12.0, 0.5, cuda_target(None))
    assert predict.budget(None) == predict.Budget(None, None, 0.5, cuda_target(None))
    assert predict.budget("H200", 0, device="cpu") == predict.Budget(None, None, 0.0, CPU)
    # Capacity: what the allocator may reserve, the context taken off, never negative.
    assert predict.budget(2.5, 0.5).capacity == 2 * GiB
    assert predict.budget(0.25, 0.5).capacity == 0
    assert predict.budget(None).capacity is None
    for bad in (-0.1, math.nan, math.inf, True, "0.5"):
        with pytest.raises(UserError, match="the CUDA context must be a finite number of GiB >= 0"):
            predict.budget("H200", bad)
    with pytest.raises(UserError) as err:
        predict.budget("H200", -0.1)
    assert str(err.value) == "the CUDA context must be a finite number of GiB >= 0, got -0.1"
    with pytest.raises(UserError) as err:
        predict.budget(-1)
    assert str(err.value) == "the card memory must be a finite number of GiB greater than 0, got -1."


def test_fits_follows_the_status():
    pred = predict.Prediction("DiT-T/2", "fp32", "none", 1, "cuda", None, None, "fits")
    assert pred.fits is True and pred.to_dict()["fits"] is True
    pred.status = "oom"
    assert pred.fits is False and pred.to_dict()["fits"] is False
    for status in ("predicted", "unsupported", "error", "ok"):
        pred.status = status
        assert pred.fits is None


def test_normalize_validates_the_knobs_and_the_device():
    cell = predict.normalize({"model": "DiT-T/2", "steps": 10})
    assert cell["device"] == "cuda" and cell["model"] == "DiT-T/2" and "steps" not in cell
    assert predict.normalize({"model": "DiT-T/2", "device": "cpu"})["device"] == "cpu"
    with pytest.raises(UserError, match="device must be cuda or cpu to plan a cell, got 'tpu'"):
        predict.normalize({"model": "DiT-T/2", "device": "tpu"})
    with pytest.raises(UserError) as err:
        predict.normalize(["DiT-T/2"])
    assert str(err.value) == "a cell config must be a mapping of knobs, got ['DiT-T/2']"


def test_the_traced_knobs_leave_the_untraced_at_their_defaults():
    cell = predict.normalize({"model": "DiT-T/2", "batch_size": 8, "lr": 0.5, "seed": 3, "precision": "bf16",
                              "optimizer_impl": "auto", "grad_ckpt": "every_2"})  # fmt: skip
    knobs = predict.trace_knobs(cell, CPU)
    assert knobs == Knobs(model="DiT-T/2", precision="bf16", grad_ckpt="every_2", optimizer_impl="fused")
    assert predict.trace_knobs({**cell, "optimizer_impl": "foreach"}, CPU).optimizer_impl == "foreach"


def test_a_trace_key_shares_policies_that_allocate_alike():
    gpu = cuda_target(None)
    key = {p: predict.trace_key(Knobs(model="DiT-T/2", precision=p), gpu) for p in ("fp32", "tf32", "bf16")}
    assert key["fp32"] == key["tf32"] != key["bf16"]
    assert key["fp32"][0] == (("model", "DiT-T/2"),) and key["fp32"][-1] == "cuda"
    assert predict.trace_key(Knobs(model="DiT-T/2"), CPU)[-1] == "cpu"
    with pytest.raises(UnsupportedError):
        predict.trace_key(Knobs(model="DiT-T/2", precision="fp16"), CPU)


def test_series_traces_are_kept_for_the_64_last_used(monkeypatch):
    traced = []
    monkeypatch.setattr(predict, "_CACHE", OrderedDict())
    monkeypatch.setattr(predict, "trace_key", lambda knobs, target: knobs)
    monkeypatch.setattr(
        predict, "trace_series", lambda knobs, target: traced.append(knobs) or f"s{knobs} {target}"
    )
    for k in range(64):
        assert predict.series_trace(k, CPU) == f"s{k} {CPU}"
    assert predict.series_trace(0, CPU) == f"s0 {CPU}" and traced == list(
        range(64)
    )  # from memory; 0 now newest
    predict.series_trace(64, CPU)  # evicts 1, the least recently used
    assert list(predict._CACHE) == [*range(2, 64), 0, 64]
    predict.series_trace(1, CPU)
    assert traced == [*range(65), 1]


def test_series_traces_go_through_the_disk_cache_when_asked(monkeypatch):
    from ditbench.plan import cache

    saved = []
    monkeypatch.setattr(predict, "_CACHE", OrderedDict())
    monkeypatch.setattr(predict, "trace_key", lambda knobs, target: knobs)
    monkeypatch.setattr(predict, "trace_series", lambda knobs, target: f"traced {knobs}")
    monkeypatch.setattr(cache, "key", lambda key: f"name {key}")
    monkeypatch.setattr(cache, "shipped", lambda key: "shipped" if key == "s" else None)
    monkeypatch.setattr(cache, "load", lambda name: "from disk" if name == "name a" else None)
    monkeypatch.setattr(cache, "save", lambda name, series: saved.append((name, series)))
    assert predict.series_trace("a", CPU, disk=True) == "from disk" and saved == []
    assert predict.series_trace("b", CPU, disk=True) == "traced b"
    assert saved == [("name b", "traced b")]
    assert predict.series_trace("c", CPU) == "traced c" and len(saved) == 1
    assert predict.series_trace("s", CPU, disk=True) == "shipped" and len(saved) == 1
    assert predict.series_trace("s2", CPU) == "traced s2"  # neither shipped nor disk traces without disk


# A hand-made trace: weights of 1000 B (a 512-granular 1024 B block in a 2 MiB small segment), a 30 MiB
# build-time temporary (its own 30 MiB segment, cached once freed), then in step 2 an activation of
# 256 MiB per sample and, on a GPU, a modeled cuBLAS workspace (8 MiB + 128 KiB before sm90, 32 MiB on
# sm90: the first fits in the cached 30 MiB block, the second needs a segment of its own).
def _series(target):
    gpu = target.device == "cuda"
    trace = Trace(
        target=target, batch_size=4099, sizes=[1000, 30 * MiB, 4099 * 256 * MiB, 0],
        events=[1, 2, -2, 3, 4, -4, -3], labels={0: "weights", 3: "workspace"},
        modeled={3: ("cublas",)} if gpu else {},
        marks={"build": 0, "step1": 3, "step2": 3, "end": 7}, notes=["a note"], params=10**6,
        kernels={("matmul", "bf16", False, 0, 10**12, 0, 0): 1},
    )  # fmt: skip
    return SeriesTrace(trace, 4099, [1000, 30 * MiB, 0, 0], [0, 0, 256 * MiB, 0])


CELL = {"model": "DiT-XL/2", "precision": "bf16", "batch_size": 4}
GPU = cuda_target(None)


@pytest.fixture
def planted(monkeypatch):
    """predict_budgets with the hand-made trace in place of a traced one."""
    monkeypatch.setattr(predict, "_CACHE", OrderedDict())
    for target in (cuda_target(None), CPU):
        knobs = predict.trace_knobs(predict.normalize({**CELL, "device": target.device}), target)
        predict._CACHE[predict.trace_key(knobs, target)] = _series(target)


def _one(gib, context=0.5, batch_size=4, **kw):
    return predict.predict_budgets(CELL, [batch_size], [predict.budget(gib, context)], **kw)[0][0]


def test_a_cell_that_fits_without_the_limit(planted):
    # Unlimited replay: 2 MiB + 30 MiB + 1 GiB reserved (the workspace takes the cached 30 MiB block);
    # at the peak (the workspace's malloc, event 4) 1024 B + 1 GiB + 8.125 MiB allocated.
    pred = _one(2.0)
    ws = 8 * MiB + 128 * 1024
    assert (pred.status, pred.fits, pred.reason) == ("fits", True, None)
    assert pred.peak_allocated_gib == (1024 + GiB + ws) / GiB
    assert pred.peak_reserved_gib == (32 * MiB + GiB) / GiB
    assert pred.device_gib == pred.peak_reserved_gib + 0.5
    assert pred.components == {"weights": 1024 / GiB, "gradients": 0.0, "optimizer": 0.0, "ema": 0.0,
                               "vae": 0.0, "activations": 1.0, "workspace": ws / GiB, "buffers": 0.0,
                               "context": 0.5}  # fmt: skip
    assert (pred.model, pred.precision, pred.grad_ckpt, pred.batch_size) == ("DiT-XL/2", "bf16", "none", 4)
    assert (pred.device, pred.card, pred.memory_gib, pred.notes) == ("cuda", None, 2.0, ["a note"])
    assert pred.config["batch_size"] == 4 and pred.config["device"] == "cuda"
    # No card: predicted, not fitted; no datasheet, so no speed.
    pred = _one(None)
    assert (pred.status, pred.fits, pred.peak_allocated_gib) == ("predicted", None, (1024 + GiB + ws) / GiB)
    assert pred.predicted_steps_per_s is None and pred.time_to_target is None


def test_a_cell_that_fits_only_once_the_cached_segment_is_released(planted):
    # Capacity 2 MiB + 1 GiB + 20 MiB: the 1 GiB segment needs the cached 30 MiB one released, and the
    # workspace then gets a new 20 MiB segment (a large request under 10 MiB).
    ws = 8 * MiB + 128 * 1024
    pred = _one(0.5 + (22 * MiB + GiB) / GiB)
    assert pred.status == "fits"
    assert pred.peak_reserved_gib == (22 * MiB + GiB) / GiB  # the limited replay's figures
    assert pred.peak_allocated_gib == (1024 + GiB + ws) / GiB


@pytest.mark.parametrize("gib", [0.5 + (GiB + 16 * MiB) / GiB, 1.0])
def test_a_cell_that_does_not_fit(planted, gib):
    # Short of the workspace's 20 MiB segment even after the release; or under the allocated peak itself.
    pred = _one(gib)
    assert (pred.status, pred.fits) == ("oom", False)
    assert pred.reason == (
        "needs 1.01 GiB allocated (1.03 reserved) + 0.5 GiB context; the card has " + f"{gib:.2f} GiB"
    )
    assert pred.peak_reserved_gib == (32 * MiB + GiB) / GiB  # the unlimited replay


def test_predict_cell_and_series_pass_the_card_and_the_context(planted):
    ws = 8 * MiB + 128 * 1024
    pred = predict.predict_cell(CELL, 3.0, context_gib=1.0)
    assert (pred.status, pred.memory_gib, pred.batch_size) == ("fits", 3.0, 4)
    assert predict.predict_cell(CELL, 2.0, context_gib=1.0).status == "oom"  # 1 GiB left for the allocator
    assert pred.device_gib == (32 * MiB + GiB) / GiB + 1.0 and pred.components["context"] == 1.0
    assert predict.predict_cell(CELL, 1.0).status == "oom"
    assert predict.predict_cell(CELL).status == "predicted"
    # Each batch size is its own replay: 512 MiB of activation at batch 2, 1 GiB at batch 4.
    two, four = predict.predict_series(CELL, [2, 4], 2.0, context_gib=0.25)
    assert (two.batch_size, two.config["batch_size"], four.config["batch_size"]) == (2, 2, 4)
    assert (
        two.peak_allocated_gib == (1024 + 512 * MiB + ws) / GiB
        and two.device_gib == (32 * MiB + 512 * MiB) / GiB + 0.25
    )
    assert four.peak_allocated_gib == (1024 + GiB + ws) / GiB


def test_a_peak_that_fills_the_card_exactly_fits_once_the_cache_is_released(monkeypatch):
    # A 30 MiB temporary, then 12 MiB per sample: exact 2 MiB multiples, so segments are the requests.
    # At batch 4 the 48 MiB allocated peak equals the capacity; the unlimited run reserved 78 MiB.
    trace = Trace(target=cuda_target(None), batch_size=4099, events=[1, -1, 2, -2],
                  marks={"build": 0, "step1": 2, "step2": 2, "end": 4})  # fmt: skip
    series = SeriesTrace(trace, 4099, [30 * MiB, 0], [0, 12 * MiB])
    monkeypatch.setattr(predict, "_CACHE", OrderedDict())
    monkeypatch.setattr(predict, "series_trace", lambda knobs, target, disk=False: series)
    pred = _one(0.5 + 48 / 1024)
    assert (pred.status, pred.peak_allocated_gib, pred.peak_reserved_gib) == ("fits", 48 / 1024, 48 / 1024)
    assert _one(0.5 + 47 / 1024).status == "oom"


def test_a_cpu_cell_is_the_peak_of_requested_bytes(planted):
    cell = {**CELL, "device": "cpu"}
    [[pred]] = predict.predict_budgets(cell, [2], [predict.budget(None, device="cpu")])
    # No rounding, no workspace on a CPU: 1000 B + 512 MiB at the activation's malloc.
    assert (pred.status, pred.device, pred.card) == ("predicted", "cpu", None)
    assert pred.peak_allocated_gib == (1000 + 512 * MiB) / GiB
    assert pred.components["weights"] == 1000 / GiB and pred.components["activations"] == 0.5
    assert pred.peak_reserved_gib is None and pred.predicted_steps_per_s is None
    # predict_cell plans a CPU cell for the CPU, whatever card is named.
    pred = predict.predict_cell(cell, "H200")
    assert (pred.device, pred.card, pred.peak_allocated_gib) == ("cpu", None, (1000 + GiB) / GiB)


def test_a_card_with_a_datasheet_gets_the_time_model(planted):
    # H200 (bf16 at its measured 780.5 TFLOPS): 4e12 FLOPs at 0.5 of it = 10.25 ms; the host's 1 kernel and
    # 28 blocks (DiT-XL/2) take 10 + 28 * 100 us = 2.81 ms, hidden. The workspace is 32 MiB on sm90.
    cal = speed.Calibration(PARAMS, 12.5, "test")
    options = predict.SpeedOptions(calibration=cal, gpus=2, target_steps=1000)
    pred = predict.predict_budgets(CELL, [4], [predict.budget("H200")], speed=options)[0][0]
    seconds = 4e12 / (0.5 * 780.5e12)
    seconds += 2 * (2 - 1) / 2 * 4 * 10**6 / 450e9  # the all-reduce of 4 MB of fp32 gradients over 2 GPUs
    assert pred.status == "fits" and pred.components["workspace"] == 32 * MiB / GiB
    assert pred.predicted_steps_per_s == pytest.approx(1 / seconds)
    assert pred.predicted_images_per_s == pytest.approx(4 * 2 / seconds)
    assert (pred.predicted_speed_band_pct, pred.gpus) == (12.5, 2)
    assert pred.time_to_target == pytest.approx({"steps": 1000, "days": 1000 * seconds / 86400,
                                                 "gpu_hours": 1000 * seconds * 2 / 3600})  # fmt: skip
    assert pred.step_split_pct["matmul"] == pytest.approx(100 * 4e12 / (0.5 * 780.5e12) / seconds, abs=0.05)
    # A target in images wins: 10,000 images at 4 a step on one GPU (the default) = 2,500 steps.
    options = predict.SpeedOptions(calibration=cal, target_images=10_000)
    pred = predict.predict_budgets(CELL, [4], [predict.budget("H200")], speed=options)[0][0]
    assert pred.time_to_target["steps"] == 2500 and pred.gpus == 1
    pred = predict.predict_budgets(CELL, [4], [predict.budget("H200")])[0][0]
    assert pred.predicted_speed_band_pct == speed.shipped().band_pct
    assert pred.time_to_target["steps"] == 400_000


def test_the_time_model_sees_the_cells_checkpointed_blocks_and_compile():
    # Launch bound: 8 elementwise kernels of 2 us on the device; the host issues each in 10 us, and
    # spends 100 us per block and 50 us per checkpointed block (DiT-XL/2: 28 blocks, all checkpointed).
    series = _series(cuda_target("H200"))
    series.trace.kernels = {("elementwise", "bf16", False, 0, 0, 1000, 0): 8}
    options = predict.SpeedOptions(calibration=speed.Calibration(PARAMS, None, "test"))
    pred = predict.Prediction("DiT-XL/2", "bf16", "full", 4, "cuda", "H200", 139.8, "fits", config={})
    predict.fill_speed(pred, series, options)
    assert pred.predicted_steps_per_s == pytest.approx(1 / ((8 * 10 + 28 * 100 + 28 * 50) * 1e-6))
    # Compiled: 8 * 0.25 = 2 launches left.
    pred = predict.Prediction(
        "DiT-XL/2", "bf16", "none", 4, "cuda", "H200", 139.8, "fits", config={"compile": True}
    )
    predict.fill_speed(pred, series, options)
    assert pred.predicted_steps_per_s == pytest.approx(1 / ((2 * 10 + 28 * 100) * 1e-6))
    # No datasheet, or not a GPU: no speed.
    for card, device in (("no card", "cuda"), ("H200", "cpu")):
        pred = predict.Prediction("DiT-XL/2", "bf16", "none", 4, device, card, None, "fits")
        predict.fill_speed(pred, series, options)
        assert pred.predicted_steps_per_s is None and pred.time_to_target is None


def test_components_add_up_what_each_label_holds():
    series = _series(CPU)
    comp = predict._components(series.trace, {0: GiB, 1: GiB // 2, 2: GiB // 4, 3: 3 * GiB})
    assert comp == {"weights": 1.0, "gradients": 0.0, "optimizer": 0.0, "ema": 0.0, "vae": 0.0,
                    "activations": 0.75, "workspace": 3.0, "buffers": 0.0}  # fmt: skip


def test_the_time_model_gets_the_cells_precision():
    # An fp32 matmul runs at the tf32 rate (405.5 TFLOPS measured on an H200) when the cell's precision
    # is tf32.
    series = _series(cuda_target("H200"))
    series.trace.kernels = {("matmul", "fp32", False, 10**13, 0, 0, 0): 1}
    options = predict.SpeedOptions(calibration=speed.Calibration(PARAMS, None, "test"))
    pred = predict.Prediction("DiT-T/2", "tf32", "none", 4, "cuda", "H200", 139.8, "fits", config={})
    predict.fill_speed(pred, series, options)
    assert pred.predicted_steps_per_s == pytest.approx(0.5 * 405.5e12 / 10**13)


def test_a_card_that_cannot_run_the_policy_is_unsupported_for_that_card_only(planted):
    preds = predict.predict_budgets(CELL, [4], [predict.budget("V100-32GB"), predict.budget("H200")])
    v100, h200 = preds[0][0], preds[1][0]
    assert v100.status == "unsupported" and "bf16" in v100.reason and v100.peak_allocated_gib is None
    assert v100.notes == [] and v100.predicted_steps_per_s is None
    assert h200.status == "fits" and h200.notes == ["a note"]


def test_cells_the_planner_does_not_trace(monkeypatch):
    def boom(knobs, target, disk=False):
        raise RuntimeError("no storage")

    monkeypatch.setattr(predict, "series_trace", boom)
    [[pred]] = predict.predict_budgets(CELL, [4], [predict.budget(24)])
    assert (pred.status, pred.reason) == (
        "error",
        "the planner could not trace this cell: RuntimeError: no storage",
    )
    assert pred.peak_allocated_gib is None and pred.notes == []
    for gpus, nodes in ((2, 1), (1, 2)):  # a rank of several is traced as one GPU
        [[pred]] = predict.predict_budgets({**CELL, "gpus": gpus, "nodes": nodes}, [4], [predict.budget(24)])
        assert pred.status == "error" and pred.reason.endswith("RuntimeError: no storage")

    def unsupported(knobs, target, disk=False):
        raise UnsupportedError(message)

    monkeypatch.setattr(predict, "series_trace", unsupported)
    message = "not on this target"
    [[pred]] = predict.predict_budgets(CELL, [4], [predict.budget(24)])
    assert (pred.status, pred.reason) == ("unsupported", "not on this target")
    # A reason is kept to 400 characters.
    message = "x" * 400
    assert predict.predict_budgets(CELL, [4], [predict.budget(24)])[0][0].reason == message
    message = "x" * 401
    assert (
        predict.predict_budgets(CELL, [4], [predict.budget(24)])[0][0].reason
        == "x" * 399 + "… (401 characters)"
    )

    def refused(knobs, target, disk=False):
        raise UserError("bad cell")

    monkeypatch.setattr(predict, "series_trace", refused)
    with pytest.raises(UserError, match="bad cell"):
        predict.predict_budgets(CELL, [4], [predict.budget(24)])
    with pytest.raises(UserError, match="batch_size"):
        predict.predict_budgets(CELL, [0], [predict.budget(24)])


def test_what_the_planner_refuses_to_trace_it_says_why(planted):
    cell = {**CELL, "gpus": 8, "strategy": "fsdp", "impl": "diffusers"}
    [[pred]] = predict.predict_budgets(cell, [4], [predict.budget(24)])
    assert pred.reason == (
        "strategy fsdp shards ditbench's DiT block by block; the diffusers DiT has no such blocks"
    )
    # An image folder's cell is traced with the VAE in the loop: a key of its own, whatever the folder.
    keys = {predict.trace_key(predict.trace_knobs(predict.normalize({**CELL, "data": d}), GPU), GPU)
            for d in ({"images": "a/"}, {"images": "b/", "vae": "ema"}, "synthetic")}  # fmt: skip
    assert len(keys) == 2
    # A latent file's batch reaches the device as synthetic data does: traced.
    [[pred]] = predict.predict_budgets({**CELL, "data": {"latents": "x.npz"}}, [4], [predict.budget(24)])
    assert (pred.status, pred.reason) == ("fits", None)


def test_the_cpu_target_traces_a_cpu_budget(monkeypatch):
    seen = []

    def record(knobs, target, disk=False):
        seen.append((target, disk))
        raise UnsupportedError("recorded")

    monkeypatch.setattr(predict, "series_trace", record)
    predict.predict_budgets({**CELL, "precision": "fp32"}, [4], [predict.budget(None, device="cpu")])
    predict.predict_budgets(CELL, [4], [predict.budget("V100-32GB")], disk_cache=True)
    assert seen == [(CPU, False), (cuda_target(None), True)]  # a GPU cell is traced on the generic sm80


# ---- trace.py: one trace per series -------------------------------------------------------------


def test_the_probe_batch_is_the_first_prime_above_every_fixed_dimension():
    assert probe_batch(Knobs(model="DiT-T/2")) == 4099
    assert probe_batch(Knobs(model="DiT-T/2", num_classes=4200)) == 4211  # 4202 -> the next prime
    assert probe_batch(Knobs(model="DiT-T/2", num_classes=4109)) == 4111  # classes + 2 is prime
    # Above the image side: 4129 is prime, one above 4128; above 8192 the first prime is 8209.
    assert probe_batch(Knobs(model="DiT-T/2", image_size=4128)) == 4129
    assert probe_batch(Knobs(model="DiT-T/2", image_size=8192)) == 8209
    assert [n for n in range(-2, 30) if _is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]
    assert not _is_prime(9) and not _is_prime(4097) and _is_prime(4099)


def test_sizes_scale_the_per_sample_part_and_model_the_workspaces():
    series = _series(cuda_target(None))
    assert series.sizes(2) == [1000, 30 * MiB, 512 * MiB, 8 * MiB + 128 * 1024]
    assert series.sizes(2, cuda_target("H200"))[3] == 32 * MiB
    # Attention's backward scratch grows with the batch: q of (B, 2 heads, 100 tokens, 64): flash on
    # sm80 (bf16) 4 B * (128 * 2 * 64 + 2 * 128) per sample; memory-efficient (fp32) 4 B * 2 * 100.
    series.trace.modeled = {
        0: ("attention", None, 2, 100, 64, True),
        1: ("attention", None, 2, 100, 64, False),
    }
    assert series.sizes(3)[:2] == [3 * 4 * (128 * 2 * 64 + 2 * 128), 3 * 4 * 2 * 100]


def test_trace_series_splits_each_size_by_the_probe(monkeypatch):
    made = []

    def fake(knobs, target, probe):
        made.append((knobs.model, target, probe))
        return Trace(target=target, batch_size=probe, sizes=[1000, probe * 6, 4099 * 4099, 0])

    monkeypatch.setattr("ditbench.plan.trace.trace_training", fake)
    series = trace_series(Knobs(model="DiT-T/2"), CPU)
    assert made == [("DiT-T/2", CPU, 4099)] and series.probe == 4099
    assert (series.const, series.per_sample) == ([1000, 0, 0, 0], [0, 6, 4099, 0])
    assert all(type(n) is int for n in series.per_sample + series.sizes(3))  # bytes stay whole numbers


# ---- allocator.py: the caching allocator's arithmetic -------------------------------------------


def test_rounding_and_segments_at_their_edges():
    assert [allocator.round_size(n) for n in (0, 1, 511, 512, 513, 1024)] == [512, 512, 512, 512, 1024, 1024]
    assert allocator.segment_size(MiB) == 2 * MiB and allocator.segment_size(MiB + 512) == 20 * MiB
    assert allocator.segment_size(10 * MiB - 512) == 20 * MiB and allocator.segment_size(10 * MiB) == 10 * MiB
    assert allocator.segment_size(10 * MiB + 512) == 12 * MiB


# ---- measured.py: calibration cells from the user's records ----------------------------------


FAILED = ("oom", "timeout", "nan_loss", "error", "skipped", "unsupported")


def _record(status="ok", steps=2.5, gpu="NVIDIA H200", metrics=None, **config):
    """A record (records.model.Record) of a cell run on `gpu` at `steps` steps/s."""
    from synthetic_records import make_record

    from ditbench.records.model import Record

    raw = make_record(status=status, **{"model": "DiT-XL/2", "precision": "bf16", "batch_size": 4, **config})
    raw.update(metrics={"steps_per_s": steps} if metrics is None else metrics, env={"gpu_name": gpu})
    return Record.model_validate(raw)


def test_the_card_of_a_record_is_the_emulated_runs_real_gpu_else_the_envs():
    assert measured._card(_record()) == "H200"
    assert measured._card(_record(gpu="A100-SXM4-80GB")) == "A100-80GB"
    emulated = _record(gpu="RTX 4090", metrics={"emulation": {"real_gpu": "H200"}})
    assert measured._card(emulated) == "H200"
    no_real = _record(gpu="RTX 4090", metrics={"emulation": {"real_gpu": None}})
    assert measured._card(no_real) == "RTX 4090"
    assert measured._card(_record(gpu="RTX 4090", metrics={"emulation": None})) == "RTX 4090"
    for record in (_record(gpu="a CPU"), _record(gpu=None), _record(gpu=None, metrics={})):
        assert measured._card(record) is None


def test_calibration_cells_are_the_measured_gpu_records(monkeypatch):
    traced = []

    def fake(knobs, target, disk=False):
        traced.append((knobs.model, knobs.grad_ckpt, knobs.compile, target, disk))
        if knobs.model == "DiT-S/2":
            raise RuntimeError("no storage")
        return SeriesTrace(Trace(target, 4099, params=10**6, kernels={"row": 1}), 4099, [], [])

    monkeypatch.setattr(predict, "series_trace", fake)
    records = [
        _record(grad_ckpt="every_2", gpus=2, compile=True),
        _record(status="oom"),
        _record(steps=None),
        _record(steps=0),
        _record(steps=-1.0),
        _record(gpu="a CPU"),
        _record(model="DiT-S/2"),
        _record(metrics={}),
    ]
    cells, skipped = measured.cells_from_records(records)
    assert skipped == [
        "record 2: status 'oom'",
        "record 3: no measured steps_per_s",
        "record 4: no measured steps_per_s",
        "record 5: no measured steps_per_s",
        "record 6: not run on a GPU of the card table",
        "record 7: not traceable (RuntimeError: no storage)",
        "record 8: no measured steps_per_s",
    ]
    # Traced as one GPU on the generic sm80 target, through the disk cache; the GPUs go to the cell.
    assert traced == [("DiT-XL/2", "every_2", True, cuda_target(None), True),
                      ("DiT-S/2", "none", False, cuda_target(None), True)]  # fmt: skip
    assert cells == [
        speed.Cell("DiT-XL/2 bf16 ckpt=every_2 b4 H200", {"row": 1}, 4, DATASHEETS["H200"], "bf16", True, 2.5,
                   gpus=2, grad_bytes=4 * 10**6, blocks=28, ckpt_blocks=14)
    ]  # fmt: skip
    assert isinstance(cells[0].measured_steps_per_s, float)
    # Under one step a second (a large model) is a measured speed too.
    cells, skipped = measured.cells_from_records([_record(steps=0.5)])
    assert [c.measured_steps_per_s for c in cells] == [0.5] and skipped == []
    # GPUs per node times nodes: 8 data-parallel GPUs.
    cells, skipped = measured.cells_from_records([_record(gpus=4, nodes=2)])
    assert [c.gpus for c in cells] == [8] and skipped == []


def test_a_calibration_from_records_or_why_none_can_calibrate(monkeypatch, tmp_path):
    rows = {("matmul", "bf16", False, 0, 10**12, 0, 0): 1}
    monkeypatch.setattr(
        predict,
        "series_trace",
        lambda k, t, disk=False: SeriesTrace(Trace(t, 4099, kernels=rows), 1, [], []),
    )
    path = tmp_path / "results.jsonl"
    with pytest.raises(UserError) as err:
        measured.from_records(path, [_record(status=FAILED[i % 6]) for i in range(7)])
    assert str(err.value) == (
        f"--calibrate {path}: no record can calibrate the speed model (record 1: status 'oom'; record 2: "
        "status 'timeout'; record 3: status 'nan_loss'; record 4: status 'error'; record 5: status "
        "'skipped'; and 2 more). A "
        "calibration cell is a record with status ok, a measured steps_per_s, run on a GPU of the card "
        "table (`ditbench plan --help` lists where the cards are)."
    )
    with pytest.raises(UserError, match=r"\(record 1: status 'oom'\)\. A calibration"):
        measured.from_records(path, [_record(status="oom")])
    # Five reasons are listed whole; a sixth is counted.
    with pytest.raises(UserError, match=r"record 5: status 'skipped'\)\. A calibration"):
        measured.from_records(path, [_record(status=FAILED[i]) for i in range(5)])
    with pytest.raises(UserError, match=r"record 5: status 'skipped'; and 1 more\)\. A calibration"):
        measured.from_records(path, [_record(status=FAILED[i]) for i in range(6)])
    # One cell: the shipped parameters scaled by one common factor to its measured speed.
    cal = measured.from_records(path, [_record(steps=2.5)])
    shipped = speed.shipped().params
    cell = speed.Cell("c", rows, 4, DATASHEETS["H200"], "bf16", False, 2.5, blocks=28)
    factor = 2.5 / speed.predict(cell, shipped)
    assert (cal.source, cal.cells, cal.band_pct) == (f"{path} (1 measured cells)", 1, None)
    assert cal.params == pytest.approx(speed.scaled(shipped, factor))


# ---- grid.py: series, their grouping and the order they are traced in -----------------------------


class _SuiteCell:
    def __init__(self, **config):
        self.config = config


def test_a_grid_is_model_by_precision_by_checkpointing_over_sorted_batches():
    series = grid.grid(
        ["DiT-S/2", "DiT-B/2"], ["bf16", "fp32"], ["none", "full"], [32, 8, 32, 16], {"lr": 0.5}
    )
    assert [(s.config["model"], s.config["precision"], s.config["grad_ckpt"]) for s in series] == [
        (m, p, c) for m in ("DiT-S/2", "DiT-B/2") for p in ("bf16", "fp32") for c in ("none", "full")
    ]
    assert all(s.batch_sizes == [8, 16, 32] for s in series)
    assert series[0].config["lr"] == 0.5 and series[0].config["device"] == "cuda"
    assert grid.grid(["DiT-S/2"], ["fp32"], ["none"], [8])[0].config["lr"] == 0.0001  # no base: the defaults
    assert grid.paper_models()[:2] == ["DiT-XL/2", "DiT-XL/4"] and len(grid.paper_models()) == 12


def test_a_suites_cells_group_into_series_by_all_but_the_batch():
    cells = [
        _SuiteCell(model="DiT-S/2", batch_size=32),
        _SuiteCell(model="DiT-S/2", batch_size=8),
        _SuiteCell(model="DiT-S/2", batch_size=32, seed=0),  # the same cell again: the default seed
        _SuiteCell(model="DiT-S/2", batch_size=16, precision="bf16"),
    ]
    series = grid.suite_grid(cells)
    assert [(s.config["precision"], s.batch_sizes) for s in series] == [("fp32", [32, 8]), ("bf16", [16])]
    assert series[0].config["device"] == "cuda"
    assert [s.config["device"] for s in grid.suite_grid(cells, "cpu")] == ["cpu", "cpu"]
    assert cells[0].config == {"model": "DiT-S/2", "batch_size": 32}  # the suite's cells are left alone


def _budgets(device="cuda"):
    return [predict.budget(None, device=device)]


def test_series_that_share_a_trace_are_grouped_and_the_costliest_goes_first():
    series = grid.grid(["DiT-S/2"], ["fp32"], ["none"], [8])
    series += grid.grid(["DiT-XL/2"], ["fp32", "tf32", "bf16"], ["none"], [8])
    series += grid.grid(["DiT-XL/2"], ["tf32"], ["none"], [8, 16])  # other batch sizes: its own group
    series += grid.grid(["DiT-B/2"], ["fp32"], ["none"], [8])
    # DiT-XL/2 costs 28 * 1152, DiT-B/2 12 * 768, DiT-S/2 12 * 384; fp32 and tf32 share a trace on a GPU.
    assert grid._cost([series[1]]) == 28 * 1152
    assert grid._groups(series, _budgets()) == [[1, 2], [3], [4], [5], [0]]
    # On a CPU fp16 cannot run: such a series is a group of its own, never merged with another.
    cpu = grid.grid(["DiT-S/2"], ["fp16", "fp16", "fp32"], ["none"], [8])
    assert grid._groups(cpu, _budgets("cpu")) == [[0], [1], [2]]


def test_the_other_series_of_a_group_are_copies_renamed_and_respeeded(monkeypatch):
    calls, respeeded = [], []

    def fake(config, batch_sizes, budgets, disk_cache, speed):
        calls.append((config["precision"], batch_sizes, disk_cache, speed))
        return [[predict.Prediction(config["model"], config["precision"], "none", b, "cuda", None, None,
                                    "fits", config=dict(config), predicted_steps_per_s=s)
                 for b, s in zip(batch_sizes, (2.0, None), strict=False)]]  # fmt: skip

    monkeypatch.setattr(grid, "predict_budgets", fake)
    monkeypatch.setattr(
        grid, "_respeed", lambda p, target, disk, speed: respeeded.append((p, target, disk, speed))
    )
    series = grid.grid(["DiT-S/2"], ["fp32", "tf32"], ["none"], [8, 16])
    out = grid._work(series, _budgets(), True, "opts")
    assert calls == [("fp32", [8, 16], True, "opts")]
    first, second = out
    assert [p.precision for p in first[0]] == ["fp32", "fp32"] and [p.precision for p in second[0]] == [
        "tf32"
    ] * 2
    assert [p.config["precision"] for p in second[0]] == ["tf32", "tf32"]
    assert [p.config["batch_size"] for p in second[0]] == [8, 16]
    assert first[0][0].config["precision"] == "fp32"  # a copy, not the first series' prediction
    # Only a prediction with a speed is respeeded, on the budgets' target, with the options given.
    assert [(p.batch_size, t, d, s) for p, t, d, s in respeeded] == [(8, cuda_target(None), True, "opts")]
    respeeded.clear()
    grid._work(series, _budgets(), False)
    assert respeeded[0][2:] == (False, predict.SpeedOptions())


def test_respeed_predicts_the_renamed_cells_speed_from_its_own_trace(monkeypatch):
    seen = []
    monkeypatch.setattr(
        predict, "series_trace", lambda knobs, target, disk=False: (knobs.precision, target, disk)
    )
    monkeypatch.setattr(predict, "fill_speed", lambda p, series, options: seen.append((p, series, options)))
    config = predict.normalize({"model": "DiT-S/2", "precision": "tf32"})
    pred = predict.Prediction("DiT-S/2", "tf32", "none", 8, "cuda", None, None, "fits", config=config)
    grid._respeed(pred, cuda_target("H200"), True, "opts")
    grid._respeed(pred, CPU, False, "opts")
    assert seen == [(pred, ("tf32", cuda_target(None), True), "opts"), (pred, ("tf32", CPU, False), "opts")]


def test_evaluate_returns_every_series_in_its_place_and_reports_progress(monkeypatch):
    def fake(config, batch_sizes, budgets, disk, speed):
        return [
            [predict.Prediction(config["model"], config["precision"], "none", 8, "cuda", None, None, "fits")]
        ]

    import concurrent.futures

    monkeypatch.setattr(grid, "predict_budgets", fake)
    # Two groups are traced in this process: a worker pool here would fail at once instead of tracing.
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", None)
    series = grid.grid(["DiT-S/2", "DiT-XL/2"], ["fp32", "tf32"], ["none"], [8])
    progress = []
    out = grid.evaluate(
        series, _budgets(), jobs=4, progress=lambda d, n, s: progress.append((d, n, s.config["model"]))
    )
    assert [(r[0][0].model, r[0][0].precision) for r in out] == [
        ("DiT-S/2", "fp32"), ("DiT-S/2", "tf32"), ("DiT-XL/2", "fp32"), ("DiT-XL/2", "tf32")
    ]  # fmt: skip
    # Two groups (fp32 and tf32 share a trace): in this process, the costliest first.
    assert progress == [(1, 4, "DiT-XL/2"), (2, 4, "DiT-XL/2"), (3, 4, "DiT-S/2"), (4, 4, "DiT-S/2")]
    assert 1 <= grid.default_jobs() <= 2


def test_largest_batches_keeps_the_largest_that_fits_per_setting():
    def pred(model, batch, status):
        return predict.Prediction(model, "fp32", "none", batch, "cuda", None, None, status)

    preds = [pred("DiT-S/2", 8, "fits"), pred("DiT-S/2", 32, "fits"), pred("DiT-S/2", 16, "fits"),
             pred("DiT-S/2", 64, "oom"), pred("DiT-B/2", 8, "oom")]  # fmt: skip
    best = grid.largest_batches(preds)
    assert best == {("DiT-S/2", "fp32", "none"): preds[1], ("DiT-B/2", "fp32", "none"): None}


# ---- kernels.py: one cost row per kernel ----------------------------------------------------------


def test_each_op_name_has_its_category():
    names = {
        "mm": "matmul", "addmm": "matmul", "convolution_backward": "matmul", "_addmm_activation": "matmul",
        "_scaled_dot_product_flash_attention_for_cpu": "attention", "_flash_attention_backward": "attention",
        "_efficient_attention_forward": "attention", "_foreach_mul_": "optimizer",
        "_fused_adamw_": "optimizer",
        "_amp_foreach_non_finite_check_and_unscale_": "optimizer", "_amp_update_scale_": "optimizer",
        "add": "elementwise", "native_layer_norm": "elementwise", "foreach_x": "elementwise",
    }  # fmt: skip
    assert {n: kernels.category(n) for n in names} == names


def test_a_quantity_carrying_the_prime_batch_is_per_sample():
    assert kernels._split(7 * 12, 7) == (0, 12)
    assert kernels._split(7 * 12 + 1, 7) == (7 * 12 + 1, 0)
    assert kernels._split(0, 7) == (0, 0)
    assert kernels._split(12, 1) == (12, 0)  # at batch 1 nothing can be told apart: all constant


def test_a_matmul_row_has_its_flops_and_every_bytes_read_and_written():
    aten = torch.ops.aten
    a, b = torch.ones(7, 8), torch.ones(8, 16)
    out = aten.mm.default(a, b)
    # 2 * 7 * 8 * 16 = 1792 FLOPs, all per sample (7 | 1792); bytes: a 224 (per sample 32), b 512
    # (constant: 7 does not divide it), the output 448 (per sample 64).
    assert kernels.op_row(aten.mm.default, (a, b), {}, out, 7, True) == (
        "matmul",
        "fp32",
        True,
        0,
        256,
        512,
        96,
    )
    # The dtype is the first floating input's; integer-only ops count as fp32; elementwise ops no FLOPs.
    h = torch.ones(7, 8, dtype=torch.bfloat16)
    assert kernels.op_row(aten.mm.default, (h, h.T), {}, h @ h.T, 7, False)[:2] == ("matmul", "bf16")
    i = torch.ones(7, dtype=torch.int64)
    assert kernels.op_row(aten.add.Tensor, (i, i), {}, i + i, 7, False) == (
        "elementwise",
        "fp32",
        False,
        0,
        0,
        0,
        24,
    )
    for dtype, name in ((torch.float16, "fp16"), (torch.float64, "fp64")):
        x = torch.ones(3, dtype=dtype)
        assert kernels.op_row(aten.add.Tensor, (i, x), {"alpha": 1}, x + x, 7, False)[1] == name
    x = torch.ones(7, 8)
    assert kernels.op_row(aten.mul.Tensor, (x, x), {}, x * x, 7, False) == (
        "elementwise",
        "fp32",
        False,
        0,
        0,
        0,
        96,
    )


def test_views_and_allocations_launch_nothing():
    aten = torch.ops.aten
    x = torch.ones(4, 4)
    assert kernels.op_row(aten.view.default, (x, [16]), {}, x.view(16), 7, False) is None
    assert kernels.op_row(aten.detach.default, (x,), {}, x.detach(), 7, False) is None
    assert kernels.op_row(aten.empty_like.default, (x,), {}, torch.empty_like(x), 7, False) is None
    assert kernels.op_row(aten.add.Scalar, (3, 4), {}, 7, 7, False) is None  # host scalars only


def test_an_in_place_foreach_op_writes_back_its_lists():
    aten = torch.ops.aten
    xs = [torch.ones(7), torch.ones(3)]
    # Read and written back, 2 * (28 + 12) bytes: the 28 (7 | 28) per sample, 4 a sample; the 12 constant.
    row = kernels.op_row(aten._foreach_add_.Scalar, (xs, 1.0), {}, None, 7, False)
    assert row == ("optimizer", "fp32", False, 0, 0, 24, 8)


def test_attention_flops_are_torchs_sdpa_formulas():
    aten = torch.ops.aten
    q = torch.ones(7, 3, 5, 4)
    fwd = aten._scaled_dot_product_flash_attention_for_cpu.default
    out = fwd(q, q, q)
    # Forward: QK^T and PV, 2 * 2 * B * H * T^2 * D = 4 * 7 * 3 * 25 * 4 = 8400, per sample 1200.
    assert kernels.op_row(fwd, (q, q, q), {}, out, 7, False)[:5] == ("attention", "fp32", False, 0, 1200)
    bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    args = (out[0], q, q, q, out[0], out[1], 0.0, False)
    grads = bwd(*args)
    # Backward: torch counts five matmuls (QK^T recomputed, dV, dP, dQ, dK): 10 * 3 * 25 * 4 per sample.
    assert kernels.op_row(bwd, args, {}, grads, 7, True)[:5] == ("attention", "fp32", True, 0, 3000)
    # An op torch has no formula for counts no FLOPs.
    x = torch.ones(7, 4)
    assert kernels._flops("relu", aten.relu.default, (x,), {}, x) == 0


def test_a_split_keeps_512_bytes_in_the_small_pool_and_more_than_1_mib_in_the_large():
    a = allocator.CachingAllocator()
    a.malloc(MiB)  # half of a 2 MiB small segment
    b = a.malloc(MiB - 512)  # leaves exactly 512 B: worth a block in the small pool
    assert b.size == MiB - 512 and a.allocated == 2 * MiB - 512
    c = a.malloc(1)
    assert (c.addr, c.size, a.reserved) == (b.addr + MiB - 512, 512, 2 * MiB)
    large = allocator.CachingAllocator()
    d = large.malloc(19 * MiB)  # a 20 MiB segment; exactly 1 MiB left is not worth a block there
    assert (d.size, large.allocated, large.reserved) == (20 * MiB, 20 * MiB, 20 * MiB)
    e = large.malloc(2 * MiB)  # nothing cached is free: a new segment
    assert (e.size, large.reserved) == (2 * MiB, 40 * MiB)


# ---- grid.py: the advice per card class -----------------------------------------------------------


def test_speed_rank_puts_low_precision_without_checkpointing_first():
    assert grid.speed_rank("bf16", "none") == (0, 0, 0)
    assert grid.speed_rank("fp16", "full") == (0, 2, 1)
    assert grid.speed_rank("bf16", "every_4") == (0, 1, 0)  # every_K sits between none and full
    assert grid.speed_rank("tf32", "none") == (1, 2, 0)
    assert grid.speed_rank("fp32", "every_2") == (1, 3, 1)
    assert grid.speed_rank("fp8", "full") == (1, 4, 2)  # an unknown precision after fp32
    order = sorted([("fp32", "none"), ("bf16", "full"), ("tf32", "none"), ("fp16", "none"), ("bf16", "none")],
                   key=lambda s: grid.speed_rank(*s))  # fmt: skip
    assert order == [("bf16", "none"), ("fp16", "none"), ("bf16", "full"), ("tf32", "none"), ("fp32", "none")]


def test_each_class_is_judged_on_its_smallest_card_and_the_asked_class_on_the_asked_card():
    got = [(gb, card.name) for gb, card in grid.class_cards()]
    assert got == [(12, "RTX 3060 12GB"), (16, "T4"), (24, "L4"), (32, "V100-32GB"), (40, "A100-40GB"),
                   (48, "L40S"), (80, "A100-80GB"), (94, "H100 NVL"), (141, "H200")]  # fmt: skip
    asked = [(gb, card.name) for gb, card in grid.class_cards(find_card("RTX 4090"))]
    assert asked == [*got[:2], (24, "RTX 4090"), *got[3:]]
    by_gib = {gb: (card.name, card.usable_gib) for gb, card in grid.class_cards(20.5)}
    assert by_gib[24] == ("a 20.5 GiB card", 20.5) and by_gib[12] == ("RTX 3060 12GB", 11.76)
    assert grid.class_cards(24)[2][1].name == "a 24 GiB card"  # a class holds up to its size
    big = grid.class_cards(200)
    assert [gb for gb, _ in big][-2:] == [141, 200] and big[-1][1].name == "a 200 GiB card"
    assert grid._pre_ampere(find_card("T4")) and not grid._pre_ampere(find_card("RTX 3060 12GB"))
    assert not grid._pre_ampere(find_card("H200"))
    assert grid._gflops("DiT-XL/2", 256) == pytest.approx(118.6, abs=0.05)  # the paper's Table 4
    assert grid._gflops("DiT-XL/2", 512) == pytest.approx(524.5, abs=0.05)


def _p(model, precision, ckpt, batch, status, peak=None, device=None, ips=None):
    return predict.Prediction(
        model,
        precision,
        ckpt,
        batch,
        "cuda",
        None,
        None,
        status,
        peak_allocated_gib=peak,
        device_gib=device,
        predicted_images_per_s=ips,
    )


def test_the_decision_tree_takes_the_largest_model_that_fits_and_its_fastest_setting():
    xl, b = "DiT-XL/2", "DiT-B/2"
    t4 = [
        _p(xl, "bf16", "none", 8, "oom", 20, 21),
        _p(xl, "fp32", "full", 8, "oom", 14, 16.5),
        _p(xl, "fp32", "full", 16, "oom", 15),
        _p(xl, "fp16", "none", 8, "unsupported"),
        _p(b, "tf32", "none", 64, "fits"),
        _p(b, "fp32", "none", 16, "fits"),
        _p(b, "fp32", "none", 32, "fits"),
        _p(b, "fp32", "full", 64, "fits"),
    ]
    a100 = [
        _p(xl, "bf16", "none", 16, "fits", ips=100),
        _p(xl, "bf16", "none", 8, "fits", ips=120),
        _p(xl, "tf32", "none", 64, "fits", ips=50),
        _p(xl, "bf16", "every_2", 128, "fits"),
        _p(xl, "fp32", "full", 128, "fits"),
        _p(xl, "fp32", "full", 256, "oom"),
        _p(b, "bf16", "none", 512, "fits"),
    ]
    rtx = [
        _p(xl, "bf16", "none", 8, "oom", 30, 31),
        _p(b, "bf16", "none", 8, "oom", 12.5, 13),
        _p(b, "fp32", "none", 8, "oom", 12.5, 13.5),
        _p(b, "bf16", "full", 16, "oom", 12.5, 13),
    ]
    cards = [(12, find_card("RTX 3060 12GB")), (16, find_card("T4")), (80, find_card("A100-80GB"))]
    by_class = {12: rtx, 16: t4, 80: a100}
    no_fit, small, large = grid.decision_tree(by_class, cards)
    # 12 GB: nothing fits; the next step is the smallest model's least demanding cell (then the smaller
    # batch), which first trains on 16 GB.
    assert (no_fit.class_gb, no_fit.card, no_fit.memory_gib) == (12, "RTX 3060 12GB", 11.76)
    assert (no_fit.model, no_fit.setting, no_fit.alternatives) == (None, None, 0)
    assert (no_fit.next_model, no_fit.next_needs, no_fit.next_class_gb) == (b, rtx[1], 16)
    # 16 GB (a T4, before Ampere: no tf32): DiT-B/2, fp32 without checkpointing at its largest batch, 32,
    # reaching the target; one alternative. The next model's least demanding cell by device memory, and
    # by the allocated peak where no device figure is given.
    assert (small.model, small.setting, small.alternatives) == (b, t4[6], 1)
    assert (small.next_model, small.next_needs, small.next_class_gb) == (xl, t4[2], 80)
    # 80 GB: DiT-XL/2; bf16 is predicted fastest but reaches only batch 16: tf32 at 64 reaches 32.
    assert (large.model, large.setting, large.alternatives, large.next_model) == (xl, a100[2], 3, None)
    assert (large.next_needs, large.next_class_gb) == (None, None)
    assert grid.decision_tree(by_class, cards, target_batch=16)[2].setting == a100[0]
    # No setting reaches 256: the largest batch, and of equal ones the faster setting (bf16 every_2).
    assert grid.decision_tree(by_class, cards, target_batch=256)[2].setting == a100[3]
    assert grid.decision_tree({}, cards) == []


def test_the_raw_peak_restarts_at_the_window_and_keeps_the_first_of_equal_peaks():
    sizes = [1, 10, 100]
    # +k+1 allocates k, -(k+1) frees it: live 1, 11, 10, 110, 100, 0.
    assert allocator.raw_peak([1, 2, -1, 3, -2, -3], sizes, (0, 6)) == (110, 3)
    # The window starts at event 3 with 111 B live, its peak: reported at the event before the window.
    assert allocator.raw_peak([1, 2, 3, -3, -2, -1], sizes, (3, 6)) == (111, 2)
    # An allocation at the window's first event counts; a peak before the window does not.
    assert allocator.raw_peak([3, -3, 1, 2], sizes, (2, 4)) == (11, 3)
    assert allocator.raw_peak([2, 3], sizes, (1, 2)) == (110, 1)
    # A smaller later allocation does not lower the peak; of equal peaks the first is kept.
    assert allocator.raw_peak([3, -3, 2], sizes, (0, 3)) == (100, 0)
    assert allocator.raw_peak([2, -2, 2, -2], sizes, (0, 4)) == (10, 0)
    # A window past the last event: nothing seen.
    assert allocator.raw_peak([1, -1], sizes, (5, 5)) == (0, -1)


def test_a_replay_before_its_window_reports_nothing_in_it():
    # The window starts after the last event: peaks stay 0 at event -1; the run's maxima still count.
    r = allocator.replay([1, 2], [10, 2 * MiB], (5, 5))
    assert (r.peak_allocated, r.peak_reserved, r.peak_event) == (0, 0, -1)
    assert (r.max_allocated, r.max_reserved, r.block_sizes) == (
        512 + 2 * MiB,
        2 * MiB + 20 * MiB,
        [512, 2 * MiB],
    )
    # Events past the window's end are not replayed: that allocation never gets a block.
    r = allocator.replay([1, 2], [10, 20], (0, 1))
    assert (r.block_sizes, r.peak_allocated, r.peak_event, r.oom) == ([512, 0], 512, 0, False)
    assert allocator.replay([], [], (0, 0)).peak_allocated == 0


def test_a_replay_that_runs_out_reports_every_figure_up_to_the_failed_request():
    # 80 MiB card: a 50 MiB segment (freed before the window), then 4 and 40 MiB carved out of it;
    # a second 40 MiB request needs a new segment, nothing is entirely free to release: OOM.
    r = allocator.replay([1, -1, 2, 3, 4], [50 * MiB, 4 * MiB, 40 * MiB, 40 * MiB], (2, 5), 80 * MiB)
    assert r == allocator.Replay(
        peak_allocated=44 * MiB, peak_reserved=50 * MiB, peak_event=3,
        block_sizes=[50 * MiB, 4 * MiB, 40 * MiB, 0], oom_event=4, oom_request=40 * MiB, retries=1,
        max_allocated=50 * MiB, max_reserved=50 * MiB,
    )  # fmt: skip


def test_replay_peaks_within_the_window():
    # The window opens on a peak already reached: the event before it.
    r = allocator.replay([1, 2, -2], [10, 20], (2, 3))
    assert (r.peak_allocated, r.peak_event) == (1024, 1)
    # Reaching the run's maximum again later keeps the first event; a smaller allocation keeps the peak.
    r = allocator.replay([1, -1, 2], [10, 10], (0, 3))
    assert (r.peak_allocated, r.peak_event) == (512, 0)
    r = allocator.replay([1, -1, 2], [2 * MiB, 512], (0, 3))
    assert (r.peak_allocated, r.peak_event) == (2 * MiB, 0)
    # Below the run's maximum (before the window) but above the window's start: the window's peak.
    r = allocator.replay([1, -1, 2], [2 * MiB, 512], (2, 3))
    assert (r.peak_allocated, r.peak_event, r.max_allocated) == (512, 2, 2 * MiB)


def test_a_release_in_the_window_does_not_lower_its_reserved_peak():
    # 51 MiB card: the freed 50 MiB segment is released for a small one (one retry); the window's
    # reserved peak stays 50 MiB, and the replay that fits reports no failed request.
    r = allocator.replay([1, -1, 2], [50 * MiB, 512], (0, 3), 51 * MiB)
    assert (r.peak_reserved, r.max_reserved, r.retries) == (50 * MiB, 50 * MiB, 1)
    assert (r.oom, r.oom_event, r.oom_request) == (False, None, 0)
    # A window peak below the run's maximum, reached twice: the first event is kept.
    r = allocator.replay([1, -1, 2, -2, 3], [2 * MiB, 512, 512], (2, 5))
    assert (r.peak_allocated, r.peak_event) == (512, 2)


def test_a_merge_keeps_the_segments_links_both_ways():
    # One 20 MiB segment: x, y, z of 4 MiB and an 8 MiB tail. Freeing x then y merges y into x, which
    # must still lead to z (in use: the segment is not entirely free, so a retry cannot release it).
    a = allocator.CachingAllocator(capacity=20 * MiB)
    x, y, z = (a.malloc(4 * MiB) for _ in range(3))
    a.free(x)
    a.free(y)
    assert a.malloc(16 * MiB) is None and (a.retries, a.reserved) == (1, 20 * MiB)
    # z must lead back to x: freeing it merges the whole segment into one 20 MiB block.
    a.free(z)
    whole = a.malloc(20 * MiB)
    assert (whole.addr, whole.size, a.reserved) == (x.addr, 20 * MiB, 20 * MiB)


def _four_blocks(capacity=None):
    """One 20 MiB segment holding x, y, z of 4 MiB and w of 8 MiB (the tail taken whole)."""
    a = allocator.CachingAllocator(capacity)
    blocks = [a.malloc(4 * MiB) for _ in range(3)] + [a.malloc(8 * MiB)]
    assert a.reserved == 20 * MiB and blocks[3].size == 8 * MiB
    return a, blocks


def test_a_block_that_absorbs_its_next_takes_over_its_links():
    # Free z, then y: y absorbs z and must lead to w and be led back to from w.
    a, (x, y, z, w) = _four_blocks()
    a.free(z)
    a.free(y)
    a.free(w)  # w merges back into y: one 16 MiB block at y
    got = a.malloc(16 * MiB)
    assert (got.addr, a.reserved) == (y.addr, 20 * MiB)
    # Then x absorbs y (with z): x leads to w, still in use, so the segment is not entirely free.
    a, (x, y, z, w) = _four_blocks(capacity=20 * MiB)
    a.free(z)
    a.free(y)
    a.free(x)
    assert a.malloc(16 * MiB) is None and (a.retries, a.reserved) == (1, 20 * MiB)


def test_an_exact_fit_at_address_0_is_reused():
    a = allocator.CachingAllocator()
    x = a.malloc(12 * MiB)  # its own 12 MiB segment at address 0
    a.free(x)
    assert (a.malloc(12 * MiB).addr, a.reserved) == (0, 12 * MiB)


def test_a_split_in_the_middle_of_a_segment_links_the_tail_to_the_next_block():
    a, (x, y, z, w) = _four_blocks()
    a.free(y)
    part = a.malloc(2 * MiB)  # y split: 2 MiB used, a 2 MiB tail that z must lead back to
    assert part.addr == y.addr
    a.free(z)  # merges with that tail: 6 MiB free after `part`
    got = a.malloc(6 * MiB)
    assert (got.addr, a.reserved) == (y.addr + 2 * MiB, 20 * MiB)


def test_segments_get_consecutive_addresses_and_each_retry_counts():
    a = allocator.CachingAllocator(capacity=40 * MiB)
    segs = [a.malloc(12 * MiB) for _ in range(3)]
    assert [s.addr for s in segs] == [0, 12 * MiB, 24 * MiB]
    for s in segs:
        a.free(s)
    a.malloc(30 * MiB)  # 36 + 30 > 40: the three free segments are released (retry 1)
    assert (a.retries, a.reserved) == (1, 30 * MiB)
    assert a.malloc(12 * MiB) is None  # 30 + 12 > 40, nothing free to release (retry 2): out of memory
    assert (a.retries, a.reserved) == (2, 30 * MiB)
