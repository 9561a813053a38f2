"""Text and JSON of a plan: the table of predicted cells, the largest batch per setting, the decision tree."""

from __future__ import annotations

from typing import Any

from ditbench.plan.grid import Advice, largest_batches
from ditbench.plan.predict import Prediction
from ditbench.plan.speed import memory_band_pct, shipped

_COMPONENT_NAMES = {"gradients": "grads", "optimizer": "Adam", "ema": "EMA"}  # the others by their name


# A fit is "tight" when the card holds less than this fraction more than the prediction: the planner's
# memory band (speed.memory_band_pct), as the report judges a fit.
TIGHT_MARGIN = memory_band_pct() / 100


def is_tight(p: Prediction) -> bool:
    """A predicted fit within the planner's error of the card's limit (a measured fit is not)."""
    return (
        p.fits is True
        and not p.measured
        and p.memory_gib is not None
        and p.device_gib is not None
        and p.device_gib * (1 + TIGHT_MARGIN) > p.memory_gib
    )


def _figure(p: Prediction) -> str:
    """What a table cell shows: the GiB the card must hold; (x) does not fit; * measured; tight."""
    if p.status == "unsupported":
        return "n/a"
    if p.status == "error":
        return "err"
    value = p.device_gib if p.device_gib is not None else p.peak_allocated_gib
    if value is None:
        return "oom*" if p.measured else "?"
    text = f"{value:.1f}" if value >= 0.1 or p.device == "cuda" else f"{value * 1024:.0f}M"
    if p.fits is False:
        text = f"({text})"
    elif is_tight(p):
        text += " tight"
    return text + ("*" if p.measured else "")


def cells_table(preds: list[Prediction]) -> str:
    batches = sorted({p.batch_size for p in preds})
    rows: dict[tuple, dict[int, Prediction]] = {}
    for p in preds:
        key = (p.model, p.precision, p.grad_ckpt, p.config.get("image_size"), p.config.get("impl"))
        rows.setdefault(key, {})[p.batch_size] = p
    show_size = len({k[3] for k in rows}) > 1
    show_impl = len({k[4] for k in rows}) > 1
    largest = largest_batches(preds)
    head = ["model", "precision", "ckpt"] + (["px"] if show_size else []) + (["impl"] if show_impl else [])
    fit_column = any(p.fits is not None for p in preds)
    header = head + [f"bs {b}" for b in batches] + (["largest batch that fits"] if fit_column else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, by_batch in rows.items():
        model, precision, ckpt, size, impl = key
        cells = [model, precision, ckpt] + ([str(size)] if show_size else []) + ([impl] if show_impl else [])
        cells += [_figure(by_batch[b]) if b in by_batch else "" for b in batches]
        if fit_column:
            best = largest.get((model, precision, ckpt))
            supported = any(p.status != "unsupported" for p in by_batch.values())
            cells.append(str(best.batch_size) if best else ("none" if supported else "n/a"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_SPLIT_NAMES = {"matmul": "mm", "attention": "attn", "elementwise": "elem", "optimizer": "opt",
                "launch_overhead": "launch", "communication": "comm"}  # fmt: skip


def speed_table(preds: list[Prediction]) -> str | None:
    """Per predicted cell that fits (or has no card limit): steps/s, images/s, days and GPU-hours to
    the target, and the two largest parts of a step; None when no cell has a speed prediction."""
    rows = [p for p in preds if p.predicted_steps_per_s is not None and p.fits is not False]
    if not rows:
        return None
    lines = [
        "| model | precision | ckpt | bs | steps/s | img/s | days | GPU-h | where the step goes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in rows:
        parts = sorted(p.step_split_pct.items(), key=lambda kv: -kv[1])[:3]
        where = ", ".join(f"{_SPLIT_NAMES.get(k, k)} {v:.0f}%" for k, v in parts if v >= 1)
        t = p.time_to_target or {}
        lines.append(
            f"| {p.model} | {p.precision} | {p.grad_ckpt} | {p.batch_size} | {p.predicted_steps_per_s:.2f} | "
            f"{p.predicted_images_per_s:.0f} | {t.get('days', float('nan')):.1f} | "
            f"{t.get('gpu_hours', float('nan')):.0f} | {where} |"
        )
    return "\n".join(lines)


def reasons(preds: list[Prediction]) -> list[str]:
    """One line per distinct reason a cell was not predicted (n/a, err)."""
    seen: dict[str, list[str]] = {}
    for p in preds:
        if p.status in ("unsupported", "error") and p.reason:
            cells = seen.setdefault(f"{'n/a' if p.status == 'unsupported' else 'err'}: {p.reason}", [])
            name = f"{p.model} {p.precision} ckpt={p.grad_ckpt}"
            if name not in cells:
                cells.append(name)
    return [
        f"{reason} ({', '.join(cells[:3])}{', ...' if len(cells) > 3 else ''})"
        for reason, cells in seen.items()
    ]


def _size(gib: float) -> str:
    return f"{gib:.2f} GiB" if gib >= 0.01 else f"{gib * 1024:.1f} MiB"


def components_text(p: Prediction) -> str:
    shown = {k: v for k, v in p.components.items() if v > 0 or k == "context"}
    return " + ".join(f"{_COMPONENT_NAMES.get(k, k)} {_size(v)}" for k, v in shown.items())


def tree_table(advice: list[Advice], target_batch: int) -> str:
    lines = [
        "| class | smallest card | largest model that trains | setting | batch | card holds GiB "
        "| predicted steps/s (days) | next step up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, a in enumerate(advice):
        card = f"{a.card} ({a.memory_gib:.2f} GiB)"
        pace = "-"
        if a.model is None:
            model = setting = batch = holds = "none"
        else:
            s = a.setting
            model = a.model
            setting = f"{s.precision}, ckpt {s.grad_ckpt}" + ("*" if s.measured else "")
            batch = str(s.batch_size) + ("" if s.batch_size >= target_batch else " (largest that fits)")
            holds = f"{s.device_gib:.1f}" if s.device_gib is not None else f"{s.peak_allocated_gib:.1f}"
            holds += " tight" if is_tight(s) else ""
            if s.predicted_steps_per_s is not None and s.time_to_target:
                pace = f"{s.predicted_steps_per_s:.2f} ({s.time_to_target['days']:.1f} d)"
        if a.next_model is None:
            step = _next_class(a, advice[i + 1 :], target_batch)
        elif a.next_needs is None:
            step = f"{a.next_model}: not predicted"
        else:
            n = a.next_needs
            need = n.device_gib if n.device_gib is not None else n.peak_allocated_gib
            where = f"the {a.next_class_gb} GB class" if a.next_class_gb else "no class of the table"
            step = (
                f"{a.next_model} needs {need:.1f} GiB at least ({n.precision}, ckpt {n.grad_ckpt}, "
                f"bs {n.batch_size}): {where}"
            )
        cells = [f"{a.class_gb} GB", card, model, setting, batch, holds, pace, step]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _next_class(a: Advice, above: list[Advice], target_batch: int) -> str:
    """What the first larger class adds for the same model: a faster setting or a larger batch."""
    here = a.setting
    for b in above:
        s = b.setting
        if s is None or b.model != a.model:
            continue
        if (s.precision, s.grad_ckpt) != (here.precision, here.grad_ckpt) or s.batch_size > here.batch_size:
            return f"{b.class_gb} GB: {s.precision}, ckpt {s.grad_ckpt}, bs {s.batch_size}"
    return "the largest model already trains; no larger class of the table adds more"


def advice_details(advice: list[Advice]) -> str:
    shown = [a for a in advice if a.setting is not None and a.setting.components]
    return "\n".join(f"- {a.class_gb} GB, {a.model}: {components_text(a.setting)}" for a in shown)


def full_text(
    cells, main, series: int, seconds: float, measured: int | None, speed, advice, target_batch
) -> str:
    """The grid's table, its speeds, reasons and notes, and the decision tree (`plan --full`, a suite)."""
    where = (
        f"{main.card} ({main.memory_gib:.2f} GiB usable)"
        if main.card
        else (f"a {main.memory_gib:g} GiB card" if main.memory_gib is not None else "no card (no fit check)")
    )
    out = [
        f"ditbench plan: {len(cells)} cells in {series} series for {where}; CUDA context "
        f"{main.context_gib:g} GiB assumed; traced in {seconds:.0f} s"
        + (f"; {measured} cells measured (--results)" if measured is not None else ""),
        "",
        cells_table(cells),
    ]
    speeds = speed_table(cells)
    if speeds:
        cal = speed.calibration or shipped()
        goal = f"{speed.target_images:,} images" if speed.target_images else f"{speed.target_steps:,} steps"
        per = f" per GPU x {speed.gpus} GPUs (DDP)" if speed.gpus > 1 else ""
        band = (
            f"+-{cal.band_pct:g}%, the calibration's worst leave-one-out error"
            if cal.band_pct is not None
            else "no error band: fewer than 3 calibration cells"
        )
        head = f"Predicted speed{per} ({band}; calibrated on {cal.source}); days and GPU-hours to {goal}:"
        out += [f"\n{head}\n", speeds]
    out += [f"\n{line}" for line in reasons(cells)]
    out += [f"\nnote: {note}" for note in sorted({n for p in cells for n in p.notes})]
    if advice:
        out += [
            f"\nDecision tree ({_tree_cards(main)}; the fastest setting, by predicted images/s, "
            f"that reaches batch {target_batch}; days to the target at its batch):\n",
            tree_table(advice, target_batch),
        ]
        details = advice_details(advice)
        if details:
            out.append("\nWhat the recommended cells hold at their peak:\n" + details)
    return "\n".join(out)


def _tree_cards(main) -> str:
    if main.card is None and main.memory_gib is None:
        return "each class's smallest card"
    asked = main.card or f"a {main.memory_gib:g} GiB card"
    return f"its own class on the {asked} asked for, each other class on its smallest card"


def to_json(
    preds: list[Prediction], advice: list[Advice] | None, meta: dict[str, Any], target_batch: int
) -> dict[str, Any]:
    largest = largest_batches(preds)
    return {
        **meta,
        "tight_margin": TIGHT_MARGIN,
        "cells": [{**p.to_dict(), "tight": is_tight(p)} for p in preds],
        "largest_batch": [
            {"model": k[0], "precision": k[1], "grad_ckpt": k[2], "batch_size": v.batch_size if v else None}
            for k, v in largest.items()
        ],
        "tree": None if advice is None else [_advice_json(a) for a in advice],
        "target_batch": target_batch,
    }


def _advice_json(a: Advice) -> dict[str, Any]:
    """An advice row (its cells as their JSON), less the count of alternatives."""
    out = {k: v for k, v in vars(a).items() if k != "alternatives"}
    for k in ("setting", "next_needs"):
        out[k] = out[k].to_dict() if out[k] else None
    return out
