"""`ditbench plan`: predicted training memory of a grid or a suite on a card, and the decision tree."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from ditbench.errors import UserError, shorten

HELP = """\
Predict each cell's peak training memory on a card without the card: the Trainer's real step is
traced on fake tensors and replayed through the CUDA caching allocator. Without SUITE the grid is
the 12 paper models x fp32/tf32/fp16/bf16 x checkpointing none/full/every_2 x batches 8..512.
Table cells show the GiB the card must hold (allocator reserve + CUDA context); (x) does not fit,
* measured (from --results), n/a the setting cannot run there.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = HELP
    parser.add_argument(
        "suite",
        nargs="?",
        help="plan this suite's cells (a shipped name or a YAML path) instead of the default grid",
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
    parser.add_argument("--image-size", type=int, default=256, help="grid image size in pixels")
    parser.add_argument(
        "--impl", default="ditbench", choices=("ditbench", "diffusers"), help="the DiT implementation"
    )
    parser.add_argument(
        "--optimizer-impl",
        default="auto",
        choices=("auto", "fused", "foreach", "for-loop"),
        help="AdamW kernel",
    )
    parser.add_argument("--results", type=Path, help="results.jsonl whose measured cells replace predictions")
    parser.add_argument(
        "--context-gib",
        type=float,
        default=None,
        help="CUDA context outside the allocator (default: 0.5, or measured with --results)",
    )
    parser.add_argument("--target-batch", type=int, default=32, help="batch the decision tree aims for")
    parser.add_argument("--no-tree", action="store_true", help="skip the decision tree over card classes")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="processes tracing series in parallel (default: from the CPU count)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the plan as JSON on stdout instead of tables"
    )
    from ditbench.expansion import DEFAULT_MAX_CELLS

    parser.add_argument(
        "--max-cells",
        type=int,
        default=None,
        metavar="N",
        help="refuse a grid (or --suite matrix) of more than N cells, counted before expanding "
        f"(default: {DEFAULT_MAX_CELLS})",
    )
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
        if value < 1 or value > 1 << 20:
            raise UserError(f"--{what} takes integers from 1 to 1048576, got {value}")
        out.append(value)
    return sorted(set(out))


def _series(args: argparse.Namespace):
    from ditbench.plan.grid import DEFAULT_BATCHES, DEFAULT_GRAD_CKPT, DEFAULT_PRECISIONS, grid, paper_models

    base = {"image_size": args.image_size, "impl": args.impl, "optimizer_impl": args.optimizer_impl}
    if args.suite is None:
        models = _list(args.models, paper_models(), "models")
        precisions = _list(args.precisions, DEFAULT_PRECISIONS, "precisions")
        from ditbench.precision import PRECISIONS

        for p in precisions:
            if p not in PRECISIONS:
                raise UserError(
                    f"--precisions: unknown precision {shorten(p)}; valid: {', '.join(PRECISIONS)}"
                )
        ckpts = _list(args.grad_ckpt, DEFAULT_GRAD_CKPT, "grad-ckpt")
        batches = _ints(args.batches, DEFAULT_BATCHES, "batches")
        from ditbench.expansion import check_count, factors, matrix_count

        axes = {"models": models, "precisions": precisions, "grad-ckpt": ckpts, "batches": batches}
        check_count(matrix_count(axes), args.max_cells, "the plan grid", factors(axes))
        if args.image_size < 8 or args.image_size % 8:
            raise UserError(f"--image-size must be a positive multiple of 8, got {args.image_size}")
        return grid(models, precisions, ckpts, batches, base), None
    for flag in ("models", "precisions", "grad_ckpt", "batches"):
        if getattr(args, flag):
            raise UserError(
                f"--{flag.replace('_', '-')} shapes the default grid; a suite brings its own cells"
            )
    from ditbench.bench.suite import load_suite
    from ditbench.plan.grid import suite_grid

    suite = load_suite(args.suite, max_cells=args.max_cells)
    device = "cuda" if (args.card or args.memory_gib is not None) else None
    return suite_grid(suite.cells, device), suite


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


def _progress(start: float):
    if not sys.stderr.isatty():
        return None

    def show(n: int, total: int, series) -> None:
        c = series.config
        print(
            f"\rtraced {n}/{total} series ({c['model']} {c['precision']} ckpt={c['grad_ckpt']}) "
            f"{time.perf_counter() - start:.0f} s   ",
            end="" if n < total else "\n",
            file=sys.stderr,
            flush=True,
        )

    return show


def run(args: argparse.Namespace) -> int:
    import warnings

    from ditbench.plan.grid import default_jobs, evaluate
    from ditbench.plan.predict import DEFAULT_CONTEXT_GIB, budget
    from ditbench.plan.render import advice_details, cells_table, reasons, to_json, tree_table
    from ditbench.plan.tree import class_cards, decision_tree

    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    context = DEFAULT_CONTEXT_GIB if args.context_gib is None else args.context_gib
    if not math.isfinite(context) or context < 0:
        raise UserError(f"--context-gib must be a finite number of GiB >= 0, got {context}")
    if args.jobs is not None and not 1 <= args.jobs <= 64:
        raise UserError(f"--jobs must be between 1 and 64, got {args.jobs}")
    if args.target_batch < 1:
        raise UserError(f"--target-batch must be a positive integer, got {args.target_batch}")
    records = _read_results(args.results) if args.results else []
    series, suite = _series(args)
    main = _budgets(args, suite, series, context)
    cuda = any(s.config["device"] == "cuda" for s in series)
    tree_cards = class_cards() if cuda and not args.no_tree else []
    budgets = [main] + [budget(card, context) for _, card in tree_cards]

    start = time.perf_counter()
    results = evaluate(series, budgets, args.jobs or default_jobs(), _progress(start), not args.no_cache)
    seconds = time.perf_counter() - start
    cells = [p for res in results for p in res[0]]
    by_class = {gb: [p for res in results for p in res[i + 1]] for i, (gb, _) in enumerate(tree_cards)}
    measured = 0
    if records:
        from ditbench.plan.measured_records import apply_measured

        measured = apply_measured(cells, records)
        for preds in by_class.values():
            apply_measured(preds, records)
    advice = decision_tree(by_class, tree_cards, args.target_batch) if tree_cards else None
    meta = {
        "card": main.card,
        "memory_gib": main.memory_gib,
        "context_gib": main.context_gib,
        "series": len(series),
        "seconds": round(seconds, 1),
        "measured_cells": measured,
    }
    if args.json:
        print(json.dumps(to_json(cells, advice, meta, args.target_batch), indent=1, allow_nan=False))
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
    for line in reasons(cells):
        print(f"\n{line}")
    notes = sorted({n for p in cells for n in p.notes})
    for note in notes:
        print(f"\nnote: {note}")
    if advice:
        print(
            "\nDecision tree (each class's smallest card; the fastest setting that reaches batch "
            f"{args.target_batch}):\n"
        )
        print(tree_table(advice, args.target_batch))
        details = advice_details(advice)
        if details:
            print("\nWhat the recommended cells hold at their peak:\n" + details)
    return 0


def _read_results(path: Path) -> list[dict]:
    from ditbench.plan.measured_records import read_results

    hint = "give a results.jsonl written by `ditbench run`"
    if not path.exists():
        raise UserError(f"--results {path}: no such file ({hint})")
    if not path.is_file():
        raise UserError(f"--results {path}: not a regular file ({hint})")
    try:
        records = read_results(path)
    except OSError as err:
        raise UserError(f"--results {path}: cannot read it ({err.strerror or err})") from err
    if not records:
        raise UserError(f"--results {path}: no result records in it ({hint})")
    return records
