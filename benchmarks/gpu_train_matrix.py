"""Time DiT training steps on one GPU: configuration x precision x checkpointing x batch size.

    python benchmarks/gpu_train_matrix.py --out reports/gpu/train_matrix.json

Every cell runs in a fresh subprocess (clean allocator, clean peak-memory counters, an OOM
cannot poison the next cell) with a per-cell time cap, trains on synthetic latents (latents
only, no VAE, like the anchors), warms up, then times a window of steps with CUDA events and
records images/s, step times, peak allocated/reserved memory and the loss. The JSON file is
rewritten atomically after every cell, so an interrupted run keeps what it measured. At the end
it prints each matched cell next to the official-code anchor measured on an H200
(benchmarks/h200_official_dit_anchor.jsonl) and says whether ditbench is at least as fast with no
more memory.

Selected to finish in about 6 minutes on one H200: the anchor settings, DiT-XL/2 bf16 +
compile + fused AdamW at batch 256 (target >= 600 img/s), every paper configuration once in
bf16, a selective-checkpointing point and the diffusers implementation. `--cells all` adds more.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Official facebookresearch/DiT code on one NVIDIA H200, latents only, no VAE (the measurements are
# in benchmarks/h200_official_dit_anchor.jsonl). key: (model, precision, grad_ckpt, batch, compile)
ANCHORS = {
    ("DiT-XL/2", "fp32", "none", 32, False): {"img_s": 54.0, "peak_gib": 32.7},
    ("DiT-XL/2", "tf32", "none", 32, False): {"img_s": 163.0, "peak_gib": 32.7},
    ("DiT-XL/2", "bf16", "none", 32, False): {"img_s": 277.0, "peak_gib": 26.1},
    ("DiT-XL/2", "fp16", "none", 32, False): {"img_s": 270.0, "peak_gib": 26.1},
    ("DiT-XL/2", "bf16", "full", 32, False): {"img_s": 194.0, "peak_gib": 15.3},
    ("DiT-XL/2", "tf32", "full", 32, False): {"img_s": 131.1, "peak_gib": 15.29},
    ("DiT-XL/2", "bf16", "none", 128, False): {"img_s": 371.0, "peak_gib": 61.9},
    ("DiT-XL/2", "bf16", "full", 128, False): {"img_s": 284.0, "peak_gib": 18.7},
    ("DiT-XL/2", "bf16", "none", 256, True): {"img_s": 596.0, "peak_gib": 93.4},  # + fused AdamW
    ("DiT-L/4", "fp32", "none", 16, False): {"img_s": 217.0, "peak_gib": 10.5},
    ("DiT-L/4", "fp16", "none", 16, False): {"img_s": 200.0, "peak_gib": 10.6},
    ("DiT-L/4", "fp16", "full", 16, False): {"img_s": 130.0, "peak_gib": 10.3},
}
MATMUL_CEILING_TFLOPS = {"bf16": 780.0, "fp16": 749.0, "tf32": 406.0, "fp32": 51.0}  # measured, same H200
TARGET_XL2_COMPILE_IMG_S = 600.0
PAPER_MODELS = [f"DiT-{s}/{p}" for s in ("XL", "L", "B", "S") for p in (2, 4, 8)]


def cell(model, precision, grad_ckpt="none", batch=32, compile=False, impl="ditbench", optimizer="auto"):
    return {
        "model": model,
        "precision": precision,
        "grad_ckpt": grad_ckpt,
        "batch_size": batch,
        "compile": compile,
        "impl": impl,
        "optimizer_impl": optimizer,
    }


def plan(selection: str) -> list[dict]:
    if selection == "tiny":  # plumbing check, runs anywhere in seconds
        return [cell("DiT-T/8", "fp32", batch=4), cell("DiT-T/2", "bf16", "every_2", batch=4)]
    cells = [cell(*key[:4], compile=key[4], optimizer="fused") for key in ANCHORS]
    cells += [cell(m, "bf16", batch=32) for m in PAPER_MODELS if m != "DiT-XL/2"]
    cells += [
        cell("DiT-XL/2", "bf16", "every_2", 128),
        cell("DiT-XL/2", "bf16", "none", 32, impl="diffusers"),
    ]
    if selection == "all":
        for m in PAPER_MODELS:
            for prec in ("tf32", "bf16"):
                for ck in ("none", "full"):
                    for b in (32, 128):
                        c = cell(m, prec, ck, b)
                        if c not in cells:
                            cells.append(c)
    return cells


def cell_key(c: dict):
    return (c["model"], c["precision"], c["grad_ckpt"], c["batch_size"], c["compile"])


# --------------------------------------------------------------------------------------------
# One cell (runs in its own process)
# --------------------------------------------------------------------------------------------


def run_cell(c: dict, device: str, warmup: int, measure: int, min_seconds: float) -> dict:
    """One cell, timed by the same window and memory functions as `ditbench run` (peaks reset after
    the warm-up, CUDA events per step, one synchronisation at the end)."""
    import torch

    sys.path.insert(0, str(REPO))
    from ditbench.bench.cell import memory
    from ditbench.bench.cell.mfu import model_flops_per_image
    from ditbench.bench.cell.window import measure_window, step_stats
    from ditbench.core.errors import UserError
    from ditbench.spec.knobs import Knobs
    from ditbench.train.step import Trainer

    out = dict(c)
    try:
        cfg = Knobs(
            model=c["model"],
            precision=c["precision"],
            grad_ckpt=c["grad_ckpt"],
            batch_size=c["batch_size"],
            compile=c["compile"],
            impl=c["impl"],
            optimizer_impl=c["optimizer_impl"],
            image_size=c.get("image_size", 256 if device != "cpu" else 64),
        )
        t0 = time.perf_counter()
        trainer = Trainer(cfg, device=device)
        out["params"] = trainer.num_params
        out["optimizer_ran"] = trainer.optimizer.ditbench_impl
        dev = trainer.device.type

        def after_warmup() -> None:
            out["warmup_s"] = round(time.perf_counter() - t0, 2)
            memory.reset_peaks(dev)

        window = measure_window(
            trainer, trainer.step, dev, warmup, measure, min_seconds, after_warmup=after_warmup
        )
        stats = step_stats(window["step_ms"])
        out.update(
            status="ok",
            steps=window["steps"],
            step_ms={k: round(stats[k], 2) for k in ("median", "p10", "p90")},
            images_per_s=round(c["batch_size"] * window["steps"] * 1000.0 / sum(window["step_ms"]), 1),
            images_per_s_wall=round(c["batch_size"] * window["steps"] / window["wall_s"], 1),
            loss_last=round(window["last_loss"], 4),
            scaler_skips=trainer.scaler_skips,
        )
        flops = model_flops_per_image(c["model"], cfg.image_size, cfg.impl)  # what run records use
        tflops = out["images_per_s"] * flops / 1e12 if flops else None  # None: no count, still a cell
        out["model_tflops_per_s"] = round(tflops, 1) if tflops is not None else None
        if tflops is not None and c["precision"] in MATMUL_CEILING_TFLOPS and dev == "cuda":
            out["mfu_vs_measured_matmul_ceiling"] = round(tflops / MATMUL_CEILING_TFLOPS[c["precision"]], 3)
        peaks = memory.peak_metrics(dev)
        if dev == "cuda":
            out["peak_alloc_gib"] = round(peaks["peak_mem_allocated_gib"], 2)
            out["peak_reserved_gib"] = round(peaks["peak_mem_reserved_gib"], 2)
    except UserError as err:
        out.update(status="unsupported", reason=str(err))
    except torch.OutOfMemoryError as err:
        out.update(status="oom", reason=str(err).splitlines()[0])
    except Exception as err:  # recorded, not raised: one bad cell must not stop the matrix
        out.update(status="error", reason=f"{type(err).__name__}: {str(err)[:500]}")
    return out


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def env_info() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node()}
    if torch.cuda.is_available():
        info.update(
            gpu=torch.cuda.get_device_name(0),
            cuda=torch.version.cuda,
            gpu_mem_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
        )
    try:
        info["git_sha"] = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except Exception:
        info["git_sha"] = None
    return info


def write_json(path: Path, obj: dict) -> None:
    sys.path.insert(0, str(REPO))
    from ditbench.files.fileio import write_json_atomic

    write_json_atomic(path, obj, indent=1)


def compare(results: list[dict]) -> list[str]:
    lines = [f"{'cell':<44} {'img/s':>8} {'anchor':>8} {'ratio':>6} {'GiB':>7} {'anchor':>7}  verdict"]
    for r in results:
        a = ANCHORS.get(cell_key(r))
        name = (
            f"{r['model']} {r['precision']} ckpt={r['grad_ckpt']} bs={r['batch_size']}"
            + (" compile" if r["compile"] else "")
            + ("" if r["impl"] == "ditbench" else f" [{r['impl']}]")
        )
        if r.get("status") != "ok":
            lines.append(f"{name:<44} {r.get('status')}: {str(r.get('reason', ''))[:60]}")
            continue
        ips, mem = r["images_per_s"], r.get("peak_alloc_gib")
        shown = "-" if mem is None else mem
        if a is None:
            lines.append(f"{name:<44} {ips:>8.1f} {'-':>8} {'-':>6} {shown:>7} {'-':>7}")
            continue
        fast = ips >= a["img_s"]
        lean = mem is not None and mem <= a["peak_gib"] + 0.05
        verdict = (
            "OK" if fast and lean else ("slower" if not fast else "") + (" more-memory" if not lean else "")
        )
        lines.append(
            f"{name:<44} {ips:>8.1f} {a['img_s']:>8.1f} {ips / a['img_s']:>6.2f} {shown:>7} "
            f"{a['peak_gib']:>7}  {verdict.strip()}"
        )
    target = [
        r
        for r in results
        if cell_key(r) == ("DiT-XL/2", "bf16", "none", 256, True) and r.get("status") == "ok"
    ]
    if target:
        ips = target[0]["images_per_s"]
        tflops = target[0].get("model_tflops_per_s")
        ceiling = (
            f"; {tflops:.0f} TFLOP/s = {100 * tflops / MATMUL_CEILING_TFLOPS['bf16']:.0f}% of the measured "
            "bf16 matmul ceiling"
            if tflops is not None
            else "; no FLOP count"
        )
        lines.append(
            f"DiT-XL/2 bf16 + compile, batch 256: {ips:.1f} img/s (target {TARGET_XL2_COMPILE_IMG_S:.0f}: "
            f"{'reached' if ips >= TARGET_XL2_COMPILE_IMG_S else 'NOT reached'}){ceiling}"
        )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / "reports" / "gpu" / "train_matrix.json"))
    p.add_argument(
        "--cells",
        default="default",
        choices=["default", "all", "tiny"],
        help="default: anchors + one pass over the 12 configs (~6 min on an H200)",
    )
    p.add_argument(
        "--device", default="cuda", help="cuda (default); cpu only with --cells tiny, for plumbing"
    )
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps per cell (compile cells: +10)")
    p.add_argument("--measure", type=int, default=10, help="at least this many timed steps")
    p.add_argument("--min-seconds", type=float, default=2.0, help="time at least this long per cell")
    p.add_argument("--cell-timeout", type=float, default=150.0, help="seconds before a cell is killed")
    p.add_argument("--budget", type=float, default=420.0, help="stop starting cells after this many seconds")
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)  # internal: run one cell, print JSON
    args = p.parse_args(argv)

    if args.cell is not None:
        c = json.loads(args.cell)
        warmup = args.warmup + (10 if c["compile"] else 0)
        print("CELL_RESULT " + json.dumps(run_cell(c, args.device, warmup, args.measure, args.min_seconds)))
        return 0

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "gpu_train_matrix: no CUDA device is visible, so there is nothing to time. This script measures "
            "GPU training throughput and memory; run it on a machine with an NVIDIA GPU (e.g. an H200). "
            "For a CPU check of the plumbing use: --device cpu --cells tiny",
            file=sys.stderr,
        )
        return 2
    if args.device == "cpu" and args.cells != "tiny":
        print("gpu_train_matrix: --device cpu is only for --cells tiny", file=sys.stderr)
        return 2

    out_path = Path(args.out)
    cells = plan(args.cells)
    record = {
        "schema": "ditbench.gpu_train_matrix/1",
        "env": env_info(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {k: v for k, v in vars(args).items() if k != "cell"},
        "anchors_source": "official DiT code on one H200 (benchmarks/h200_official_dit_anchor.jsonl)",
        "results": [],
    }
    t_start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for i, c in enumerate(cells):
        elapsed = time.perf_counter() - t_start
        if elapsed > args.budget:
            record["results"].append(dict(c, status="skipped", reason=f"budget of {args.budget:.0f} s used"))
            continue
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--cell",
            json.dumps(c),
            "--device",
            args.device,
            "--warmup",
            str(args.warmup),
            "--measure",
            str(args.measure),
            "--min-seconds",
            str(args.min_seconds),
        ]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.cell_timeout, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CELL_RESULT ")]
            if lines:
                res = json.loads(lines[-1][len("CELL_RESULT ") :])
            else:
                res = dict(c, status="error", reason=f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
        except subprocess.TimeoutExpired:
            res = dict(c, status="timeout", reason=f"cell exceeded {args.cell_timeout:.0f} s")
        res["cell_wall_s"] = round(time.perf_counter() - t0, 1)
        record["results"].append(res)
        record["duration_s"] = round(time.perf_counter() - t_start, 1)
        write_json(out_path, record)
        status = res.get("status")
        summary = (
            f"{res.get('images_per_s')} img/s, {res.get('peak_alloc_gib')} GiB"
            if status == "ok"
            else f"{status}: {str(res.get('reason'))[:100]}"
        )
        print(
            f"[{i + 1}/{len(cells)}] {c['model']} {c['precision']} ckpt={c['grad_ckpt']} bs={c['batch_size']}"
            f"{' compile' if c['compile'] else ''} {c['impl']}: {summary} ({res['cell_wall_s']} s)",
            flush=True,
        )
    record["comparison"] = compare(record["results"])
    write_json(out_path, record)
    print("\n".join(record["comparison"]))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
