"""Gaussian diffusion as DiT trains and samples it (the openai guided-diffusion formulation): 1000 steps,
linear betas 1e-4 .. 0.02, epsilon prediction, learned-range variance; hybrid loss MSE(eps) + L_vb (in
bits, seeing the mean detached); DDPM and DDIM over respaced timesteps, classifier-free guidance.
Schedules are float64 numpy gathered per timestep as float32, like the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ditbench.core.errors import UserError

ModelFn = Callable[..., torch.Tensor]
NUM_TIMESTEPS = 1000  # the DiT/ADM diffusion; sampling respaces these


def linear_betas(num_timesteps: int = NUM_TIMESTEPS) -> np.ndarray:
    scale = NUM_TIMESTEPS / num_timesteps  # keeps the same end points for other step counts, as the reference
    return np.linspace(scale * 1e-4, scale * 0.02, num_timesteps, dtype=np.float64)


def space_timesteps(num_timesteps: int, section_counts: str | int | list[int]) -> list[int]:
    """The timesteps kept when respacing: "250" -> 250 evenly spaced steps from [0, 999]; "ddimN" every
    (num_timesteps // N)-th step; "10,15,20" equal sections, each count spaced evenly (the reference's)."""
    if isinstance(section_counts, (int, str)):
        text = str(section_counts).strip()
        if text.startswith("ddim"):
            try:
                desired = int(text[len("ddim") :])
            except ValueError:
                raise UserError(
                    f"timestep respacing {section_counts!r}: expected ddimN, e.g. ddim50"
                ) from None
            for stride in range(1, num_timesteps):
                if len(range(0, num_timesteps, stride)) == desired:
                    return sorted(range(0, num_timesteps, stride))
            raise UserError(
                f"cannot take exactly {desired} steps with an integer stride from {num_timesteps}"
            )
        try:
            counts = [int(x) for x in text.split(",")]
        except ValueError:
            raise UserError(
                f"timestep respacing {section_counts!r}: expected a step count such as 250, "
                "a comma list such as 10,15,20, or ddimN"
            ) from None
    else:
        counts = [int(x) for x in section_counts]
    size_per, extra = divmod(num_timesteps, len(counts))
    start, kept = 0, []
    for i, count in enumerate(counts):
        size = size_per + (1 if i < extra else 0)
        if count < 1 or count > size:
            raise UserError(
                f"cannot take {count} steps from a section of {size} (respacing {section_counts!r})"
            )
        stride = 1 if count <= 1 else (size - 1) / (count - 1)
        pos = 0.0
        for _ in range(count):
            kept.append(start + round(pos))
            pos += stride
        start += size
    return sorted(set(kept))


def normal_kl(mean1, logvar1, mean2, logvar2):
    """KL(N(mean1, exp(logvar1)) || N(mean2, exp(logvar2))), elementwise."""
    return 0.5 * (
        -1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2)
    )


def approx_standard_normal_cdf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def discretized_gaussian_log_likelihood(x, means, log_scales):
    """log-likelihood of x in [-1, 1] under a Gaussian discretised into 256 bins (edge bins open)."""
    centered = x - means
    inv_stdv = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv_stdv * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_cdf_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_cdf_delta))


def mean_flat(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=list(range(1, x.ndim)))


class GaussianDiffusion:
    """Epsilon-prediction diffusion with learned-range variance over `betas`. `timestep_map` (`respaced`)
    maps this process's steps to the original ones the model is always called with."""

    def __init__(self, betas: np.ndarray, timestep_map: list[int] | None = None):
        betas = np.asarray(betas, dtype=np.float64)
        if betas.ndim != 1 or not ((betas > 0) & (betas <= 1)).all():
            raise ValueError("betas must be a 1-D array in (0, 1]")
        self.betas = betas
        self.num_timesteps = len(betas)
        self.timestep_map = list(range(self.num_timesteps)) if timestep_map is None else list(timestep_map)
        alphas = 1.0 - betas
        ac = np.cumprod(alphas)
        ac_prev = np.append(1.0, ac[:-1])
        self.alphas_cumprod = ac
        self.alphas_cumprod_prev = ac_prev
        self.sqrt_alphas_cumprod = np.sqrt(ac)
        self.sqrt_one_minus_alphas_cumprod = np.sqrt(1.0 - ac)
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / ac)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / ac - 1.0)
        self.posterior_variance = betas * (1.0 - ac_prev) / (1.0 - ac)
        # The posterior variance is 0 at t = 0; the log is clipped to its value at t = 1.
        self.posterior_log_variance_clipped = np.log(
            np.append(self.posterior_variance[1], self.posterior_variance[1:])
        )
        self.posterior_mean_coef1 = betas * np.sqrt(ac_prev) / (1.0 - ac)
        self.posterior_mean_coef2 = (1.0 - ac_prev) * np.sqrt(alphas) / (1.0 - ac)
        self.log_betas = np.log(betas)
        self._identity_map = self.timestep_map == list(range(self.num_timesteps))
        self._device_cache: dict[tuple[str, torch.device], torch.Tensor] = {}

    def respaced(self, section_counts: str | int | list[int]) -> GaussianDiffusion:
        """A process over a subset of the timesteps with betas recomputed so that the kept steps
        have the same alphas_cumprod as in this process."""
        if section_counts in (None, "", str(self.num_timesteps), self.num_timesteps):
            return self
        use = set(space_timesteps(self.num_timesteps, section_counts))
        new_betas, new_map, last = [], [], 1.0
        for i, ac in enumerate(self.alphas_cumprod):
            if i in use:
                new_betas.append(1.0 - ac / last)
                new_map.append(self.timestep_map[i])
                last = ac
        return GaussianDiffusion(np.array(new_betas), timestep_map=new_map)

    def _table(self, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The schedule `name` as a `dtype` tensor on t's device, made once per device."""
        key = (name, t.device)
        if key not in self._device_cache:
            self._device_cache[key] = torch.as_tensor(getattr(self, name), dtype=dtype, device=t.device)
        return self._device_cache[key]

    def _take(self, name: str, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """arr[t] as float32 on like's device, shaped to broadcast against like."""
        out = self._table(name, t, torch.float32)[t]
        return out.reshape(out.shape + (1,) * (like.ndim - 1))

    def _model_t(self, t: torch.Tensor) -> torch.Tensor:
        return t if self._identity_map else self._table("timestep_map", t, t.dtype)[t]

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return (
            self._take("sqrt_alphas_cumprod", t, x0) * x0
            + self._take("sqrt_one_minus_alphas_cumprod", t, x0) * noise
        )

    def q_posterior(self, x0, x_t, t):
        mean = (
            self._take("posterior_mean_coef1", t, x_t) * x0 + self._take("posterior_mean_coef2", t, x_t) * x_t
        )
        return (
            mean,
            self._take("posterior_variance", t, x_t),
            self._take("posterior_log_variance_clipped", t, x_t),
        )

    def p_mean_variance_from_output(
        self, model_output: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, clip_denoised: bool = False
    ) -> dict[str, torch.Tensor]:
        """Mean, log variance and predicted x0 of p(x_{t-1} | x_t) from an 8-channel model output."""
        c = x_t.shape[1]
        if model_output.shape[1] != 2 * c:
            raise ValueError(
                f"expected a learned-sigma output with {2 * c} channels, got {model_output.shape[1]}"
            )
        eps, v = model_output[:, :c], model_output[:, c:]
        min_log = self._take("posterior_log_variance_clipped", t, x_t)
        max_log = self._take("log_betas", t, x_t)
        frac = (v + 1) / 2
        log_variance = frac * max_log + (1 - frac) * min_log
        pred_x0 = (
            self._take("sqrt_recip_alphas_cumprod", t, x_t) * x_t
            - self._take("sqrt_recipm1_alphas_cumprod", t, x_t) * eps
        )
        if clip_denoised:
            pred_x0 = pred_x0.clamp(-1, 1)
        mean, _, _ = self.q_posterior(pred_x0, x_t, t)
        return {"mean": mean, "log_variance": log_variance, "pred_xstart": pred_x0, "eps": eps}

    def p_mean_variance(self, model: ModelFn, x_t, t, model_kwargs=None, clip_denoised=False):
        out = model(x_t, self._model_t(t), **(model_kwargs or {}))
        return self.p_mean_variance_from_output(out.float(), x_t, t, clip_denoised)

    def vb_terms_bpd(self, model_output: torch.Tensor, x0, x_t, t) -> torch.Tensor:
        """Per-sample variational bound term in bits: KL(q || p) for t > 0, decoder NLL at t = 0."""
        true_mean, _, true_log_var = self.q_posterior(x0, x_t, t)
        out = self.p_mean_variance_from_output(model_output, x_t, t)
        kl = mean_flat(normal_kl(true_mean, true_log_var, out["mean"], out["log_variance"])) / math.log(2.0)
        nll = -mean_flat(discretized_gaussian_log_likelihood(x0, out["mean"], 0.5 * out["log_variance"]))
        nll = nll / math.log(2.0)
        return torch.where(t == 0, nll, kl)

    def training_losses(
        self,
        model: ModelFn,
        x0: torch.Tensor,
        t: torch.Tensor,
        model_kwargs: dict | None = None,
        noise: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """Per-sample hybrid loss {"loss": mse + vb, "mse", "vb"} for timesteps t (original indices); the
        model output is cast to float32 first (autocast leaves it in bf16/fp16)."""
        if noise is None:
            noise = torch.randn_like(x0)
        x_t = self.q_sample(x0, t, noise)
        out = model(x_t, self._model_t(t), **(model_kwargs or {})).float()
        c = x0.shape[1]
        eps, v = out[:, :c], out[:, c:]
        # Frozen-mean trick: vb sees eps detached, so it trains only the variance channels.
        vb = self.vb_terms_bpd(torch.cat([eps.detach(), v], dim=1), x0, x_t, t)
        mse = mean_flat((noise.float() - eps) ** 2)
        return {"loss": mse + vb, "mse": mse, "vb": vb}

    def p_sample(self, model, x, t, model_kwargs=None, clip_denoised=False, generator=None):
        out = self.p_mean_variance(model, x, t, model_kwargs, clip_denoised)
        noise = torch.randn(x.shape, device=x.device, generator=generator)
        nonzero = (t != 0).float().reshape(-1, *([1] * (x.ndim - 1)))
        return out["mean"] + nonzero * torch.exp(0.5 * out["log_variance"]) * noise

    @torch.no_grad()
    def p_sample_loop(
        self,
        model: ModelFn,
        shape,
        noise: torch.Tensor | None = None,
        model_kwargs=None,
        clip_denoised: bool = False,
        device=None,
        progress: bool = False,
        generator: torch.Generator | None = None,
        eta: float | None = None,
    ) -> torch.Tensor:
        """Ancestral DDPM sampling (with `eta`: DDIM's) through every step of this (respaced) process."""
        x = torch.randn(tuple(shape), device=device or "cpu", generator=generator) if noise is None else noise
        steps = range(self.num_timesteps - 1, -1, -1)
        if progress:
            from ditbench.core.progress import progress as bar

            steps = bar(steps, desc="sampling", unit="step", leave=False, plain=False)
        for i in steps:
            t = torch.full((x.shape[0],), i, device=x.device, dtype=torch.long)
            if eta is None:
                x = self.p_sample(model, x, t, model_kwargs, clip_denoised, generator)
            else:
                x = self.ddim_sample(model, x, t, model_kwargs, clip_denoised, eta, generator)
        return x

    def ddim_sample(self, model, x, t, model_kwargs=None, clip_denoised=False, eta=0.0, generator=None):
        out = self.p_mean_variance(model, x, t, model_kwargs, clip_denoised)
        # Re-derive eps from the (possibly clipped) x0 prediction, as DDIM does.
        eps = (self._take("sqrt_recip_alphas_cumprod", t, x) * x - out["pred_xstart"]) / self._take(
            "sqrt_recipm1_alphas_cumprod", t, x
        )
        ab = self._take("alphas_cumprod", t, x)
        ab_prev = self._take("alphas_cumprod_prev", t, x)
        sigma = eta * torch.sqrt((1 - ab_prev) / (1 - ab)) * torch.sqrt(1 - ab / ab_prev)
        mean = out["pred_xstart"] * torch.sqrt(ab_prev) + torch.sqrt(1 - ab_prev - sigma**2) * eps
        if eta == 0:
            return mean
        nonzero = (t != 0).float().reshape(-1, *([1] * (x.ndim - 1)))
        return mean + nonzero * sigma * torch.randn(x.shape, device=x.device, generator=generator)

    def ddim_sample_loop(self, *args, eta: float = 0.0, **kwargs) -> torch.Tensor:
        """Deterministic DDIM sampling (eta=0) or its stochastic variant (eta>0)."""
        return self.p_sample_loop(*args, eta=eta, **kwargs)


def create_diffusion(
    timestep_respacing: str | int | None = None, num_timesteps: int = NUM_TIMESTEPS
) -> GaussianDiffusion:
    """DiT's diffusion: linear schedule, learned-range sigma; respaced when asked ("250", "ddim50")."""
    base = GaussianDiffusion(linear_betas(num_timesteps))
    return base.respaced(timestep_respacing) if timestep_respacing else base


def sample_latents(
    model,
    diffusion: GaussianDiffusion,
    labels: torch.Tensor,
    latent_size: int,
    cfg_scale: float = 1.0,
    sampler: str = "ddpm",
    null_class: int | None = None,
    guidance_channels: int | None = None,
    generator: torch.Generator | None = None,
    progress: bool = False,
    in_channels: int = 4,
) -> torch.Tensor:
    """Class-conditional latents (N, C, s, s) for `labels`, with classifier-free guidance when
    cfg_scale > 1 (the batch is doubled with the null class, as DiT's sampler does)."""
    if sampler not in ("ddpm", "ddim"):
        raise UserError(f"sampler {sampler!r} is not known; use ddpm or ddim")
    n = labels.shape[0]
    z = torch.randn((n, in_channels, latent_size, latent_size), device=labels.device, generator=generator)
    loop = diffusion.p_sample_loop if sampler == "ddpm" else diffusion.ddim_sample_loop
    if cfg_scale <= 1.0:
        return loop(model, None, noise=z, model_kwargs={"y": labels}, progress=progress, generator=generator)
    null = getattr(model, "num_classes", 1000) if null_class is None else null_class
    y = torch.cat([labels, torch.full_like(labels, null)])
    kwargs = {"y": y, "cfg_scale": cfg_scale, "guidance_channels": guidance_channels}
    out = loop(
        model.forward_with_cfg, None, torch.cat([z, z]), kwargs, progress=progress, generator=generator
    )
    return out[:n]
