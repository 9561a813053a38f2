"""The cell contract: one table of knobs, one validation, and every knob reaches the training step."""

import math

import pytest

from ditbench.core.errors import UserError
from ditbench.spec.cell import CellSpec, Steps
from ditbench.spec.knobs import KNOBS, TRAIN_KNOBS, Knobs


def test_knobs_are_validated_however_they_are_built():
    knobs = Knobs(model="DiT-XL-2", grad_ckpt="on", batch_size=3, lr=2e-4, optimizer_impl="for-loop")
    assert (knobs.model, knobs.grad_ckpt, knobs.batch_size, knobs.lr) == ("DiT-XL/2", "full", 3, 2e-4)
    assert knobs == Knobs(
        **{
            "model": "DiT-XL/2",
            "grad_ckpt": "full",
            "batch_size": 3,
            "lr": 2e-4,
            "optimizer_impl": "for-loop",
        }
    )
    assert set(KNOBS) - set(TRAIN_KNOBS) == {"gpus", "nodes", "strategy", "threads"}  # how processes start
    with pytest.raises(UserError, match="batch_size must be an integer from 1 to 1,048,576"):
        knobs.replace(batch_size=0)


@pytest.mark.parametrize(
    "values, words",
    [
        ({"model": "DiT-T/8", "lr": math.nan}, "lr must be a finite number"),
        ({"model": "DiT-T/8", "lr": math.inf}, "lr must be a finite number"),
        ({"model": "DiT-T/8", "seed": 2**63}, "seed must be an integer from 0"),
        ({"model": "DiT-T/8", "precision": "fp8"}, "fp32, tf32, fp16, bf16"),
        ({"model": "DiT-T/8", "grad_ckpt": "all"}, "every_K"),
        ({"model": "DiT-T/8", "optimizer": "sgd"}, "adamw"),
        ({"model": "DiT-T/8", "attention": "xformers"}, "math, sdpa, flash, efficient, cudnn"),
        ({"model": "DiT-T/8", "impl": "diffusers", "grad_ckpt": "every_2"}, "impl diffusers"),
        ({"model": "DiT-T/8", "image_size": 72}, "multiple of 64"),
        ({"model": "DiT-T/8", "strategy": "fsdp"}, "needs gpus x nodes > 1"),
        ({"model": "DiT-T/8", "batch_size": True}, "batch_size must be an integer"),
        ({"model": "DiT-T/8", "bacth_size": 2}, "Did you mean `batch_size`"),
        ({"batch_size": 2}, "no model given"),
        ({"model": "DiT-T/8", "threads": 0}, "threads must be an integer from 1 to 4,096 or auto, got 0"),
        ({"model": "DiT-T/8", "threads": "all"}, "from 1 to 4,096 or auto, got a string 'all'"),
        ({"model": "DiT-T/8", "threads": True}, "threads must be an integer"),
        ({"model": "DiT-T/8", "threads": 2.0}, "threads must be an integer"),
    ],
)
def test_bad_values_are_refused_where_they_enter(values, words):
    with pytest.raises(UserError, match=words):
        Knobs(**values)
    if "bacth_size" not in values:  # the same rule guards knobs built in code
        with pytest.raises(UserError, match=words):
            Knobs(**values)


def test_attention_and_optimizer_reach_the_step():
    from ditbench.train.step import Trainer

    trainer = Trainer(Knobs(model="DiT-T/8", image_size=64, batch_size=2, attention="math"))
    assert {b.attn.attention for b in trainer.base_model.blocks} == {"math"}
    assert trainer.attention_kernel == "math"
    assert type(trainer.optimizer).__name__ == "AdamW"
    with pytest.raises(UserError, match="attention 'xformers'"):
        from ditbench.models import build_model

        build_model("DiT-T/8", image_size=64, attention="xformers")  # the model's own hook refuses it too


def test_spec_round_trips_through_the_record_and_refuses_unknown_keys():
    knobs = Knobs(**{"model": "DiT-T/8", "gpus": 2, "batch_size": 4})
    spec = CellSpec(knobs, "cpu", Steps(1, 2, 0.0), smoke_steps=5, gpu_memory_gib=None)
    config = spec.model_dump(mode="json")
    assert config["global_batch"] == 8 and config["card"] is None
    assert CellSpec.read(config, "config") == spec
    with pytest.raises(UserError, match="unknown key `gpu_memory_gb`"):
        CellSpec.read({**config, "gpu_memory_gb": 24}, "config")
    with pytest.raises(UserError, match="missing card"):
        CellSpec.read({k: v for k, v in config.items() if k != "card"}, "config")
    with pytest.raises(UserError, match="global_batch"):
        CellSpec.read({**config, "global_batch": 4}, "config")
