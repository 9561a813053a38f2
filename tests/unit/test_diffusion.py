import math

import numpy as np
import pytest
import torch

from ditbench.core.errors import UserError
from ditbench.models import build_model
from ditbench.models.diffusion import GaussianDiffusion, create_diffusion, sample_latents, space_timesteps


def _reference_losses(x0, t, noise, out):
    """The hybrid loss re-derived in float64 numpy from the formulas (DDPM/improved-DDPM papers),
    written differently from ditbench's code where the maths allows."""
    x0, noise, out = (a.double().numpy() for a in (x0, noise, out))
    t = t.numpy()
    betas = np.linspace(1e-4, 0.02, 1000)
    alphas = 1 - betas
    abar = np.cumprod(alphas)
    abar_prev = np.concatenate([[1.0], abar[:-1]])
    post_var = betas * (1 - abar_prev) / (1 - abar)
    post_logvar_clipped = np.log(np.where(np.arange(1000) == 0, post_var[1], post_var))

    def b(a):  # per-sample value broadcast over (C, H, W)
        return a[t].reshape(-1, 1, 1, 1)

    c = x0.shape[1]
    eps, v = out[:, :c], out[:, c:]
    x_t = np.sqrt(b(abar)) * x0 + np.sqrt(1 - b(abar)) * noise
    mse = ((noise - eps) ** 2).mean(axis=(1, 2, 3))

    # True posterior q(x_{t-1} | x_t, x0).
    true_mean = (np.sqrt(b(abar_prev)) * b(betas) / (1 - b(abar))) * x0 + (
        np.sqrt(b(alphas)) * (1 - b(abar_prev)) / (1 - b(abar))
    ) * x_t
    true_logvar = b(post_logvar_clipped)
    # Model: DDPM mean form 1/sqrt(alpha) (x_t - beta / sqrt(1 - abar) eps), learned-range variance.
    model_mean = (x_t - b(betas) / np.sqrt(1 - b(abar)) * eps) / np.sqrt(b(alphas))
    frac = (v + 1) / 2
    model_logvar = frac * np.log(b(betas)) + (1 - frac) * true_logvar
    var1, var2 = np.exp(true_logvar), np.exp(model_logvar)
    kl = 0.5 * (np.log(var2 / var1) + (var1 + (true_mean - model_mean) ** 2) / var2 - 1)
    kl_bits = kl.mean(axis=(1, 2, 3)) / math.log(2)

    def cdf(z):  # the tanh approximation the reference decoder uses
        return 0.5 * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))

    std = np.exp(0.5 * model_logvar)
    upper = cdf((x0 - model_mean + 1 / 255) / std)
    lower = cdf((x0 - model_mean - 1 / 255) / std)
    logp = np.where(
        x0 < -0.999,
        np.log(np.maximum(upper, 1e-12)),
        np.where(x0 > 0.999, np.log(np.maximum(1 - lower, 1e-12)), np.log(np.maximum(upper - lower, 1e-12))),
    )
    nll_bits = -logp.mean(axis=(1, 2, 3)) / math.log(2)
    vb = np.where(t == 0, nll_bits, kl_bits)
    return mse + vb, mse, vb


def test_training_loss_equals_float64_reference():
    g = torch.Generator().manual_seed(0)
    n = 6
    x0 = torch.randn(n, 4, 8, 8, generator=g) * 0.8
    noise = torch.randn(n, 4, 8, 8, generator=g)
    t = torch.tensor([0, 1, 5, 100, 500, 999])
    eps = torch.randn(n, 4, 8, 8, generator=g)
    v = torch.rand(n, 4, 8, 8, generator=g) * 2 - 1
    fixed = torch.cat([eps, v], dim=1)

    def model(x_t, tt, **kw):
        return fixed

    got = create_diffusion().training_losses(model, x0, t, {}, noise=noise)
    loss, mse, vb = _reference_losses(x0, t, noise, fixed)
    np.testing.assert_allclose(got["mse"].numpy(), mse, rtol=1e-5)
    np.testing.assert_allclose(got["vb"].numpy(), vb, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(got["loss"].numpy(), loss, rtol=2e-4, atol=1e-5)


def test_vb_trains_only_the_variance():
    d = create_diffusion()
    x0 = torch.randn(4, 4, 8, 8)
    out = torch.randn(4, 8, 8, 8, requires_grad=True)
    t = torch.tensor([0, 3, 300, 900])
    terms = d.training_losses(lambda x, tt, **kw: out, x0, t, {})
    (g_vb,) = torch.autograd.grad(terms["vb"].sum(), out, retain_graph=True)
    assert torch.count_nonzero(g_vb[:, :4]) == 0 and torch.count_nonzero(g_vb[:, 4:]) > 0
    (g_mse,) = torch.autograd.grad(terms["mse"].sum(), out)
    assert torch.count_nonzero(g_mse[:, 4:]) == 0


def test_zero_initialised_dit_has_unit_mse():
    torch.manual_seed(0)
    model = build_model("DiT-T/2", image_size=64).train()
    x0 = torch.randn(64, 4, 8, 8)
    t = torch.randint(0, 1000, (64,))
    terms = create_diffusion().training_losses(model, x0, t, {"y": torch.randint(0, 1000, (64,))})
    assert terms["mse"].mean().item() == pytest.approx(1.0, abs=0.05)
    assert torch.isfinite(terms["vb"]).all()


def test_schedule_float64_and_linear():
    d = create_diffusion()
    assert d.num_timesteps == 1000 and d.betas.dtype == np.float64
    assert d.betas[0] == pytest.approx(1e-4) and d.betas[-1] == pytest.approx(0.02)
    assert np.allclose(np.diff(d.betas), (0.02 - 1e-4) / 999)


def test_space_timesteps():
    assert space_timesteps(1000, "10") == [0, 111, 222, 333, 444, 555, 666, 777, 888, 999]
    kept = space_timesteps(1000, "250")
    assert len(kept) == 250 and kept[0] == 0 and kept[-1] == 999
    assert space_timesteps(1000, "ddim50") == list(range(0, 1000, 20))
    assert len(space_timesteps(1000, "10,20")) == 30
    with pytest.raises(UserError):
        space_timesteps(1000, "fast")


def test_respaced_schedule_keeps_alphas_cumprod():
    base = create_diffusion()
    sp = create_diffusion("250")
    assert sp.num_timesteps == 250
    assert sp.timestep_map == space_timesteps(1000, "250")
    np.testing.assert_allclose(sp.alphas_cumprod, base.alphas_cumprod[sp.timestep_map], rtol=1e-12)
    assert ((sp.betas > 0) & (sp.betas < 1)).all()
    assert sp.betas[0] == pytest.approx(base.betas[0])
    assert sp.betas.max() > base.betas.max()  # respaced steps jump further


def _oracle(target):
    """A model that knows the data is exactly `target`: the true eps for every (x_t, t)."""
    abar = torch.from_numpy(create_diffusion().alphas_cumprod).float()

    def model(x, t, **kw):
        a = abar[t].reshape(-1, 1, 1, 1)
        eps = (x - a.sqrt() * target) / (1 - a).sqrt()
        return torch.cat([eps, torch.zeros_like(eps)], dim=1)

    return model


@pytest.mark.parametrize("sampler,steps", [("ddim", "ddim25"), ("ddpm", "50")])
def test_samplers_recover_the_data_with_an_oracle(sampler, steps):
    target = torch.linspace(-1, 1, 4 * 4 * 4).reshape(1, 4, 4, 4).repeat(2, 1, 1, 1)
    d = create_diffusion(steps)
    g = torch.Generator().manual_seed(0)
    loop = d.ddim_sample_loop if sampler == "ddim" else d.p_sample_loop
    out = loop(_oracle(target), (2, 4, 4, 4), generator=g)
    torch.testing.assert_close(out, target, atol=2e-3, rtol=0)


def _random_model():
    torch.manual_seed(1)
    model = build_model("DiT-T/4", image_size=32, num_classes=10).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.02)
    return model


@pytest.mark.slow
def test_sampling_is_deterministic_for_a_seed():
    model = _random_model()
    d = create_diffusion("5")
    labels = torch.tensor([1, 2, 3])

    def draw(seed, sampler, cfg):
        g = torch.Generator().manual_seed(seed)
        return sample_latents(model, d, labels, latent_size=4, cfg_scale=cfg, sampler=sampler, generator=g)

    for sampler in ("ddpm", "ddim"):
        for cfg in (1.0, 1.5):
            a, b = draw(0, sampler, cfg), draw(0, sampler, cfg)
            assert a.shape == (3, 4, 4, 4) and torch.isfinite(a).all()
            assert torch.equal(a, b)
    assert not torch.equal(draw(0, "ddpm", 1.0), draw(1, "ddpm", 1.0))
    assert not torch.equal(draw(0, "ddpm", 1.0), draw(0, "ddpm", 4.0))


def test_gaussian_diffusion_validates_betas():
    with pytest.raises(ValueError):
        GaussianDiffusion(np.array([0.0, 0.1]))
    with pytest.raises(ValueError) as err:
        GaussianDiffusion(np.array([0.5, 1.5]))
    assert str(err.value) == "betas must be a 1-D array in (0, 1]"
    with np.errstate(divide="ignore"):  # beta = 1 is allowed: alpha-bar reaches 0
        assert GaussianDiffusion(np.array([0.5, 1.0])).alphas_cumprod.tolist() == [0.5, 0.0]


def test_the_schedule_is_float64_whatever_betas_are_given_as():
    d = GaussianDiffusion(np.array([0.1, 0.3], dtype=np.float32))
    assert d.betas.dtype == np.float64 and d.alphas_cumprod.dtype == np.float64
    # float32(0.1) and float32(0.3) widened, then 1 - beta multiplied in float64
    b1, b2 = float(np.float32(0.1)), float(np.float32(0.3))
    assert d.alphas_cumprod.tolist() == [1.0 - b1, (1.0 - b1) * (1.0 - b2)]
