"""The answer first (`ditbench plan --card CARD`): per model, the fastest setting that fits the card.

A setting is a precision, a checkpointing and a per-GPU micro-batch; the accumulation that reaches the
global batch follows, so every row trains the same recipe and its days compare. The settings are
ranked by predicted images/s and walked down until one fits (docs/plan.md).
"""

from __future__ import annotations

import itertools
import math
import textwrap
from dataclasses import dataclass
from typing import Any

from ditbench.core.errors import UserError
from ditbench.plan.emulation import cuda_target
from ditbench.plan.predict import Budget, Prediction, SpeedOptions, normalize, predict_budgets, trace_knobs
from ditbench.plan.render import is_tight
from ditbench.plan.speed import band, datasheet, memory_band_pct, memory_errors_pct, shipped
from ditbench.records.metrics import IMAGES_PER_S

ANSWER_MODELS = ("DiT-S/2", "DiT-B/2", "DiT-L/2", "DiT-XL/2")  # the paper's four sizes at its patch
CKPTS = ("none", "every_2", "full")
IMG = IMAGES_PER_S.key  # the answer's images/s, named as the record's


@dataclass
class Option:
    config: dict[str, Any]  # the cell: model, precision, grad_ckpt, batch_size (per GPU), grad_accum
    rate: float  # images/s over all GPUs
    steps_per_s: float  # optimizer steps
    series: Any = None  # its trace (trace.SeriesTrace)
    pred: Prediction | None = None  # its memory, once replayed
    need_gib: float | None = None  # a lower bound, when it was dropped without a replay


@dataclass
class Answer:
    model: str
    best: Option | None
    dropped: Option | None  # the next faster setting, which does not fit
    searched: int


def default_precisions(bud: Budget, sheet) -> tuple[str, ...]:
    """The card's fastest 16-bit precision and its fastest with float32 storage (precision.BY_SPEED):
    bf16 and tf32 from sm80 on, else fp16 and fp32."""
    from ditbench.hardware.precision import BY_SPEED, LOW_PRECISIONS

    ampere = bud.target.bf16 and (sheet is None or sheet.bf16)
    low = next(p for p in BY_SPEED if p in LOW_PRECISIONS and (ampere or p != "bf16"))
    full = next(p for p in BY_SPEED if p not in LOW_PRECISIONS and (ampere or p != "tf32"))
    return low, full


def micro_batches(global_batch: int, gpus: int, allowed: list[int] | None) -> list[int]:
    if global_batch % gpus:
        raise UserError(
            f"--global-batch {global_batch} does not split over {gpus} GPUs; give a multiple of {gpus}"
        )
    per_gpu = global_batch // gpus
    sizes = [b for b in range(1, per_gpu + 1) if per_gpu % b == 0 and (allowed is None or b in allowed)]
    if not sizes:
        raise UserError(f"--batches: none of {allowed} divides the {per_gpu} images per GPU of a step")
    return sizes


def search(
    model: str,
    bud: Budget,
    speed: SpeedOptions,
    precisions: tuple[str, ...],
    ckpts: tuple[str, ...],
    batches: list[int],
    global_batch: int,
    base: dict[str, Any],
    disk: bool = True,
) -> Answer:
    from ditbench.plan.predict import series_trace, step_time_of

    target = cuda_target(None)  # one trace serves every GPU
    sheet = speed.sheet or datasheet(bud.card)
    cal = speed.calibration or shipped()
    options = []
    for precision, ckpt, batch in itertools.product(precisions, ckpts, batches):
        accum = global_batch // (speed.gpus * batch)
        cell = normalize({**base, "model": model, "precision": precision, "grad_ckpt": ckpt,
                          "batch_size": batch, "grad_accum": accum})  # fmt: skip
        series = series_trace(trace_knobs(cell, target), target, disk=disk)
        t = step_time_of(series, cell, sheet, cal, speed.gpus)
        options.append(Option(cell, t.steps_per_s * global_batch, t.steps_per_s, series))
    options.sort(key=lambda o: -o.rate)
    dropped = None
    capacity = bud.capacity
    for option in options:
        batch = option.config["batch_size"]
        live = option.series.live_peak(batch)
        if capacity is not None and live > capacity:  # the allocator holds at least what is live
            option.need_gib = live / 2**30 + bud.context_gib
        else:
            option.pred = predict_budgets(option.config, [batch], [bud], disk, speed)[0][0]
            if option.pred.status in ("fits", "predicted"):
                return Answer(model, option, dropped, len(options))
        dropped = option
    return Answer(model, None, dropped, len(options))


def row(answer: Answer, speed_band: float | None, memory_band: float) -> dict[str, Any]:
    """An answer as the JSON row and the figures the text shows; intervals: speed.band."""
    out: dict[str, Any] = {"model": answer.model, "fits": bool(answer.best), "searched": answer.searched}
    b, d = answer.best, answer.dropped
    if d is not None:
        need = d.need_gib if d.pred is None else d.pred.device_gib
        out["next_faster"] = {**_setting(d), IMG: d.rate, "needs_gib": need,
                              "reason": None if d.pred is None else d.pred.reason}  # fmt: skip
    if b is None:
        return out
    p = b.pred
    memory = p.device_gib if p.device_gib is not None else p.peak_allocated_gib
    days = p.time_to_target["days"]  # to the goal's steps, at the setting's steps/s
    out.update(
        _setting(b),
        memory_gib=memory,
        memory_interval=band(memory, memory_band),
        tight=is_tight(p),
        **{IMG: b.rate, f"{IMG}_interval": band(b.rate, speed_band)},
        days=days,
        days_interval=None
        if speed_band is None
        else [days / (1 + speed_band / 100), days / (1 - speed_band / 100)],
        gpu_hours=p.time_to_target["gpu_hours"],
        step_split_pct=p.step_split_pct,
        components=p.components,
        notes=p.notes,
    )
    return out


def _setting(o: Option) -> dict[str, Any]:
    c = o.config
    return {k: c[k] for k in ("precision", "grad_ckpt", "batch_size", "grad_accum")}


def _range(v: float, iv, fmt: str) -> str:
    text = format(v, fmt)
    return text if iv is None else f"{text} ({format(iv[0], fmt)}-{format(iv[1], fmt)})"


def text(doc: dict[str, Any], where: str, gpus: int, context_gib: float) -> str:
    """The answer (plan's JSON document) as at most ~25 lines: a table, why not faster, a legend."""
    rows = doc["answer"]
    lines = [
        f"{where}: the fastest setting that fits, per model, at {doc['global_batch']} images a step "
        f"({doc['steps']:,} steps):",
        "",
        "| model | precision | ckpt | batch x accum | memory GiB | img/s | days | GPU-hours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    why = []
    for r in rows:
        if r["fits"]:
            setting = f"{r['precision']} | {r['grad_ckpt']} | {r['batch_size']} x {r['grad_accum']}"
            lines.append(
                f"| {r['model']} | {setting} "
                f"| {_range(r['memory_gib'], r['memory_interval'], '.1f')}{' tight' if r['tight'] else ''} "
                f"| {_range(r[IMG], r[f'{IMG}_interval'], ',.0f')} "
                f"| {_range(r['days'], r['days_interval'], '.1f')} | {r['gpu_hours']:,.0f} |"
            )
        else:
            lines.append(f"| {r['model']} | does not fit | | | | | | |")
        d = r.get("next_faster")
        if d is None:
            why.append(f"{r['model']}: none; this is the fastest of the {r['searched']} settings searched")
        else:
            setting = f"{d['precision']}, ckpt {d['grad_ckpt']}, {d['batch_size']} x {d['grad_accum']}"
            need = "" if d["needs_gib"] is None else f" needs {d['needs_gib']:.1f} GiB"
            why.append(f"{r['model']}: {setting} ({d[IMG]:,.0f} img/s){need}")
    lines += ["", "Next faster setting, dropped (it does not fit):", *[f"  {w}" for w in why], ""]
    saves = [
        f"{r['model']} {r['latents'][IMG] / r[IMG] - 1:+.0%} img/s, "
        f"{r['latents']['memory_gib'] - r['memory_gib']:+.2f} GiB"
        for r in rows
        if "latents" in r
    ]
    if saves:
        head = "Images go through the VAE every step; on latents extracted once (`ditbench extract-latents`):"
        lines += [
            head,
            *textwrap.wrap("; ".join(saves), 108, initial_indent="  ", subsequent_indent="  "),
            "",
        ]
    legend = (
        "precision: bf16/fp16 autocast, tf32 fp32 with tensor-core matmuls, fp32 strict; ckpt: activation "
        "checkpointing of no, every second (every_2) or every block (full); batch x accum: images per GPU "
        f"per micro-batch x micro-batches per step (x {gpus} GPU(s) = {doc['global_batch']}); memory: "
        f"what the card holds at the peak (allocator reserve + {context_gib:g} GiB CUDA context); img/s: "
        "training images a second over all GPUs; days, GPU-hours: to the steps above. (a-b): "
        + doc["interval_note"]
        + " `--full`: every setting's memory and speed, and the decision tree; `--json`: all of it."
    )
    return "\n".join(lines + textwrap.wrap(legend, 110))


def plan(bud: Budget, speed: SpeedOptions, models, precisions, ckpts, batches, global_batch: int, base,
         disk: bool = True) -> tuple[dict[str, Any], str]:  # fmt: skip
    """The answer for each model: (the JSON document, the text)."""
    found = [search(m, bud, speed, precisions, ckpts, batches, global_batch, base, disk) for m in models]
    images = isinstance(base.get("data"), dict)
    steps = speed.target_steps if not speed.target_images else math.ceil(speed.target_images / global_batch)
    cal = speed.calibration or shipped()
    memory_band = memory_band_pct()
    rows = [row(a, cal.band_pct, memory_band) for a in found]
    if images:  # the same settings on pre-extracted latents: what extracting them saves
        for r, a in zip(rows, found, strict=True):
            if a.best is not None:
                lat = {**a.best.config, "data": "synthetic"}
                p = predict_budgets(lat, [lat["batch_size"]], [bud], disk, speed)[0][0]
                r["latents"] = {IMG: p.predicted_images_per_s, "memory_gib": p.device_gib}
    speed_text = (
        f"+-{cal.band_pct:g}% (the largest error of {cal.cells} cells each predicted by a fit without it; "
        f"{cal.source})."
        if cal.band_pct is not None
        else "without a band (fewer than 3 calibration cells)."
    )
    note = (
        f"the interval the measured errors give: memory +-{memory_band:g}% (the largest error over "
        f"{len(memory_errors_pct())} H200 cells, rounded up; tight: the card may not hold it), speed "
        + speed_text
    )
    name = bud.card or f"a {bud.memory_gib:g} GiB card"
    where = f"{name} ({bud.memory_gib:.2f} GiB usable) x {speed.gpus} GPU{'s' if speed.gpus > 1 else ''}"
    doc = {"global_batch": global_batch, "steps": steps, "answer": rows, "interval_note": note}
    return doc, text(doc, where, speed.gpus, bud.context_gib)
