"""Text from records and suites made inert for what it goes into: markdown (`md_text`, `md_code`,
`md_inline`), CSV (a formula gets a leading `'`), any UTF-8 encoder (`plain`). HTML: `html.escape`.
"""

from __future__ import annotations

import re
from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_SPECIAL = re.compile(r"([\\`*\[|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")  # `a_b` is no emphasis
# ditbench's own markup: a bold marker, or a code span as CommonMark pairs them (a run of backticks
# closed by the next run of the same length), so what is kept as code is code in every viewer
_MARKUP = re.compile(r"(?<!`)(`+)(?!`).*?(?<!`)\1(?!`)|\*\*")


def plain(text: Any) -> str:
    """str(text) that every UTF-8 writer accepts: lone surrogates and NUL as backslash escapes."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\x00")


def _inert(text: str) -> str:
    return _SPECIAL.sub(r"\\\1", text).replace("<", "&lt;")


def _line(text: Any) -> str:
    return " ".join(plain(text).split())  # one line: a newline would start a block of its own


def _not_a_block(line: str) -> str:
    return "\\" + line if line[:1] in ("#", ">", "+", "-") else line  # no heading, quote or list


def md_text(text: Any) -> str:
    """User text for markdown prose, a heading or a table cell: one line, no HTML, link, image, code,
    emphasis, new cell or new block."""
    return _not_a_block(_inert(_line(text)))


def md_code(text: Any) -> str:
    """User text (a path, an id) as an inline code span its backticks cannot end; `|` is escaped, as a
    table cell needs (GitHub renders `\\|` in a code span as `|` there)."""
    body = _line(text).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", body)), default=0) + 1)
    pad = " " if body[:1] == "`" or body[-1:] == "`" else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def md_inline(text: Any) -> str:
    """A line ditbench wrote with user values in it: its `code` spans and **bold** kept, every other
    character md_text-escaped (so a user value can add at most a code span or bold, never a link)."""
    line, out, at = _line(text), [], 0
    for markup in _MARKUP.finditer(line):
        out += [_inert(line[at : markup.start()]), markup.group(0).replace("|", "\\|")]
        at = markup.end()
    return _not_a_block("".join(out) + _inert(line[at:]))


def csv_cell(value: Any) -> Any:
    """A value for a CSV cell: text that a spreadsheet would run as a formula is prefixed with `'`."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_safe(frame):
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype.kind not in "biufcmM":  # text columns (object, or pandas' str dtype)
            out[column] = out[column].map(csv_cell).astype(object)
    out.columns = [csv_cell(str(c)) for c in out.columns]
    return out
