"""MkDocs hooks for the pages' executed code (markdown-exec runs it while the site builds).

* ``docs/`` goes on ``sys.path``, so that a page can ``from docs_figures import figure_html``.
* The running Python's ``bin/`` goes first on ``PATH``, so that a page's shell blocks
  (``attnlab train ...``) run the ``attnlab`` of the environment that builds the site.
* The pages' code runs in a fresh temporary folder (the working directory during the
  build), so that ``runs/...`` and other files a page writes land there and are removed
  afterwards; ``ATTNLAB_DATA_DIR`` is made absolute first.
* The changelog page is ``CHANGELOG.md`` from the repository's top, its links made relative to the page.
* The snippets' base paths (``--8<-- "bench/attention.md"``) are made absolute first.
* Matplotlib draws off-screen.
* Links from the site's root (``href="/zh/index.html"``, which the language switch uses
  where a page has no translation) become relative to the page, so that the site works
  opened from the disk as well as served.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

_DOCS = str(Path(__file__).resolve().parent)
_state: dict[str, str] = {}  # the working folders: "home", "work"
_started: dict[str, float] = {}  # page -> when its Markdown began rendering
_seconds: dict[str, float] = {}  # page -> seconds its Markdown took to render (its code included)
log = logging.getLogger("mkdocs.hooks.attnlab")


def on_startup(**kwargs) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    if _DOCS not in sys.path:
        sys.path.insert(0, _DOCS)
    bin_dir = str(Path(sys.executable).parent)
    if not os.environ.get("PATH", "").startswith(bin_dir + os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    if os.environ.get("ATTNLAB_DATA_DIR"):
        os.environ["ATTNLAB_DATA_DIR"] = str(Path(os.environ["ATTNLAB_DATA_DIR"]).resolve())


def enter_workdir() -> str:
    """Make a fresh temporary folder the working directory (once per build); return it."""
    if "work" in _state:  # a plugin may run the configuration hooks again (one build per language)
        return _state["work"]
    _state["home"] = os.getcwd()
    _state["work"] = tempfile.mkdtemp(prefix="attnlab-docs-")
    os.chdir(_state["work"])
    return _state["work"]


def leave_workdir() -> None:
    if "work" in _state:
        os.chdir(_state.pop("home"))
        shutil.rmtree(_state.pop("work"), ignore_errors=True)


def on_config(config, **kwargs):  # the configuration's own paths are absolute by now
    # ... but not an extension's: the snippets' base paths (docs/, the repository) are made
    # absolute here, before the working directory moves to the temporary folder.
    top = Path(config.config_file_path).resolve().parent
    snippets = config.mdx_configs.get("pymdownx.snippets", {})
    if "base_path" in snippets:
        paths = snippets["base_path"]
        snippets["base_path"] = [str(top / p) for p in ([paths] if isinstance(paths, str) else paths)]
    enter_workdir()
    return config


_CJK = "\u3000-\u303f\u3400-\u9fff\uff00-\uffef"
_CJK_BREAK = re.compile(f"([{_CJK}])\n(?=[{_CJK}])")


def join_cjk_lines(markdown: str) -> str:
    """Join lines broken between two CJK characters outside code fences: a browser shows a
    line break inside a paragraph as a space, which Chinese text does not have."""
    parts = re.split(r"(^```.*?^```)", markdown, flags=re.M | re.S)
    return "".join(p if i % 2 else _CJK_BREAK.sub(r"\1", p) for i, p in enumerate(parts))


def on_page_markdown(markdown, page, **kwargs):
    _started[page.file.src_uri] = time.perf_counter()
    if page.file.src_uri == "en/changelog.md":
        # The page is CHANGELOG.md, whose links are written from the repository's top
        # (docs/en/results/vision.md): from the page they are relative to docs/en/.
        markdown = (Path(_DOCS).parent / "CHANGELOG.md").read_text(encoding="utf-8").replace("](docs/en/", "](")
    return join_cjk_lines(markdown) if page.file.src_uri.startswith("zh/") else markdown


def on_page_content(html, page, **kwargs):
    if page.file.src_uri in _started:
        _seconds[page.file.src_uri] = time.perf_counter() - _started.pop(page.file.src_uri)
    return html


def on_post_build(config, **kwargs) -> None:
    leave_workdir()
    slow = sorted(_seconds.items(), key=lambda kv: -kv[1])[:8]
    log.info("slowest pages (rendering and their code): " + ", ".join(f"{p} {s:.1f} s" for p, s in slow))


def on_build_error(**kwargs) -> None:
    leave_workdir()


_ROOT_LINK = re.compile(r'(href|src)="/(?!/)([^"]*)"')


def relative_root_links(html: str, page_url: str) -> str:
    """``href="/x/y.html"`` -> the same target relative to the page at ``page_url``
    (``"zh/tutorials/vit.html"``, as MkDocs writes page URLs)."""
    here = posixpath.dirname(page_url)

    def swap(m: re.Match) -> str:
        target = m.group(2) or "index.html"
        return f'{m.group(1)}="{posixpath.relpath(target, here or ".")}"'

    return _ROOT_LINK.sub(swap, html)


def on_post_page(output, page, **kwargs):
    return relative_root_links(output, page.url)
