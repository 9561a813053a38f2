"""`ditbench` commands written down outside the code (workflow steps, the README, docs/), found and
checked against today's command line, so that a renamed flag fails a test instead of a user."""

from __future__ import annotations

import re
import shlex

PROGRAM = re.compile(r"(^|/)(bin/)?ditbench$")


def ditbench_commands(blocks: list[str]) -> list[list[str]]:
    """Each `ditbench ...` (or `PATH/bin/ditbench ...`, `python -m ditbench ...`, `torchrun ... -m
    ditbench ...`) that a block of shell lines starts, as argv after the program; environment
    assignments before the program and `#` comments are skipped."""
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|\||;|\|", line):
                argv = shlex.split(part.strip(), comments=True)
                redirect = [i for i, a in enumerate(argv) if re.match(r"\d?[<>]|&>", a)]
                argv = argv[: redirect[0]] if redirect else argv
                while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", argv[0]):
                    argv = argv[1:]
                if argv and PROGRAM.search(argv[0]):
                    commands.append(argv[1:])
                elif (
                    "-m" in argv
                    and argv.index("-m") + 1 < len(argv)
                    and argv[argv.index("-m") + 1] == "ditbench"
                ):
                    commands.append(argv[argv.index("-m") + 2 :])
    return commands


def parse_error(argv: list[str]) -> str | None:
    """Why today's CLI would refuse `ditbench ARGV` before running it (None: it parses), as `main` parses:
    unknown options are refused, extra positionals only where the command takes KEY=VALUE overrides."""
    from ditbench.cli import COMMANDS, _build_parser

    if not argv or argv[0] not in COMMANDS:
        return f"no command {argv[:1]}"
    try:
        args, extra = _build_parser(argv[0]).parse_known_args(argv)
    except SystemExit as stop:  # argparse's usage error, or --help
        return None if "--help" in argv or "-h" in argv else f"argparse exited {stop.code}"
    if args.command != argv[0]:
        return f"parsed as {args.command}"
    if extra and not (hasattr(args, "overrides") and not any(a.startswith("-") for a in extra)):
        return f"unrecognized arguments: {' '.join(extra)}"
    return None
