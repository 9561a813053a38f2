"""The plan's text and JSON pinned by value (issue 27, mutation testing of ditbench/plan/render.py).

Each expected line is written out here from the format the function documents (GiB to one decimal,
MiB below 0.1 GiB on a CPU, "(x)" for a cell that does not fit, "tight" within the planner's margin,
"*" for a measured cell), on hand-made predictions and advice, so nothing is traced.
"""

from __future__ import annotations

import math

from ditbench.plan import render
from ditbench.plan.grid import Advice
from ditbench.plan.predict import Prediction


def _p(
    model="DiT-S/2", precision="fp32", ckpt="none", batch=8, status="fits", device="cuda", memory=80.0, **kw
):
    return Prediction(model, precision, ckpt, batch, device, "H200", memory, status, **kw)


# ---- a table cell ------------------------------------------------------------------------------


def test_a_fit_is_tight_within_6_percent_of_the_card_and_only_when_predicted():
    assert render.TIGHT_MARGIN == 0.06
    limit = 50.0 * (1 + 0.06)  # a device figure of 50 GiB is tight on a card holding less than this
    assert render.is_tight(_p(device_gib=50.0, memory=limit - 0.01))
    assert not render.is_tight(_p(device_gib=50.0, memory=limit))  # strictly less
    assert not render.is_tight(_p(device_gib=50.0, memory=limit - 0.01, measured=True))
    assert not render.is_tight(_p(device_gib=50.0, memory=None))
    assert not render.is_tight(_p(device_gib=None, peak_allocated_gib=50.0, memory=51.0))
    assert not render.is_tight(_p(status="oom", device_gib=50.0, memory=49.0))
    assert not render.is_tight(_p(status="predicted", device_gib=50.0, memory=51.0))


def test_a_cell_shows_the_gib_the_card_must_hold_and_what_it_means():
    assert render._figure(_p(status="unsupported", device_gib=1.0)) == "n/a"
    assert render._figure(_p(status="error", device_gib=1.0)) == "err"
    assert render._figure(_p(status="oom")) == "?"
    assert render._figure(_p(status="oom", measured=True)) == "oom*"
    # The device figure (reserved + context) when there is one, else the allocated peak.
    assert render._figure(_p(device_gib=12.34, peak_allocated_gib=9.0)) == "12.3"
    assert render._figure(_p(peak_allocated_gib=9.06)) == "9.1"
    assert render._figure(_p(status="oom", device_gib=90.0)) == "(90.0)"
    assert render._figure(_p(status="oom", device_gib=90.0, measured=True)) == "(90.0)*"
    assert render._figure(_p(device_gib=79.0, memory=80.0)) == "79.0 tight"
    assert render._figure(_p(status="ok", device_gib=79.0, memory=80.0, measured=True)) == "79.0*"
    # Below 0.1 GiB a CPU cell is shown in MiB (0.05 GiB = 51.2 MiB); a GPU cell stays in GiB.
    assert render._figure(_p(device="cpu", memory=None, status="predicted", peak_allocated_gib=0.05)) == "51M"
    assert render._figure(_p(device="cpu", memory=None, status="predicted", peak_allocated_gib=0.1)) == "0.1"
    assert render._figure(_p(status="predicted", memory=None, peak_allocated_gib=0.04)) == "0.0"


# ---- the tables --------------------------------------------------------------------------------


def test_the_cells_table_has_a_column_per_batch_and_the_largest_that_fits():
    preds = [
        _p(batch=16, status="oom", device_gib=90.0),
        _p(batch=8, device_gib=1.0),
        _p("DiT-B/2", "bf16", "full", 16, status="unsupported"),
        _p("DiT-XL/2", "bf16", "none", 8, status="oom", device_gib=85.0),
    ]
    assert render.cells_table(preds).splitlines() == [
        "| model | precision | ckpt | bs 8 | bs 16 | largest batch that fits |",
        "|---|---|---|---|---|---|",
        "| DiT-S/2 | fp32 | none | 1.0 | (90.0) | 8 |",
        "| DiT-B/2 | bf16 | full |  | n/a | n/a |",
        "| DiT-XL/2 | bf16 | none | (85.0) |  | none |",
    ]
    # Without a card nothing fits or not: no last column.
    free = [_p(status="predicted", memory=None, peak_allocated_gib=2.0)]
    assert render.cells_table(free).splitlines() == [
        "| model | precision | ckpt | bs 8 |",
        "|---|---|---|---|",
        "| DiT-S/2 | fp32 | none | 2.0 |",
    ]


def test_the_cells_table_shows_image_size_and_attention_when_they_differ():
    preds = [
        _p(device_gib=1.0, config={"image_size": 256, "impl": "sdpa"}),
        _p(device_gib=2.0, config={"image_size": 512, "impl": "sdpa"}),
        _p(device_gib=3.0, config={"image_size": 512, "impl": "math"}),
    ]
    assert render.cells_table(preds).splitlines() == [
        "| model | precision | ckpt | px | impl | bs 8 | largest batch that fits |",
        "|---|---|---|---|---|---|---|",
        "| DiT-S/2 | fp32 | none | 256 | sdpa | 1.0 | 8 |",
        "| DiT-S/2 | fp32 | none | 512 | sdpa | 2.0 | 8 |",
        "| DiT-S/2 | fp32 | none | 512 | math | 3.0 | 8 |",
    ]
    same = [_p(device_gib=1.0, config={"image_size": 256, "impl": "sdpa"})]
    assert (
        render.cells_table(same).splitlines()[0]
        == "| model | precision | ckpt | bs 8 | largest batch that fits |"
    )


def test_the_speed_table_has_the_pace_and_the_three_largest_parts_of_a_step():
    split = {"optimizer": 0.6, "matmul": 60.4, "communication": 4.0, "attention": 25.0, "elementwise": 10.0}
    fast = _p(predicted_steps_per_s=1.234, predicted_images_per_s=39.4, step_split_pct=split,
              time_to_target={"days": 2.345, "gpu_hours": 56.7})  # fmt: skip
    odd = _p("DiT-B/2", status="predicted", predicted_steps_per_s=2.0, predicted_images_per_s=16.0,
             step_split_pct={"other": 98.2, "launch_overhead": 1.0, "optimizer": 0.8})  # fmt: skip
    oom = _p(status="oom", predicted_steps_per_s=9.0, predicted_images_per_s=72.0)
    assert render.speed_table([fast, oom, odd, _p()]).splitlines() == [
        "| model | precision | ckpt | bs | steps/s | img/s | days | GPU-h | where the step goes |",
        "|---|---|---|---|---|---|---|---|---|",
        "| DiT-S/2 | fp32 | none | 8 | 1.23 | 39 | 2.3 | 57 | mm 60%, attn 25%, elem 10% |",
        "| DiT-B/2 | fp32 | none | 8 | 2.00 | 16 | nan | nan | other 98%, launch 1% |",
    ]
    assert render.speed_table([oom, _p()]) is None
    names = {"communication": "comm", "optimizer": "opt"}
    for key, short in names.items():
        row = _p(predicted_steps_per_s=1.0, predicted_images_per_s=8.0, step_split_pct={key: 100.0})
        assert render.speed_table([row]).splitlines()[2].endswith(f"| {short} 100% |")


def test_each_reason_once_with_up_to_three_cells():
    preds = [_p(f"DiT-{m}", status="unsupported", reason="no fp16 here") for m in ("S/2", "B/2", "L/2")]
    preds += [_p("DiT-S/2", status="unsupported", reason="no fp16 here")]  # the same cell again
    preds += [_p("DiT-S/2", "bf16", "full", status="error", reason="boom")]
    preds += [_p(status="error"), _p(status="oom", reason="too big")]
    assert render.reasons(preds) == [
        "n/a: no fp16 here (DiT-S/2 fp32 ckpt=none, DiT-B/2 fp32 ckpt=none, DiT-L/2 fp32 ckpt=none)",
        "err: boom (DiT-S/2 bf16 ckpt=full)",
    ]
    preds.append(_p("DiT-XL/2", status="unsupported", reason="no fp16 here"))
    assert render.reasons(preds)[0] == (
        "n/a: no fp16 here (DiT-S/2 fp32 ckpt=none, DiT-B/2 fp32 ckpt=none, DiT-L/2 fp32 ckpt=none, ...)"
    )


def test_components_in_gib_from_0_01_else_mib_and_the_context_always():
    comps = {"weights": 1.5, "gradients": 0.01, "optimizer": 0.005, "ema": 0.0, "activations": 2.0,
             "workspace": 0.25, "context": 0.0, "other": 3.0}  # fmt: skip
    # 0.005 GiB = 5.12 MiB.
    assert render.components_text(_p(components=comps)) == (
        "weights 1.50 GiB + grads 0.01 GiB + Adam 5.1 MiB + activations 2.00 GiB + workspace 0.25 GiB"
        " + context 0.0 MiB + other 3.00 GiB"
    )
    assert render.components_text(_p(components={"ema": 0.5})) == "EMA 0.50 GiB"


# ---- the decision tree -------------------------------------------------------------------------


def _a(gb, model, setting, next_model=None, next_needs=None, next_class_gb=None):
    return Advice(gb, f"card{gb}", gb - 0.5, model, setting, 0, next_model, next_needs, next_class_gb)


def test_the_tree_table_row_per_class():
    small = _p("DiT-B/2", batch=16, device_gib=20.0, memory=21.0)  # 20 GiB x 1.06 > 21: tight
    needs = _p("DiT-XL/2", "bf16", "full", 8, status="oom", peak_allocated_gib=30.04)
    fast = _p("DiT-XL/2", "bf16", "none", 32, device_gib=70.0, memory=79.5, predicted_steps_per_s=2.5,
              time_to_target={"days": 3.26})  # fmt: skip
    rows = [
        _a(12, None, None, "DiT-S/2", None),
        _a(24, "DiT-B/2", small, "DiT-XL/2", needs, 80),
        _a(40, "DiT-B/2", _p("DiT-B/2", batch=64, peak_allocated_gib=30.0, measured=True), "DiT-XL/2", needs),
        _a(80, "DiT-XL/2", fast),
    ]
    lines = render.tree_table(rows, 32).splitlines()
    assert lines[:2] == [
        "| class | smallest card | largest model that trains | setting | batch | card holds GiB "
        "| predicted steps/s (days) | next step up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    assert lines[2:] == [
        "| 12 GB | card12 (11.50 GiB) | none | none | none | none | - | DiT-S/2: not predicted |",
        "| 24 GB | card24 (23.50 GiB) | DiT-B/2 | fp32, ckpt none | 16 (largest that fits) | 20.0 tight | - "
        "| DiT-XL/2 needs 30.0 GiB at least (bf16, ckpt full, bs 8): the 80 GB class |",
        "| 40 GB | card40 (39.50 GiB) | DiT-B/2 | fp32, ckpt none* | 64 | 30.0 | - "
        "| DiT-XL/2 needs 30.0 GiB at least (bf16, ckpt full, bs 8): no class of the table |",
        "| 80 GB | card80 (79.50 GiB) | DiT-XL/2 | bf16, ckpt none | 32 | 70.0 | 2.50 (3.3 d) "
        "| the largest model already trains; no larger class of the table adds more |",
    ]


def test_the_next_class_up_adds_a_faster_setting_or_a_larger_batch():
    here = _p("DiT-XL/2", "fp32", "full", 16, device_gib=70.0)
    same = _p("DiT-XL/2", "fp32", "full", 16, device_gib=70.0)
    larger = _p("DiT-XL/2", "fp32", "full", 32, device_gib=70.0)
    faster = _p("DiT-XL/2", "bf16", "full", 16, device_gib=70.0)
    other_ckpt = _p("DiT-XL/2", "fp32", "none", 8, device_gib=70.0)
    a = _a(80, "DiT-XL/2", here)
    last = "the largest model already trains; no larger class of the table adds more"
    assert render._next_class(a, [_a(94, "DiT-XL/2", same), _a(141, "DiT-XL/2", larger)], 32) == (
        "141 GB: fp32, ckpt full, bs 32"
    )
    assert render._next_class(a, [_a(94, "DiT-XL/2", faster)], 32) == "94 GB: bf16, ckpt full, bs 16"
    assert render._next_class(a, [_a(94, "DiT-XL/2", other_ckpt)], 32) == "94 GB: fp32, ckpt none, bs 8"
    assert render._next_class(a, [_a(94, "DiT-L/2", larger), _a(141, None, None)], 32) == last
    assert render._next_class(a, [_a(94, "DiT-XL/2", same)], 32) == last


def test_advice_details_list_the_components_of_each_setting():
    comps = {"weights": 1.0, "context": 0.5}
    rows = [_a(12, None, None), _a(24, "DiT-B/2", _p()), _a(80, "DiT-XL/2", _p(components=comps))]
    assert render.advice_details(rows) == "- 80 GB, DiT-XL/2: weights 1.00 GiB + context 0.50 GiB"
    two = [_a(24, "DiT-B/2", _p(components=comps)), _a(80, "DiT-XL/2", _p(components=comps))]
    assert render.advice_details(two).splitlines() == [
        "- 24 GB, DiT-B/2: weights 1.00 GiB + context 0.50 GiB",
        "- 80 GB, DiT-XL/2: weights 1.00 GiB + context 0.50 GiB",
    ]


def test_the_json_has_every_cell_the_largest_batches_and_the_tree():
    fit, tight = _p(batch=8, device_gib=10.0), _p(batch=16, device_gib=79.0)
    oom = _p("DiT-B/2", batch=8, status="oom", device_gib=90.0)
    needs = _p("DiT-L/2", status="oom", device_gib=95.0)
    advice = [_a(80, "DiT-S/2", tight, "DiT-L/2", needs, 141), _a(12, None, None)]
    doc = render.to_json([fit, tight, oom], advice, {"card": "H200", "tight_margin": 1.0}, 32)
    assert doc["card"] == "H200" and doc["tight_margin"] == 0.06 and doc["target_batch"] == 32
    assert doc["cells"] == [
        {**p.to_dict(), "tight": t} for p, t in ((fit, False), (tight, True), (oom, False))
    ]
    assert doc["largest_batch"] == [
        {"model": "DiT-S/2", "precision": "fp32", "grad_ckpt": "none", "batch_size": 16},
        {"model": "DiT-B/2", "precision": "fp32", "grad_ckpt": "none", "batch_size": None},
    ]
    assert doc["tree"] == [
        {"class_gb": 80, "card": "card80", "memory_gib": 79.5, "model": "DiT-S/2", "setting": tight.to_dict(),
         "next_model": "DiT-L/2", "next_needs": needs.to_dict(), "next_class_gb": 141},
        {"class_gb": 12, "card": "card12", "memory_gib": 11.5, "model": None, "setting": None,
         "next_model": None, "next_needs": None, "next_class_gb": None},
    ]  # fmt: skip
    assert render.to_json([], None, {}, 8)["tree"] is None
    assert math.isclose(doc["cells"][1]["device_gib"], 79.0)


def test_mib_are_1024_to_the_gib():
    # 0.0805 GiB = 82.432 MiB; 0.00932 GiB = 9.54368 MiB.
    assert (
        render._figure(_p(device="cpu", memory=None, status="predicted", peak_allocated_gib=0.0805)) == "82M"
    )
    assert render._size(0.00932) == "9.5 MiB"


def test_the_tree_table_next_steps_and_paces():
    fp32 = _p("DiT-XL/2", "fp32", "full", 16, device_gib=70.0)
    bf16 = _p("DiT-XL/2", "bf16", "none", 8, device_gib=70.0, predicted_steps_per_s=3.0)  # no time to target
    needs = _p("DiT-XL/2", "bf16", "full", 8, status="oom", peak_allocated_gib=30.0, device_gib=31.04)
    rows = [_a(40, "DiT-XL/2", bf16), _a(80, "DiT-XL/2", fp32), _a(141, "DiT-XL/2", fp32),
            _a(24, "DiT-B/2", _p("DiT-B/2", batch=64, device_gib=9.0), "DiT-XL/2", needs, 40)]  # fmt: skip
    lines = render.tree_table(rows, 8).splitlines()[2:]
    last = "the largest model already trains; no larger class of the table adds more"
    # 40 GB: 80 GB is the first larger class and adds fp32 with full checkpointing at 16.
    assert lines[0].endswith("| 70.0 | - | 80 GB: fp32, ckpt full, bs 16 |")
    assert lines[1].endswith(f"| 70.0 | - | {last} |")  # 141 GB adds nothing to 80 GB
    assert lines[3].endswith("| DiT-XL/2 needs 31.0 GiB at least (bf16, ckpt full, bs 8): the 40 GB class |")
    # Classes of another model or none are passed over to the first that adds something.
    a = _a(80, "DiT-XL/2", fp32)
    above = [_a(94, "DiT-L/2", bf16), _a(100, None, None), _a(141, "DiT-XL/2", bf16)]
    assert render._next_class(a, above, 8) == "141 GB: bf16, ckpt none, bs 8"
