"""`ditbench suites`: the shipped suites with their cell counts, devices and descriptions."""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

from ditbench.spec.suite import SUITES_DIR, load_suite, shipped_suites, suite_schema


def describe(path: Path) -> dict[str, object]:
    """Name, cell count, device and description of one suite file (errors are the suite's own)."""
    suite = load_suite(path)
    return {
        "name": suite.name,
        "file": str(path),
        "cells": len(suite.cells),
        "device": suite.device,
        "description": " ".join(suite.description.split()),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of text")
    parser.add_argument(
        "--schema",
        action="store_true",
        help="print the JSON Schema of a suite file (for an editor: completion and checks as you type)",
    )


def run(args: argparse.Namespace) -> int:
    if args.schema:
        print(json.dumps(suite_schema(), indent=2))
        return 0

    rows = [describe(path) for path in shipped_suites().values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(f"{row['name']}  ({row['cells']} cells, device {row['device']})")
        print(
            textwrap.fill(str(row["description"]), width=100, initial_indent="    ", subsequent_indent="    ")
        )
    print(f"\nfiles: {SUITES_DIR}; run one with `ditbench run NAME` (or a path to your own YAML)")
    return 0
