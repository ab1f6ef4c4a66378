"""One self-contained HTML page built from sections of text, tables and images.

Every image is embedded as a base64 ``data:`` URI and the CSS is inline, so the file
opens anywhere, offline, and can be mailed or archived alone. A Content-Security-Policy
in the page forbids loading anything from elsewhere, so a stray external reference
shows up as a blocked request (and a console error) instead of silently working on the
author's machine only. Everything given as text is escaped; only :class:`Html` parts
are inserted as they are.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

from ..errors import InputError

__all__ = ["Section", "Image", "Table", "Pre", "Note", "Html", "Details", "render_html", "data_uri"]


@dataclass
class Image:
    """An image (PNG, JPEG or GIF bytes, or a file of one), shown with a caption."""

    source: bytes | str | Path
    caption: str = ""
    alt: str = ""  # default: the caption


@dataclass
class Table:
    """Rows of cells (any value; shown with ``str``); numbers are right-aligned."""

    rows: Sequence[Sequence[Any]]
    header: Sequence[str] | None = None


@dataclass
class Pre:
    """Preformatted text (a file's content, a log)."""

    text: str


@dataclass
class Note:
    """A muted remark: why a part of the report is missing, what a figure was computed with."""

    text: str


@dataclass
class Html:
    """Markup inserted as it is: the caller vouches that it is escaped. ``scripts``: the
    CSP sources (``'sha256-...'``) of the inline scripts it runs (an embedded explorer's:
    a frame's ``srcdoc`` page keeps the report's policy), which the page then allows."""

    markup: str
    scripts: tuple[str, ...] = ()


@dataclass
class Details:
    """Parts folded under a one-line ``summary`` (an HTML ``<details>`` element, closed until
    the reader opens it): what a reader seldom needs, such as a run's every setting."""

    summary: str
    parts: list["Part"] = field(default_factory=list)


Part = Union[str, Image, Table, Pre, Note, Html, Details]  # str: a paragraph of text


@dataclass
class Section:
    heading: str
    parts: list[Part] = field(default_factory=list)


_MIME = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"))

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #1b1b1b; background: #fff; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.8em; }
h3, h4 { font-size: 1.05em; margin-top: 1.2em; }
.subtitle { color: #555; margin-top: 0; }
nav { font-size: 0.92em; margin: 1em 0; }
nav a { margin-right: 1em; color: #0b5cad; text-decoration: none; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; border: 1px solid #e2e2e2; padding: 0.7em; overflow-x: auto; font-size: 0.88em; }
figure { display: inline-block; margin: 0.5em 1em 1em 0; vertical-align: top; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.88em; color: #444; }
/* the explorer takes the window's width, not the text's column: its head view spreads its lines over it */
iframe.explorer { display: block; box-sizing: border-box; width: calc(100vw - 3em); height: 820px;
                  margin-left: calc(50% - 50vw + 1.5em); border: 1px solid #ddd; }
details > summary { cursor: pointer; color: #0b5cad; margin: 0.4em 0; }
.note { color: #666; font-style: italic; }
.scroll { overflow-x: auto; }
"""

# No scripts, no fonts, nothing fetched: only this document's inline styles and data: images (and the
# scripts of an embedded attention explorer, by their hashes).
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def data_uri(source: bytes | str | Path) -> str:
    """``data:image/...;base64,...`` for image bytes or an image file."""
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    mime = next((m for magic, m in _MIME if data.startswith(magic)), None)
    if mime is None:
        name = "bytes" if isinstance(source, bytes) else str(source)
        raise InputError(f"image must be PNG, JPEG or GIF data; {name} is none of them")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _table(table: Table) -> str:
    out = ['<div class="scroll"><table>']
    if table.header:
        out.append("<tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in table.header) + "</tr>")
    for row in table.rows:
        cells = (f'<td class="num">{html.escape(str(c))}</td>' if _is_number(c) else f"<td>{html.escape(str(c))}</td>"
                 for c in row)
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table></div>"


def _part(part: Part) -> str:
    if isinstance(part, str):
        return f"<p>{html.escape(part)}</p>"
    if isinstance(part, Image):
        caption = f"<figcaption>{html.escape(part.caption)}</figcaption>" if part.caption else ""
        alt = html.escape(part.alt or part.caption)
        return f'<figure><img src="{data_uri(part.source)}" alt="{alt}">{caption}</figure>'
    if isinstance(part, Table):
        return _table(part)
    if isinstance(part, Pre):
        return f"<pre>{html.escape(part.text)}</pre>"
    if isinstance(part, Note):
        return f'<p class="note">{html.escape(part.text)}</p>'
    if isinstance(part, Html):
        return part.markup
    if isinstance(part, Details):
        return "\n".join([f"<details><summary>{html.escape(part.summary)}</summary>", *map(_part, part.parts),
                          "</details>"])
    raise TypeError(f"a section part must be str, Image, Table, Pre, Note, Html or Details; got {type(part).__name__}")


def _anchor(heading: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-") or "section"
    anchor, i = base, 2
    while anchor in taken:
        anchor, i = f"{base}-{i}", i + 1
    taken.add(anchor)
    return anchor


def _flat(parts: Sequence[Part]) -> list[Part]:
    """``parts`` with those folded in :class:`Details` among them."""
    return [q for p in parts for q in ([p, *_flat(p.parts)] if isinstance(p, Details) else [p])]


def render_html(title: str, sections: Sequence[Section], subtitle: str = "") -> str:
    """The page: a title, a line under it, links to the sections, and the sections."""
    taken: set[str] = set()
    anchors = [_anchor(s.heading, taken) for s in sections]
    nav = " ".join(f'<a href="#{a}">{html.escape(s.heading)}</a>' for a, s in zip(anchors, sections))
    scripts = sorted({h for s in sections for p in _flat(s.parts) if isinstance(p, Html) for h in p.scripts})
    csp = CSP + (f"; script-src {' '.join(scripts)}" if scripts else "")
    body = []
    for anchor, section in zip(anchors, sections):
        body.append(f'<section id="{anchor}">\n<h2>{html.escape(section.heading)}</h2>')
        body.extend(_part(p) for p in section.parts)
        body.append("</section>")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',  # the browser asks for no favicon.ico next to the file
        f"<title>{html.escape(title)}</title>",
        f"<style>{CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="subtitle">{html.escape(subtitle)}</p>' if subtitle else "",
        f"<nav>{nav}</nav>",
        *body,
        "</body>",
        "</html>",
        "",
    ])
