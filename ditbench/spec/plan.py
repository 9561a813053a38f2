"""`ditbench plan`'s request: the default grid's axes and how to predict, validated once from its flags.
Each error names the flag.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ditbench.precision import PRECISIONS
from ditbench.spec.base import SpecModel
from ditbench.spec.knobs import MAX_BATCH_SIZE, MAX_PROCESSES, GradCkpt, Model
from ditbench.validation import rule

MAX_JOBS = 64
MAX_TARGET = 10**12


def _count(template: str, low: int, high: int | None = None, **more: Any) -> Any:
    """An integer flag from `low` to `high` (None when not given), `template` its error."""
    one = Annotated[int, Field(strict=True, ge=low, le=high, **more)]
    return Annotated[one | None, rule(template), Field(default=None)]


Precision = Annotated[
    Literal[PRECISIONS], rule(f"--precisions: unknown precision {{value}}; valid: {', '.join(PRECISIONS)}")
]
Batch = Annotated[
    int,
    Field(strict=True, ge=1, le=MAX_BATCH_SIZE),
    rule(f"--batches takes integers from 1 to {MAX_BATCH_SIZE}, got {{value}}"),
]


class PlanRequest(SpecModel):
    # the default grid (None: a suite's cells, or the flag's default in plan.grid)
    models: list[Model] | None = None
    precisions: list[Precision] | None = None
    grad_ckpt: list[GradCkpt] | None = None
    batches: list[Batch] | None = None
    image_size: _count("--image-size must be a positive multiple of 8, got {value}", 8, multiple_of=8)
    # how to predict
    context_gib: Annotated[
        Annotated[float, Field(ge=0, allow_inf_nan=False)] | None,
        rule("--context-gib must be a finite number of GiB >= 0, got {value}"),
    ] = None
    jobs: _count(f"--jobs must be between 1 and {MAX_JOBS}, got {{value}}", 1, MAX_JOBS)
    target_batch: _count("--target-batch must be a positive integer, got {value}", 1)
    gpus: _count(f"--gpus must be an integer from 1 to {MAX_PROCESSES}, got {{value}}", 1, MAX_PROCESSES)
    target_steps: _count("--target-steps must be an integer from 1 to 10^12, got {value}", 1, MAX_TARGET)
    target_images: _count("--target-images must be an integer from 1 to 10^12, got {value}", 1, MAX_TARGET)
    global_batch: _count("--global-batch must be an integer from 1 to 1048576, got {value}", 1, 1 << 20)
