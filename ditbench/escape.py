"""User text made inert for the file it goes into: markdown people open, CSV a spreadsheet opens.

Suite names, cell names, models, reasons and claim texts come from files a user (or someone else)
wrote. In markdown, `<` starts HTML that many viewers render and `[` starts a link; a newline
starts a new block (a heading of its own). In CSV, a cell starting with `=`, `+`, `-`, `@`, a tab
or a carriage return is a formula to a spreadsheet (OWASP "CSV injection"): it gets a leading `'`,
which spreadsheets show as text. The HTML report escapes with `html.escape` (report.blocks).
"""

from __future__ import annotations

from typing import Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def md_text(text: Any) -> str:
    """One line of user text for markdown prose or a heading: no HTML, no link, no new block."""
    return " ".join(str(text).split()).replace("<", "&lt;").replace("[", "\\[")


def md_cell(text: Any) -> str:
    """User text for a markdown table cell: md_text, and `|` cannot end the cell."""
    return md_text(text).replace("|", "\\|")


def csv_cell(value: Any) -> Any:
    """A value for a CSV cell: text that a spreadsheet would run as a formula is prefixed with `'`."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_safe(frame):
    """A copy of a DataFrame whose text cells and column names are csv_cell'd."""
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype.kind not in "biufcmM":  # text columns (object, or pandas' str dtype)
            out[column] = out[column].map(csv_cell).astype(object)
    out.columns = [csv_cell(str(c)) for c in out.columns]
    return out
