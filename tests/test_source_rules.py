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
