"""The one exception type that reaches the user as a message rather than a traceback."""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable
from typing import Any

SHORT_LIMIT = 80  # characters of a user's value that a message quotes


class UserError(Exception):
    """Bad input from the user, with the whole explanation: a file, key or value, and what would be
    valid. The CLI prints it as one paragraph and exits with status 2."""

    exit_code = 2


class UnsupportedError(UserError):
    """A setting that cannot run on this machine (fp16 on CPU): the runner records the cell `unsupported`."""


_BOUNDED = reprlib.Repr()
_BOUNDED.maxlevel, _BOUNDED.maxstring, _BOUNDED.maxother = 3, 4 * SHORT_LIMIT, 4 * SHORT_LIMIT
_BOUNDED.maxlist = _BOUNDED.maxtuple = _BOUNDED.maxdict = _BOUNDED.maxset = 8


def shorten(value: Any, limit: int = SHORT_LIMIT, *, quote: bool = True) -> str:
    """A user's value for a message, repr'd (str'd when quote=False) and cut to `limit` characters: a
    300-byte YAML file can expand to a value whose repr is 40 MB."""
    text = value if isinstance(value, str) and not quote else _BOUNDED.repr(value)  # never a whole huge repr
    if len(text) <= limit:
        return text
    size = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return f"{text[: max(limit - 1, 1)]}…{size}"


def did_you_mean(word: Any, choices: Iterable[str], cutoff: float = 0.5, show: str = "`{}`") -> str:
    """ " Did you mean `x`?" for the closest of `choices` to `word` (`show`: how it is quoted), or ""."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=cutoff)
    return f" Did you mean {show.format(close[0])}?" if close else ""
