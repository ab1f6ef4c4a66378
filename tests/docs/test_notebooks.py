"""The tutorials' notebooks (docs/notebooks.py): a page cut into prose and blocks, the notebook
made of them, its links and notes as Jupyter shows them, and a cell run in a real Jupyter kernel.
The notebooks of the real pages are checked on the built site (tests/docs/test_site.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs"))
try:
    import notebooks
finally:
    sys.path.remove(str(ROOT / "docs"))

PAGE = '''# A tutorial

Some prose, a [link to another tutorial](inside.md#7-the-explorer) and [to the guide](../guide/data.md).

!!! note "Tiny models"
    They are barely trained.
    Two lines.

```python exec="on" source="above" result="text" session="t-en"
x = 1
print("x is", x)
```

```python
not run: a sketch
```

```bash exec="on" source="above" result="text"
attnlab --version
```

```python exec="on" html="on" session="t-en"
page
```
'''


def test_a_page_is_cut_into_its_prose_and_blocks_in_order():
    parts = notebooks.parts(PAGE)
    assert [(p.kind, p.language, p.executed) for p in parts] == [
        ("markdown", "", False), ("code", "python", True), ("markdown", "", False), ("code", "python", False),
        ("markdown", "", False), ("code", "bash", True), ("markdown", "", False), ("code", "python", True),
        ("markdown", "", False)]
    assert parts[1].text == 'x = 1\nprint("x is", x)' and parts[1].options["session"] == "t-en"
    assert notebooks.cell_source(parts[5]) == "%%bash\nattnlab --version"


def test_the_notebook_holds_the_title_the_setup_then_every_block_as_a_cell():
    nbformat = pytest.importorskip("nbformat", reason="the docs tools: pip install -e '.[docs]'")
    nb = notebooks.notebook(notebooks.parts(PAGE), None, src_uri="en/tutorials/t.md", lang="en")
    nbformat.validate(nbformat.from_dict(nb))
    cells = nb["cells"]
    assert "".join(cells[0]["source"]) == "# A tutorial" and "".join(cells[1]["source"]) == notebooks.SETUP
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert code == [notebooks.SETUP, 'x = 1\nprint("x is", x)', "%%bash\nattnlab --version", "page"]
    prose = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    # links to the other tutorial's notebook and to the guide's built page; a note as a quote
    assert "](inside.ipynb#7-the-explorer)" in prose and "](../guide/data.html)" in prose
    assert "> **Tiny models**\n>\n> They are barely trained.\n> Two lines." in prose
    assert "```python\nnot run: a sketch\n```" in prose  # shown, not run


def test_a_chinese_notebooks_links_reach_the_english_only_pages():
    text = notebooks.notebook_markdown("见 [API](../../en/api/attention.md#masks) 与 [上一篇](vit.md)。",
                                       "zh/tutorials/inside.md")
    assert text == "见 [API](../../api/attention.html#masks) 与 [上一篇](vit.ipynb)。"


def test_the_page_offers_its_notebook_under_its_title():
    page = notebooks.with_run_line("# Title\n\nBody.\n", "zh/tutorials/vit.md")
    title, blank, line = page.split("\n")[:3]
    assert title == "# Title" and blank == "" and "[vit.ipynb](vit.ipynb)" in line and "jupyter lab vit.ipynb" in line


def test_a_cell_runs_in_a_jupyter_kernel_and_its_figure_and_error_come_back(tmp_path):
    pytest.importorskip("ipykernel", reason="the docs tools: pip install -e '.[docs]'")
    kernel = notebooks.PageKernel(str(tmp_path))
    try:
        outputs = kernel.run("import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, 1])\n"
                             "print('drawn')\nopen('made.txt', 'w').write('x')")
        assert notebooks.printed(outputs) == "drawn\n"
        shown = notebooks.displays_html(outputs)  # the figure shown at the end of its cell, and the last value
        assert shown.count('<img alt="the figure the code above draws" src="data:image/png;base64,') == 1
        assert "<pre><code>1</code></pre>" in shown
        assert (tmp_path / "made.txt").is_file()  # the kernel runs in the page's folder
        bash = kernel.run("%%bash\necho out; echo err >&2")
        assert notebooks.printed(bash, stderr=True) == "out\nerr\n" and notebooks.printed(bash) == "out\n"
        with pytest.raises(notebooks.CellError, match="ZeroDivisionError"):
            kernel.run("1 / 0")
        assert notebooks.printed(kernel.run("print('still here')")) == "still here\n"
    finally:
        kernel.close()


def test_html_from_a_cell_is_shown_as_it_is_and_a_png_only_as_base64():
    assert notebooks.displays_html([{"output_type": "display_data", "data": {"text/html": "<b>x</b>"},
                                     "metadata": {}}]) == "<b>x</b>"
    with pytest.raises(ValueError):
        notebooks.displays_html([{"output_type": "display_data", "metadata": {},
                                  "data": {"image/png": '"><script>alert(1)</script>'}}])


def test_every_tutorials_lab_command_names_real_recipes_keys_and_models():
    """Each "try it in the lab" runs as written: the command line parses, each recipe with its keys
    loads, and each model the lab opens is a packaged one, a run the same lines train, or a run the
    page's own notebook writes."""
    import shlex

    from attnlab.cli.app import build_parser
    from attnlab.formats.packaged import PACKAGED
    from attnlab.recipes import load_recipe

    stems = {p.stem for p in (ROOT / "docs" / "en" / "tutorials").glob("*.md")}
    assert set(notebooks.LAB) == stems
    parser = build_parser()
    for stem, (commands, what) in notebooks.LAB.items():
        assert set(what) == {"en", "zh"} and all(len(text) > 40 for text in what.values())
        page = (ROOT / "docs" / "en" / "tutorials" / f"{stem}.md").read_text(encoding="utf-8")
        written = {p.text for p in notebooks.parts(page) if p.executed}
        trained: set[str] = set()
        for line in commands:
            argv = shlex.split(line)
            assert argv[0] == "attnlab"
            args = parser.parse_args(argv[1:])
            if argv[1] == "train":
                load_recipe(args.recipe, [a for a in argv[3:] if "=" in a and not a.startswith("-")])
                trained.add(args.run_dir)
            else:
                assert argv[1] == "lab" and line == commands[-1]
                for model in args.models:
                    made_by_page = model.startswith("runs/") and any(model in code for code in written)
                    assert model in PACKAGED or model in trained or made_by_page, f"{stem}: {model}"
    assert notebooks.lab_lines("zh", "vit").startswith("**到实验室里试一试**")
