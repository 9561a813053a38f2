"""The `ditbench` command: each sub-command's module (`add_arguments(parser)`, `run(args) -> int`) is
imported only when it runs, so `ditbench --help` and a typo answer at once, without torch."""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import textwrap

from ditbench import __version__
from ditbench.cli.options import HelpFormatter, check_arguments, check_text_arguments
from ditbench.core.errors import UserError, shorten

TRACEBACK_ENV = "DITBENCH_TRACEBACK"  # set: an unforeseen OSError shows its traceback

# name -> (module, one-line help). Order is the order `ditbench --help` lists them in.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("ditbench.cli.run", "run a benchmark suite (a matrix of training cells)"),
    "suites": ("ditbench.cli.suites", "list the suites shipped with ditbench and what each measures"),
    "train": ("ditbench.cli.train", "train a DiT for a number of steps and print the loss"),
    "extract-latents": (
        "ditbench.cli.extract_latents",
        "encode an image folder to a latent file through the VAE",
    ),
    "sample": ("ditbench.cli.sample", "sample images from a checkpoint into an ADM-format .npz"),
    "fid": ("ditbench.cli.fid", "FID, sFID, Inception Score, precision/recall and KID of a sample batch"),
    "report": ("ditbench.cli.report", "turn results.jsonl files into markdown, HTML and CSV reports"),
    "export": ("ditbench.cli.export", "write each cell as a TensorBoard, MLflow or W&B run"),
    "compare": ("ditbench.cli.compare", "compare two runs and fail on a regression (exit 1)"),
    "ab": ("ditbench.cli.ab", "run a suite on two environments in paired rounds; fail on a regression"),
    "plan": ("ditbench.cli.plan", "predict training memory on any card without the card, and what fits"),
    "env": ("ditbench.cli.env", "print the environment that result records capture"),
}


def _build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ditbench",
        description="Benchmark and evaluate Diffusion Transformer (DiT) training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="`ditbench COMMAND --help` describes a command's options; every command shows its "
        "defaults as (default: X).",
    )
    parser.add_argument("--version", action="version", version=f"ditbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        if name == command:  # only the chosen command's module is imported
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def _print_error(message: str) -> None:
    paragraph = textwrap.fill(
        " ".join(message.split()),
        width=100,
        subsequent_indent="  ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    print(f"ditbench: error: {paragraph}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = _build_parser(command if command in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:  # `run SUITE --out x key=value`: argparse leaves positionals after an option unparsed
        if hasattr(args, "overrides") and not any(a.startswith("-") for a in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 2
    for stream in (sys.stdout, sys.stderr):  # a record's lone surrogate is printed escaped, never fatal
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        check_text_arguments(argv)
        check_arguments(args)
        return int(args._run(args) or 0)
    except UserError as err:
        _print_error(str(err))
        return err.exit_code
    except UnicodeEncodeError as err:  # ditbench's own text always encodes: this came from an input
        _print_error(
            f"an input holds text that is not valid Unicode ({err.reason}: "
            f"{err.object[err.start : err.end][:8]!r}), e.g. a lone surrogate written as \\ud800 in a JSON "
            "file, and it could not be written out; fix that field of the input."
        )
        return 2
    except (RuntimeError, MemoryError) as err:  # out of memory (train, sample, fid): a paragraph, in GiB
        from ditbench.core.faults import is_out_of_memory, one_line
        from ditbench.core.units import bytes_as_gib

        if not is_out_of_memory(err) or os.environ.get(TRACEBACK_ENV):
            raise
        _print_error(
            f"out of memory: {bytes_as_gib(one_line(err))[:400]}. Lower --batch-size, or (train) use "
            "--grad-ckpt full or --precision bf16; `ditbench plan` predicts what fits."
        )
        return 2
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit cannot fail
        return 141
    except OSError as err:  # a file system refusal no check foresaw: which file and why, not a traceback
        if os.environ.get(TRACEBACK_ENV):
            raise
        files = [shorten(str(f)) for f in (err.filename, err.filename2) if f is not None]
        where = f" ({' -> '.join(files)})" if files else ""
        what = err.strerror or shorten(str(err), 300, quote=False)
        _print_error(
            f"{what}{where}: the file system refused an operation. Check the paths you gave and the free "
            f"space; {TRACEBACK_ENV}=1 shows where it happened."
        )
        return 2
    except KeyboardInterrupt:
        # a command whose work survives an interruption says what is kept (args._resume)
        kept, drop = getattr(args, "_resume", None), getattr(args, "_resume_drop", ())
        again = f"; {kept}: ditbench {shlex.join(a for a in argv if a not in drop)}" if kept else ""
        print(f"ditbench: interrupted{again}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
