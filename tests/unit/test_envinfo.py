"""`ditbench env` checks that torch and torchvision load together (a compiled op, not only the import)."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from ditbench.cli import env as envinfo
from ditbench.cli import main


@pytest.fixture
def broken_torchvision(monkeypatch):
    """A torchvision that imports but whose compiled extension does not match torch (another index)."""
    vision = types.ModuleType("torchvision")
    vision.__version__ = "0.21.0+cpu"
    ops = types.ModuleType("torchvision.ops")

    def nms(boxes, scores, iou):
        raise RuntimeError("operator torchvision::nms does not exist")

    ops.nms = nms
    vision.ops = ops
    monkeypatch.setitem(sys.modules, "torchvision", vision)
    monkeypatch.setitem(sys.modules, "torchvision.ops", ops)
    monkeypatch.setattr(torch, "__version__", "2.14.1+cpu")


def test_a_matching_torchvision_passes():
    result = envinfo.torchvision_check()
    assert result["ok"] is True and result["error"] is None and result["fix"] is None
    assert result["torchvision"] == sys.modules["torchvision"].__version__


def test_a_mismatched_torchvision_is_named_with_the_fix(broken_torchvision):
    assert envinfo.torchvision_check() == {
        "ok": False,
        "torch": "2.14.1+cpu",
        "torchvision": "0.21.0+cpu",
        "error": "RuntimeError: operator torchvision::nms does not exist",
        "fix": "pip install torch==2.14.1 torchvision==0.29.1 --index-url https://download.pytorch.org/whl/cpu",
    }


def test_env_records_the_failure_and_exits_2(broken_torchvision, capsys):
    assert main(["env", "--json"]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out)["torchvision_check"]["ok"] is False
    err = " ".join(captured.err.split())
    assert err.startswith("ditbench: error: torch 2.14.1+cpu and torchvision 0.21.0+cpu do not load together")
    assert "operator torchvision::nms does not exist" in err
    assert err.endswith(
        "Install matching versions from the same index: pip install torch==2.14.1 torchvision==0.29.1 "
        "--index-url https://download.pytorch.org/whl/cpu"
    )
    assert main(["env"]) == 2
    assert "torchvision      0.21.0+cpu: BROKEN" in capsys.readouterr().out


def test_a_torchvision_that_does_not_import_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    result = envinfo.torchvision_check()
    assert (result["ok"], result["torchvision"]) == (False, None)
    assert result["error"].startswith("ModuleNotFoundError: import of torchvision halted")
    assert result["fix"] == "pip install torch==2.6.0 torchvision==0.21.0"


@pytest.mark.parametrize(
    "torch_version, vision",
    [("2.14.1+cu130", "0.29.1+cu130"), ("2.6.0", "0.21.0"), ("2.0.1", "0.15.1")],
)
def test_the_matching_torchvision_release(torch_version, vision):
    assert envinfo._matching_torchvision(torch_version) == vision
