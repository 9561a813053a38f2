"""A cell's quality phase: evaluate at the end of the smoke run, or train a quality run to each listed step.

Training time is the training steps' wall clock alone (`sample_s` and `score_s` are apart);
`train_gpu_s` is processes x wall. Evaluations finished before a failure are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ditbench.faults import check_finite, failure
from ditbench.quality.evaluation import SPLIT, Evaluator
from ditbench.spec.cell import CellSpec

CHECK_EVERY = 100  # training steps between reads of the loss (a host synchronisation) in a quality run


def ema_model(trainer, spec: CellSpec, ctx):
    """The EMA weights as a bare model in eval mode, on every rank: a plain or DDP model's EMA is a full
    copy; under FSDP2 every rank gathers the sharded EMA's full tensors (a collective) into its own."""
    if trainer.ema.model is not None:
        return trainer.ema.model
    import torch

    from ditbench.models.build import build_model

    k = spec.knobs
    full = {
        name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()
        for name, t in trainer.ema.state_dict().items()
    }
    with torch.device(ctx.device):
        model = build_model(k.model, image_size=k.image_size, num_classes=k.num_classes, impl=k.impl)
    missing, unexpected = model.load_state_dict(full, strict=False)
    assert not unexpected and not [m for m in missing if m in dict(model.named_parameters())]
    return model.eval().requires_grad_(False)


def run_quality(
    spec: CellSpec,
    ctx,
    build_trainer: Callable[[CellSpec, Any], Any],
    *,
    smoke: tuple[Any, float] | None = None,
    out_dir: str | Path | None = None,
    cell_id: str = "cell",
    extractor=None,
) -> dict[str, Any]:
    """The record's `quality` field (complete on rank 0). `smoke`: (the smoke run's trainer, its training
    seconds) for `at: [smoke_end]`. The phase's failures are the field's status, never raised."""
    q = spec.quality
    field: dict[str, Any] = {
        "status": "error",
        "reason": None,
        "sampler": q.sampler.model_dump(),
        "samples": q.samples,
        "seeds": list(q.seeds),
        "at": "smoke_end" if q.at_smoke_end else list(q.at),
        "ranks": ctx.world_size,
        "split": SPLIT if ctx.world_size > 1 else "one process samples and scores",
        "evaluations": [],
    }
    grid = (Path(out_dir), cell_id) if out_dir is not None else None
    try:
        evaluator = Evaluator(spec, ctx, extractor)
        field.update(evaluator.prepare())
        field["decoder"] = evaluator.decoder_desc
        if q.at_smoke_end:
            if smoke is None:
                raise RuntimeError("the smoke run did not finish, so there is nothing to evaluate at its end")
            trainer, wall = smoke
            evaluation = evaluator.evaluate(ema_model(trainer, spec, ctx), spec.smoke_steps, wall, grid)
            field["evaluations"].append(evaluation)
        else:
            _quality_run(spec, ctx, build_trainer, evaluator, field, grid)
        field.update(status="ok")
    except Exception as err:  # noqa: BLE001 - the phase's failure is this field's status, not the cell's
        field.update(failure(err))
    return _ordered(field)


FIELD_ORDER = ("status", "reason", "reference", "inception", "banner", "sampler", "samples", "seeds", "at")


def _ordered(field: dict[str, Any]) -> dict[str, Any]:
    """The field in reading order, each evaluation's warnings said once for the whole field."""
    evaluations = [e for e in field.pop("evaluations") if e is not None]
    warnings: list[str] = []
    for e in evaluations:
        warnings += [w for w in e.pop("warnings", []) if w not in warnings]
    out = {k: field.pop(k) for k in FIELD_ORDER if k in field}
    out.update(field)
    if warnings:
        out["warnings"] = warnings
    out["evaluations"] = evaluations
    return out


def _quality_run(spec, ctx, build_trainer, evaluator: Evaluator, field: dict, grid) -> None:
    """A fresh trainer trained to each listed step and evaluated there; losses checked every so often."""
    import torch

    trainer = build_trainer(spec, ctx)
    done, wall = 0, 0.0
    for step in spec.quality.at:
        losses = []
        start = evaluator._now()
        while done < step:
            losses.append(trainer.step(trainer.next_batch()))
            done += 1
            if len(losses) >= CHECK_EVERY or done == step:
                check_finite(losses, done - len(losses) + 1, "quality run")
                field.setdefault("train_loss", []).append([done, float(torch.stack(losses).float().mean())])
                losses = []
        wall += evaluator._now() - start
        field["evaluations"].append(evaluator.evaluate(ema_model(trainer, spec, ctx), step, wall, grid))
    field["train_steps"] = done


def quality_failed(field: dict | None) -> bool:
    """Whether a rank's quality phase raised (its peers cannot go on); a non-finite loss is agreed on."""
    return field is not None and field.get("status") not in ("ok", "nan_loss")
