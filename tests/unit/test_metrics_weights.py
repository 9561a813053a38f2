"""Inception weights: no code ever runs from a weight file, by any route; official or not is said.

The payload is torch-fidelity's state dict with one `num_batches_tracked` replaced by an object
that writes a marker file when unpickled (the attack of issue 9). Each route that names a
weight file (`--inception-weights`, $DITBENCH_INCEPTION_WEIGHTS, the torch hub cache) must
exit 2 with a message naming the file, and the marker must never appear.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from metrics_support import calibrated_weights_file

from ditbench.cli import main
from ditbench.core.errors import UserError
from ditbench.metrics import weights
from ditbench.metrics.inception import InceptionV3, build_calibrated_inception
from ditbench.metrics.weights import (
    load_network,
    load_weight_file,
    state_dict_sha256,
)


class Payload:
    """Unpickling this writes `marker`: what a crafted weight file would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


@pytest.fixture(scope="module")
def attack(tmp_path_factory):
    root = tmp_path_factory.mktemp("attack")
    marker = root / "MARKER"
    state = InceptionV3().state_dict()
    state["Mixed_6d.branch1x1.bn.num_batches_tracked"] = Payload(marker)
    payload = root / weights.WEIGHTS_FILE_NAME
    torch.save(state, payload)
    rng = np.random.default_rng(0)
    for name in ("samples", "ref"):
        np.savez(root / f"{name}.npz", arr_0=rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8))
    return root, payload, marker


def test_the_payload_is_live(attack, tmp_path):
    """Guard against a test that cannot fail: unpickled naively, this payload does run."""
    marker = tmp_path / "proof"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.read_text() == "code ran"


def _fid(root, *extra):
    return [
        "fid",
        "--samples",
        str(root / "samples.npz"),
        "--ref",
        str(root / "ref.npz"),
        "--no-cache",
        *extra,
    ]


@pytest.mark.parametrize("route", ["option", "environment", "hub_cache"])
def test_no_route_unpickles_a_weight_file(route, attack, tmp_path, monkeypatch, capsys):
    root, payload, marker = attack
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv(weights.WEIGHTS_ENV, raising=False)
    monkeypatch.setattr(weights, "download_atomic", lambda url, dest: pytest.fail("must not download"))
    extra = []
    if route == "option":
        extra = ["--inception-weights", str(payload)]
        named = payload
    elif route == "environment":
        monkeypatch.setenv(weights.WEIGHTS_ENV, str(payload))
        named = payload
    else:
        named = weights.default_weights_path()
        assert str(tmp_path) in str(named)
        named.parent.mkdir(parents=True)
        shutil.copy(payload, named)
    code = main(_fid(root, *extra, "--out", str(tmp_path / "m.json")))
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert not marker.exists()
    assert "Python objects other than tensors" in err and str(named) in err
    assert "Traceback" not in err and not (tmp_path / "m.json").exists()


def test_torch_fidelity_runs_code_from_a_weight_file(tmp_path):
    """Why ditbench keeps its own Inception (docs/metrics.md): torch-fidelity 0.4.0's
    FeatureExtractorInceptionV3 takes weights only as a path it unpickles with weights_only=False
    (feature_extractor_inceptionv3.py line 95) or by downloading them (line 93), so the file's code
    runs. When this test fails, torch-fidelity loads safely and the switch is worth revisiting."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    marker = tmp_path / "MARKER"
    state = InceptionV3().state_dict()
    state["Mixed_6d.branch1x1.bn.num_batches_tracked"] = Payload(marker)
    payload = tmp_path / "crafted.pth"
    torch.save(state, payload)
    with pytest.raises(UserError, match="Python objects other than tensors"):
        load_weight_file(payload)
    assert not marker.exists()  # ditbench's loader refused without running it
    try:
        FeatureExtractorInceptionV3(
            "inception-v3-compat", ["2048"], feature_extractor_weights_path=str(payload)
        )
    except Exception:  # noqa: BLE001 - the state dict then fails to load; the code has already run
        pass
    assert marker.read_text() == "code ran"


@pytest.mark.slow
def test_the_command_exits_2_without_a_traceback(attack, tmp_path):
    root, payload, marker = attack
    proc = subprocess.run(
        [sys.executable, "-m", "ditbench", *_fid(root, "--inception-weights", str(payload))],
        capture_output=True,
        text=True,
        env={**os.environ, "TORCH_HOME": str(tmp_path)},
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert not marker.exists() and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("ditbench: error: Inception weights file")


def test_the_environment_variable_can_name_the_test_network(monkeypatch):
    monkeypatch.setenv(weights.WEIGHTS_ENV, "test")
    _, info = load_network(None)
    assert info.name == "test" and info.official is False


def test_unofficial_weights_load_and_say_so(tmp_path):
    net, info = load_weight_file(calibrated_weights_file())
    assert info.official is False and info.name == calibrated_weights_file().name
    assert info.sha256 != weights.OFFICIAL_SHA256 and len(info.sha256) == 64
    assert info.banner == weights.NOT_OFFICIAL_BANNER
    assert info.describe()["path"] == str(calibrated_weights_file())
    assert not net.training


def test_the_official_digest_makes_weights_official(monkeypatch):
    import hashlib

    digest = hashlib.sha256(calibrated_weights_file().read_bytes()).hexdigest()
    monkeypatch.setattr(weights, "OFFICIAL_SHA256", digest)
    _, info = load_weight_file(calibrated_weights_file())
    assert info.official is True and info.name == weights.OFFICIAL_NAME and info.banner is None


def test_a_legacy_format_state_dict_loads_safely(tmp_path):
    """Files saved before PyTorch 1.6 (not a zip) load through the same weights-only path."""
    legacy = tmp_path / "legacy.pth"
    torch.save(
        torch.load(calibrated_weights_file(), weights_only=True), legacy, _use_new_zipfile_serialization=False
    )
    net, info = load_weight_file(legacy)
    assert state_dict_sha256(net.state_dict()) == load_network("test")[1].sha256


def _state_with(key, value):
    state = dict(torch.load(calibrated_weights_file(), weights_only=True))
    state[key] = value
    return state


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.mkdir(), "is a folder"),
        (lambda p: p.write_bytes(b""), "could not be read"),
        (
            lambda p: p.write_bytes(calibrated_weights_file().read_bytes()[:5000]),
            "truncated or not a PyTorch",
        ),
        (lambda p: torch.save([torch.zeros(1)], p), "holds a list, not a state dict"),
        (lambda p: torch.save({"fc.weight": 3}, p), "is not a tensor but a Python int"),
        (lambda p: torch.save({"fc.weight": torch.zeros(3, 3)}, p), "does not fit the FID InceptionV3"),
        (
            lambda p: torch.save(_state_with("fc.bias", torch.full((1008,), float("nan"))), p),
            "'fc.bias' holds NaN",
        ),
        (
            lambda p: torch.save(
                _state_with("Conv2d_1a_3x3.bn.running_var", torch.full((32,), float("inf"))), p
            ),
            "holds NaN or infinite",
        ),
    ],
    ids=["directory", "empty", "truncated", "list", "int_entry", "wrong_shapes", "nan", "inf"],
)
def test_bad_weight_files_get_a_clear_error(tmp_path, make, message):
    path = tmp_path / "w.pth"
    make(path)
    with pytest.raises(UserError, match=message) as err:
        load_network(path)
    assert str(path) in str(err.value)


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "MAX_WEIGHTS_BYTES", 1000)
    with pytest.raises(UserError, match="this is not its weight file"):
        load_network(calibrated_weights_file())


@pytest.mark.slow  # builds the network a second time (~20 s on 2 cores)
def test_the_test_network_is_reproducible_and_leaves_the_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    built = build_calibrated_inception()
    assert torch.equal(torch.rand(3), expected)  # the caller's random stream is untouched
    _, info = load_network("test")
    assert info.name == "test" and info.official is False and info.path is None
    assert info.describe()["recipe"] == weights.TEST_NETWORK_RECIPE == 2
    assert state_dict_sha256(built.state_dict()) == info.sha256
    assert json.loads(json.dumps(info.describe()))["sha256"] == info.sha256
