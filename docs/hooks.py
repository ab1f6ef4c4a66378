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
* What a page's code printed is kept in ``.cache/docs/`` (one file a page, under a hash of the
  page's Markdown, attnlab's source files, the docs helpers and the tools' versions) and replayed
  when that hash is seen again: a page whose code and library are unchanged is not run again.
  ``ATTNLAB_DOCS_CACHE=0`` runs every page (``tests/test_docs.py`` does: the build is the test
  of every example).
* A Chinese page's links to English-only pages (the API reference, the architecture, the
  changelog) are written as the repository has them and become the site's URLs.
* Links from the site's root (``href="/zh/index.html"``, which the language switch uses
  where a page has no translation) become relative to the page, so that the site works
  opened from the disk as well as served.
"""

from __future__ import annotations

import hashlib
import json
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


# ----------------------------------------------------------------------------- the pages' executed output, kept
_CACHE = Path(_DOCS).parent / ".cache" / "docs"
_exec: dict[str, object] = {"replay": None, "record": None, "failed": False, "key": None}
_counts = {"run": 0, "reused": 0}


def _fingerprint() -> str:
    """What a page's output depends on besides its Markdown: attnlab's source files, the docs
    helpers, and the versions of Python, torch and markdown-exec."""
    import markdown_exec
    import torch

    digest = hashlib.sha256(f"{sys.version}|{torch.__version__}|{getattr(markdown_exec, '__version__', '')}".encode())
    top = Path(_DOCS).parent
    files = sorted((top / "src" / "attnlab").rglob("*")) + sorted(Path(_DOCS).glob("*.py"))
    for path in files:
        if path.is_file() and path.suffix in (".py", ".yaml", ".js", ".html", ".css", ".json"):
            digest.update(str(path.relative_to(top)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _caching() -> bool:
    return os.environ.get("ATTNLAB_DOCS_CACHE", "1") != "0"


def _wrap_runs() -> None:
    """Every markdown-exec runner (python, pycon, sh, bash, console) through :func:`_kept`."""
    from markdown_exec._internal.formatters import bash, console, pycon, python, sh

    for module, name in ((python, "_run_python"), (pycon, "_run_python"), (sh, "_run_sh"), (console, "_run_sh"),
                         (bash, "_run_bash")):
        run = getattr(module, name)
        if not getattr(run, "_attnlab_kept", False):
            setattr(module, name, _kept(run))


def _kept(run):
    def kept(code, *args, **kwargs):
        replay = _exec["replay"]
        if replay is not None:  # an unchanged page: its blocks' outputs in order
            if not replay:
                raise RuntimeError("the page's kept outputs ran out: delete .cache/docs and build again")
            return replay.pop(0)
        try:
            out = run(code, *args, **kwargs)
        except BaseException:
            _exec["failed"] = True
            raise
        if _exec["record"] is not None:
            _exec["record"].append(out)
        return out

    kept._attnlab_kept = True
    return kept


def _begin_page(markdown: str, src_uri: str) -> None:
    if not _caching():
        _exec.update(replay=None, record=None, failed=False, key=None)
        return
    if "fingerprint" not in _state:
        _state["fingerprint"] = _fingerprint()
        _wrap_runs()
    key = hashlib.sha256(f"{_state['fingerprint']}|{src_uri}|{markdown}".encode()).hexdigest()
    kept = _CACHE / f"{key}.json"
    try:
        outputs = json.loads(kept.read_text(encoding="utf-8")) if kept.is_file() else None
    except (OSError, ValueError):
        outputs = None
    _exec.update(replay=outputs, record=None if outputs is not None else [], failed=False, key=key)


def _end_page() -> None:
    if _exec["key"] is None:
        return
    if _exec["replay"] is not None:
        _counts["reused"] += 1
    elif not _exec["failed"] and _exec["record"] is not None:
        _counts["run"] += 1
        _CACHE.mkdir(parents=True, exist_ok=True)
        tmp = _CACHE / f".{_exec['key']}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(_exec["record"]), encoding="utf-8")
        os.replace(tmp, _CACHE / f"{_exec['key']}.json")
    _exec.update(replay=None, record=None, failed=False, key=None)


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


_ENGLISH_LINK = re.compile(r"\]\(((?:\.\./)+en/[^)#\s]+)\.md(#[^)\s]*)?\)")


def english_links(markdown: str, src_uri: str) -> str:
    """A Chinese page's links to English-only pages, written as the repository has them
    (``../../en/api/attention.md``: they work where the Markdown is read, on GitHub), as the
    site's URLs of those pages from its root (``/api/attention.html``), which MkDocs leaves
    alone and :func:`relative_root_links` makes relative to the page: the Chinese build holds
    no English page for MkDocs to convert the link to."""
    here = posixpath.dirname(src_uri)

    def swap(m: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(here, m.group(1)))  # en/api/attention
        if not target.startswith("en/"):
            return m.group(0)
        return f"](/{target.removeprefix('en/')}.html{m.group(2) or ''})"  # the English pages are the site's root

    return _ENGLISH_LINK.sub(swap, markdown)


def on_page_markdown(markdown, page, **kwargs):
    _started[page.file.src_uri] = time.perf_counter()
    if page.file.src_uri == "en/changelog.md":
        # The page is CHANGELOG.md, whose links are written from the repository's top
        # (docs/en/results/vision.md): from the page they are relative to docs/en/.
        markdown = (Path(_DOCS).parent / "CHANGELOG.md").read_text(encoding="utf-8").replace("](docs/en/", "](")
    if page.file.src_uri.startswith("zh/"):
        markdown = join_cjk_lines(english_links(markdown, page.file.src_uri))
    _begin_page(markdown, page.file.src_uri)
    return markdown


def on_page_content(html, page, **kwargs):
    _end_page()
    if page.file.src_uri in _started:
        _seconds[page.file.src_uri] = time.perf_counter() - _started.pop(page.file.src_uri)
    return html


def on_post_build(config, **kwargs) -> None:
    leave_workdir()
    slow = sorted(_seconds.items(), key=lambda kv: -kv[1])[:8]
    log.info("slowest pages (rendering and their code): " + ", ".join(f"{p} {s:.1f} s" for p, s in slow))
    if _caching():
        log.info(f"pages whose code ran: {_counts['run']}; reused from .cache/docs (their Markdown and attnlab "
                 f"unchanged): {_counts['reused']}")


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
