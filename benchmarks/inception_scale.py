"""The scale of the test Inception (`--inception-weights test`): FID, sFID and KID on known inputs.

    OMP_NUM_THREADS=1 python benchmarks/inception_scale.py [--n 64] [--out reports/test_inception_scale]

The test network (metrics/inception.py) is a random InceptionV3 whose features are scaled to a
stated total variance over its calibration images. Its numbers mean nothing about image quality;
this table says what range they read in: the same synthetic distribution at two seeds (the noise
floor at this N), the 'smooth', 'mixed' and 'noisy' styles of inception.synthetic_images against
each other, and the same style at 32 px and 128 px (larger inputs carry more high-frequency energy,
the way photographs do). It also measures the features' total variance over the calibration images,
which the recipe sets to inception.FEATURE_TRACE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from ditbench.metrics import inception as calibrated  # noqa: E402
from ditbench.metrics.fid import feature_statistics, frechet_distance  # noqa: E402
from ditbench.metrics.kid import kernel_inception_distance  # noqa: E402
from ditbench.metrics.weights import TEST_NETWORK_RECIPE, load_network  # noqa: E402

SETS = {  # name: (style, image size, seed)
    "mixed-a": ("mixed", 32, 100),
    "mixed-b": ("mixed", 32, 101),
    "smooth": ("smooth", 32, 102),
    "noisy": ("noisy", 32, 103),
    "mixed-128px": ("mixed", 128, 104),
}
PAIRS = [
    ("mixed-a", "mixed-b", "same distribution, two seeds (noise floor)"),
    ("mixed-a", "smooth", "mixed vs smooth"),
    ("mixed-a", "noisy", "mixed vs noisy"),
    ("smooth", "noisy", "smooth vs noisy"),
    ("mixed-a", "mixed-128px", "mixed at 32 px vs 128 px"),
]


def features(net, images, batch: int = 16) -> dict[str, torch.Tensor]:
    out: dict[str, list] = {"pool3": [], "spatial": []}
    with torch.no_grad():
        for i in range(0, len(images), batch):
            x = images[i : i + batch]
            f = net(x if isinstance(x, torch.Tensor) else calibrated.to_nchw(x))
            for k in out:
                out[k].append(f[k])
    return {k: torch.cat(v) for k, v in out.items()}


def total_variance(x: torch.Tensor) -> float:
    x = x.double()
    return float(((x - x.mean(0)) ** 2).sum() / (len(x) - 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="images per set (default 64)")
    ap.add_argument("--out", default="reports/test_inception_scale")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # FewSamplesWarning: N < 2048 is the point of a small table
    t0 = time.perf_counter()
    load_start = os.getloadavg()[0]
    net, info = load_network("test")
    calib = features(net, calibrated.calibration_images(16, seed=1000))  # the recipe's images (seed 0)
    feats = {}
    for name, (style, size, seed) in SETS.items():
        feats[name] = features(net, calibrated.synthetic_images(args.n, size, seed=seed, style=style))
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    kid_subset = args.n // 2
    rows = []
    for a, b, what in PAIRS:
        fa, fb = feats[a], feats[b]
        kid = kernel_inception_distance(fa["pool3"], fb["pool3"], subsets=100, subset_size=kid_subset)
        rows.append(
            {
                "pair": what,
                "sets": [a, b],
                "fid": frechet_distance(*feature_statistics(fa["pool3"]), *feature_statistics(fb["pool3"])),
                "sfid": frechet_distance(
                    *feature_statistics(fa["spatial"]), *feature_statistics(fb["spatial"])
                ),
                "kid": kid[0],
                "kid_std": kid[1],
            }
        )
    scale = {
        name: {
            "pool3_mean": float(f["pool3"].double().mean()),
            "pool3_total_variance": total_variance(f["pool3"]),
            "spatial_mean": float(f["spatial"].double().mean()),
            "spatial_total_variance": total_variance(f["spatial"]),
        }
        for name, f in {"calibration images": calib, **feats}.items()
    }
    record = {
        "network": {**info.describe(), "feature_trace": calibrated.FEATURE_TRACE},
        "recipe": TEST_NETWORK_RECIPE,
        "n_per_set": args.n,
        "kid": {"subsets": 100, "subset_size": kid_subset},
        "sets": {k: {"style": s, "size_px": z, "seed": d} for k, (s, z, d) in SETS.items()},
        "rows": rows,
        "feature_scale": scale,
        "conditions": {
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "load_1min_start": load_start,
            "load_1min_end": os.getloadavg()[0],
            "wall_s": round(time.perf_counter() - t0, 1),
        },
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "README.md").write_text(markdown(record))
    print(markdown(record))
    return 0


def markdown(r: dict) -> str:
    c = r["conditions"]
    lines = [
        "# The scale of the test Inception",
        "",
        f"`--inception-weights test`: the calibrated random network, recipe {r['recipe']} (sha256 "
        f"{r['network']['sha256'][:12]}), features scaled to a total variance of "
        f"{r['network']['feature_trace']:g} over its 16 calibration images. Not the official "
        "Inception: these numbers say what range its values read in, nothing about image quality.",
        "",
        f"N = {r['n_per_set']} synthetic images per set (calibrated.synthetic_images; 32 px unless "
        f"named), KID over {r['kid']['subsets']} subsets of {r['kid']['subset_size']}. Made by "
        f"`benchmarks/inception_scale.py --n {r['n_per_set']}` in {c['wall_s']:.0f} s on "
        f"{c['torch_threads']} torch thread(s), {c['cpu_count']} cores, load "
        f"{c['load_1min_start']:.1f} -> {c['load_1min_end']:.1f}, torch {c['torch']}.",
        "",
        "| pair | FID | sFID | KID (std over subsets) |",
        "|---|---:|---:|---:|",
    ]
    for row in r["rows"]:
        lines.append(
            f"| {row['pair']} | {row['fid']:.1f} | {row['sfid']:.1f} | "
            f"{row['kid']:.4f} ({row['kid_std']:.4f}) |"
        )
    lines += [
        "",
        "Feature scale per set (mean value; total variance = trace of the covariance):",
        "",
        "| set | pool3 mean | pool3 total variance | spatial mean | spatial total variance |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in r["feature_scale"].items():
        lines.append(
            f"| {name} | {s['pool3_mean']:.3f} | {s['pool3_total_variance']:.1f} | "
            f"{s['spatial_mean']:.3f} | {s['spatial_total_variance']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
