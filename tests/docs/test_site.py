"""The documentation site: it builds with every example executed, its links resolve, and
its pages work in a real browser, offline, in both languages.

The build (``mkdocs build --strict``, as ``make docs``) runs every executed block of every
page (markdown-exec); a block that raises is a warning, and ``--strict`` fails the build
on it, so this module is also the test of every tutorial's code.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ("attention", "norms", "transformer", "vit", "cnn-attention", "efficient", "language-models", "own-data",
             "inside")
LANGUAGES = {"en": "", "zh": "zh/"}  # the language and its folder in the site
GUIDE = ("index", "command-line", "recipes", "data", "models", "generation", "runs", "training", "inside")
RESULTS = ("index", "vision", "precision", "own-images", "text", "language-models", "decoding", "attention-kinds",
           "attention-2024", "explorer", "fine-tuning", "heads", "notebooks", "sharded-training", "fast-paths")


# The tests of the built site: the build runs every example of every page (minutes), so they run in
# `make test-long`, which CI runs after `make test`.
needs_site = pytest.mark.long


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site, built here; or, while writing pages, one built before (``ATTNLAB_DOCS_SITE=site``
    after ``make docs``: then this module checks that build and runs no example itself)."""
    if os.environ.get("ATTNLAB_DOCS_SITE"):
        return Path(os.environ["ATTNLAB_DOCS_SITE"]).resolve()
    pytest.importorskip("mkdocs", reason="the docs tools are absent: pip install -e '.[docs]' (make test installs them)")
    if not os.environ.get("ATTNLAB_DATA_DIR"):
        pytest.skip("the tutorials read the shipped data: set ATTNLAB_DATA_DIR (the Makefile points it at ../shared/data)")
    out = tmp_path_factory.mktemp("site")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "ATTNLAB_DOCS_CACHE": "0"})  # every example runs
    assert proc.returncode == 0, f"mkdocs build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    print(f"site built in {time.perf_counter() - t0:.0f} s")
    return out


class _Page(HTMLParser):
    """The links, image sources and element ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key) and tag in ("a", "img", "link", "script"):
                self.links.append(a[key])


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def broken_links(site_dir: Path) -> list[str]:
    """Every internal link or asset of the site's pages that names a missing file or anchor."""
    pages = {p: _parse(p) for p in site_dir.rglob("*.html")}
    bad = []
    for path, page in pages.items():
        if path.name == "404.html":  # served at any address, so its links start at the server's root
            continue
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("data:", "mailto:")):
                continue  # outside links are not followed here (the browser test sees none are fetched)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                bad.append(f"{path.relative_to(site_dir)}: {link} (no file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    bad.append(f"{path.relative_to(site_dir)}: {link} (no anchor)")
    return bad


@needs_site
def test_every_tutorial_is_built_in_both_languages_with_its_code_run(site):
    for lang, folder in LANGUAGES.items():
        for name in TUTORIALS:
            page = site / folder / "tutorials" / f"{name}.html"
            assert page.is_file(), f"{lang} tutorial {name} missing"
            html = page.read_text(encoding="utf-8")
            assert f'lang="{lang}"' in html
            assert "Traceback (most recent call last)" not in html
    # the pictures are made by the pages' code while the site builds: inline PNGs, no files pasted in
    pictures = sum((site / f / "tutorials" / f"{n}.html").read_text(encoding="utf-8").count("data:image/png;base64,")
                   for f in LANGUAGES.values() for n in TUTORIALS)
    assert pictures >= 2 * len(TUTORIALS)


@needs_site
def test_every_tutorial_is_a_notebook_made_of_its_pages_blocks_and_their_outputs(site):
    """Each tutorial's notebook lies beside its page, offered under its title; its code cells are the
    page's executed blocks, in order (they cannot drift), and hold what the build's Jupyter kernel
    printed and drew, which is what the page shows (its code ran once)."""
    nbformat = pytest.importorskip("nbformat", reason="the docs tools are absent: pip install -e '.[docs]'")
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import notebooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    for lang, folder in LANGUAGES.items():
        for name in TUTORIALS:
            path = site / folder / "tutorials" / f"{name}.ipynb"
            nb = nbformat.read(path, as_version=4)
            nbformat.validate(nb)
            assert nb.metadata.attnlab == {"page": f"{lang}/tutorials/{name}.md", "lang": lang}
            source = (ROOT / "docs" / lang / "tutorials" / f"{name}.md").read_text(encoding="utf-8")
            blocks = [notebooks.cell_source(p) for p in notebooks.parts(source) if p.executed]
            cells = [c for c in nb.cells if c.cell_type == "code"]
            assert [c.source for c in cells] == [notebooks.SETUP, *blocks], f"{path}: cells and page differ"
            assert all(c.execution_count == i + 1 for i, c in enumerate(cells)), f"{path}: not run top to bottom"
            assert not [o for c in cells for o in c.outputs if o.output_type == "error"]
            assert sum(len(c.outputs) for c in cells) >= len(cells) // 2, f"{path}: cells without outputs"
            assert "docs_figures" not in "".join(c.source for c in cells)  # nothing of the site's own helpers
            page = (site / folder / "tutorials" / f"{name}.html").read_text(encoding="utf-8")
            assert f'href="{name}.ipynb"' in page, f"{name}: the page does not offer its notebook"
            lines = [line.strip() for c in cells[1:] for line in notebooks.printed(c.outputs).splitlines()]
            plain = [line for line in lines if len(line) > 20 and not set(line) & set("\"'<>&")]
            assert plain and all(line in page for line in plain[:5]), f"{name}: the page lacks its cells' output"


@needs_site
@pytest.mark.parametrize("package", ["attention", "layers", "models", "data", "engine", "tasks", "recipes", "viz",
                                     "report", "exercises"])
def test_the_api_reference_lists_every_public_name(site, package):
    module = importlib.import_module(f"attnlab.{package}")
    page = (site / "api" / f"{package}.html").read_text(encoding="utf-8")
    missing = [name for name in module.__all__ if f'id="attnlab.{package}.{name}"' not in page]
    assert missing == []


@needs_site
def test_the_api_reference_shows_shapes_and_the_mask_convention(site):
    attention = (site / "api" / "attention.html").read_text(encoding="utf-8")
    assert "(B, Lq, E)" in attention and "blocked" in attention


@needs_site
def test_every_internal_link_resolves(site):
    assert broken_links(site) == []


def test_the_link_check_sees_a_broken_link(tmp_path):
    (tmp_path / "a.html").write_text('<p id="here"><a href="b.html#there">b</a> <a href="a.html#here">a</a>'
                                     '<img src="pics/x.png"><a href="https://example.org/">far</a></p>')
    (tmp_path / "b.html").write_text('<p id="elsewhere">b</p>')
    assert broken_links(tmp_path) == ["a.html: b.html#there (no anchor)", "a.html: pics/x.png (no file)"]


# ----------------------------------------------------------------------------- in a browser
def _open(driver, page: Path) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")
    driver.get(page.resolve().as_uri())
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
    state = driver.execute_script("""
        return {ready: document.readyState, lang: document.documentElement.lang,
                text: document.querySelector('article') ? document.querySelector('article').innerText.length : 0,
                formulas: document.querySelectorAll('.katex').length,
                untypeset: Array.from(document.querySelectorAll('.arithmatex')).filter(
                    e => !e.querySelector('.katex')).length,
                images: Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt])};""")
    # Opened from the disk, the theme's language switch cannot read the sitemap (the browser
    # refuses file:// requests); the switch still works through each page's own links (tested below).
    state["errors"] = [e["message"] for e in driver.get_log("browser")
                       if e["level"] == "SEVERE" and "sitemap.xml" not in e["message"]]
    shot = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("L")
    state["shades"] = len(np.unique(np.asarray(shot)))
    return state


@needs_site
@pytest.mark.parametrize("lang", list(LANGUAGES))
def test_pages_render_in_a_browser(browser, site, lang):
    pages = [site / LANGUAGES[lang] / "index.html"] + [site / LANGUAGES[lang] / "tutorials" / f"{n}.html"
                                                       for n in TUTORIALS]
    # the home page, a results page (with its plots), a page of the guide; the architecture page and the changelog
    pages += [site / LANGUAGES[lang] / "results" / "vision.html", site / LANGUAGES[lang] / "guide" / "models.html"]
    if lang == "en":
        pages += [site / "api" / "attention.html", site / "architecture.html", site / "changelog.html"]
    for page in pages:
        state = _open(browser, page)
        where = page.relative_to(site)
        assert state["ready"] == "complete" and state["lang"] == lang, where
        assert state["errors"] == [], f"{where}: {state['errors']}"
        assert state["text"] > 500 and state["shades"] > 20, f"{where} looks blank"
        for complete, width, alt in state["images"]:
            assert complete and width > 0, f"{where}: image {alt!r} did not load"
        assert state["untypeset"] == 0, f"{where}: formulas left as TeX"
        if page.parent.name == "tutorials" and page.name == "attention.html":
            assert state["formulas"] > 5, f"{where}: formulas not typeset"


def _search(driver, page: Path, query: str) -> list[str]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page.resolve().as_uri())
    box = driver.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()
    box.send_keys(query)
    try:
        WebDriverWait(driver, 20).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "li.md-search-result__item"))
    except Exception:
        return []
    return [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "li.md-search-result__item a")]


@needs_site
@pytest.mark.parametrize("lang, query, page", [("en", "rollout", "tutorials/vit.html"),
                                               ("zh", "rollout", "tutorials/vit.html")])
def test_search_works_offline(browser, site, lang, query, page):
    hits = _search(browser, site / LANGUAGES[lang] / "index.html", query)
    assert hits, f"searching {query!r} on the {lang} site found nothing"
    assert any(page in unquote(h) for h in hits), hits


@needs_site
def test_the_language_switch_leads_to_the_other_language(browser, site):
    from selenium.webdriver.common.by import By

    from selenium.webdriver.support.ui import WebDriverWait

    browser.get((site / "tutorials" / "vit.html").resolve().as_uri())
    WebDriverWait(browser, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "a[hreflang]")) >= 2)
    links = {a.get_attribute("hreflang"): a.get_attribute("href")
             for a in browser.find_elements(By.CSS_SELECTOR, "a[hreflang]")}
    assert set(links) >= {"en", "zh"}, links
    browser.get(links["zh"])
    assert browser.execute_script("return document.documentElement.lang") == "zh"
    assert unquote(browser.current_url).endswith("zh/tutorials/vit.html"), browser.current_url


# ----------------------------------------------------------------------------- the build's hooks
def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_root_links_become_relative_to_the_page():
    hooks = _hooks()
    html = '<a href="/zh/index.html">中文</a><a href="//cdn.example/x.js">far</a><img src="/">'
    assert hooks.relative_root_links(html, "api/tasks.html") == \
        '<a href="../zh/index.html">中文</a><a href="//cdn.example/x.js">far</a><img src="../index.html">'
    assert hooks.relative_root_links('<a href="/guide.html">', "index.html") == '<a href="guide.html">'


def test_chinese_lines_are_joined_outside_code():
    hooks = _hooks()
    text = "先用几行代码\n手写注意力\nthen English\n```python\n# 中\n文\n```\n真\n实"
    assert hooks.join_cjk_lines(text) == "先用几行代码手写注意力\nthen English\n```python\n# 中\n文\n```\n真实"


@needs_site
def test_the_guide_and_the_results_are_in_both_languages_two_clicks_from_home(site):
    for lang, folder in LANGUAGES.items():
        home = _parse(site / folder / "index.html")
        for section, names in (("guide", GUIDE), ("results", RESULTS)):
            # one click: the section's first page is linked from the home page's text or navigation ...
            assert any(link.split("#")[0].endswith(f"{section}/index.html") for link in home.links), (lang, section)
            first = _parse(site / folder / section / "index.html")
            for name in names[1:]:  # ... and the second: every page of the section from that one
                assert (site / folder / section / f"{name}.html").is_file(), (lang, section, name)
                assert any(link.split("#")[0].endswith(f"{name}.html") for link in first.links), (lang, section, name)


def test_a_chinese_page_keeps_the_english_anchors():
    # a link to guide/models.md#hugging-face-checkpoint-folders reaches the same section in both languages
    for section, names in (("guide", GUIDE), ("results", RESULTS)):
        for name in names:
            en, zh = (ROOT / "docs" / lang / section / f"{name}.md" for lang in LANGUAGES)
            headings = [re.findall(r"^##+ .*$", p.read_text(encoding="utf-8"), re.M) for p in (en, zh)]
            assert len(headings[0]) == len(headings[1]), (section, name)
            if section == "guide":
                assert all(re.search(r"\{#[\w-]+\}$", h) for h in headings[1]), (name, headings[1])


def test_the_readme_is_short_and_links_the_guide_and_the_results():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for lang in LANGUAGES:
        assert f"docs/{lang}/guide/index.md" in readme and f"docs/{lang}/results/index.md" in readme
    assert "docs/en/architecture.md" in readme and "CONTRIBUTING.md" in readme and "CHANGELOG.md" in readme


def test_the_readme_links_to_every_page_in_both_languages():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = set(re.findall(r"\]\((docs/[^)#]+)\)", readme))
    for lang in LANGUAGES:
        for name in TUTORIALS:
            assert f"docs/{lang}/tutorials/{name}.md" in links, (lang, name)
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_no_page_holds_a_control_character():
    # A "\text" typed into a Python string once became a TAB and an "ext" in a formula.
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        bad = [(n, line) for n, line in enumerate(text.splitlines(), 1) if re.search(r"[\x00-\x08\x0b-\x1f]|\t", line)]
        assert not bad, f"{page.relative_to(ROOT)}: line {bad[0][0]} holds a control character: {bad[0][1]!r}"


def test_every_relative_link_of_a_page_resolves_where_the_markdown_is_read():
    """On GitHub a page's links are files of the repository: the Chinese pages reach the English-only
    API reference as ../../en/api/NAME.md (the build turns them into the site's URLs)."""
    missing = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if not path or re.match(r"^[a-z]+:", path) or path.startswith("/") or not path.endswith((".md", ".html")):
                continue
            if not (page.parent / unquote(path)).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert missing == []


def test_a_chinese_pages_links_to_english_pages_become_the_sites_urls():
    hooks = _hooks()
    text = "见 [API](../../en/api/attention.md#attnlab.attention.build_attention) 与 [中文](../guide/index.md)"
    assert hooks.english_links(text, "zh/tutorials/vit.md") == \
        "见 [API](/api/attention.html#attnlab.attention.build_attention) 与 [中文](../guide/index.md)"
    assert hooks.english_links("[c](../en/changelog.md)", "zh/index.md") == "[c](/changelog.html)"
    # and then relative to the page, as every link from the site's root is
    assert hooks.relative_root_links('<a href="/api/attention.html#x">', "zh/tutorials/vit.html") == \
        '<a href="../../api/attention.html#x">'
