"""The device check's in-process parts, each run by device_check.py in a process of its own:

    python benchmarks/device_parts.py PART --out RESULT.json [--dry-run] [--work DIR]

PART is one of preflight, fid, ddp, sampling. Each writes one JSON object to RESULT.json (atomically)
and exits 0 once it has written it; a crash leaves no file and the driver reports the log's tail.
`--dry-run` runs the same code on a CPU with tiny settings.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PACKAGES = {"diffusers": "diffusers", "torch-fidelity": "torch_fidelity", "nvidia-ml-py": "pynvml"}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def preflight(args) -> dict[str, Any]:
    """The machine, the packages, and what the speed work offers (attention backends, compile modes)."""
    import torch

    import ditbench
    from ditbench.models import configs
    from ditbench.spec import knobs

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "ditbench": ditbench.__version__,
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "packages": {name: _version(name) for name in PACKAGES},
        "disk_free_gib": round(shutil.disk_usage(args.work).free / 2**30, 1),
    }
    if out["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        out["gpu"] = {
            "name": props.name,
            "count": torch.cuda.device_count(),
            "total_gib": round(props.total_memory / 2**30, 2),
            "sm_count": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
        }
        try:
            import pynvml

            pynvml.nvmlInit()
            out["gpu"]["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception as err:  # noqa: BLE001 - NVML is optional
            out["gpu"]["driver"] = f"unknown ({type(err).__name__})"
    out["inception_weights"] = preflight_weights()
    modes = list(getattr(knobs, "COMPILE_MODES", None) or getattr(configs, "COMPILE_MODES", None) or ())
    mode_knob = "compile_mode" if "compile_mode" in knobs.KNOBS else ("compile" if modes else None)
    valid = []
    for mode in modes:
        try:
            knobs.PartialKnobs(**{mode_knob: mode})
            valid.append(mode)
        except Exception:  # noqa: BLE001 - a mode this knob does not take is not offered
            pass
    out["speed_work"] = {
        "attention_backends": list(configs.ATTENTION_BACKENDS),
        "compile_modes": valid,
        "compile_mode_knob": mode_knob if valid else None,
    }
    return out


# ---------------------------------------------------------------------------------------------
# FID: ~8,000 samples against a reference whose statistics are already cached
# ---------------------------------------------------------------------------------------------

FID_REAL = {"n": 8000, "ref_n": 2000, "pool": 500, "size": 256, "batch": 250}
FID_DRY = {"n": 10, "ref_n": 10, "pool": 5, "size": 32, "batch": 10}


def tiled_images(count: int, pool: int, size: int, seed: int):
    """`count` uint8 images made from `pool` distinct ones (coarse blocks plus noise), tiled: a second
    to build 8,000 at 256 px, where drawing each one afresh takes a minute on one thread."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cells = -(-size // 16)
    coarse = rng.integers(0, 256, size=(pool, cells, cells, 3), dtype=np.uint8)
    base = np.repeat(np.repeat(coarse, 16, axis=1), 16, axis=2)[:, :size, :size]
    base = (base // 8 * 7 + rng.integers(0, 32, size=base.shape, dtype=np.uint8)).astype(np.uint8)
    return base[np.arange(count) % pool]


def fid(args) -> dict[str, Any]:
    import numpy as np
    import torch

    from ditbench.metrics.evaluate import Scorer
    from ditbench.metrics.weights import TEST_NETWORK, FeatureExtractor

    s = FID_DRY if args.dry_run else FID_REAL
    device = "cpu" if args.dry_run else "cuda"
    work = Path(args.work)
    t = time.perf_counter()
    samples, ref = work / "fid_samples.npz", work / "fid_ref.npz"
    np.savez(samples, arr_0=tiled_images(s["n"], s["pool"], s["size"], 1))
    np.savez(ref, arr_0=tiled_images(s["ref_n"], s["pool"], s["size"], 2))
    prepare_s = time.perf_counter() - t
    # One network for both evaluations: loading it is not what a second evaluation is timed for.
    t = time.perf_counter()
    extractor = FeatureExtractor(
        preflight_weights() or TEST_NETWORK, device, batch_size=s["batch"], progress=False
    )
    load_s = time.perf_counter() - t
    common = dict(extractor=extractor, cache_dir=work / "fid_cache", progress=False)
    try:
        t = time.perf_counter()
        Scorer(str(ref), **common).prepare()  # fills the reference cache (a user's first evaluation)
        fill_s = time.perf_counter() - t
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        result = Scorer(str(ref), **common).score(str(samples))  # what a user waits for the second time
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
    finally:
        samples.unlink(missing_ok=True)
    features_s = result["timings_s"]["sample_features"]
    return {
        "settings": {**s, "device": device, "precision": result["settings"]["precision"]},
        "inception": result["inception"],
        "prepare_inputs_s": round(prepare_s, 2),
        "load_network_s": round(load_s, 2),
        "reference_cache_fill_s": round(fill_s, 2),
        "end_to_end_s": round(wall, 2),
        "sample_features_img_s": round(s["n"] / features_s, 1) if features_s else None,
        "reference_cache_hit": (result["reference"].get("cache") or {}).get("hit"),
        "timings_s": result["timings_s"],
        "metrics": result["metrics"],
        "skipped": result["skipped"],
    }


def preflight_weights() -> str | None:
    from ditbench.metrics.weights import WEIGHTS_ENV, default_weights_path

    given = os.environ.get(WEIGHTS_ENV)
    if given:
        return given
    return str(default_weights_path()) if default_weights_path().is_file() else None


# ---------------------------------------------------------------------------------------------
# DDP overhead at one GPU, and sampling throughput
# ---------------------------------------------------------------------------------------------

DDP_REAL = {
    "model": "DiT-XL/2",
    "precision": "bf16",
    "batch": 32,
    "size": 256,
    "warmup": 3,
    "measure": 10,
    "repeats": 2,
}
DDP_DRY = {
    "model": "DiT-T/8",
    "precision": "fp32",
    "batch": 2,
    "size": 64,
    "warmup": 1,
    "measure": 3,
    "repeats": 1,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ddp(args) -> dict[str, Any]:
    """The same cell bare and wrapped in DistributedDataParallel at world size 1, A/B/A/B: DDP's own cost
    (bucketing, hooks, the all-reduce kernels) with no communication to hide it."""
    import torch

    from ditbench.bench.cell.window import measure_window
    from ditbench.hardware import dist
    from ditbench.spec.knobs import Knobs
    from ditbench.train.step import Trainer

    s = DDP_DRY if args.dry_run else DDP_REAL
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    os.environ["LOCAL_WORLD_SIZE"] = "1"
    ctx = dist.init("cpu" if args.dry_run else "cuda")
    times: dict[str, list[float]] = {"plain": [], "ddp": []}
    try:
        for _ in range(s["repeats"]):
            for mode in ("plain", "ddp"):
                cfg = Knobs(
                    model=s["model"], image_size=s["size"], precision=s["precision"], batch_size=s["batch"]
                )
                wrap = (lambda m: dist.wrap_model(m, "ddp", ctx)) if mode == "ddp" else None
                trainer = Trainer(cfg, device=str(ctx.device), wrap_model=wrap)
                window = measure_window(
                    trainer, trainer.step, ctx.device.type, s["warmup"], s["measure"], 0.0
                )
                times[mode].append(statistics.median(window["step_ms"]))
                del trainer
                if ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
    finally:
        dist.shutdown()
    plain, wrapped = statistics.median(times["plain"]), statistics.median(times["ddp"])
    return {
        "settings": s,
        "backend": ctx.backend,
        "step_ms_plain": round(plain, 3),
        "step_ms_ddp": round(wrapped, 3),
        "images_per_s_plain": round(1e3 * s["batch"] / plain, 1),
        "images_per_s_ddp": round(1e3 * s["batch"] / wrapped, 1),
        "ddp_overhead_pct": round(100 * (wrapped / plain - 1), 2),
        "step_ms_runs": times,
    }


SAMPLE_REAL = {"model": "DiT-XL/2", "size": 256, "precision": "bf16", "batch": 32, "steps": 250}
SAMPLE_DRY = {"model": "DiT-T/2", "size": 32, "precision": "fp32", "batch": 2, "steps": 3}


def sampling(args) -> dict[str, Any]:
    """`ditbench sample` itself (random weights, random-weight VAE: they cost what trained ones do):
    a 3-step warm-up of the same shapes, then one batch at the full number of steps, cfg 1.5."""
    from ditbench.cli import sample as cli
    from ditbench.sampling import sampler

    s = SAMPLE_DRY if args.dry_run else SAMPLE_REAL
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    common = ["random", "--model", s["model"], "--image-size", str(s["size"]), "--vae", "random"]
    common += [
        "--cfg-scale",
        "1.5",
        "--device",
        "cpu" if args.dry_run else "cuda",
        "--precision",
        s["precision"],
    ]
    common += ["--batch-size", str(s["batch"]), "--num-samples", str(s["batch"]), "--no-progress"]
    work = Path(args.work)
    warm = parser.parse_args([*common, "--steps", "3", "--out", str(work / "sample_warm.npz")])
    sampler.sample(warm)
    rec = sampler.sample(
        parser.parse_args([*common, "--steps", str(s["steps"]), "--out", str(work / "sample.npz")])
    )
    seconds = rec["sampling_seconds"]
    return {
        "settings": {**s, "cfg_scale": 1.5, "sampler": "ddpm", "weights": "random", "vae": "random"},
        "seconds": round(seconds, 3),
        "images_per_s": rec["images_per_s"],
        "ms_per_step": round(1e3 * seconds / s["steps"], 2),
        "shape": rec["shape"],
    }


PARTS = {"preflight": preflight, "fid": fid, "ddp": ddp, "sampling": sampling}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=sorted(PARTS))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("."))
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result = PARTS[args.part](args)
    result["part_seconds"] = round(time.perf_counter() - start, 2)
    tmp = args.out.with_name(args.out.name + ".part")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
