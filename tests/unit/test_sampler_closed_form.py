"""The DDPM and DDIM samplers checked against the papers' closed forms, written out here from the
equations rather than from ditbench's schedule arrays:

* one DDPM step against the posterior q(x_{t-1} | x_t, x0) of Ho et al. 2020 (eq. 6-7) with the
  learned-range variance of Nichol & Dhariwal 2021 (eq. 15);
* one DDIM step against Song et al. 2021 (eq. 12, sigma from eq. 16), eta = 0 and eta > 0;
* full runs with a Gaussian-data oracle. For data x0 ~ N(mu, s^2) and x_t = sqrt(a) x0 +
  sqrt(1 - a) eps (a = alpha-bar_t), x_t ~ N(sqrt(a) mu, V_t) with V_t = a s^2 + 1 - a, and the exact
  noise prediction is E[eps | x_t] = sqrt(1 - a) / V_t * (x_t - sqrt(a) mu). With that oracle:
  - DDPM whose variance channel gives the true Var(x_{t-1} | x_t) keeps every intermediate x_t at
    exactly N(sqrt(a_t) mu, V_t), so the run is checked against the data's law after every step;
  - DDIM with eta = 0 is an affine map of x_T, so each step is checked per sample against the map
    derived here; with eta > 0 its mean and variance follow a recursion derived here.
"""

import math

import numpy as np
import pytest
import torch

from ditbench.core.errors import UserError
from ditbench.models.diffusion import create_diffusion, sample_latents, space_timesteps

# The DiT/ADM schedule written out: 1000 linear betas from 1e-4 to 0.02.
BETAS = np.linspace(1e-4, 0.02, 1000)
ABAR = np.cumprod(1.0 - BETAS)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _kept(respacing):
    return list(range(1000)) if respacing is None else space_timesteps(1000, respacing)


def _step_schedule(kept, i):
    """(alpha-bar_t, alpha-bar_{t-1}, beta_t) of step i of the process over the kept timesteps."""
    a = ABAR[kept[i]]
    a_prev = ABAR[kept[i - 1]] if i > 0 else 1.0
    return a, a_prev, 1.0 - a / a_prev


def _posterior_variance(kept, i):
    a, a_prev, beta = _step_schedule(kept, i)
    return beta * (1.0 - a_prev) / (1.0 - a)  # Ho et al. eq. 7: beta-tilde_t


def _bcast(values, like):
    return torch.as_tensor(values, dtype=torch.float64).reshape(-1, *([1] * (like.ndim - 1)))


# ---- one step -------------------------------------------------------------------------------


@pytest.mark.parametrize("respacing", [None, "50"])
@pytest.mark.parametrize("v_value", [-1.0, 0.3, 1.0])
def test_one_ddpm_step_is_the_posterior_sample(respacing, v_value):
    d = create_diffusion(respacing)
    kept = _kept(respacing)
    steps = [0, 1, len(kept) // 2, len(kept) - 1]
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(len(steps), 4, 3, 3, generator=gen)
    eps = torch.randn(len(steps), 4, 3, 3, generator=gen)
    v = torch.full_like(eps, v_value)
    seen_t = []

    labels = torch.arange(len(steps))

    def model(x_t, t, **kw):
        assert torch.equal(kw["y"], labels)  # the caller's model_kwargs reach the model
        seen_t.append(t.clone())
        return torch.cat([eps, v], dim=1)

    t = torch.tensor(steps)
    got = d.p_sample(model, x, t, {"y": labels}, generator=torch.Generator().manual_seed(11))
    z = torch.randn(x.shape, generator=torch.Generator().manual_seed(11)).double()
    assert torch.equal(seen_t[0], torch.tensor([kept[i] for i in steps]))  # the model sees original t

    rows = [
        (*_step_schedule(kept, i), _posterior_variance(kept, i), _posterior_variance(kept, 1)) for i in steps
    ]
    a, a_prev, beta, post_var, post_var_1 = (_bcast(vals, x) for vals in zip(*rows, strict=True))
    xd, epsd = x.double(), eps.double()
    x0 = (xd - torch.sqrt(1 - a) * epsd) / torch.sqrt(a)  # eq. 4 solved for x0
    mean = torch.sqrt(a_prev) * beta / (1 - a) * x0 + torch.sqrt(1 - beta) * (1 - a_prev) / (1 - a) * xd
    # Learned range: log sigma^2 = f log beta_t + (1 - f) log beta-tilde_t, f = (v + 1) / 2; beta-tilde_0 = 0,
    # so its log is taken at t = 1, as the reference does.
    log_min = torch.log(torch.where(torch.tensor(steps).reshape(-1, 1, 1, 1) == 0, post_var_1, post_var))
    frac = (v_value + 1) / 2
    std = torch.exp(0.5 * (frac * torch.log(beta) + (1 - frac) * log_min))
    nonzero = _bcast([float(i > 0) for i in steps], x)
    want = mean + nonzero * std * z
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("respacing", [None, "ddim50"])
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_one_ddim_step_is_song_eq_12(respacing, eta):
    d = create_diffusion(respacing)
    kept = _kept(respacing)
    steps = [0, 1, len(kept) // 2, len(kept) - 1]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(len(steps), 4, 3, 3, generator=gen)
    eps = torch.randn(len(steps), 4, 3, 3, generator=gen)
    out = torch.cat([eps, torch.rand_like(eps) * 2 - 1], dim=1)  # DDIM ignores the variance channels

    labels = torch.arange(len(steps))

    def model(x_t, t, **kw):
        assert torch.equal(kw["y"], labels)
        return out

    got = d.ddim_sample(
        model, x, torch.tensor(steps), {"y": labels}, eta=eta, generator=torch.Generator().manual_seed(13)
    )
    z = torch.randn(x.shape, generator=torch.Generator().manual_seed(13)).double()

    a, a_prev, _ = (_bcast(vals, x) for vals in zip(*[_step_schedule(kept, i) for i in steps], strict=True))
    xd, epsd = x.double(), eps.double()
    x0 = (xd - torch.sqrt(1 - a) * epsd) / torch.sqrt(a)
    sigma = eta * torch.sqrt((1 - a_prev) / (1 - a)) * torch.sqrt(1 - a / a_prev)  # eq. 16
    want = torch.sqrt(a_prev) * x0 + torch.sqrt(1 - a_prev - sigma**2) * epsd + sigma * z
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    if eta > 0:
        assert not torch.allclose(want, torch.sqrt(a_prev) * x0 + torch.sqrt(1 - a_prev) * epsd)


# ---- Gaussian-data oracle -------------------------------------------------------------------

MU = torch.tensor([0.5, -0.3], dtype=torch.float64)  # per channel
S = torch.tensor([0.5, 0.8], dtype=torch.float64)


def _marginal(a):
    """Mean and variance of x_t per channel when alpha-bar_t = a (a = 1: the data)."""
    return math.sqrt(a) * MU, a * S**2 + 1 - a


class GaussianOracle:
    """The exact E[eps | x_t] for Gaussian data; its variance channel, for DDPM over `kept`, picks the
    log variance whose exp is the true Var(x_{t-1} | x_t) = beta-tilde_t + c1^2 Var(x0 | x_t)."""

    def __init__(self, kept):
        self.kept = kept
        self.step_of = {orig: i for i, orig in enumerate(kept)}

    def v_channel(self, i):
        if i == 0:
            return torch.zeros(2, dtype=torch.float64)  # no noise is added at the last step
        a, a_prev, beta = _step_schedule(self.kept, i)
        _, var_t = _marginal(a)
        var_x0 = S**2 * (1 - a) / var_t
        c1 = math.sqrt(a_prev) * beta / (1 - a)
        log_min = math.log(_posterior_variance(self.kept, i))
        target = torch.log(_posterior_variance(self.kept, i) + c1**2 * var_x0)
        frac = (target - log_min) / (math.log(beta) - log_min)
        assert ((frac >= 0) & (frac <= 1)).all()  # the true variance lies in the learned range
        return 2 * frac - 1

    def __call__(self, x, t, **kw):
        a = torch.as_tensor(ABAR[t.numpy()], dtype=torch.float64).reshape(-1, 1, 1, 1)
        mu, s2 = MU.reshape(1, -1, 1, 1), S.reshape(1, -1, 1, 1) ** 2
        var_t = a * s2 + 1 - a
        eps = torch.sqrt(1 - a) / var_t * (x.double() - torch.sqrt(a) * mu)
        orig, where = t.unique(return_inverse=True)
        v = torch.stack([self.v_channel(self.step_of[int(o)]) for o in orig])[where]
        return torch.cat([eps, v.reshape(-1, 2, 1, 1).expand_as(eps)], dim=1).float()


def _start(n, a_T, gen):
    """x_T drawn from its exact law (not N(0, 1), which differs from it by sqrt(a_T) mu)."""
    mean, var = _marginal(a_T)
    z = torch.randn(n, 2, 1, 1, generator=gen, dtype=torch.float64)
    return (mean.reshape(1, 2, 1, 1) + var.sqrt().reshape(1, 2, 1, 1) * z).float()


def _assert_law(x, mean, var, what):
    """Sample mean and variance per channel within 5 standard errors of (mean, var)."""
    n = x.shape[0]
    got_mean, got_var = x.double().mean(dim=(0, 2, 3)), x.double().var(dim=(0, 2, 3))
    tol_mean, tol_var = 5 * torch.sqrt(var / n), 5 * var * math.sqrt(2 / (n - 1))
    assert ((got_mean - mean).abs() < tol_mean).all(), f"{what}: mean {got_mean.tolist()} != {mean.tolist()}"
    assert ((got_var - var).abs() < tol_var).all(), f"{what}: variance {got_var.tolist()} != {var.tolist()}"


def test_ddpm_with_the_gaussian_oracle_keeps_the_true_law_after_every_step():
    respacing, n = "50", 40_000
    d, kept = create_diffusion(respacing), _kept(respacing)
    oracle = GaussianOracle(kept)
    x_T = _start(n, ABAR[kept[-1]], torch.Generator().manual_seed(0))
    x, gen = x_T, torch.Generator().manual_seed(1)
    for i in reversed(range(len(kept))):
        x = d.p_sample(oracle, x, torch.full((n,), i), generator=gen)
        if i > 0:
            mean, var = _marginal(ABAR[kept[i - 1]])
        else:  # the last step returns E[x0 | x_t0]: the data's mean, variance less Var(x0 | x_t0)
            a0 = ABAR[kept[0]]
            mean, var = MU, S**2 - S**4 * (1 - a0) / _marginal(a0)[1]
        _assert_law(x, mean, var, f"after step {i}")
    _assert_law(x, MU, S**2, "DDPM output against the data")
    # The loop is those steps: same start and generator, same samples.
    again = d.p_sample_loop(oracle, None, noise=x_T, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again, x)


def _ddim_gain(a, a_prev, sigma):
    """x_{t-1} - sqrt(a_prev) mu = gain * (x_t - sqrt(a) mu) + sigma z for Gaussian data with the exact
    oracle: x0_hat - mu = sqrt(a) s^2 / V_t * d and eps_hat = sqrt(1 - a) / V_t * d, d = x_t - sqrt(a) mu."""
    _, var_t = _marginal(a)
    return (math.sqrt(a_prev * a) * S**2 + torch.sqrt(1 - a_prev - sigma**2) * math.sqrt(1 - a)) / var_t


@pytest.mark.parametrize(
    "respacing,var_error",
    [("ddim50", 0.11), pytest.param(None, 0.007, marks=pytest.mark.slow)],  # 1000 steps: about 3 s
)
def test_ddim_eta0_with_the_gaussian_oracle_is_the_derived_affine_map(respacing, var_error):
    """Deterministic DDIM maps x_T affinely, so every step is checked per sample; its discretisation
    shrinks the variance (by 11% at most over ddim50, 0.7% over all 1000 steps): stated, not hidden."""
    n = 256
    d, kept = create_diffusion(respacing), _kept(respacing)
    oracle = GaussianOracle(kept)
    x_T = _start(n, ABAR[kept[-1]], torch.Generator().manual_seed(0))
    x, want = x_T, x_T.double()
    var = _marginal(ABAR[kept[-1]])[1]
    for i in reversed(range(len(kept))):
        a, a_prev, _ = _step_schedule(kept, i)
        gain = _ddim_gain(a, a_prev, torch.zeros(()))
        want = math.sqrt(a_prev) * MU.reshape(1, 2, 1, 1) + gain.reshape(1, 2, 1, 1) * (
            want - math.sqrt(a) * MU.reshape(1, 2, 1, 1)
        )
        x = d.ddim_sample(oracle, x, torch.full((n,), i), eta=0.0)
        err = float((x.double() - want).abs().max())
        assert err < 2e-4, f"after step {i}: {err} from the derived map"
        var = gain**2 * var
        assert ((var / _marginal(a_prev)[1] - 1).abs() <= var_error).all()
    _assert_law(x, MU, var, "DDIM output")
    again = d.ddim_sample_loop(oracle, None, noise=x_T)
    assert torch.equal(again, x)


def test_ddim_eta1_with_the_gaussian_oracle_follows_the_derived_law_after_every_step():
    respacing, n, eta = "ddim50", 40_000, 1.0
    d, kept = create_diffusion(respacing), _kept(respacing)
    oracle = GaussianOracle(kept)
    x = _start(n, ABAR[kept[-1]], torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(2)
    var = _marginal(ABAR[kept[-1]])[1]
    for i in reversed(range(len(kept))):
        a, a_prev, _ = _step_schedule(kept, i)
        sigma = torch.tensor(eta * math.sqrt((1 - a_prev) / (1 - a)) * math.sqrt(1 - a / a_prev))
        var = _ddim_gain(a, a_prev, sigma) ** 2 * var + sigma**2
        x = d.ddim_sample(oracle, x, torch.full((n,), i), eta=eta, generator=gen)
        _assert_law(x, math.sqrt(a_prev) * MU, var, f"after step {i}")
        assert ((var / _marginal(a_prev)[1] - 1).abs() <= 0.22).all()  # stochastic DDIM over 50 steps


# ---- sample_latents: the loop, the labels and classifier-free guidance -------------------------


class StubDiT:
    """A stand-in for DiT's two entry points: a fixed affine eps of x, and a record of the calls."""

    num_classes = 10

    def __init__(self):
        self.calls = []

    def _out(self, x, t):
        eps = 0.3 * x + 0.01 * t.float().reshape(-1, 1, 1, 1)
        return torch.cat([eps, torch.full_like(eps, 0.5)], dim=1)

    def __call__(self, x, t, y):
        self.calls.append(("plain", y.clone()))
        return self._out(x, t)

    def forward_with_cfg(self, x, t, y, cfg_scale, guidance_channels):
        self.calls.append(("cfg", y.clone(), cfg_scale, guidance_channels))
        return self._out(x, t) * cfg_scale


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_sample_latents_runs_the_chosen_loop_from_its_noise(sampler):
    d, labels = create_diffusion("5"), torch.tensor([3, 1, 4])
    model = StubDiT()
    got = sample_latents(
        model, d, labels, latent_size=2, sampler=sampler, generator=torch.Generator().manual_seed(0)
    )
    g = torch.Generator().manual_seed(0)
    z = torch.randn((3, 4, 2, 2), generator=g)
    loop = d.p_sample_loop if sampler == "ddpm" else d.ddim_sample_loop
    want = loop(StubDiT(), None, noise=z, model_kwargs={"y": labels}, generator=g)
    assert got.shape == (3, 4, 2, 2) and torch.equal(got, want)
    assert len(model.calls) == 5 and all(c[0] == "plain" and torch.equal(c[1], labels) for c in model.calls)


@pytest.mark.parametrize("null_class,want_null", [(None, 10), (7, 7)])
def test_sample_latents_guides_with_the_null_class(null_class, want_null):
    d, labels = create_diffusion("4"), torch.tensor([2, 5])
    model = StubDiT()
    got = sample_latents(
        model,
        d,
        labels,
        latent_size=2,
        cfg_scale=1.5,
        sampler="ddim",
        null_class=null_class,
        guidance_channels=3,
        generator=torch.Generator().manual_seed(1),
        in_channels=3,
    )
    g = torch.Generator().manual_seed(1)
    z = torch.randn((2, 3, 2, 2), generator=g)
    y = torch.tensor([2, 5, want_null, want_null])
    kwargs = {"y": y, "cfg_scale": 1.5, "guidance_channels": 3}
    want = d.ddim_sample_loop(StubDiT().forward_with_cfg, None, noise=torch.cat([z, z]), model_kwargs=kwargs)[
        :2
    ]
    assert got.shape == (2, 3, 2, 2) and torch.equal(got, want)
    assert all(c[0] == "cfg" and torch.equal(c[1], y) and c[2:] == (1.5, 3) for c in model.calls)
    # cfg_scale 1 is no guidance: the plain forward, the labels alone
    model = StubDiT()
    sample_latents(model, d, labels, latent_size=2, cfg_scale=1.0, generator=torch.Generator().manual_seed(1))
    assert {c[0] for c in model.calls} == {"plain"}


def test_sample_latents_refuses_an_unknown_sampler():
    with pytest.raises(UserError, match="sampler 'euler' is not known; use ddpm or ddim"):
        sample_latents(StubDiT(), create_diffusion("2"), torch.tensor([0]), latent_size=2, sampler="euler")


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_clip_denoised_clamps_the_predicted_x0_in_the_posterior(sampler):
    d, kept = create_diffusion("50"), _kept("50")
    i = 10
    a, a_prev, beta = _step_schedule(kept, i)
    x = torch.full((1, 1, 1, 3), 0.5)
    eps = torch.tensor([[[[-3.0, 0.1, 5.0]]]])  # x0 = (x - sqrt(1 - a) eps) / sqrt(a): > 1, inside, < -1
    out = torch.cat([eps, torch.full_like(eps, -1.0)], dim=1)
    t = torch.tensor([i])
    x0 = ((x.double() - math.sqrt(1 - a) * eps.double()) / math.sqrt(a)).clamp(-1, 1)
    assert x0[0, 0, 0, 0] == 1.0 and abs(x0[0, 0, 0, 1]) < 1 and x0[0, 0, 0, 2] == -1.0
    assert (x.double()[0, 0, 0, 2] - math.sqrt(1 - a) * 5.0) / math.sqrt(a) < -2  # below clamp(-2, 1) too
    if sampler == "ddpm":
        got = d.p_sample(
            lambda *a, **k: out, x, t, clip_denoised=True, generator=torch.Generator().manual_seed(4)
        )
        z = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).double()
        mean = (
            math.sqrt(a_prev) * beta / (1 - a) * x0
            + math.sqrt(1 - beta) * (1 - a_prev) / (1 - a) * x.double()
        )
        want = mean + math.sqrt(_posterior_variance(kept, i)) * z
    else:
        got = d.ddim_sample(lambda *a, **k: out, x, t, clip_denoised=True)
        eps_again = (x.double() / math.sqrt(a) - x0) / math.sqrt(1 / a - 1)  # eps re-derived from clipped x0
        want = math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev) * eps_again
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_the_noise_is_drawn_on_the_samples_device(sampler):
    # The meta device stands in for a GPU: noise drawn anywhere else could not be added to x.
    d = create_diffusion("5")
    x, t = torch.zeros(2, 4, 2, 2, device="meta"), torch.tensor([3, 0], device="meta")

    def model(x, t, **k):
        assert t.device.type == "meta"  # the respaced timestep table follows t's device
        return torch.zeros(2, 8, 2, 2, device="meta")

    step = d.p_sample(model, x, t) if sampler == "ddpm" else d.ddim_sample(model, x, t, eta=0.5)
    assert step.device.type == "meta"
    assert d.p_sample_loop(model, (2, 4, 2, 2), device="meta").device.type == "meta"

    # the same process then samples on the CPU: its per-device tables are kept apart
    def cpu_model(x, t, **k):
        assert t.device.type == "cpu" and t.tolist() in (
            [999, 999],
            [749, 749],
            [500, 500],
            [250, 250],
            [0, 0],
        )
        return torch.zeros(2, 8, 2, 2)

    assert d.p_sample_loop(cpu_model, (2, 4, 2, 2)).device.type == "cpu"


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_a_loop_without_noise_draws_it_from_the_generator_and_shows_progress_alike(sampler):
    d, model = create_diffusion("4"), StubDiT()
    loop = d.p_sample_loop if sampler == "ddpm" else d.ddim_sample_loop

    def run(progress):
        return loop(
            model,
            (2, 4, 2, 2),
            model_kwargs={"y": torch.tensor([1, 2])},
            progress=progress,
            generator=torch.Generator().manual_seed(9),
        )

    quiet = run(False)
    torch.manual_seed(123)  # the global generator must play no part
    assert torch.equal(run(True), quiet)
    z = torch.randn((2, 4, 2, 2), generator=torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(9)
    torch.randn((2, 4, 2, 2), generator=g)  # the loop's own draw of z
    assert torch.equal(
        quiet, loop(model, None, noise=z, model_kwargs={"y": torch.tensor([1, 2])}, generator=g)
    )


def test_sample_latents_draws_its_noise_on_the_labels_device():
    # The meta device stands in for a GPU: the labels say where the samples live.
    d, labels = create_diffusion("2"), torch.tensor([1, 2], device="meta")

    def model(x, t, y):
        assert x.device.type == "meta" and t.device.type == "meta"
        return torch.zeros(2, 8, 2, 2, device="meta")

    assert sample_latents(model, d, labels, latent_size=2).device.type == "meta"


class NoClassesDiT:
    """A guided model that does not say how many classes it has: the null class is then 1000,
    ImageNet's (DiT's own null label)."""

    def __init__(self):
        self.ys = []

    def forward_with_cfg(self, x, t, y, cfg_scale, guidance_channels):
        self.ys.append(y.clone())
        return torch.cat([0.3 * x, torch.zeros_like(x)], dim=1)


def test_a_model_without_num_classes_is_guided_with_the_null_class_1000():
    model = NoClassesDiT()
    sample_latents(model, create_diffusion("2"), torch.tensor([4, 0]), latent_size=2, cfg_scale=2.0)
    assert len(model.ys) == 2 and all(y.tolist() == [4, 0, 1000, 1000] for y in model.ys)


def test_guided_ddpm_draws_every_step_from_the_generator():
    d, labels = create_diffusion("3"), torch.tensor([2, 5])

    def run():
        return sample_latents(
            StubDiT(), d, labels, latent_size=2, cfg_scale=1.5, generator=torch.Generator().manual_seed(5)
        )

    first = run()
    torch.manual_seed(321)  # the global generator must play no part
    assert torch.equal(run(), first)
    g = torch.Generator().manual_seed(5)
    z = torch.randn((2, 4, 2, 2), generator=g)
    kwargs = {"y": torch.tensor([2, 5, 10, 10]), "cfg_scale": 1.5, "guidance_channels": None}
    model = StubDiT().forward_with_cfg
    want = d.p_sample_loop(model, None, noise=torch.cat([z, z]), model_kwargs=kwargs, generator=g)
    assert torch.equal(first, want[:2])


@pytest.mark.parametrize("cfg_scale", [1.0, 1.5])
def test_sampling_shows_one_sampling_bar_on_a_terminal_only_when_asked(cfg_scale, capsys, monkeypatch):
    d, labels = create_diffusion("3"), torch.tensor([2, 5])

    def run(**kw):
        sample_latents(StubDiT(), d, labels, latent_size=2, cfg_scale=cfg_scale, **kw)
        return capsys.readouterr().err

    assert run(progress=True) == ""  # a log (stderr is no terminal here): no line per sampling loop
    monkeypatch.setattr("ditbench.core.progress.is_terminal", lambda stream=None: True)
    assert run() == ""  # not asked
    err = run(progress=True)
    # tqdm's first frame: "sampling", counted in steps; the bar is cleared at the end (leave=False)
    assert err.startswith("\rsampling:   0%|") and "| 0/3 [" in err and "?step/s]" in err
    assert err.endswith("\r") and "\n" not in err and "100%" not in err


def test_p_mean_variance_does_not_clip_unless_asked():
    d, kept = create_diffusion("50"), _kept("50")
    a = _step_schedule(kept, 10)[0]
    x, eps = torch.full((1, 1, 1, 1), 0.5), torch.full((1, 1, 1, 1), -3.0)
    out = torch.cat([eps, torch.zeros_like(eps)], dim=1)
    x0 = (0.5 + 3.0 * math.sqrt(1 - a)) / math.sqrt(a)  # beyond 1
    got = d.p_mean_variance(lambda *a, **k: out, x, torch.tensor([10]))
    assert x0 > 1.5 and got["pred_xstart"].item() == pytest.approx(x0, rel=1e-5)
    assert torch.equal(got["eps"], eps)  # the model's own noise prediction, returned as given


# ---- respacing: the reference's section convention, written out -------------------------------


def test_sections_split_the_range_with_the_remainder_first():
    # 10 steps in 3 sections: sizes 4, 3, 3 (the remainder goes to the first); 2 of [0, 4) spaced
    # 3 apart, 3 of [4, 7), 1 of [7, 10).
    assert space_timesteps(10, "2,3,1") == [0, 3, 4, 5, 6, 7]
    assert space_timesteps(10, [2, 3, 1]) == [0, 3, 4, 5, 6, 7]
    assert space_timesteps(1000, 10) == space_timesteps(1000, "10")
    assert space_timesteps(1000, "ddim1000") == list(range(1000))
    assert space_timesteps(1000, "ddim500") == list(range(0, 1000, 2))


@pytest.mark.parametrize(
    "spec,message",
    [
        ("ddimx", "timestep respacing 'ddimx': expected ddimN, e.g. ddim50"),
        ("ddim999", "cannot take exactly 999 steps with an integer stride from 1000"),
        (
            "fast",
            "timestep respacing 'fast': expected a step count such as 250, "
            "a comma list such as 10,15,20, or ddimN",
        ),
        ("2000", "cannot take 2000 steps from a section of 1000 (respacing '2000')"),
    ],
)
def test_bad_respacing_is_named(spec, message):
    with pytest.raises(UserError) as err:
        space_timesteps(1000, spec)
    assert str(err.value) == message


@pytest.mark.parametrize("same", [None, "", "1000", 1000])
def test_respacing_to_every_step_is_the_process_itself(same):
    d = create_diffusion()
    assert d.respaced(same) is d


def test_an_output_without_the_variance_channels_is_named():
    d = create_diffusion("2")
    with pytest.raises(ValueError) as err:
        d.p_sample(lambda *a, **k: torch.zeros(1, 4, 2, 2), torch.zeros(1, 4, 2, 2), torch.tensor([1]))
    assert str(err.value) == "expected a learned-sigma output with 8 channels, got 4"
