"""The two sides of `ditbench ab`: an interpreter (or a virtual environment) and its environment
variables. Each side's ditbench runs the cell specs this one writes, so a probe asks each side to read
every spec before any cell runs; one that cannot is refused by name (exit 2)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ditbench.bench.launch.process import MODULE, child_env
from ditbench.core.errors import UserError, shorten

PROBE_TIMEOUT_S = 300.0  # importing torch on a cold disk
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Run by the side's interpreter: its ditbench must have the cell module and read every spec file.
PROBE = """
import importlib.util, json, sys
try:
    import ditbench
    from ditbench.bench.launch.files import read_spec
    if importlib.util.find_spec(sys.argv[1]) is None:
        raise ImportError("no module " + sys.argv[1])
    for path in sys.argv[2:]:
        read_spec(path)
except Exception as err:
    print(json.dumps({"error": type(err).__name__ + ": " + str(err)[:600]}))
else:
    import torch
    print(json.dumps({"ditbench": ditbench.__version__, "torch": torch.__version__,
                      "python_version": sys.version.split()[0], "package": ditbench.__file__}))
"""


@dataclass(frozen=True)
class Side:
    name: str  # "A" or "B"
    python: str  # absolute path, links kept (a venv's bin/python is a link to its base interpreter)
    env: tuple[tuple[str, str], ...] = ()
    info: dict[str, Any] = field(default_factory=dict, compare=False)  # what the probe found

    def about(self) -> dict[str, Any]:
        return {"python": self.python, "env": dict(self.env), **self.info}


def interpreter(option: str, given: str) -> str:
    """The interpreter a side names: a file, a virtual environment's folder, or a name on PATH."""
    path = Path(given).expanduser()
    if path.is_dir():
        found = [p for p in (path / "bin" / "python", path / "Scripts" / "python.exe") if p.is_file()]
        if not found:
            raise UserError(
                f"{option} {shorten(given)} is a folder without bin/python: give a Python interpreter "
                "or a virtual environment's folder (python -m venv DIR; pip install ditbench into it)."
            )
        path = found[0]
    elif os.sep not in given and not path.exists():
        located = shutil.which(given)
        path = Path(located) if located else path
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UserError(
            f"{option} {shorten(given)} is not an executable Python interpreter: give the path of one "
            "(e.g. /opt/main/.venv/bin/python), a virtual environment's folder, or a name on PATH."
        )
    return os.path.abspath(path)


def env_items(option: str, items: list[str]) -> tuple[tuple[str, str], ...]:
    """--a-env / --b-env KEY=VALUE items, checked."""
    out = []
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not _ENV_NAME.fullmatch(key) or "\0" in value:
            raise UserError(
                f"{option}-env {shorten(item)} is not KEY=VALUE with KEY an environment variable name "
                "(letters, digits, _; not starting with a digit), e.g. DITBENCH_INJECT_FAULT=DiT=slow:0.1."
            )
        out.append((key, value))
    return tuple(out)


def probe(side: Side, specs: list[Path]) -> Side:
    """The side, with what its interpreter reports; UserError naming the side if it cannot run the cells."""
    argv = [side.python, "-c", PROBE, MODULE, *map(str, specs)]
    env = child_env(side.python, dict(side.env))  # as FreshProcess starts the side's cells
    who = f"side {side.name} (--{side.name.lower()} {side.python})"
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UserError(f"{who} did not start: {err}.") from None
    lines = done.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        found = None
    if not isinstance(found, dict) or "error" in found:
        why = (
            found["error"]
            if isinstance(found, dict)
            else (done.stderr.strip()[-600:] or f"exit {done.returncode}")
        )
        raise UserError(
            f"{who} cannot run this suite's cells: {why}. Both "
            "sides must be ditbench versions that read the cell spec this ditbench writes "
            f"(ditbench.bench.launch.files.read_spec) and have {MODULE}: install ditbench into that "
            "environment, or one whose cell spec matches this one's."
        )
    return Side(side.name, side.python, side.env, found)
