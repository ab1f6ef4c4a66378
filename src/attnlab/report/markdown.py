"""The little Markdown our own reports write, as HTML: headings, pipe tables (with
``---:`` alignment), bullet lists, paragraphs, ``code`` and **bold**.

Not a general Markdown parser: it reads what :mod:`attnlab.bench.report` writes, and
anything else comes out as escaped paragraphs, never as raw markup, so the page stays
safe whatever the text holds. A full parser would be one more dependency for that.
"""

from __future__ import annotations

import html
import re

__all__ = ["markdown_to_html"]

_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _inline(text: str) -> str:
    """Escaped text with ``code`` spans and **bold**."""
    out = []
    for i, piece in enumerate(re.split(r"(`[^`]*`)", text)):
        if i % 2:
            out.append(f"<code>{html.escape(piece[1:-1])}</code>")
        else:
            out.append(re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(piece)))
    return "".join(out)


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [c.strip().replace("\\|", "|") for c in _CELL_SPLIT.split(line)]


def _table(lines: list[str]) -> str:
    header, aligns = _cells(lines[0]), []
    for spec in _cells(lines[1]):
        aligns.append("right" if spec.endswith(":") and not spec.startswith(":")
                      else "center" if spec.startswith(":") and spec.endswith(":") else "")
    style = lambda i: f' style="text-align: {aligns[i]}"' if i < len(aligns) and aligns[i] else ""  # noqa: E731
    out = ['<div class="scroll"><table>',
           "<tr>" + "".join(f"<th{style(i)}>{_inline(c)}</th>" for i, c in enumerate(header)) + "</tr>"]
    for line in lines[2:]:
        out.append("<tr>" + "".join(f"<td{style(i)}>{_inline(c)}</td>" for i, c in enumerate(_cells(line))) + "</tr>")
    return "\n".join(out) + "</table></div>"


def markdown_to_html(text: str, heading_offset: int = 0) -> str:
    """HTML for ``text``; ``heading_offset`` demotes headings (1: ``#`` becomes ``<h2>``)."""
    lines = text.splitlines()
    out: list[str] = []
    paragraph: list[str] = []
    items: list[str] = []

    def flush() -> None:
        if paragraph:
            out.append(f"<p>{_inline(' '.join(paragraph))}</p>")
            paragraph.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if "|" in stripped and i + 1 < len(lines) and _SEPARATOR.match(lines[i + 1]):
            flush()
            end = i + 2
            while end < len(lines) and lines[end].strip() and "|" in lines[end]:
                end += 1
            out.append(_table(lines[i:end]))
            i = end
            continue
        heading = _HEADING.match(stripped)
        if heading:
            flush()
            level = min(6, len(heading.group(1)) + heading_offset)
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif stripped.startswith(("- ", "* ")):
            if paragraph:
                flush()
            items.append(stripped[2:])
        elif not stripped:
            flush()
        elif items and line.startswith("  "):  # a list item continued on the next line
            items[-1] += " " + stripped
        else:
            if items:
                flush()
            paragraph.append(stripped)
        i += 1
    flush()
    return "\n".join(out)
