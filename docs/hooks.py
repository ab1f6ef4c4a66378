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
  ``ATTNLAB_DOCS_CACHE=0`` runs every page (``tests/docs/test_site.py`` does: the build is the test
  of every example).
* A Chinese page's links to English-only pages (the API reference, the architecture, the
  changelog) are written as the repository has them and become the site's URLs.
* Links from the site's root (``href="/zh/index.html"``, which the language switch uses
  where a page has no translation) become relative to the page, so that the site works
  opened from the disk as well as served.
* A tutorial's blocks run as the cells of its notebook, in a Jupyter kernel of the page's own,
  and the notebook with their outputs is written beside the page (``docs/notebooks.py``); the
  page offers it under its title.
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
    """Every markdown-exec runner (python, pycon, sh, bash, console) through :func:`_kept`, a
    tutorial's python and bash blocks through its notebook's kernel (:func:`_in_notebook`), and
    what a cell drew added under its block (:func:`_with_displays`)."""
    from markdown_exec._internal.formatters import bash, console, pycon, python, sh

    for module, name in ((python, "_run_python"), (pycon, "_run_python"), (sh, "_run_sh"), (console, "_run_sh"),
                         (bash, "_run_bash")):
        run = getattr(module, name)
        if not getattr(run, "_attnlab_kept", False):
            if module in (python, bash):
                run = _in_notebook(run)
            setattr(module, name, _kept(run))
    for module in (python, bash):
        if not getattr(module.base_format, "_attnlab_displays", False):
            module.base_format = _with_displays(module.base_format)


def _kept(run):
    def kept(code, *args, **kwargs):
        replay = _exec["replay"]
        if replay is not None:  # an unchanged page: its blocks' outputs in order
            if not replay:
                raise RuntimeError("the page's kept outputs ran out: delete .cache/docs and build again")
            out, _nb["shown"] = replay.pop(0)
            return out
        try:
            out = run(code, *args, **kwargs)
        except BaseException:
            _exec["failed"] = True
            raise
        if _exec["record"] is not None:
            _exec["record"].append([out, _nb["shown"]])
        return out

    kept._attnlab_kept = True
    return kept


# ----------------------------------------------------------------------------- a tutorial's notebook
# the page being built when it is a notebook too: its parts, its kernel, each cell's outputs, and what
# the last cell drew (HTML for the page)
_nb: dict = {"page": None, "parts": None, "kernel": None, "outputs": [], "shown": "", "notebook": None}
_notebook_seconds: dict[str, float] = {}  # page -> seconds its notebook took, kernel start to last cell


def _in_notebook(run):
    """A block of a tutorial run as its notebook's next cell (the kernel starts with the notebook's
    setup cell); other pages' blocks run as markdown-exec runs them."""
    def in_notebook(code, returncode=None, session=None, id=None, interactive=False, **extra):  # noqa: A002
        if _nb["page"] is None:
            return run(code, returncode=returncode, session=session, id=id, interactive=interactive, **extra)
        import notebooks
        from markdown_exec._internal.formatters.base import ExecutionError
        from markdown_exec._internal.rendering import code_block

        shell = run.__module__.endswith(".bash")
        if _nb["kernel"] is None:  # in a folder of its own: a notebook needs no other page's files
            _nb["started"] = time.perf_counter()
            _nb["kernel"] = notebooks.PageKernel(tempfile.mkdtemp(prefix="notebook-", dir=os.getcwd()))
            _nb["outputs"].append(_nb["kernel"].run(notebooks.SETUP))
        try:
            outputs = _nb["kernel"].run(f"%%bash\n{code}" if shell else code)
        except notebooks.CellError as exc:
            raise ExecutionError(code_block("python", str(exc)), None if not shell else 1) from None
        _nb["outputs"].append(outputs)
        _nb["shown"] = notebooks.displays_html(outputs)
        return notebooks.printed(outputs, stderr=shell)

    in_notebook._attnlab_notebook = True
    return in_notebook


def _with_displays(base_format):
    """markdown-exec's formatting of a block, then the figures and rich outputs its cell showed."""
    def formatted(**kwargs):
        _nb["shown"] = ""
        out = base_format(**kwargs)
        shown, _nb["shown"] = _nb["shown"], ""
        if not shown:
            return out
        from markupsafe import Markup

        return Markup(str(out) + shown)

    formatted._attnlab_displays = True
    return formatted


def _begin_notebook(markdown: str, src_uri: str) -> None:
    import notebooks

    page_parts = notebooks.parts(markdown)
    other = sorted({p.language for p in page_parts if p.executed and p.language not in ("python", "bash")})
    if other:
        raise RuntimeError(f"{src_uri}: a tutorial is a notebook too, whose cells are python or bash; it runs {other}")
    _nb.update(page=src_uri, parts=page_parts, kernel=None, outputs=[], shown="", notebook=None)


def _end_notebook(page) -> None:
    """The page's kernel stopped and its notebook written beside the page (its outputs from this
    build, or kept with the page's outputs when its code did not run again)."""
    if _nb["page"] is None:
        return
    import notebooks

    try:
        if _nb["kernel"] is not None:
            _nb["kernel"].close()
            _notebook_seconds[_nb["page"]] = time.perf_counter() - _nb["started"]
        nb = _nb["notebook"]
        if nb is None:
            blocks = sum(p.executed for p in _nb["parts"])
            if len(_nb["outputs"]) != blocks + 1:
                raise RuntimeError(f"{_nb['page']}: {blocks} executed blocks, but {len(_nb['outputs']) - 1} cells ran")
            nb = notebooks.notebook(_nb["parts"], _nb["outputs"], src_uri=_nb["page"], lang=_nb["page"][:2])
        target = Path(page.file.abs_dest_path).with_suffix(".ipynb")
        target.parent.mkdir(parents=True, exist_ok=True)
        notebooks.write_notebook(str(target), nb)
        _nb["notebook"] = nb
    finally:
        _nb.update(page=None, parts=None, kernel=None, outputs=[], shown="")


def _begin_page(markdown: str, src_uri: str) -> None:
    if "wrapped" not in _state:
        _wrap_runs()
        _state["wrapped"] = "yes"
    if not _caching():
        _exec.update(replay=None, record=None, failed=False, key=None)
        return
    if "fingerprint" not in _state:
        _state["fingerprint"] = _fingerprint()
    key = hashlib.sha256(f"{_state['fingerprint']}|{src_uri}|{markdown}".encode()).hexdigest()
    kept = _CACHE / f"{key}.json"
    try:
        kept_page = json.loads(kept.read_text(encoding="utf-8")) if kept.is_file() else None
    except (OSError, ValueError):
        kept_page = None
    if not isinstance(kept_page, dict):
        kept_page = None
    outputs = kept_page["runs"] if kept_page is not None else None
    if kept_page is not None and _nb["page"] is not None:
        _nb["notebook"] = kept_page.get("notebook")
        if _nb["notebook"] is None:  # kept before the page was a notebook: run it again
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
        tmp.write_text(json.dumps({"runs": _exec["record"], "notebook": _nb["notebook"]}), encoding="utf-8")
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
    import notebooks

    src = page.file.src_uri
    _started[src] = time.perf_counter()
    if src == "en/changelog.md":
        # The page is CHANGELOG.md, whose links are written from the repository's top
        # (docs/en/results/vision.md): from the page they are relative to docs/en/.
        markdown = (Path(_DOCS).parent / "CHANGELOG.md").read_text(encoding="utf-8").replace("](docs/en/", "](")
    if src.startswith("zh/"):
        markdown = join_cjk_lines(markdown)
    if notebooks.is_notebook_page(src):
        _begin_notebook(markdown, src)  # its links as the repository has them: the notebook makes its own
        markdown = notebooks.with_run_line(markdown, src)
    if src.startswith("zh/"):
        markdown = english_links(markdown, src)
    _begin_page(markdown, src)
    return markdown


def on_page_content(html, page, **kwargs):
    _end_page_and_notebook(page)
    if page.file.src_uri in _started:
        _seconds[page.file.src_uri] = time.perf_counter() - _started.pop(page.file.src_uri)
    return html


def _end_page_and_notebook(page) -> None:
    try:
        if not _exec["failed"]:
            _end_notebook(page)  # first: the page's kept outputs hold its notebook
        elif _nb["kernel"] is not None:
            _nb["kernel"].close()
    finally:
        _end_page()
        _nb.update(page=None, parts=None, kernel=None, outputs=[], shown="", notebook=None)


def on_post_build(config, **kwargs) -> None:
    leave_workdir()
    slow = sorted(_seconds.items(), key=lambda kv: -kv[1])[:8]
    log.info("slowest pages (rendering and their code): " + ", ".join(f"{p} {s:.1f} s" for p, s in slow))
    if _caching():
        log.info(f"pages whose code ran: {_counts['run']}; reused from .cache/docs (their Markdown and attnlab "
                 f"unchanged): {_counts['reused']}")
    if _notebook_seconds:
        log.info("notebooks run top to bottom in a Jupyter kernel (seconds, kernel start to last cell): "
                 + ", ".join(f"{p} {t:.1f}" for p, t in sorted(_notebook_seconds.items())))


def on_build_error(**kwargs) -> None:
    if _nb["kernel"] is not None:
        _nb["kernel"].close()
        _nb["kernel"] = None
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
