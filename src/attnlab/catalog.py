"""What attnlab holds, as Markdown tables made from its registries: the attention kinds with
what each honours, the Hugging Face families that load, the tasks and the shipped recipes.

The README's tables are regions of the file between ``<!-- generated: NAME -->`` and
``<!-- end generated -->``, filled by::

    python -m attnlab.catalog --write README.md     # rewrite the regions
    python -m attnlab.catalog --check README.md     # exit 1 when a region differs from the registries

and the user guide prints the same tables while the site builds, so no list of what attnlab
supports is written by hand (``tests/test_catalog.py`` holds the README to them).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable

from .attention import list_attention
from .attention.registry import attention_entry
from .families import HF_FAMILY_CHECKPOINTS
from .io import atomic_write_bytes
from .formats.hf.load import HF_FAMILIES
from .recipes import list_recipes
from .run.task import list_tasks

__all__ = ["attention_kinds_table", "hf_families_table", "recipes_table", "tasks_list", "TABLES", "fill", "main"]

_WORDS = {
    "en": {"yes": "yes", "no": "no", "only": "only", "none": "-",
           "kinds": ["kind", "input", "what it is", "causal", "padding", "weights", "cache"],
           "families": ["`model_type`", "checkpoints", "loads as"],
           "recipes": ["recipe", "task", "what it trains"]},
    "zh": {"yes": "是", "no": "否", "only": "仅因果", "none": "-",
           "kinds": ["类型", "输入", "说明（英文）", "因果掩码", "填充掩码", "注意力权重", "缓存"],
           "families": ["`model_type`", "检查点", "读入为"],
           "recipes": ["配方", "任务", "说明（英文）"]},
}


def _words(lang: str) -> dict:
    if lang not in _WORDS:
        raise ValueError(f"lang must be one of {', '.join(_WORDS)}; got {lang!r}")
    return _WORDS[lang]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def attention_kinds_table(lang: str = "en") -> str:
    """Every registered kind: its input (``tokens`` ``(B, L, E)`` or ``grid`` ``(B, C, H, W)``),
    what it is, and what it honours: a causal mask (``only``: it has no other form), key padding,
    the weight matrix that ``capture_attention`` records, a decoding cache of its own."""
    w = _words(lang)

    def flag(value: bool | None) -> str:
        return w["none"] if value is None else w["yes"] if value else w["no"]

    rows = []
    for family in ("tokens", "grid"):
        for name in list_attention(family):
            entry = attention_entry(name)
            caps = entry.capabilities
            causal = w["only"] if caps.causal_only else flag(caps.causal)
            rows.append([f"`{name}`", family, entry.summary, causal, flag(caps.padding), flag(caps.weights),
                         flag(caps.cache)])
    return _table(w["kinds"], rows)


def hf_families_table(lang: str = "en") -> str:
    """Every ``model_type`` that :func:`attnlab.formats.from_hf` reads, the checkpoints that carry
    it and the attnlab class it loads as (``GPT``, ``TextEncoder``, ``VisionTransformer``)."""
    w = _words(lang)
    rows = [[f"`{kind}`", HF_FAMILY_CHECKPOINTS[kind][1], f"`{family.model.__name__}`"]
            for kind, family in HF_FAMILIES.items()]
    return _table(w["families"], rows)


def recipes_table(lang: str = "en") -> str:
    """Every shipped recipe with its task and its description."""
    w = _words(lang)
    return _table(w["recipes"], [[f"`{name}`", f"`{task}`", text] for name, task, text in list_recipes()])


def tasks_list(lang: str = "en") -> str:
    """The registered tasks, as one line of their names."""
    _words(lang)
    return ", ".join(f"`{task.name}`" for task in list_tasks())


TABLES: dict[str, Callable[[str], str]] = {
    "attention-kinds": attention_kinds_table,
    "hf-families": hf_families_table,
    "recipes": recipes_table,
    "tasks": tasks_list,
}

_REGION = re.compile(r"(<!-- generated: ([\w-]+)(?: ([a-z]{2}))? -->\n)(.*?)(<!-- end generated -->)", re.S)


def fill(text: str) -> str:
    """``text`` with each ``<!-- generated: NAME [LANG] -->`` region holding the table NAME makes now."""
    def region(match: re.Match) -> str:
        name, lang = match.group(2), match.group(3) or "en"
        if name not in TABLES:
            raise ValueError(f"unknown generated region {name!r}; known: {', '.join(TABLES)}")
        return f"{match.group(1)}{TABLES[name](lang)}\n{match.group(5)}"
    return _REGION.sub(region, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.catalog",
                                     description="fill a Markdown file's generated regions from the registries")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the files' regions")
    action.add_argument("--check", action="store_true", help="exit 1 when a file's region differs")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    stale = []
    for file in args.files:
        text = file.read_text(encoding="utf-8")
        new = fill(text)
        if new != text:
            stale.append(str(file))
            if args.write:
                atomic_write_bytes(file, new.encode("utf-8"))
    if args.check and stale:
        print(f"generated regions out of date in {', '.join(stale)}: run python -m attnlab.catalog --write "
              f"{' '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
