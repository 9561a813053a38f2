"""The card table as the planner reads it: every card has an architecture, generic names say what they
chose, the 32 GB class, "tight" fits, and torch's kernel-override warning kept from the user."""

from __future__ import annotations

import warnings

import pytest

from ditbench.hardware.cards import CARDS, MEMORY_CLASSES_GB, ambiguity, cards_in_class, find_card
from ditbench.plan.emulation import CARD_ARCH, cuda_autocast
from ditbench.plan.predict import Prediction
from ditbench.plan.render import TIGHT_MARGIN, _figure, is_tight


def test_every_card_has_an_architecture_and_a_class():
    assert {c.name for c in CARDS} == set(CARD_ARCH)
    assert {c.memory_class_gb for c in CARDS} == set(MEMORY_CLASSES_GB)


def test_the_32_gb_cards():
    assert [(c.name, c.usable_gib) for c in cards_in_class(32)] == [("RTX 5090", 31.84), ("V100-32GB", 31.75)]
    assert find_card("rtx-5090").name == "RTX 5090" and find_card("Tesla V100-SXM2-32GB").name == "V100-32GB"
    assert CARD_ARCH["RTX 5090"] == (12, 0) and CARD_ARCH["V100-32GB"] == (7, 0)


@pytest.mark.parametrize(
    "name, chosen, other",
    [("A100", "A100-80GB (79.35 GiB usable)", "A100-40GB (39.39 GiB)"),
     ("nvidia v100", "V100-32GB (31.75 GiB usable)", "V100 16GB (15.77 GiB)")],
)  # fmt: skip
def test_a_generic_name_says_what_it_chose_and_the_alternatives(name, chosen, other):
    note = ambiguity(name)
    assert f"chose {chosen}" in note and other in note
    assert find_card(name).name == chosen.split(" ")[0]


@pytest.mark.parametrize("name", ["A100-40GB", "A100 80GB", "H100", "A10", "RTX 4090"])
def test_an_exact_name_is_not_ambiguous(name):
    assert ambiguity(name) is None


def _pred(device_gib: float, memory_gib: float = 24.0, status: str = "fits", measured: bool = False):
    return Prediction(
        "DiT-L/4", "bf16", "none", 32, "cuda", "RTX 4090", memory_gib, status,
        peak_allocated_gib=device_gib - 1, peak_reserved_gib=device_gib - 0.5, device_gib=device_gib,
        measured=measured,
    )  # fmt: skip


def test_a_fit_within_the_planners_error_of_the_limit_is_tight():
    edge = 24.0 / (1 + TIGHT_MARGIN)  # 22.64 GiB: the largest prediction that is not tight
    assert not is_tight(_pred(edge - 0.01)) and _figure(_pred(edge - 0.01)) == "22.6"
    assert is_tight(_pred(edge + 0.01)) and _figure(_pred(edge + 0.01)) == "22.7 tight"
    assert not is_tight(_pred(24.5, status="oom")) and _figure(_pred(24.5, status="oom")) == "(24.5)"
    assert not is_tight(_pred(23.5, measured=True))  # a measured fit is no prediction


def test_the_tight_margin_covers_the_anchors_errors():
    """The margin is the planner's largest error on the committed H200 table (reserved decides a fit)."""
    import json
    from pathlib import Path

    rows = json.loads((Path(__file__).resolve().parents[2] / "reports/plan_vs_h200/rows.json").read_text())
    eager = [r for r in rows["anchors"] if not r["compile"] and r["measured_reserved_gib"] is not None]
    worst = max(abs(r["predicted_reserved_gib"] / r["measured_reserved_gib"] - 1) for r in eager)
    worst = max(worst, *(abs(r["error_pct"]) / 100 for r in eager))
    assert worst <= TIGHT_MARGIN < worst + 0.01


def test_torchs_kernel_override_warning_is_not_shown(monkeypatch):
    import torch

    real = torch.library.Library.impl

    def impl(self, *args, **kwargs):
        warnings.warn(
            "Warning only once for all operators, other operators may also be overridden.\n"
            "  Overriding a previously registered kernel for the same operator and the same dispatch key",
            UserWarning,
            stacklevel=2,
        )
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.library.Library, "impl", impl)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with cuda_autocast():
            warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["another warning"]
