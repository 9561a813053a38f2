"""`ditbench plan`: predicted training memory of a grid or a suite on a card, and the decision tree."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ditbench.errors import UserError, shorten

HELP = """\
Predict each cell's peak training memory on a card without the card: the Trainer's real step is
traced on fake tensors and replayed through the CUDA caching allocator. Without SUITE the grid is
the 12 paper models x fp32/tf32/fp16/bf16 x checkpointing none/full/every_2 x batches 8..512.
Table cells show the GiB the card must hold (allocator reserve + CUDA context); (x) does not fit,
"tight" fits within the planner's error (6%) of the card's memory, * measured (from --results), n/a
the setting cannot run there. With SUITE, KEY=VALUE overrides change its cells (optimizer_impl=foreach).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = HELP
    parser.add_argument(
        "suite",
        nargs="?",
        help="plan this suite's cells (a shipped name or a YAML path) instead of the default grid",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="change the suite as `ditbench run` does: a knob (optimizer_impl=foreach, batch_size=[16,32]) "
        "or a suite key (card=H100)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--card", help='the card to plan for, e.g. "RTX 4090", A100-80GB, H200')
    where.add_argument("--memory-gib", type=float, help="or the card's usable memory in GiB")
    parser.add_argument("--models", action="append", help="grid models, comma-separated (default: the 12)")
    parser.add_argument(
        "--precisions", action="append", help="grid precisions (default: fp32,tf32,fp16,bf16)"
    )
    parser.add_argument(
        "--grad-ckpt", action="append", help="grid checkpointing (default: none,full,every_2)"
    )
    parser.add_argument("--batches", action="append", help="grid batch sizes (default: 8,16,...,512)")
    parser.add_argument("--image-size", type=int, default=None, help="grid image size in pixels (256)")
    parser.add_argument(
        "--impl", default=None, choices=("ditbench", "diffusers"), help="grid DiT implementation (ditbench)"
    )
    parser.add_argument(
        "--optimizer-impl",
        default=None,
        choices=("auto", "fused", "foreach", "for-loop"),
        help="grid AdamW kernel (auto)",
    )
    parser.add_argument("--results", type=Path, help="results.jsonl whose measured cells replace predictions")
    parser.add_argument(
        "--context-gib",
        type=float,
        default=None,
        help="CUDA context outside the allocator (default: 0.5, or measured with --results)",
    )
    parser.add_argument(
        "--target-batch", type=int, default=None, help="batch the decision tree aims for (32)"
    )
    parser.add_argument("--no-tree", action="store_true", help="skip the decision tree over card classes")
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="data-parallel GPUs per cell for the speed prediction (default: 1): adds DDP's all-reduce over "
        "the card's interconnect; memory stays the one-GPU trace",
    )
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument(
        "--target-steps", type=int, default=None, help="steps to train, for days and GPU-hours (400000)"
    )
    goal.add_argument("--target-images", type=int, default=None, help="or images to train on")
    parser.add_argument(
        "--calibrate",
        type=Path,
        metavar="RESULTS.jsonl",
        help="fit the speed model on these measured cells (ditbench records of GPUs in the card table) "
        "instead of the shipped H200 calibration",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="processes tracing series in parallel (default: from the CPU count)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the plan as JSON on stdout instead of tables"
    )
    from ditbench.expansion import add_max_cells

    add_max_cells(parser, "a grid (or --suite matrix) of")
    parser.add_argument(
        "--no-cache", action="store_true", help="trace every series afresh (default: reuse traces on disk)"
    )


def _list(values: list[str] | None, default, what: str) -> list[str]:
    if not values:
        return list(default)
    out = [v.strip() for text in values for v in text.split(",") if v.strip()]
    if not out:
        raise UserError(f"--{what} is empty; give a comma-separated list")
    return out


def _ints(values: list[str] | None, default, what: str) -> list[int]:
    out = []
    for text in _list(values, [str(b) for b in default], what):
        try:
            value = int(text)
        except ValueError:
            raise UserError(f"--{what} takes positive integers, got {shorten(text)}") from None
        out.append(value)
    return sorted(set(out))


def _request(args: argparse.Namespace):
    """The flags that take values, validated once; the grid's only without a suite (whose cells bring
    their own, and `_refuse_grid_flags` says so)."""
    from ditbench.plan.grid import DEFAULT_BATCHES, DEFAULT_GRAD_CKPT, DEFAULT_PRECISIONS, paper_models
    from ditbench.spec.base import from_flags
    from ditbench.spec.plan import PlanRequest

    if args.suite is not None and "=" in args.suite and not Path(args.suite).exists():
        args.suite, args.overrides = None, [args.suite, *args.overrides]  # `plan key=value`: no suite
    given = {
        k: getattr(args, k)
        for k in ("context_gib", "jobs", "target_batch", "gpus", "target_steps", "target_images")
    }
    if args.suite is None:
        given.update(
            models=_list(args.models, paper_models(), "models"),
            precisions=_list(args.precisions, DEFAULT_PRECISIONS, "precisions"),
            grad_ckpt=_list(args.grad_ckpt, DEFAULT_GRAD_CKPT, "grad-ckpt"),
            batches=_ints(args.batches, DEFAULT_BATCHES, "batches"),
            image_size=256 if args.image_size is None else args.image_size,
        )
    return from_flags(PlanRequest, given)


def _series(args: argparse.Namespace, request):
    from ditbench.plan.grid import grid

    if args.suite is None:
        if args.overrides:
            raise UserError(
                f"{shorten(args.overrides[0])}: KEY=VALUE overrides change a suite; without SUITE the "
                "plan is the default grid, shaped by --models, --precisions, --grad-ckpt, --batches, "
                "--image-size, --impl and --optimizer-impl"
            )
        base = {
            "image_size": request.image_size,
            "impl": args.impl or "ditbench",
            "optimizer_impl": args.optimizer_impl or "auto",
        }
        from ditbench.expansion import check_count, factors, matrix_count

        r = request
        axes = {
            "models": r.models,
            "precisions": r.precisions,
            "grad-ckpt": r.grad_ckpt,
            "batches": r.batches,
        }
        check_count(matrix_count(axes), args.max_cells, "the plan grid", factors(axes))
        return grid(r.models, r.precisions, r.grad_ckpt, r.batches, base), None
    _refuse_grid_flags(args)
    from ditbench.plan.grid import suite_grid
    from ditbench.spec.suite import load_suite

    suite = load_suite(args.suite, args.overrides, max_cells=args.max_cells)
    device = "cuda" if (args.card or args.memory_gib is not None) else None
    return suite_grid(suite.cells, device), suite


# The flags that shape the default grid, and the suite knob each stands for.
_GRID_FLAGS = {
    "models": "model",
    "precisions": "precision",
    "grad_ckpt": "grad_ckpt",
    "batches": "batch_size",
    "image_size": "image_size",
    "impl": "impl",
    "optimizer_impl": "optimizer_impl",
}


def _refuse_grid_flags(args: argparse.Namespace) -> None:
    """A suite brings its own cells, so a grid flag would be ignored: an error saying where to set it."""
    for flag, knob in _GRID_FLAGS.items():
        value = getattr(args, flag)
        if value is None or value == []:
            continue
        items = [v.strip() for text in value for v in text.split(",")] if isinstance(value, list) else [value]
        shown = ",".join(str(v) for v in items)
        as_yaml = str(items[0]) if len(items) == 1 else f"[{shown}]"
        override = f"ditbench plan {shorten(args.suite, quote=False)} {knob}={shorten(as_yaml, quote=False)}"
        raise UserError(
            f"--{flag.replace('_', '-')} {shorten(shown)} shapes the default grid and does not apply to "
            f"a suite, whose cells bring their own {knob} (the suite's value would win). Set it in the "
            f"suite (`{knob}:` under defaults, or a matrix axis) or as an override after the suite's "
            f"name: `{override}`."
        )


def _budgets(args: argparse.Namespace, suite, series, context: float):
    from ditbench.plan.predict import budget

    if all(s.config["device"] == "cpu" for s in series) and args.card is None and args.memory_gib is None:
        return budget(None, context, device="cpu")  # a CPU suite: the CPU allocator, no card
    if args.card is not None:
        return budget(args.card, context)
    if args.memory_gib is not None:
        return budget(args.memory_gib, context)
    if suite is not None and (suite.card or suite.gpu_memory_gib) is not None:
        # The suite emulates a card: its allocator is capped at the card less the CUDA context.
        return budget(suite.card or suite.gpu_memory_gib, context)
    return budget(None, context)


def _refuse_unused(args: argparse.Namespace, cuda: bool) -> None:
    """Flags that would be silently ignored by this plan are errors that say why."""
    if args.target_batch is not None and (args.no_tree or not cuda):
        why = "--no-tree skips it" if args.no_tree else "a CPU plan has none (give --card to plan for a GPU)"
        raise UserError(f"--target-batch sets the batch the decision tree aims for, and {why}")
    if args.context_gib is not None and not cuda:
        raise UserError(
            "--context-gib is the CUDA context a GPU holds outside the allocator; this plan's cells run on "
            "the CPU, which has none (give --card or --memory-gib to plan them for a GPU)"
        )


def _progress(total: int, no_cache: bool):
    """A progress line on stderr while the series are traced (a bar on a terminal, a line every 30 s
    in a log): the first plan of a grid traces for minutes."""
    from ditbench.progress import progress

    reuse = "" if no_cache else " (traces on disk are reused)"
    print(
        f"ditbench plan: tracing {total} series{reuse}",
        file=sys.stderr,
        flush=True,
    )
    return progress(total=total, unit="series", desc="traced")


def run(args: argparse.Namespace) -> int:
    import warnings

    from ditbench.plan.grid import default_jobs, evaluate
    from ditbench.plan.predict import DEFAULT_CONTEXT_GIB, budget
    from ditbench.plan.render import advice_details, cells_table, reasons, speed_table, to_json, tree_table
    from ditbench.plan.tree import DEFAULT_TARGET_BATCH, class_cards, decision_tree

    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    request = _request(args)
    context = DEFAULT_CONTEXT_GIB if request.context_gib is None else request.context_gib
    target_batch = DEFAULT_TARGET_BATCH if request.target_batch is None else request.target_batch
    records = _read_results(args.results) if args.results else []
    speed = _speed_options(args, request)
    series, suite = _series(args, request)
    main = _budgets(args, suite, series, context)
    cuda = any(s.config["device"] == "cuda" for s in series)
    _refuse_unused(args, cuda)
    card_name = args.card if args.card is not None else getattr(suite, "card", None)
    if card_name is not None:
        from ditbench.cards import ambiguity

        note = ambiguity(card_name)
        if note:
            print(f"ditbench plan: {note}", file=sys.stderr)
    tree_cards = class_cards() if cuda and not args.no_tree else []
    budgets = [main] + [budget(card, context) for _, card in tree_cards]

    start = time.perf_counter()
    jobs = request.jobs or default_jobs()
    with _progress(len(series), args.no_cache) as bar:
        results = evaluate(series, budgets, jobs, lambda n, total, s: bar.update(1), not args.no_cache, speed)
    seconds = time.perf_counter() - start
    cells = [p for res in results for p in res[0]]
    by_class = {gb: [p for res in results for p in res[i + 1]] for i, (gb, _) in enumerate(tree_cards)}
    measured = 0
    if records:
        from ditbench.plan.measured_records import apply_measured

        measured = apply_measured(cells, records)
        for preds in by_class.values():
            apply_measured(preds, records)
    advice = decision_tree(by_class, tree_cards, target_batch) if tree_cards else None
    meta = {
        "card": main.card,
        "memory_gib": main.memory_gib,
        "context_gib": main.context_gib,
        "series": len(series),
        "seconds": round(seconds, 1),
        "measured_cells": measured,
        "gpus": speed.gpus,
        "target_steps": None if speed.target_images else speed.target_steps,
        "target_images": speed.target_images,
        "speed_calibration": {
            k: v for k, v in (speed.calibration or _shipped()).to_dict().items() if k != "loo"
        },
    }
    if args.json:
        print(json.dumps(to_json(cells, advice, meta, target_batch), indent=1, allow_nan=False))
        return 0
    where = (
        f"{main.card} ({main.memory_gib:.2f} GiB usable)"
        if main.card
        else (f"a {main.memory_gib:g} GiB card" if main.memory_gib is not None else "no card (no fit check)")
    )
    print(
        f"ditbench plan: {len(cells)} cells in {len(series)} series for {where}; CUDA context "
        f"{main.context_gib:g} GiB assumed; traced in {seconds:.0f} s"
        + (f"; {measured} cells measured (--results)" if records else "")
    )
    print()
    print(cells_table(cells))
    speeds = speed_table(cells)
    if speeds:
        cal = speed.calibration or _shipped()
        goal = f"{speed.target_images:,} images" if speed.target_images else f"{speed.target_steps:,} steps"
        per = f" per GPU x {speed.gpus} GPUs (DDP)" if speed.gpus > 1 else ""
        band = (
            f"+-{cal.band_pct:g}%, the calibration's worst leave-one-out error"
            if cal.band_pct is not None
            else "no error band: fewer than 3 calibration cells"
        )
        print(f"\nPredicted speed{per} ({band}; calibrated on {cal.source}); days and GPU-hours to {goal}:\n")
        print(speeds)
    for line in reasons(cells):
        print(f"\n{line}")
    notes = sorted({n for p in cells for n in p.notes})
    for note in notes:
        print(f"\nnote: {note}")
    if advice:
        print(
            "\nDecision tree (each class's smallest card; the fastest setting, by predicted images/s, "
            f"that reaches batch {target_batch}; days to the target at its batch):\n"
        )
        print(tree_table(advice, target_batch))
        details = advice_details(advice)
        if details:
            print("\nWhat the recommended cells hold at their peak:\n" + details)
    return 0


def _shipped():
    from ditbench.plan.speed import shipped

    return shipped()


def _speed_options(args: argparse.Namespace, request):
    from ditbench.plan.predict import SpeedOptions
    from ditbench.plan.speed import DEFAULT_TARGET_STEPS

    calibration = None
    if args.calibrate is not None:
        from ditbench.plan.calibration import from_records

        calibration = from_records(args.calibrate, _read_results(args.calibrate, "--calibrate"))
    return SpeedOptions(
        calibration=calibration,
        gpus=request.gpus or 1,
        target_steps=request.target_steps or DEFAULT_TARGET_STEPS,
        target_images=request.target_images,
    )


def _read_results(path: Path, flag: str = "--results") -> list:
    from ditbench.records.jsonl import read_records

    hint = "give a results.jsonl written by `ditbench run`"
    if not path.exists():
        raise UserError(f"{flag} {path}: no such file ({hint})")
    if not path.is_file():
        raise UserError(f"{flag} {path}: not a regular file ({hint})")
    try:
        records = read_records(path)  # lines that are not records are skipped, with a warning
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot read it ({err.strerror or err})") from err
    if not records:
        raise UserError(f"{flag} {path}: no result records in it ({hint})")
    return records
