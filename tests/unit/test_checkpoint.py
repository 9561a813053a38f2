import os
import pickle

import pytest
import torch

from ditbench.core.errors import UserError
from ditbench.models import build_model
from ditbench.models.checkpoint import (
    infer_config,
    load_model_weights,
    read_checkpoint,
    save_checkpoint,
)


def _randomised(name="DiT-T/4", image_size=64, seed=0):
    torch.manual_seed(seed)
    model = build_model(name, image_size=image_size)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.01)
    return model


def test_round_trip_prefers_ema(tmp_path):
    model, ema = _randomised(seed=0), _randomised(seed=1)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    path = tmp_path / "sub" / "ckpt.pt"
    save_checkpoint(path, model, ema, opt, step=7, config={"model": "DiT-T/4", "image_size": 64})
    assert [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]  # no temp file left behind
    loaded, info = load_model_weights(path)
    assert info.source == "ema" and info.step == 7 and info.config["image_size"] == 64
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, ema.state_dict()[k])
    raw, info = load_model_weights(path, model_name="DiT-T/4", prefer_ema=False)
    assert info.source == "model"
    for k, v in raw.state_dict().items():
        assert torch.equal(v, model.state_dict()[k])
    assert not loaded.training


def test_bare_official_style_state_dict_loads(tmp_path):
    model = _randomised("DiT-T/2", image_size=32)
    path = tmp_path / "DiT-T-2-32x32.pt"
    torch.save(model.state_dict(), path)  # what the released DiT files are
    loaded, info = load_model_weights(path)
    assert info.source == "bare" and info.step is None
    x, t, y = torch.randn(2, 4, 4, 4), torch.tensor([3, 900]), torch.tensor([1, 2])
    assert torch.equal(loaded(x, t, y), model.eval()(x, t, y))


def test_ddp_and_compile_prefixes_are_stripped(tmp_path):
    model = _randomised()
    sd = {"module._orig_mod." + k: v for k, v in model.state_dict().items()}
    torch.save(sd, tmp_path / "p.pt")
    loaded, _ = load_model_weights(tmp_path / "p.pt")
    assert torch.equal(loaded.pos_embed, model.pos_embed)


def test_infer_config_of_xl2_shapes():
    with torch.device("meta"):
        sd = build_model("DiT-XL/2", image_size=512).state_dict()
    info = infer_config(sd)
    assert info["name"] == "DiT-XL/2" and info["image_size"] == 512
    assert info["num_classes"] == 1000 and info["learn_sigma"] and info["depth"] == 28


def test_wrong_configuration_names_what_the_file_holds(tmp_path):
    path = tmp_path / "t4.pt"
    torch.save(_randomised("DiT-T/4", image_size=64).state_dict(), path)
    with pytest.raises(UserError) as err:
        load_model_weights(path, model_name="DiT-T/2")
    msg = str(err.value)
    assert "DiT-T/4 at 64 px" in msg and "DiT-T/2" in msg
    with pytest.raises(UserError, match="DiT-T/4 at 64 px"):
        load_model_weights(path, image_size=128)


class Payload:
    """Unpickling this would call _side_effect: a stand-in for a malicious checkpoint."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (_side_effect, (self.marker,))


def _side_effect(marker):
    with open(marker, "w") as f:
        f.write("code ran")
    return {}


def test_checkpoint_needing_arbitrary_unpickling_is_refused(tmp_path):
    marker = tmp_path / "ran.txt"
    path = tmp_path / "evil.pt"
    torch.save({"model": Payload(str(marker))}, path)
    with pytest.raises(UserError) as err:
        load_model_weights(path)
    assert "refused" in str(err.value) and "weights_only" in str(err.value)
    assert not marker.exists()


def test_plain_pickle_garbage_and_missing(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(UserError):
        read_checkpoint(junk)
    lst = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], lst)
    with pytest.raises(UserError, match="not a state dict"):
        read_checkpoint(lst)
    other = tmp_path / "other.pt"
    torch.save({"weight": torch.zeros(2)}, other)
    with pytest.raises(UserError, match="not a DiT state dict"):
        load_model_weights(other)


def test_save_is_atomic_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "c.pt"
    model = _randomised()
    save_checkpoint(path, model, None, None, 1, {})
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError):
        save_checkpoint(path, model, None, None, 2, {})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.pt"]


def test_pickle_module_error_type_is_what_torch_raises(tmp_path):
    # Guards the assumption read_checkpoint relies on: weights_only refusals are UnpicklingErrors.
    path = tmp_path / "evil.pt"
    torch.save(Payload(str(tmp_path / "x")), path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
