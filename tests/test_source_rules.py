"""Rules of the source tree that a reader relies on (CONTRIBUTING.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "attnlab"

# A machine named in a measurement, or one time set against another ("7 µs against 18", "0.3 s vs 0.5").
_MACHINE = re.compile(r"\b(EPYC|Xeon|Ryzen|Core i[3579])\b")
_TIMES = re.compile(r"\d[\d,.]* ?(µs|us|ms|s)\b[^\n]{0,40}\b(against|vs\.?)\s+\d", re.IGNORECASE)
# Where a CPU's name is data, not a measurement: the machine line a run records.
_MACHINE_IS_DATA = {"engine/machine.py"}


def _comments_and_docstrings(text: str) -> str:
    """The comments (after ``#``) and the triple-quoted strings of a module, other text blanked."""
    kept = [m.group(0) for m in re.finditer(r'"""[\s\S]*?"""', text)]
    kept += [line.split("#", 1)[1] for line in text.splitlines()
             if "#" in line and not line.lstrip().startswith(("'", '"'))]
    return "\n".join(kept)


def test_no_machine_timing_in_a_comment_or_docstring():
    found = []
    for file in sorted(SRC.rglob("*.py")):
        rel = file.relative_to(SRC).as_posix()
        if rel.startswith("exercises/catalog/"):
            continue  # the learners' tasks, not comments on the code
        text = _comments_and_docstrings(file.read_text(encoding="utf-8"))
        for pattern in (_TIMES,) if rel in _MACHINE_IS_DATA else (_MACHINE, _TIMES):
            found += [f"{rel}: {m.group(0)!r}" for m in pattern.finditer(text)]
    assert not found, "a machine timing in the code (it belongs on a results page):\n" + "\n".join(found)


def test_the_rule_finds_what_it_is_for():
    sample = '"""A step took 8.9 µs against 10.5 (AMD EPYC)."""\nx = 1  # 0.3 s vs 0.5 here\n'
    text = _comments_and_docstrings(sample)
    assert _MACHINE.search(text) and len(_TIMES.findall(text)) == 2


_ACCESSORS = re.compile(r"(?<![\w.])attention_(family|capabilities|options|takes|options_named|position_options|"
                        r"forms_weights|summary|honours|causal_only|keeps_cache)\(")


def _former_paths() -> re.Pattern[str]:
    from attnlab.moved import MOVED

    return re.compile(r"\b(" + "|".join(re.escape(m) for m in sorted(MOVED, key=len, reverse=True)) + r")\b(?![\w.])")


def _says_a_former_name(code: str, paths: re.Pattern[str]) -> bool:
    code = code.split("#", 1)[0]
    return bool((paths.search(code) and ("import" in code or "(" in code)) or _ACCESSORS.search(code))


def test_the_code_names_no_former_path_or_accessor():
    """What a user still may say for a while (attnlab.moved's former paths, the registry's former
    accessors) the code itself never says: each former name has one place, its notice."""
    from attnlab.moved import MOVED_NAMES

    paths, found = _former_paths(), []
    everything = {}
    for file in sorted(SRC.rglob("*.py")):
        rel = file.relative_to(SRC).as_posix()
        everything[rel] = file.read_text(encoding="utf-8")
        if rel in ("moved.py", "attention/registry.py"):
            continue
        found += [f"{rel}:{n}: {line.strip()}" for n, line in enumerate(everything[rel].splitlines(), 1)
                  if _says_a_former_name(line, paths)]
    for name in MOVED_NAMES:  # a name that left a module is imported from its new home
        module, attr = name.rsplit(".", 1)
        found += [f"{rel}: {name}" for rel, text in everything.items()
                  if re.search(rf"from {re.escape(module)} import [^\n]*\b{attr}\b", text)]
    assert not found, "the code names a former path or accessor:\n" + "\n".join(found)


def test_the_former_name_rule_finds_what_it_is_for():
    paths = _former_paths()
    assert _says_a_former_name("    from attnlab.models.hf import from_hf", paths)
    assert _says_a_former_name("    if attention_family(kind) != 'tokens':", paths)
    assert not _says_a_former_name("    from attnlab.formats.hf.load import from_hf", paths)
    assert not _says_a_former_name("    if attention_entry(kind).family != 'tokens':  # attention_family(kind)", paths)
