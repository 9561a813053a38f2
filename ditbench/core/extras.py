"""Optional packages behind pip extras: one import point that names the extra when one is missing."""

from __future__ import annotations

import importlib

from ditbench.core.errors import UnsupportedError, UserError


def require_diffusers(purpose: str):
    """diffusers, or an UnsupportedError (its cell is `unsupported`) naming `purpose` and the extra."""
    try:
        return importlib.import_module("diffusers")
    except ImportError as err:
        raise UnsupportedError(
            f"{purpose} needs the diffusers package, which is not installed or does not import "
            f'({type(err).__name__}: {err}). It is an optional extra: pip install "ditbench[vae]" '
            '(or pip install "diffusers>=0.27"). The default paths (ditbench run cpu_smoke, fid, '
            "report, compare) do not need it."
        ) from err


def require_extra(module: str, extra: str, purpose: str):
    """`module` imported, or a UserError naming `purpose` and `pip install "ditbench[extra]"`."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise UserError(
            f"{purpose} needs the {module} package, which is not installed or does not import "
            f"({type(err).__name__}: {err}). It is an optional extra: pip install 'ditbench[{extra}]'. "
            "Nothing was written; the other commands do not need it."
        ) from err
