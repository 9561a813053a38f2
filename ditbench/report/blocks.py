"""A report as a list of blocks (headings, paragraphs, tables, images), rendered to markdown and HTML:
built once, so report.md and report.html say the same; the HTML embeds its plots and loads nothing.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ditbench.core.escape import md_inline, md_text


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    css: list[list[str]] = field(default_factory=list)  # per-cell class names for the HTML


@dataclass
class Image:
    name: str
    title: str
    png: bytes
    file: str  # the PNG's name next to report.md


Block = Heading | Para | Bullets | Table | Image


# ------------------------------------------------------------------------------------------ format


def num(x: Any, digits: int = 1, unit: str = "") -> str:
    if x is None or isinstance(x, bool):
        return "—"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "—"
    if math.isnan(x):
        return "—"
    return (f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}f}") + unit


def speedup_text(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}x"


def saved_text(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    text = f"{x:+.1f}%"
    return "+0.0%" if text == "-0.0%" else text  # a saving that rounds to nothing has no sign


def knob_text(name: str, v: Any) -> str:
    if name == "grad_ckpt":
        return f"ckpt={v}"
    if name == "precision":
        return str(v)
    if name == "compile":
        return "compile" if v else "eager"
    if name == "run":
        return f"· run {v}"
    return f"{name}={json.dumps(v) if isinstance(v, (dict, list)) else v}"


# ------------------------------------------------------------------------------------------ render


def to_markdown(blocks: list[Block]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, Heading):  # a title, a suite or model name: user text, one line
            parts.append("#" * b.level + " " + md_text(b.text))
        elif isinstance(b, Para):  # ditbench's text with user values (names, reasons, claims) in it
            parts.append(md_inline(b.text))
        elif isinstance(b, Bullets):
            parts.append("\n".join(f"- {md_inline(item)}" for item in b.items))
        elif isinstance(b, Table):
            lines = [
                "| " + " | ".join(md_inline(h) for h in b.headers) + " |",
                "|" + "|".join("---" for _ in b.headers) + "|",
            ]
            lines += ["| " + " | ".join(md_inline(c) for c in row) + " |" for row in b.rows]
            parts.append("\n".join(lines))
        elif isinstance(b, Image):
            parts.append(f"[![{md_text(b.title).replace(']', '')}]({b.file})]({b.file})")
    return "\n\n".join(parts) + "\n"


def _inline_html(text: str) -> str:
    out = html.escape(str(text), quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       padding: 0 1rem; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: .2rem; }
table { border-collapse: collapse; margin: .8rem 0; font-size: .9rem; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d0d0; padding: .3rem .55rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
code { background: #f3f3f3; padding: 0 .2rem; border-radius: 3px; }
.status-ok { background: #eef8ee; } .status-oom, .status-error, .status-timeout, .status-nan_loss
{ background: #fbeaea; } .status-skipped, .status-unsupported { background: #f2f2f2; color: #666; }
.held { background: #e3f4e3; font-weight: 600; } .not-held { background: #fbe3e3; font-weight: 600; }
.not-measured { color: #666; } .noisy { background: #fff6d8; }
figure { margin: 1.2rem 0; } figure img { max-width: 100%; border: 1px solid #e5e5e5; }
figcaption { font-size: .9rem; color: #555; }
"""


def to_html(blocks: list[Block], title: str) -> str:
    body = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{_inline_html(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            body.append(f"<p>{_inline_html(b.text)}</p>")
        elif isinstance(b, Bullets):
            body.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{_inline_html(h)}</th>" for h in b.headers)
            rows = []
            for r, row in enumerate(b.rows):
                classes = b.css[r] if r < len(b.css) else []
                tds = []
                for c, cell in enumerate(row):
                    cls = classes[c] if c < len(classes) else ""
                    tds.append(f'<td class="{cls}">' if cls else "<td>")
                    tds[-1] += _inline_html(cell) + "</td>"
                rows.append("<tr>" + "".join(tds) + "</tr>")
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.png).decode("ascii")
            body.append(
                f'<figure id="plot-{b.name}"><img class="plot" alt="{html.escape(b.title)}" '
                f'src="data:image/png;base64,{data}"><figcaption>{html.escape(b.title)}</figcaption>'
                "</figure>"
            )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )
