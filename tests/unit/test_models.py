import math

import numpy as np
import pytest
import torch

from ditbench.core.errors import UnsupportedError, UserError
from ditbench.models import MODEL_NAMES, PAPER_MODEL_NAMES, build_model, count_params, parse_grad_ckpt
from ditbench.models.configs import grad_ckpt_name, latent_size

OFFICIAL_COUNTS = {
    "DiT-XL/2": 675_129_632,
    "DiT-XL/4": 675_074_432,
    "DiT-XL/8": 675_683_072,
    "DiT-L/2": 458_102_816,
    "DiT-L/4": 458_053_760,
    "DiT-L/8": 458_594_816,
    "DiT-B/2": 130_512_416,
    "DiT-B/4": 130_475_648,
    "DiT-B/8": 130_881_536,
    "DiT-S/2": 32_963_360,
    "DiT-S/4": 32_945_024,
    "DiT-S/8": 33_148_160,
}


def tiny(name="DiT-T/2", image_size=64, **kw):
    return build_model(name, image_size=image_size, **kw)


def inputs(n=4, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, size, size, generator=g)
    t = torch.randint(0, 1000, (n,), generator=g)
    y = torch.randint(0, 1000, (n,), generator=g)
    return x, t, y


@pytest.mark.parametrize("name", PAPER_MODEL_NAMES)
def test_parameter_counts_equal_official(name):
    with torch.device("meta"):
        model = build_model(name)
    assert count_params(model) == OFFICIAL_COUNTS[name]


def test_model_names_cover_paper_and_tiny():
    assert set(PAPER_MODEL_NAMES) == set(OFFICIAL_COUNTS)
    assert {"DiT-T/2", "DiT-T/4", "DiT-T/8"} <= set(MODEL_NAMES)


def test_official_state_dict_names():
    model = tiny("DiT-T/4")
    keys = set(model.state_dict())
    top = {
        "pos_embed",
        "x_embedder.proj.weight",
        "x_embedder.proj.bias",
        "t_embedder.mlp.0.weight",
        "t_embedder.mlp.0.bias",
        "t_embedder.mlp.2.weight",
        "t_embedder.mlp.2.bias",
        "y_embedder.embedding_table.weight",
        "final_layer.linear.weight",
        "final_layer.linear.bias",
        "final_layer.adaLN_modulation.1.weight",
        "final_layer.adaLN_modulation.1.bias",
    }
    per_block = [
        "attn.qkv.weight",
        "attn.qkv.bias",
        "attn.proj.weight",
        "attn.proj.bias",
        "mlp.fc1.weight",
        "mlp.fc1.bias",
        "mlp.fc2.weight",
        "mlp.fc2.bias",
        "adaLN_modulation.1.weight",
        "adaLN_modulation.1.bias",
    ]
    expected = top | {f"blocks.{i}.{k}" for i in range(len(model.blocks)) for k in per_block}
    assert keys == expected
    sd = model.state_dict()
    d = 64
    assert sd["y_embedder.embedding_table.weight"].shape == (1001, d)  # null class row
    assert sd["blocks.0.attn.qkv.weight"].shape == (3 * d, d)
    assert sd["blocks.0.mlp.fc1.weight"].shape == (4 * d, d)
    assert sd["blocks.0.adaLN_modulation.1.weight"].shape == (6 * d, d)
    assert sd["final_layer.linear.weight"].shape == (4 * 4 * 8, d)  # learn_sigma: 8 channels


def test_xl2_shapes_on_meta():
    with torch.device("meta"):
        model = build_model("DiT-XL/2")
    sd = model.state_dict()
    assert sd["pos_embed"].shape == (1, 256, 1152)
    assert sd["x_embedder.proj.weight"].shape == (1152, 4, 2, 2)
    assert len(model.blocks) == 28
    assert not model.pos_embed.requires_grad


def test_pos_embed_is_mae_sincos():
    # Independent MAE-style reference in numpy: meshgrid(w, h) ordering, [sin, cos] per axis.
    model = tiny("DiT-T/2")
    d, g = 64, 4
    gh = np.arange(g, dtype=np.float64)
    gw = np.arange(g, dtype=np.float64)
    grid = np.stack(np.meshgrid(gw, gh), axis=0).reshape(2, 1, g, g)

    def one_d(dim, pos):
        omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    ref = np.concatenate([one_d(d // 2, grid[0]), one_d(d // 2, grid[1])], axis=1)
    assert np.allclose(model.pos_embed[0].numpy(), ref.astype(np.float32), atol=1e-6)


def test_timestep_frequencies_cos_first():
    from ditbench.models.dit import TimestepEmbedder

    t = torch.tensor([0.0, 7.0])
    emb = TimestepEmbedder.frequencies(t, 256)
    assert emb.shape == (2, 256)
    assert torch.allclose(emb[0, :128], torch.ones(128))  # cos(0)
    assert torch.allclose(emb[0, 128:], torch.zeros(128))  # sin(0)
    k = 5
    freq = math.exp(-math.log(10000) * k / 128)
    assert emb[1, k].item() == pytest.approx(math.cos(7 * freq), abs=1e-6)
    assert emb[1, 128 + k].item() == pytest.approx(math.sin(7 * freq), abs=1e-6)


def test_adaln_zero_output_is_zero_and_shape():
    model = tiny("DiT-T/2").eval()
    x, t, y = inputs()
    out = model(x, t, y)
    assert out.shape == (4, 8, 8, 8)
    assert torch.count_nonzero(out) == 0


def test_unpatchify_inverts_patch_layout():
    model = tiny("DiT-T/4")
    n, p, c, h = 2, 4, 8, 2
    img = torch.arange(n * c * (h * p) ** 2, dtype=torch.float32).reshape(n, c, h * p, h * p)
    # patchify by hand: (N, C, h, p, w, q) -> (N, h, w, p, q, C) -> tokens
    tokens = img.reshape(n, c, h, p, h, p).permute(0, 2, 4, 3, 5, 1).reshape(n, h * h, p * p * c)
    assert torch.equal(model.unpatchify(tokens), img)


def test_label_dropout_in_train_mode_only():
    model = tiny("DiT-T/8", class_dropout_prob=0.5)
    emb = model.y_embedder
    labels = torch.zeros(2000, dtype=torch.long)
    torch.manual_seed(0)
    dropped = emb.token_drop(labels)
    frac = (dropped == 1000).float().mean().item()
    assert 0.45 < frac < 0.55
    model.eval()
    out_eval = emb(labels[:4], train=False)
    assert torch.equal(out_eval, emb.embedding_table(labels[:4]))
    forced = emb(labels[:2], train=False, force_drop_ids=torch.tensor([1, 0]))
    assert torch.equal(forced[0], emb.embedding_table.weight[1000])


def test_no_dropout_means_no_null_row():
    model = tiny("DiT-T/8", class_dropout_prob=0.0)
    assert model.y_embedder.embedding_table.weight.shape[0] == 1000


def test_learn_sigma_false_gives_four_channels():
    model = tiny("DiT-T/8", learn_sigma=False)
    x, t, y = inputs()
    assert model(x, t, y).shape == (4, 4, 8, 8)


def _randomise(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def test_forward_with_cfg_guides_all_eps_channels():
    model = _randomise(tiny("DiT-T/4")).eval()
    x, t, _ = inputs(n=2)
    y = torch.tensor([3, 1000])
    x2, t2 = torch.cat([x[:1], x[:1]]), torch.cat([t[:1], t[:1]])
    out = model.forward_with_cfg(x2, t2, y, cfg_scale=4.0)
    raw = model(x2, t2, y)
    eps = raw[1:, :4] + 4.0 * (raw[:1, :4] - raw[1:, :4])
    assert torch.allclose(out[0, :4], eps[0], atol=1e-5)
    assert torch.allclose(out[1, :4], eps[0], atol=1e-5)
    assert torch.allclose(out[:, 4:], raw[:, 4:])
    official = model.forward_with_cfg(x2, t2, y, cfg_scale=4.0, guidance_channels=3)
    assert torch.allclose(official[:, 3], raw[:, 3])  # the official code leaves channel 3 unguided


def test_unknown_model_lists_valid_names():
    with pytest.raises(UserError) as err:
        build_model("DiT-M/2")
    assert "DiT-XL/2" in str(err.value) and "DiT-T/8" in str(err.value)


def test_official_hyphen_names_accepted():
    with torch.device("meta"):
        assert count_params(build_model("DiT-XL-2")) == OFFICIAL_COUNTS["DiT-XL/2"]


@pytest.mark.parametrize("size", [100, 0, 36])
def test_bad_image_size(size):
    with pytest.raises(UserError, match="image_size"):
        build_model("DiT-S/8", image_size=size)


def test_latent_size():
    assert latent_size(256, 2) == 32 and latent_size(512, 8) == 64


@pytest.mark.parametrize(
    "value,expected",
    [
        ("none", 0),
        ("full", 1),
        ("every_2", 2),
        ("every_1", 1),
        (None, 0),
        (True, 1),
        (False, 0),
        ("on", 1),  # YAML reads on/off/yes/no as booleans: the command line takes the same words
        ("Off", 0),
        ("yes", 1),
    ],
)
def test_parse_grad_ckpt(value, expected):
    assert parse_grad_ckpt(value) == expected


@pytest.mark.parametrize("value", ["sometimes", "every_0", "every_x", "half", "all", "every3", "1", 2])
def test_parse_grad_ckpt_rejects(value):
    with pytest.raises(UserError, match="every_K"):
        parse_grad_ckpt(value)


def test_grad_ckpt_has_one_canonical_spelling():
    assert [grad_ckpt_name(v) for v in (False, "off", "none", True, "on", "every_1", "every_3")] == [
        "none",
        "none",
        "none",
        "full",
        "full",
        "full",
        "every_3",
    ]


def _grads(mode):
    torch.manual_seed(0)
    model = _randomise(tiny("DiT-T/2", grad_ckpt=mode)).train()
    model.y_embedder.dropout_prob = 0.0  # same labels in every mode
    x, t, y = inputs(n=8)
    model(x, t, y).square().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_grad_ckpt_leaves_gradients_unchanged():
    ref = _grads("none")
    for mode in ("full", "every_2", "every_3"):
        got = _grads(mode)
        assert got.keys() == ref.keys()
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-7, msg=f"{mode}: {k}")


def _peak_bytes(mode, n=16):
    """Peak bytes of live CPU tensors during forward+backward, from the profiler's allocator events."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = tiny("DiT-T/2", grad_ckpt=mode).train()
    x, t, y = inputs(n=n)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(x, t, y).square().mean().backward()
    live = peak = 0
    for ev in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += ev.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def test_grad_ckpt_lowers_peak_memory():
    none, every2, full = _peak_bytes("none"), _peak_bytes("every_2"), _peak_bytes("full")
    assert full < every2 < none
    assert full < 0.7 * none


def test_diffusers_impl_builds_runs_and_counts():
    model = build_model("DiT-T/4", image_size=64, impl="diffusers")
    x, t, y = inputs()
    out = model(x, t, y)
    assert out.shape == (4, 8, 8, 8)
    assert torch.count_nonzero(out) == 0  # adaLN-Zero init applied to diffusers' modules too
    # Each of the 4 blocks owns a timestep MLP (256*D + D + D*D + D) and a label table (1001*D);
    # the position table is a buffer. Net difference from the ditbench DiT (D=64, 2x2 tokens):
    d, depth, tokens = 64, 4, 4
    per_copy = 256 * d + d + d * d + d + 1001 * d
    ours = count_params(build_model("DiT-T/4", image_size=64))
    assert count_params(model) == ours + (depth - 1) * per_copy - tokens * d


def test_the_diffusers_model_guides_as_the_dit_does():
    """Both implementations' forward_with_cfg are one rule (models.dit.cfg_forward): same weights
    in, the diffusers model's guided output is its raw output guided the same way."""
    model = _randomise(build_model("DiT-T/4", image_size=64, impl="diffusers")).eval()
    x, t, _ = inputs(n=2)
    y = torch.tensor([3, 1000])
    x2, t2 = torch.cat([x[:1], x[:1]]), torch.cat([t[:1], t[:1]])
    with torch.no_grad():
        out = model.forward_with_cfg(x2, t2, y, cfg_scale=4.0)
        raw = model(x2, t2, y)
        official = model.forward_with_cfg(x2, t2, y, cfg_scale=4.0, guidance_channels=3)
    eps = raw[1:, :4] + 4.0 * (raw[:1, :4] - raw[1:, :4])
    assert torch.allclose(out[0, :4], eps[0], atol=1e-5) and torch.allclose(out[1, :4], eps[0], atol=1e-5)
    assert torch.allclose(out[:, 4:], raw[:, 4:])
    assert torch.allclose(official[:, 3], raw[:, 3])  # the official code leaves channel 3 unguided
    assert torch.allclose(official[0, :3], eps[0, :3], atol=1e-5)


def test_diffusers_xl2_parameter_count():
    with torch.device("meta"):
        model = build_model("DiT-XL/2", impl="diffusers")
    assert count_params(model) == 749_826_464  # +74,696,832 (+11.1%) vs official 675,129,632


def test_diffusers_rejects_selective_ckpt():
    with pytest.raises(UnsupportedError, match="every_2"):
        build_model("DiT-T/4", image_size=64, impl="diffusers", grad_ckpt="every_2")


def test_unknown_impl():
    with pytest.raises(UserError, match="ditbench, diffusers"):
        build_model("DiT-T/4", image_size=64, impl="timm")
