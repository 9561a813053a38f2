"""`ditbench fid`: score a sample batch against a reference, print a table, write JSON."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from ditbench.core.errors import UserError
from ditbench.core.escape import plain
from ditbench.metrics import registry
from ditbench.metrics.registry import DEFAULTS


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ditbench.cli.options import add_device, add_json, add_no_progress, add_yes

    d = DEFAULTS
    p.add_argument(
        "--samples",
        required=True,
        metavar="S",
        help="generated images: ADM .npz (`arr_0` uint8 N x H x W x 3) or a folder of PNG/JPEG files",
    )
    p.add_argument(
        "--ref",
        required=True,
        metavar="R",
        help="reference: ADM reference .npz (images, optionally precomputed mu/sigma/mu_s/sigma_s), a "
        "folder or .npz of real images, or a ditbench statistics file",
    )
    p.add_argument(
        "--metrics",
        metavar="LIST",
        help=f"comma-separated subset of {','.join(registry.ALL_METRICS)} (default: all the inputs allow)",
    )
    p.add_argument("--batch-size", type=int, default=d["batch_size"], help="images per Inception pass")
    add_device(p)
    p.add_argument(
        "--inception-weights",
        default=d["inception_weights"],
        metavar="PATH",
        help="torch-fidelity's weights-inception-2015-12-05-6726825d.pth (default: "
        "$DITBENCH_INCEPTION_WEIGHTS, else the torch hub cache, downloaded once); `test`: a calibrated "
        "random network that needs no download (its numbers are not comparable with papers; a file "
        "named test: ./test)",
    )
    p.add_argument(
        "--tf32",
        action="store_true",
        default=d["tf32"],
        help="allow TF32 in the network (faster on Ampere+, changes the features; recorded)",
    )
    for opt in registry.OPTIONS.values():  # each metric's options, from its spec
        p.add_argument(
            opt.flag,
            type=opt.kind,
            default=opt.default,
            metavar="N" if opt.kind is int else "X",
            help=opt.help,
        )
    add_json(p)
    p.add_argument(
        "--out",
        metavar="FILE.json",
        help="the JSON result file to write (default: next to the samples, SAMPLES.metrics.json)",
    )
    p.add_argument(
        "--no-cache", action="store_true", help="neither read nor write the reference statistics cache"
    )
    p.add_argument(
        "--cache-dir",
        default=d["cache_dir"],
        metavar="DIR",
        help="reference cache (default: $DITBENCH_CACHE/fid, else ~/.cache/ditbench/fid)",
    )
    add_no_progress(p)
    add_yes(p)


FID_STATISTICS = {"images": "; FID statistics from its images", "precomputed": "; precomputed FID statistics"}


def format_table(result: dict) -> str:
    m, intervals, t = result["metrics"], result.get("intervals") or {}, result["timings_s"]
    s, r, st, net = result["samples"], result["reference"], result["settings"], result["inception"]
    ref = f"{r['count']} images" if r["count"] is not None else "statistics only"
    ref += FID_STATISTICS.get(r.get("fid_statistics"), "")
    ref += "; features from the cache" if r["cache"].get("hit") else ""
    what = f"{net['name']} (" + ("official" if net["official"] else "NOT official")
    if net.get("recipe") is not None:  # the calibrated random test network
        what += f", calibrated random network recipe {net['recipe']}"
    lines = [f"*** {result['banner']} ***", ""] if result.get("banner") else []
    lines += [
        f"samples    {s['path'] or 'array'}  ({s['count']} images, {s['height']}x{s['width']})",
        f"reference  {r['path']}  ({ref})",
        f"network    {what}, sha256 {net['sha256'][:12]}) on {st['device']}, {st['precision']}",
        "",
    ]
    width = max(len(o.label) for o in registry.OUTPUTS.values())
    for o in registry.OUTPUTS.values():
        if o.key in m and intervals.get(o.key):
            value, low, high = o.with_ends(m[o.key], intervals[o.key][0], intervals[o.key][1])
            lines.append(f"{o.label:<{width}}  {value}  (95% {low} to {high})")
        elif o.key in m:
            lines.append(f"{o.label:<{width}}  {o.fmt.format(m[o.key])}")
    lines += [f"{metric:<{width}}  skipped: {reason}" for metric, reason in result["skipped"].items()]
    if intervals:
        lines.append(
            f"intervals: bootstrap, {st['bootstrap']} resamples of the samples ({t['bootstrap']:.1f} s)"
        )
    lines += [
        "",
        f"time {t['total']:.1f} s (reference features {t.get('reference_features', 0):.1f} s, "
        f"sample features {t.get('sample_features', 0):.1f} s)",
    ]
    return "\n".join(lines)


def _announce(args: argparse.Namespace, scorer, source) -> None:
    """The Inception passes ahead: the samples', and the reference's when its features are not
    precomputed (a cache hit, found only once the reference is hashed, makes it shorter)."""
    from ditbench.hardware.walltime import INCEPTION_FLOPS, announce, flops_s

    name = str(source.path) if source.path else "the samples"  # as score() names them
    # what the counts cannot give is refused first, then the network (and its weight file) is checked
    keys = {k for m in scorer.plan(source.count, name)[0] for k in m.reference_keys}
    device = str(scorer.extractor.device)
    per_image = flops_s(INCEPTION_FLOPS, device, "tf32" if args.tf32 else "fp32")
    ref = scorer.reference
    refs = ref.count if ref.missing(keys) and ref.images is not None else 0
    what = f"Inception features of {source.count:,} images" + (
        f" and {refs:,} reference images" + ("" if args.no_cache else " (fewer if cached)") if refs else ""
    )
    cheaper = "A GPU (--device cuda) computes them in minutes; the reference's features are cached once made."
    announce("fid", per_image and per_image * (source.count + refs), what, device, args.yes, cheaper)


def run(args: argparse.Namespace) -> int:
    from ditbench.files.fileio import write_atomic
    from ditbench.metrics.evaluate import Scorer, as_source, default_output_path

    if args.out:  # before any compute: a name that says JSON, a path that can be written, not an input
        from ditbench.files.outpaths import check_file_target, refuse_output_as_input

        check_file_target(args.out, "--out", writes=("the JSON result", (".json",)))
        refuse_output_as_input([("--out", args.out)], [("--samples", args.samples), ("--ref", args.ref)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the result carries its own warnings; printed below
        source = as_source(args.samples)  # the samples are checked before the reference
        scorer = Scorer(
            args.ref,
            metrics=args.metrics,
            batch_size=args.batch_size,
            device=args.device,
            inception=args.inception_weights,
            tf32=args.tf32,
            cache=not args.no_cache,
            cache_dir=args.cache_dir,
            progress=not args.no_progress,
            **{name: getattr(args, name) for name in registry.OPTIONS},
        )
        _announce(args, scorer, source)
        if not args.no_cache:
            args._resume = "the reference's features are cached once computed; the same command reuses them"
        result = scorer.score(source)
    for w in ([result["banner"]] if result.get("banner") else []) + result["warnings"]:
        print(f"ditbench: warning: {w}", file=sys.stderr)
    text = json.dumps(result, indent=2, allow_nan=False)  # ASCII: every path escaped, valid JSON
    out = Path(args.out) if args.out else default_output_path(args.samples)
    if out is not None:
        try:
            write_atomic(out, text + "\n", "--out")
        except (OSError, UserError) as err:
            if args.out:
                raise UserError(f"--out {out} could not be written: {err}.") from None
            print(f"ditbench: warning: could not write {out} ({err}); use --out", file=sys.stderr)
            out = None
    if args.json:
        print(text)
    else:
        print(plain(format_table(result)))  # a path that is not UTF-8 shows as escapes, not a crash
        if out is not None:
            print(plain(f"result written to {out}"))
    return 0
