"""The suite's `quality:` section: validated key by key like every other setting, carried by the
cell's spec (and so its id and the record's config), refused where a cell cannot be evaluated."""

import copy

import pytest

from ditbench.core.errors import UserError
from ditbench.spec.cell import CellSpec, cell_id
from ditbench.spec.quality import QualitySpec, Sampler
from ditbench.spec.suite import parse_suite

PIXELS = {"pixels": "builtin:mpl-gray16"}


def suite(quality=None, **top):
    raw = {
        "name": "q",
        "device": "cpu",
        "defaults": {
            "model": "DiT-T/2",
            "image_size": 64,
            "num_classes": 2,
            "data": PIXELS,
            "smoke": {"steps": 20, "cells": "baseline"},
        },
        "matrix": {"precision": ["fp32", "bf16"]},
        "baseline": {"precision": "fp32"},
        **top,
    }
    if quality is not None:
        raw["quality"] = quality
    return parse_suite(raw, "q.yaml")


def test_the_section_applies_to_the_smoke_cells_by_default():
    s = suite({"reference": "builtin:mpl-gray16-ref", "samples": 64, "inception": "test"})
    fp32, bf16 = s.cells
    assert fp32.spec.quality == QualitySpec("builtin:mpl-gray16-ref", samples=64, inception="test")
    assert bf16.spec.quality is None and "quality" not in bf16.config
    assert fp32.config["quality"] == {
        "reference": "builtin:mpl-gray16-ref",
        "samples": 64,
        "sampler": {"name": "ddpm", "steps": 250, "cfg_scale": 1.5, "precision": "fp32"},
        "at": ["smoke_end"],
        "seeds": [0, 1],
        "inception": "test",
        "vae": None,
        "batch_size": 32,
        "grid": 16,
    }
    # the record's config reads back to the same spec: nothing is dropped between suite and cell
    assert CellSpec.read(fp32.config, "config") == fp32.spec


def test_a_quality_section_changes_the_ids_of_the_cells_it_applies_to_only():
    plain, evaluated = suite(), suite({"reference": "r.npz", "cells": "baseline", "samples": 10})
    assert plain.cells[0].cell_id != evaluated.cells[0].cell_id
    assert plain.cells[1].cell_id == evaluated.cells[1].cell_id
    other = suite({"reference": "r.npz", "cells": "baseline", "samples": 20})
    assert other.cells[0].cell_id != evaluated.cells[0].cell_id
    assert cell_id(evaluated.cells[0].spec) == evaluated.cells[0].cell_id


def test_steps_seeds_and_cells_in_their_long_forms():
    s = suite(
        {
            "reference": "r.npz",
            "at": [4000, 0, 1000],
            "seeds": [7, 3],
            "cells": [{"precision": "bf16"}],
            "sampler": {"name": "ddim", "steps": 50, "cfg_scale": 1.0},
        }
    )
    q = s.cells[1].spec.quality
    assert q.at == (0, 1000, 4000) and q.seeds == (7, 3) and s.cells[0].spec.quality is None
    assert q.sampler == Sampler("ddim", 50, 1.0, "fp32")
    assert suite({"reference": "r.npz", "seeds": 3, "cells": "all", "at": [5]}).cells[
        1
    ].spec.quality.seeds == (
        0,
        1,
        2,
    )


@pytest.mark.parametrize(
    "quality, needle",
    [
        ({"samples": 10}, "at `quality.reference`: a quality section needs a `reference`"),
        (
            {"reference": "r", "smaples": 10},
            "at `quality.smaples`: unknown key `smaples`. Did you mean `samples`?",
        ),
        ({"reference": "r", "samples": 1}, "at `quality.samples`: samples must be an integer from 2"),
        (
            {"reference": "r", "samples": True},
            "samples must be an integer from 2 to 10,000,000, got a boolean True",
        ),
        ({"reference": "r", "at": []}, "at must be [smoke_end] or a list of training steps"),
        ({"reference": "r", "at": [10, 10]}, "at lists a step twice"),
        ({"reference": "r", "at": [-1]}, "at `quality.at[0]`: at must be an integer from 0"),
        ({"reference": "r", "seeds": 0}, "seeds must be an integer from 1 to 64"),
        (
            {"reference": "r", "seeds": [1, 1]},
            "seeds must be a count from 1 to 64 or a list of distinct seeds",
        ),
        (
            {"reference": "r", "sampler": {"name": "euler"}},
            "at `quality.sampler.name`: unknown name 'euler'; valid: ddpm, ddim",
        ),
        (
            {"reference": "r", "sampler": {"steps": 2000}},
            "at `quality.sampler.steps`: steps must be an integer from 1 to 1,000",
        ),
        (
            {"reference": "r", "sampler": {"cfg_scale": 0.5}},
            "at `quality.sampler.cfg_scale`: cfg_scale must be a finite number in [1, 100]",
        ),
        ({"reference": "r", "sampler": "ddpm"}, "at `quality.sampler`: expected a mapping"),
        ({"reference": "r", "grid": 1000}, "grid must be an integer from 0 to 256"),
        ({"reference": "", "samples": 10}, "reference must be a path or a name"),
        (
            {"reference": "r", "cells": "some"},
            "expected one of smoke, all, baseline or a list of partial cells",
        ),
        ({"reference": "r", "cells": [{"precison": "bf16"}]}, "at `quality.cells[0].precison`: unknown key"),
        ({"reference": "r", "cells": [{"precision": "fp16"}]}, "`quality.cells`: selects no cell"),
        (
            {"reference": "r", "cells": "all"},
            "cell DiT-T/2 bf16 ckpt=none bs=32 cannot be evaluated: quality.at",
        ),
        ({"reference": "r", "vae": "ema"}, "pixel data decodes without a VAE"),
        ({"reference": "r", "samples": float("nan")}, "not a finite number"),
        ("r.npz", "at `quality`: expected a mapping"),
    ],
)
def test_mistakes_name_the_file_and_key(quality, needle):
    with pytest.raises(UserError) as err:
        suite(quality)
    assert needle in str(err.value) and "suite q.yaml" in str(err.value)


@pytest.mark.parametrize(
    "data, vae, needle",
    [
        ("synthetic", None, "trains on synthetic latents"),
        ({"images": "imgs", "vae": "random"}, None, "its VAE is random"),
        ({"images": "imgs", "vae": "ema"}, "mse", "is not the VAE it trains with"),
        ({"latents": "l.npz"}, None, "does not say which VAE made it"),
        ({"latents": "l.npz"}, "random", "quality.vae random"),
    ],
)
def test_cells_whose_samples_cannot_be_decoded_meaningfully_are_refused(data, vae, needle):
    q = {"reference": "r", "cells": "all", "at": [10]}
    if vae:
        q["vae"] = vae
    raw = copy.deepcopy(q)
    with pytest.raises(UserError, match=needle):
        suite(raw, defaults={"model": "DiT-T/2", "image_size": 64, "data": data})


def test_decoders_follow_the_data():
    q = QualitySpec("r", vae="mse")
    s = suite(
        {"reference": "r", "cells": "all", "at": [10], "vae": "mse"},
        defaults={"model": "DiT-T/2", "data": {"latents": "l.npz"}},
    )
    assert q.decoder(s.cells[0].spec.knobs) == "mse"
    s = suite(
        {"reference": "r", "cells": "all", "at": [10]},
        defaults={"model": "DiT-T/2", "data": {"images": "d", "vae": "ema"}},
    )
    assert s.cells[0].spec.quality.decoder(s.cells[0].spec.knobs) == "ema"


def test_a_quality_schedule_of_too_many_evaluations_is_refused_before_it_is_built():
    from ditbench.spec.quality import MAX_EVALUATIONS

    steps = list(range(0, 200 * 10, 10))  # 200 steps x 64 seeds = 12,800 evaluations of each cell
    with pytest.raises(UserError, match=r"200 steps x 64 seeds is 12,800 evaluations.*cap of 10,000"):
        suite({"reference": "r.npz", "cells": "all", "samples": 10, "at": steps, "seeds": 64})
    assert MAX_EVALUATIONS == 10_000
    assert suite({"reference": "r.npz", "cells": "all", "samples": 10, "at": steps[:150], "seeds": 64})
