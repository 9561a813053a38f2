"""ditbench's training step against the official DiT train.py loop, side by side on one CPU.

    python benchmarks/bench_vs_official.py [--cells all|quick|S8-fp32,...] [--out reports/speed_cpu.md]

The reference recipe is written here from the official loop (facebookresearch/DiT train.py and the
guided-diffusion loss it calls): `torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)`
with torch's default implementation for the device (the for-loop one on a CPU), the hybrid loss
(MSE on eps + the variational bound on the frozen-mean output, timestep tables gathered from float64
numpy arrays per call), `opt.zero_grad()`, `loss.backward()`, `opt.step()` and the python-loop EMA
`ema.mul_(0.9999).add_(p, alpha=1e-4)` over every named parameter. Both sides train the same DiT
(ditbench's, official state-dict layout and initialisation) from the same weights, on the same
pre-drawn batches; a bf16 cell runs the reference's forward and loss under the same CPU autocast, a
checkpointed cell gives it the same checkpointed model: what differs is the step around the model.

Rounds alternate in one process (reference then ditbench, then ditbench then reference, ...), each
side running `--steps` timed steps per round after a warm-up, with the garbage collector off while
timing. Per round, ratio = reference median step / ditbench median step; a cell reports the median
ratio over rounds and its range. The markdown table goes to `--out`, the figures to `--json`.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import platform
import statistics
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ditbench.models.build import build_model  # noqa: E402
from ditbench.spec.knobs import Knobs  # noqa: E402
from ditbench.train.step import Trainer  # noqa: E402

IMAGE_SIZE = 128
BATCH = 8
TARGET_RATIO = 1.2


@dataclass(frozen=True)
class BenchCell:
    model: str
    precision: str
    grad_ckpt: str

    @property
    def key(self) -> str:
        size = self.model.split("-")[1].replace("/", "")
        return f"{size}-{self.precision}" + ("-ckpt" if self.grad_ckpt != "none" else "")

    @property
    def label(self) -> str:
        return f"{self.model} {self.precision}" + (
            f" ckpt={self.grad_ckpt}" if self.grad_ckpt != "none" else ""
        )


CELLS = [
    BenchCell(m, p, c)
    for m in ("DiT-S/8", "DiT-S/4", "DiT-B/8")
    for p, c in (("fp32", "none"), ("bf16", "none"), ("fp32", "full"))
]


# ---- the reference recipe: the official loss and loop, written from their formulas ------------------


class OfficialHybridLoss:
    """guided-diffusion's training_losses as DiT configures it: linear betas 1e-4..0.02 over 1000 steps,
    eps prediction, learned-range variance, loss = MSE(eps) + the variational bound in bits, which sees
    the predicted eps detached. Schedule values are gathered per call from float64 numpy tables
    (`from_numpy(arr).to(device)[t].float()`), as the official code does."""

    def __init__(self, num_timesteps: int = 1000):
        betas = np.linspace(1e-4, 0.02, num_timesteps, dtype=np.float64)
        self.num_timesteps = num_timesteps
        alphas = 1.0 - betas
        ac = np.cumprod(alphas)
        ac_prev = np.append(1.0, ac[:-1])
        self.sqrt_ac = np.sqrt(ac)
        self.sqrt_one_minus_ac = np.sqrt(1.0 - ac)
        self.sqrt_recip_ac = np.sqrt(1.0 / ac)
        self.sqrt_recipm1_ac = np.sqrt(1.0 / ac - 1)
        post_var = betas * (1.0 - ac_prev) / (1.0 - ac)
        self.post_log_var_clipped = np.log(np.append(post_var[1], post_var[1:]))
        self.post_coef1 = betas * np.sqrt(ac_prev) / (1.0 - ac)
        self.post_coef2 = (1.0 - ac_prev) * np.sqrt(alphas) / (1.0 - ac)
        self.log_betas = np.log(betas)

    @staticmethod
    def _extract(arr: np.ndarray, t: torch.Tensor, shape) -> torch.Tensor:
        res = torch.from_numpy(arr).to(device=t.device)[t].float()
        while len(res.shape) < len(shape):
            res = res[..., None]
        return res.expand(shape)

    @staticmethod
    def _mean_flat(x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=list(range(1, len(x.shape))))

    def _posterior(self, x0, xt, t):
        mean = (
            self._extract(self.post_coef1, t, xt.shape) * x0
            + self._extract(self.post_coef2, t, xt.shape) * xt
        )
        return mean, self._extract(self.post_log_var_clipped, t, xt.shape)

    @staticmethod
    def _normal_kl(mean1, logvar1, mean2, logvar2):
        return 0.5 * (
            -1.0
            + logvar2
            - logvar1
            + torch.exp(logvar1 - logvar2)
            + (mean1 - mean2) ** 2 * torch.exp(-logvar2)
        )

    @staticmethod
    def _decoder_log_likelihood(x, means, log_scales):
        def cdf(v):
            return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * torch.pow(v, 3))))

        centered = x - means
        inv_stdv = torch.exp(-log_scales)
        cdf_plus = cdf(inv_stdv * (centered + 1.0 / 255.0))
        cdf_min = cdf(inv_stdv * (centered - 1.0 / 255.0))
        log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
        log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
        log_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
        return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_delta))

    def training_losses(self, model, x0, t, model_kwargs, noise=None):
        if noise is None:
            noise = torch.randn_like(x0)
        xt = (
            self._extract(self.sqrt_ac, t, x0.shape) * x0
            + self._extract(self.sqrt_one_minus_ac, t, x0.shape) * noise
        )
        out = model(xt, t, **model_kwargs).float()  # autocast leaves a bf16 output; the loss is fp32
        c = xt.shape[1]
        eps, var_values = torch.split(out, c, dim=1)
        frozen = torch.cat([eps.detach(), var_values], dim=1)
        f_eps, f_var = torch.split(frozen, c, dim=1)
        min_log = self._extract(self.post_log_var_clipped, t, xt.shape)
        max_log = self._extract(self.log_betas, t, xt.shape)
        frac = (f_var + 1) / 2
        log_var = frac * max_log + (1 - frac) * min_log
        pred_x0 = (
            self._extract(self.sqrt_recip_ac, t, xt.shape) * xt
            - self._extract(self.sqrt_recipm1_ac, t, xt.shape) * f_eps
        )
        model_mean, _ = self._posterior(pred_x0, xt, t)
        true_mean, true_log_var = self._posterior(x0, xt, t)
        kl = self._mean_flat(self._normal_kl(true_mean, true_log_var, model_mean, log_var)) / np.log(2.0)
        nll = -self._decoder_log_likelihood(x0, model_mean, 0.5 * log_var)
        nll = self._mean_flat(nll) / np.log(2.0)
        vb = torch.where(t == 0, nll, kl)
        mse = self._mean_flat((noise - eps) ** 2)
        return {"loss": mse + vb, "mse": mse, "vb": vb}


@torch.no_grad()
def official_update_ema(ema_model, model, decay: float = 0.9999) -> None:
    ema_params = OrderedDict(ema_model.named_parameters())
    for name, param in OrderedDict(model.named_parameters()).items():
        ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


class OfficialStep:
    """The official train.py loop body on a model: t, hybrid loss, zero_grad, backward, step, EMA."""

    def __init__(self, model: torch.nn.Module, autocast_dtype: torch.dtype | None = None):
        self.model = model.train()
        self.ema = copy.deepcopy(model).eval()
        self.ema.requires_grad_(False)
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
        self.diffusion = OfficialHybridLoss()
        self.autocast_dtype = autocast_dtype
        self.device = next(model.parameters()).device

    def step(self, batch) -> torch.Tensor:
        x, y = batch
        t = torch.randint(0, self.diffusion.num_timesteps, (x.shape[0],), device=x.device)
        with torch.autocast(
            self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None
        ):
            loss = self.diffusion.training_losses(self.model, x, t, dict(y=y))["loss"].mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        official_update_ema(self.ema, self.model)
        return loss.detach()


def build_pair(cell: BenchCell, seed: int = 0, image_size: int = IMAGE_SIZE, batch: int = BATCH, **knobs):
    """(ditbench Trainer, OfficialStep) on the same initial weights; `knobs` go to ditbench's Knobs."""
    cfg = Knobs(
        model=cell.model,
        image_size=image_size,
        batch_size=batch,
        precision=cell.precision,
        grad_ckpt=cell.grad_ckpt,
        seed=seed,
        **knobs,
    )
    trainer = Trainer(cfg, device="cpu")
    model = build_model(cell.model, image_size=image_size, grad_ckpt=cell.grad_ckpt)
    model.load_state_dict(trainer.base_model.state_dict())
    reference = OfficialStep(model, torch.bfloat16 if cell.precision == "bf16" else None)
    return trainer, reference


# ---- timing ------------------------------------------------------------------------------------------


# wall: elapsed time. cpu: this process's CPU time, which other processes on a shared, loaded machine
# inflate far less (they still share caches and memory bandwidth); with one torch thread no worker spins.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _timed(step, batches, n: int, clock=time.perf_counter) -> list[float]:
    out = []
    gc.collect()
    gc.disable()
    try:
        for i in range(n):
            t0 = clock()
            step(batches[i % len(batches)])
            out.append((clock() - t0) * 1e3)
    finally:
        gc.enable()
    return out


def measure_cell(cell: BenchCell, rounds: int, steps: int, warmup: int, clock: str = "wall", **knobs) -> dict:
    trainer, reference = build_pair(cell, **knobs)
    g = torch.Generator().manual_seed(1)
    latent = IMAGE_SIZE // 8
    batches = [
        (torch.randn(BATCH, 4, latent, latent, generator=g), torch.randint(0, 1000, (BATCH,), generator=g))
        for _ in range(4)
    ]
    sides = {"reference": reference.step, "ditbench": trainer.step}
    for step in sides.values():
        _timed(step, batches, warmup)
    tick = CLOCKS[clock]
    times: dict[str, list[float]] = {"reference": [], "ditbench": []}
    ratios = []
    for r in range(rounds):
        order = ("reference", "ditbench") if r % 2 == 0 else ("ditbench", "reference")
        this = {side: _timed(sides[side], batches, steps, tick) for side in order}
        for side, ms in this.items():
            times[side].extend(ms)
        ratios.append(statistics.median(this["reference"]) / statistics.median(this["ditbench"]))
    ref_ms, dit_ms = statistics.median(times["reference"]), statistics.median(times["ditbench"])
    return {
        "cell": cell.label,
        "key": cell.key,
        "model": cell.model,
        "precision": cell.precision,
        "grad_ckpt": cell.grad_ckpt,
        "image_size": IMAGE_SIZE,
        "batch_size": BATCH,
        "reference_ms": ref_ms,
        "ditbench_ms": dit_ms,
        "ratio": statistics.median(ratios),
        # Load from other processes only ever adds time: the fastest steps are each side's least disturbed.
        "ratio_fastest": min(times["reference"]) / min(times["ditbench"]),
        "reference_min_ms": min(times["reference"]),
        "ditbench_min_ms": min(times["ditbench"]),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "round_ratios": [round(x, 4) for x in ratios],
        "reference_samples_ms": [round(x, 2) for x in times["reference"]],
        "ditbench_samples_ms": [round(x, 2) for x in times["ditbench"]],
        "optimizer_kernel": getattr(trainer.optimizer, "ditbench_impl", None),
        "meets_target": statistics.median(ratios) >= TARGET_RATIO,
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# ditbench step vs the official DiT train.py loop on a CPU",
        "",
        f"`python benchmarks/bench_vs_official.py {meta['args']}` on {meta['cpu']} "
        f"({meta['threads']} torch thread(s), torch {meta['torch']}), {meta['when']}, timed by the "
        f"{meta['clock']} clock. {IMAGE_SIZE} px, batch {BATCH}, synthetic latents, "
        f"{meta['rounds']} alternating rounds of {meta['steps']} step(s) per side after {meta['warmup']} "
        "warm-up steps. Ratio = reference median step time / ditbench median step time, per round; "
        "the table gives the median over rounds and its range, and the ratio of each side's fastest step. "
        f"Target: >= {TARGET_RATIO}x in every cell.",
        "",
        "| cell | reference ms/step | ditbench ms/step | ratio (median) | range over rounds "
        "| fastest steps (ms) | ratio of fastest | >= target |",
        "|---|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {r['reference_ms']:.1f} | {r['ditbench_ms']:.1f} | {r['ratio']:.2f}x | "
            f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f} | {r['reference_min_ms']:.0f} / "
            f"{r['ditbench_min_ms']:.0f} | {r['ratio_fastest']:.2f}x | "
            f"{'yes' if r['meets_target'] else 'NO'} |"
        )
    lines += ["", meta.get("note", "").strip(), ""]
    return "\n".join(lines)


def select(spec: str) -> list[BenchCell]:
    if spec == "all":
        return CELLS
    if spec == "quick":
        return [c for c in CELLS if c.key == "S8-fp32"]
    keys = {c.key: c for c in CELLS}
    wanted = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = [k for k in wanted if k not in keys]
    if unknown:
        raise SystemExit(f"unknown cell(s) {', '.join(unknown)}; valid: {', '.join(keys)}, all, quick")
    return [keys[k] for k in wanted]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", default="all", help="all, quick, or keys such as S8-fp32,B8-bf16,S4-fp32-ckpt")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=3, help="timed steps per side per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="wall, or this process's CPU time")
    p.add_argument("--out", default=None, help="markdown table (e.g. reports/speed_cpu.md)")
    p.add_argument("--json", default=None, help="every figure as JSON")
    p.add_argument("--note", default="", help="a paragraph appended under the table")
    args = p.parse_args(argv)
    if min(args.rounds, args.steps) < 1 or args.warmup < 0:
        raise SystemExit("--rounds and --steps must be at least 1, --warmup at least 0")
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    rows = []
    for cell in select(args.cells):
        row = measure_cell(cell, args.rounds, args.steps, args.warmup, args.clock)
        rows.append(row)
        print(
            f"{row['cell']:<24} reference {row['reference_ms']:8.1f} ms  "
            f"ditbench {row['ditbench_ms']:8.1f} ms  ratio {row['ratio']:.2f}x "
            f"({row['ratio_min']:.2f}-{row['ratio_max']:.2f}), fastest steps {row['ratio_fastest']:.2f}x",
            flush=True,
        )
    meta = {
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "args": " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "note": args.note,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(markdown(rows, meta))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"meta": meta, "cells": rows}, indent=1) + "\n")
    return 0 if all(r["meets_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
