"""`ditbench plan --card CARD`: the answer first, one screen, the fastest setting per model that fits."""

from __future__ import annotations

import json
import math

import pytest

from ditbench.cli import main
from ditbench.core.errors import UserError
from ditbench.hardware.cards import Datasheet
from ditbench.plan import answer
from ditbench.plan.predict import SpeedOptions, budget, predict_budgets


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DITBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def run(capsys, *argv):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())


BASE = {"image_size": 256, "impl": "ditbench", "optimizer_impl": "auto"}


def test_the_answer_is_the_fastest_setting_that_fits_and_the_next_faster_does_not():
    bud = budget(6.0)  # a 6 GiB card: DiT-B/2 trains, but not at its fastest
    opts = SpeedOptions(sheet=Datasheet(60, 60, 120, 900, 32, "PCIe 4.0"))
    batches = answer.micro_batches(256, 1, None)
    found = answer.search("DiT-B/2", bud, opts, ("bf16", "tf32"), answer.CKPTS, batches, 256, BASE)
    best, dropped = found.best, found.dropped
    assert found.searched == 2 * 3 * 9 and batches == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert best.pred.fits and best.pred.device_gib <= 6.0
    assert best.config["batch_size"] * best.config["grad_accum"] == 256
    assert dropped.rate > best.rate
    need = dropped.need_gib if dropped.pred is None else dropped.pred.device_gib
    assert need > 6.0
    # Every faster setting was tried and does not fit: the answer is the fastest that fits.
    faster = [o for o in _all_options(found, opts, batches) if o[1] > best.rate]
    assert faster and all(predict_budgets(c, [c["batch_size"]], [bud])[0][0].fits is False for c, _ in faster)


def _all_options(found, opts, batches):
    from ditbench.plan import speed
    from ditbench.plan.emulation import cuda_target
    from ditbench.plan.predict import normalize, series_trace, step_time_of, trace_knobs

    out = []
    for p in ("bf16", "tf32"):
        for c in answer.CKPTS:
            for b in batches:
                cell = normalize({**BASE, "model": found.model, "precision": p, "grad_ckpt": c,
                                  "batch_size": b, "grad_accum": 256 // b})  # fmt: skip
                series = series_trace(trace_knobs(cell, cuda_target(None)), cuda_target(None), disk=True)
                t = step_time_of(series, cell, opts.sheet, speed.shipped())
                out.append((cell, t.steps_per_s * 256))
    return out


def test_accumulation_holds_the_gradients_through_the_forward():
    """From the second micro-batch on, the gradients live through the forward: 32 x 8 holds more than 32
    x 1, by about the gradients' size (4 bytes a parameter; the backward adds each new gradient into
    the old one, and the step draws all its micro-batches' noise at once)."""
    cell = {**BASE, "model": "DiT-S/2", "precision": "bf16", "grad_ckpt": "none", "batch_size": 32}
    one = predict_budgets(cell, [32], [budget("H200")], True)[0][0]
    eight = predict_budgets({**cell, "grad_accum": 8}, [32], [budget("H200")], True)[0][0]
    grads = 4 * 32_963_360 / 2**30
    assert grads < eight.peak_allocated_gib - one.peak_allocated_gib < grads * 1.1


def test_the_intervals_come_from_the_measured_errors_and_batches_divide_the_step():
    from ditbench.plan import speed

    assert speed.band(100.0, 5.0) == (95.0, 105.0) and speed.band(100.0, None) is None
    errors = speed.memory_errors_pct()  # written by benchmarks/plan_vs_h200.py, one per eager anchor
    assert len(errors) == 19 and speed.memory_band_pct() == math.ceil(max(abs(e) for e in errors)) == 6
    loo = [abs(r["error_pct"]) for r in speed.shipped().loo]
    assert speed.shipped().band_pct == round(max(loo), 1)
    assert answer.micro_batches(96, 2, None) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 48]
    assert answer.micro_batches(256, 8, [8, 32, 64]) == [8, 32]
    with pytest.raises(UserError, match="does not split over 3 GPUs"):
        answer.micro_batches(256, 3, None)
    with pytest.raises(UserError, match="none of"):
        answer.micro_batches(256, 1, [3])


def test_the_default_plan_is_one_screen_with_a_legend_for_every_column(capsys):
    code, out, _ = run(capsys, "--card", "RTX 4090")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) <= 25, out
    assert lines[0].startswith("RTX 4090 (23.99 GiB usable) x 1 GPU: the fastest setting that fits")
    header = lines[2]
    assert header == "| model | precision | ckpt | batch x accum | memory GiB | img/s | days | GPU-hours |"
    rows = [line for line in lines if line.startswith("| DiT-")]
    assert [r.split(" | ")[0] for r in rows] == ["| DiT-S/2", "| DiT-B/2", "| DiT-L/2", "| DiT-XL/2"]
    for r in rows:  # every row at the global batch: micro-batch x accumulation = 256
        batch, accum = r.split(" | ")[3].split(" x ")
        assert int(batch) * int(accum) == 256
    legend = " ".join(lines[lines.index("") + 1 :])
    columns = ("precision:", "ckpt:", "batch x accum:", "memory:", "img/s:", "days, GPU-hours:", "(a-b):")
    for column in columns:
        assert column in legend, column


def test_the_json_answer_states_each_row_at_the_same_global_batch(capsys):
    code, out, _ = run(capsys, "--card", "A100-80GB", "--gpus", "8", "--models", "DiT-XL/2", "--json")
    doc = json.loads(out)
    (r,) = doc["answer"]
    assert code == 0 and doc["global_batch"] == 256 and doc["steps"] == 400_000
    assert r["batch_size"] * r["grad_accum"] * 8 == 256
    assert r["gpu_hours"] == pytest.approx(r["days"] * 24 * 8)
    lo, hi = r["images_per_s_interval"]
    assert lo < r["images_per_s"] < hi and r["memory_interval"][0] < r["memory_gib"] < r["memory_interval"][1]


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "plan for which card?"),
        (["--memory-gib", "24"], "plan for which card?"),
        (["--tflops", "100", "--card", "T4"], "--tflops and --mem-bw describe a card not in the table"),
        (["--memory-gib", "24", "--tflops", "nan", "--mem-bw", "1"], "--tflops must be a finite number"),
        (["--card", "T4", "--global-batch", "0"], "--global-batch must be an integer from 1"),
        (["--card", "T4", "--gpus", "3"], "--global-batch 256 does not split over 3 GPUs"),
        (["--card", "RTX 4900"], "unknown card 'RTX 4900'. Did you mean 'RTX 4090'?"),
        (["--card", "P100"], "`ditbench plan --memory-gib GIB --tflops T --mem-bw GBS`"),
    ],
)
def test_an_answer_without_a_card_or_with_a_bad_flag_is_refused(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and message in err


def test_a_card_not_in_the_table(capsys):
    argv = ["--memory-gib", "24", "--tflops", "165", "--mem-bw", "1008", "--models", "DiT-S/2"]
    code, out, _ = run(capsys, *argv)
    assert code == 0 and out.startswith("a 24 GiB card (24.00 GiB usable) x 1 GPU:")
