"""The suites shipped in the package (ditbench/suites/*.yaml, linked as the repository's suites/).

An argument that names an existing file is that file, else a shipped suite's name (with or without
`.yaml`); `resolve_shipped` does the same for the package's claims files (report.claims).
"""

from __future__ import annotations

from pathlib import Path

from ditbench.errors import UserError, shorten

SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


def shipped_suites(folder: Path = SUITES_DIR) -> dict[str, Path]:
    """Name -> file of every YAML in `folder` (the shipped suites), sorted by name."""
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def resolve_suite(arg: str | Path) -> Path:
    """The suite file `arg` means: an existing path as given, else a shipped suite of that name."""
    return resolve_shipped(arg, SUITES_DIR, "suite", "(`ditbench suites` lists them with their descriptions)")


def resolve_shipped(arg: str | Path, folder: Path, kind: str, listed: str = "") -> Path:
    """An existing path as given, else the YAML of that name (with or without .yaml) in `folder`,
    one of the package's own (suites, claims); UserError naming the shipped ones otherwise."""
    path, text = Path(arg), str(arg)
    name = text[: -len(".yaml")] if text.endswith(".yaml") else text
    shipped = shipped_suites(folder)
    bare = name in shipped and "/" not in text and "\\" not in text
    if path.exists() and not (bare and path.is_dir()):  # a run's --out named like the suite is no suite
        return path
    if bare:
        return shipped[name]
    raise UserError(
        f"{kind} {shorten(text)} does not exist: there is no such file and no shipped {kind} of that "
        f"name; give a path to a {kind} YAML or "
        f"one of the shipped names: {', '.join(shipped) or '(none found in ' + str(folder) + ')'}"
        + (f" {listed}" if listed else "")
        + "."
    )
