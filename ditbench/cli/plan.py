"""`ditbench plan`: predicted training memory of a grid or a suite on a card, and the decision tree."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from ditbench.core.errors import UserError, shorten
from ditbench.plan.speed import DEFAULT_GLOBAL_BATCH

HELP = """\
The answer first: per model (the paper's four sizes at patch 2 unless --models), the fastest setting that
fits the card (precision, checkpointing, per-GPU batch and the accumulation that reaches the global batch),
its memory and speed with intervals, and days to the target, every row at one global batch. Memory: the
Trainer's step traced on fake tensors and replayed through the CUDA caching allocator; speed: a time model
of the step's kernels calibrated on measured GPUs. --full adds the grid (12 paper models x fp32/tf32/fp16/
bf16 x checkpointing none/full/every_2 x batches 8..512: GiB the card must hold; (x) does not fit, "tight"
within the planner's error of the card, * measured (--results), n/a cannot run there) and the decision
tree. With SUITE, its cells are planned; KEY=VALUE overrides change them (optimizer_impl=foreach).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ditbench.core.expansion import add_max_cells

    parser.description = HELP
    add = parser.add_argument
    add(
        "suite",
        nargs="?",
        help="plan this suite's cells (a shipped name or a YAML path) instead of the default grid",
    )
    add(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="change the suite as `ditbench run` does: a knob (optimizer_impl=foreach, batch_size=[16,32]) "
        "or a suite key (card=H100)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--card", help='the card to plan for, e.g. "RTX 4090", A100-80GB, H200')
    where.add_argument("--memory-gib", type=float, help="or the usable GiB of a card not in the table")
    add(
        "--tflops",
        type=float,
        help="with --memory-gib: its dense bf16/fp16 tensor TFLOPS (tf32 and fp32: half)",
    )
    add("--mem-bw", type=float, help="with --memory-gib: its memory bandwidth in GB/s")
    add("--full", action="store_true", help="after the answer, the grid and the decision tree")
    add("--images", action="store_true", help="train from images, the VAE encoding every step")
    add("--global-batch", type=int, help=f"images per optimizer step, all GPUs ({DEFAULT_GLOBAL_BATCH})")
    add("--models", action="append", help="models, comma-separated (default: S/2,B/2,L/2,XL/2; --full: 12)")
    add(
        "--precisions",
        action="append",
        help="precisions (default: the card's fastest; --full: fp32,tf32,fp16,bf16)",
    )
    add("--grad-ckpt", action="append", help="checkpointing (default: none,full,every_2)")
    add(
        "--batches",
        action="append",
        help="per-GPU batch sizes (default: those dividing the global batch; --full: 8,16,...,512)",
    )
    add("--image-size", type=int, help="grid image size in pixels (256)")
    add("--impl", choices=("ditbench", "diffusers"), help="grid DiT implementation (ditbench)")
    add("--optimizer-impl", choices=("auto", "fused", "foreach", "for-loop"), help="grid AdamW kernel (auto)")
    add("--results", type=Path, help="results.jsonl whose measured cells replace predictions")
    add(
        "--context-gib",
        type=float,
        help="CUDA context outside the allocator (default: 0.5, or measured with --results)",
    )
    add("--target-batch", type=int, help="batch the decision tree aims for (32)")
    add("--no-tree", action="store_true", help="skip the decision tree over card classes")
    add(
        "--gpus",
        type=int,
        help="data-parallel GPUs (default: 1): memory per rank, the collectives over the card's interconnect",
    )
    add("--shard", choices=("ddp", "fsdp"), help="with --gpus: DDP (a replica per GPU, default) or FSDP2")
    goal = parser.add_mutually_exclusive_group()
    goal.add_argument("--target-steps", type=int, help="steps to train, for days and GPU-hours (400000)")
    goal.add_argument("--target-images", type=int, help="or images to train on")
    add(
        "--calibrate",
        type=Path,
        metavar="RESULTS.jsonl",
        help="fit the speed model on these measured cells (ditbench records of GPUs in the card table) "
        "instead of the shipped H200 calibration",
    )
    add("--jobs", type=int, help="processes tracing series in parallel (default: from the CPU count)")
    add("--json", action="store_true", help="print the plan as JSON on stdout instead of tables")
    add_max_cells(parser, "a grid (or --suite matrix) of")
    add("--no-cache", action="store_true", help="trace every series afresh (default: reuse traces on disk)")


def _list(values: list[str] | None, default, what: str) -> list[str]:
    if not values:
        return list(default)
    out = [v.strip() for text in values for v in text.split(",") if v.strip()]
    if not out:
        raise UserError(f"--{what} is empty; give a comma-separated list")
    return out


def _ints(values: list[str] | None, default, what: str) -> list[int]:
    out = set()
    for text in _list(values, [str(b) for b in default], what):
        try:
            out.add(int(text))
        except ValueError:
            raise UserError(f"--{what} takes positive integers, got {shorten(text)}") from None
    return sorted(out)


def _is_suite(args: argparse.Namespace) -> bool:
    if args.suite is not None and "=" in args.suite and not Path(args.suite).exists():
        args.suite, args.overrides = None, [args.suite, *args.overrides]  # `plan key=value`: no suite
    if args.suite is None and args.overrides:
        raise UserError(
            f"{shorten(args.overrides[0])}: KEY=VALUE overrides change a suite; without SUITE the "
            "plan is the default grid, shaped by --models, --precisions, --grad-ckpt, --batches, "
            "--image-size, --impl and --optimizer-impl"
        )
    return args.suite is not None


def _request(args: argparse.Namespace):
    """The flags that take values, validated once; the grid's only without a suite (whose cells bring
    their own, and `_refuse_grid_flags` says so)."""
    from ditbench.plan.grid import DEFAULT_BATCHES, DEFAULT_GRAD_CKPT, DEFAULT_PRECISIONS, paper_models
    from ditbench.spec.base import from_flags
    from ditbench.spec.plan import PlanRequest

    keys = ("context_gib", "jobs", "target_batch", "gpus", "target_steps", "target_images", "global_batch")
    given = {k: getattr(args, k) for k in keys}
    if not _is_suite(args):
        given.update(
            models=_list(args.models, paper_models(), "models"),
            precisions=_list(args.precisions, DEFAULT_PRECISIONS, "precisions"),
            grad_ckpt=_list(args.grad_ckpt, DEFAULT_GRAD_CKPT, "grad-ckpt"),
            batches=_ints(args.batches, DEFAULT_BATCHES, "batches"),
            image_size=256 if args.image_size is None else args.image_size,
        )
    return from_flags(PlanRequest, given)


def _base(args: argparse.Namespace, request) -> dict:
    if args.shard and not args.gpus:
        raise UserError(f"--shard {args.shard} splits a model over GPUs: give --gpus N (2 or more)")
    impl, optimizer, gpus = args.impl or "ditbench", args.optimizer_impl or "auto", request.gpus or 1
    from ditbench.plan.predict import IMAGES

    data = {"data": IMAGES} if args.images else {}
    return {"image_size": request.image_size, "impl": impl, "optimizer_impl": optimizer, "gpus": gpus,
            "strategy": args.shard or "ddp", **data}  # fmt: skip


def _series(args: argparse.Namespace, request):
    from ditbench.core.expansion import check_count, factors, matrix_count
    from ditbench.plan.grid import grid, suite_grid
    from ditbench.spec.suite import load_suite

    if args.suite is None:
        r = request
        axes = {"models": r.models, "precisions": r.precisions, "grad-ckpt": r.grad_ckpt}
        axes["batches"] = r.batches
        check_count(matrix_count(axes), args.max_cells, "the plan grid", factors(axes))
        return grid(r.models, r.precisions, r.grad_ckpt, r.batches, _base(args, request)), None
    _refuse_grid_flags(args)
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
    "shard": "strategy",
}


def _refuse_grid_flags(args: argparse.Namespace) -> None:
    """A suite brings its own cells, so a grid flag would be ignored: an error saying where to set it."""
    if args.images:
        raise UserError("--images shapes the default grid; a suite's cells bring their own `data:`")
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

    asked = args.card if args.card is not None else args.memory_gib
    if asked is None and all(s.config["device"] == "cpu" for s in series):
        return budget(None, context, device="cpu")  # a CPU suite: the CPU allocator, no card
    if asked is None and suite is not None:  # a suite that emulates a card plans for it
        asked = suite.card or suite.gpu_memory_gib
    return budget(asked, context)


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
    """A progress line on stderr while the series are traced: the first plan of a grid takes minutes."""
    from ditbench.core.progress import progress

    reuse = "" if no_cache else " (traces on disk are reused)"
    print(f"ditbench plan: tracing {total} series{reuse}", file=sys.stderr, flush=True)
    return progress(total=total, unit="series", desc="traced")


def _answer(args: argparse.Namespace, request, context: float, speed):
    """(JSON rows, text) of the answer on the card asked, or None when no card with a speed is given.
    The grid's lists (request) are the answer's where the flag was given; its own defaults otherwise."""
    from ditbench.plan import answer
    from ditbench.plan.predict import budget, normalize
    from ditbench.plan.speed import datasheet

    models = request.models if args.models else list(answer.ANSWER_MODELS)
    ckpts = tuple(request.grad_ckpt if args.grad_ckpt else answer.CKPTS)
    base = _base(args, request)
    for m, c in itertools.product(models, ckpts):  # a model and setting that cannot run: before any trace
        normalize({**base, "model": m, "grad_ckpt": c})
    bud = budget(args.card if args.card is not None else args.memory_gib, context)  # one of them or None
    sheet = speed.sheet or datasheet(bud.card)
    if bud.memory_gib is None or sheet is None:
        return None
    precisions = tuple(request.precisions if args.precisions else answer.default_precisions(bud, sheet))
    global_batch = request.global_batch or DEFAULT_GLOBAL_BATCH
    batches = answer.micro_batches(global_batch, speed.gpus, request.batches if args.batches else None)
    return answer.plan(bud, speed, models, precisions, ckpts, batches, global_batch, base, not args.no_cache)


def run(args: argparse.Namespace) -> int:
    import warnings

    from ditbench.hardware.cards import ambiguity, find_card
    from ditbench.plan.grid import DEFAULT_TARGET_BATCH, class_cards, decision_tree, default_jobs, evaluate
    from ditbench.plan.predict import DEFAULT_CONTEXT_GIB, budget
    from ditbench.plan.render import full_text, to_json
    from ditbench.plan.speed import shipped

    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    request = _request(args)
    context = DEFAULT_CONTEXT_GIB if request.context_gib is None else request.context_gib
    target_batch = DEFAULT_TARGET_BATCH if request.target_batch is None else request.target_batch
    records = _read_results(args.results) if args.results else []
    speed = _speed_options(args, request)
    full = args.full or args.suite is not None
    series, suite = _series(args, request) if full else (None, None)  # counted before anything is traced
    answered = None if args.suite is not None else _answer(args, request, context, speed)
    if not full:
        if answered is None:
            raise UserError(
                'plan for which card? Give --card NAME (`ditbench plan --card "RTX 4090"`), or --memory-gib, '
                "--tflops and --mem-bw for a card not in the table; --full plans the grid without a card"
            )
        print(json.dumps(answered[0], indent=1, allow_nan=False) if args.json else answered[1])
        return 0
    main = _budgets(args, suite, series, context)
    cuda = any(s.config["device"] == "cuda" for s in series)
    _refuse_unused(args, cuda)
    card_name = args.card if args.card is not None else getattr(suite, "card", None)
    if card_name is not None and (note := ambiguity(card_name)):
        print(f"ditbench plan: {note}", file=sys.stderr)
    asked = find_card(main.card) if main.card else main.memory_gib
    tree_cards = class_cards(asked) if cuda and not args.no_tree else []
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
        from ditbench.plan.measured import apply_measured

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
            k: v for k, v in (speed.calibration or shipped()).to_dict().items() if k != "loo"
        },
    }
    if args.json:
        doc = {**to_json(cells, advice, meta, target_batch), **(answered[0] if answered else {})}
        print(json.dumps(doc, indent=1, allow_nan=False))
        return 0
    if answered:
        print(answered[1] + "\n")
    shown = measured if records else None
    print(full_text(cells, main, len(series), seconds, shown, speed, advice, target_batch))
    return 0


def _speed_options(args: argparse.Namespace, request):
    from ditbench.hardware.cards import described
    from ditbench.plan.predict import SpeedOptions
    from ditbench.plan.speed import DEFAULT_TARGET_STEPS

    sheet = calibration = None
    if args.tflops is not None or args.mem_bw is not None:
        if args.memory_gib is None or args.tflops is None or args.mem_bw is None:
            raise UserError(
                "--tflops and --mem-bw describe a card not in the table, with --memory-gib: give all three "
                "(e.g. --memory-gib 24 --tflops 165 --mem-bw 1008); a card of the table (--card) has its own"
            )
        sheet = described(args.tflops, args.mem_bw)
    if args.calibrate is not None:
        from ditbench.plan.measured import from_records

        calibration = from_records(args.calibrate, _read_results(args.calibrate, "--calibrate"))
    steps = request.target_steps or DEFAULT_TARGET_STEPS
    return SpeedOptions(calibration, request.gpus or 1, steps, request.target_images, sheet)


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
