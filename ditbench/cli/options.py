"""The one flag convention every `ditbench` command follows (tests/test_cli_convention.py walks them):
`(default: X)` shown one way (HelpFormatter), `--device`, `--precision`, `--json`, `--out` naming one kind
of thing in its metavar (DIR, FILE.npz), `--no-progress`, `--yes` (long CPU work, ditbench.hardware.walltime).
"""

from __future__ import annotations

import argparse

from ditbench.core.errors import UserError, shorten
from ditbench.hardware.precision import PRECISIONS, check_precision


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option with a default says `(default: X)` at the end of its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        hidden = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        switch = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if "(default" in text or hidden or switch or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def add_device(parser: argparse.ArgumentParser, what: str = "where to compute") -> None:
    # checked by device.resolve_device: the one-paragraph error (exit 2), not argparse's usage dump
    choices = "auto (a GPU where one is visible, else the CPU), cpu, or cuda (cuda:N for one GPU)"
    parser.add_argument("--device", default="auto", metavar="{auto,cpu,cuda}", help=f"{what}: {choices}")


def add_precision(parser: argparse.ArgumentParser, default: str, help: str) -> None:
    # the choices are shown, and checked by `check_arguments` (the one-paragraph error, exit 2)
    parser.add_argument("--precision", default=default, metavar="{" + ",".join(PRECISIONS) + "}", help=help)


def check_arguments(args: argparse.Namespace) -> None:
    """The convention's checks that argparse would answer with a usage dump: a clean UserError instead."""
    if getattr(args, "precision", None) is not None:
        check_precision(args.precision, "--precision")


def check_text_arguments(argv: list[str]) -> None:
    """Every argument must be UTF-8 text (ditbench writes them into records and reports): a byte that is
    not (a lone surrogate to Python) would fail deep inside a parser or a write, with a traceback."""
    for position, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as err:
            shown = arg.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
            raise UserError(
                f"argument {position} ({shorten(shown, 120, quote=False)}) holds a byte that is not UTF-8 "
                f"text (at character {err.start + 1}); ditbench writes its arguments into records and "
                "reports as UTF-8. Give it as UTF-8 text (rename a file whose name is not)."
            ) from None


def add_json(parser: argparse.ArgumentParser, what: str = "the result") -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON on stdout instead of text")


def add_yes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--yes", action="store_true", help="start even when the estimate on a CPU is over 30 minutes"
    )


def add_no_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (where stderr is not a terminal, progress is plain lines anyway)",
    )
