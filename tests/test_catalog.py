"""The lists of what attnlab supports are made from its registries, so none can go stale: the
catalog's tables hold every registered kind, family, recipe and task, the torch-free table of
families equals from_hf's, and the guide's table of families has a row for each."""

import re
import subprocess
import sys
from pathlib import Path

from attnlab import catalog, families
from attnlab.attention import list_attention
from attnlab.formats.hf.load import HF_FAMILIES
from attnlab.recipes import list_recipes
from attnlab.run.task import list_tasks

ROOT = Path(__file__).resolve().parents[1]


def test_the_families_table_names_what_from_hf_reads():
    assert list(families.HF_FAMILY_CHECKPOINTS) == list(HF_FAMILIES)
    assert {kind for kind, family in HF_FAMILIES.items() if family.model.__name__ == "GPT"} == set(families.DECODERS)


def test_every_registered_name_is_in_its_table():
    kinds = catalog.attention_kinds_table()
    assert all(f"| `{name}` |" in kinds for family in ("tokens", "grid") for name in list_attention(family))
    assert all(f"| `{kind}` |" in catalog.hf_families_table("zh") for kind in HF_FAMILIES)
    assert all(f"| `{name}` |" in catalog.recipes_table() for name, _, _ in list_recipes())
    assert all(f"`{task.name}`" in catalog.tasks_list() for task in list_tasks())


def test_the_flags_say_what_each_kind_honours():
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in catalog.attention_kinds_table().splitlines()}
    assert rows["linformer"][3] == "no" and rows["gated_delta"][3] == "only" and rows["axial"][3] == "-"
    assert rows["exact"][5:] == ["yes", "yes |"]


def test_a_region_is_filled_and_a_stale_one_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- generated: tasks -->\nold list\n<!-- end generated -->\nend\n", encoding="utf-8")
    assert catalog.main(["--check", str(page)]) == 1
    assert catalog.main(["--write", str(page)]) == 0
    assert catalog.tasks_list() in page.read_text(encoding="utf-8")
    assert catalog.main(["--check", str(page)]) == 0


def test_the_guide_names_every_family():
    guide = (ROOT / "docs" / "en" / "guide" / "models.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| (.*?) \|", guide, re.M))
    named = {kind for row in rows for kind in re.findall(r"`(\w+)`", row)}
    assert set(HF_FAMILIES) - named == set()


def test_no_help_or_docstring_lists_a_few_families_by_hand():
    for file in (ROOT / "src" / "attnlab").rglob("*.py"):
        if file.name == "families.py":
            continue
        text = file.read_text(encoding="utf-8")
        assert "GPT-2, Llama, Mistral" not in text, file


def test_every_generated_region_of_the_readme_and_the_site_is_current():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    marked = [f for f in files if "<!-- generated: " in f.read_text(encoding="utf-8")]
    assert {ROOT / "README.md", ROOT / "docs" / "en" / "guide" / "recipes.md",
            ROOT / "docs" / "zh" / "guide" / "recipes.md"} <= set(marked)
    # In a fresh process: pytest-xdist runs several test files in one worker, and one that registers a recipe or a
    # kind of its own (tests/test_plugins.py) would make the tables of this process differ from the shipped ones.
    done = subprocess.run([sys.executable, "-m", "attnlab.catalog", "--check", *map(str, marked)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + "run: python -m attnlab.catalog --write README.md docs/*/guide/*.md"
