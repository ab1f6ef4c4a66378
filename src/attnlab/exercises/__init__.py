"""Exercises that check their answer, one set per tutorial.

Each tutorial ends with a few exercises (``attention-1``, ``norms-2``, ...). Write the
function the exercise asks for and hand it to :func:`check`: it runs your function and the
reference on random and edge inputs (one token, a fully masked row, padding, float16, an
empty batch, ...) and prints one sentence, what is right or the first thing that is wrong,
with the case, the shapes and, when your answer matches a typical mistake of that exercise,
what the mistake is::

    from attnlab import exercises

    def masked_attention(q, k, v, mask):
        ...

    exercises.check("attention-1", masked_attention)

:func:`names` lists the exercises, :func:`describe` says what one asks, :func:`skeleton`
gives the code to start from and :func:`solution` the reference solution.
``set_language("zh")`` switches every message and text to Chinese.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

from ..errors import InputError
from ..suggest import did_you_mean
from . import solutions
from .checking import Exercise, Verdict, current_cell, get_language, resolve_language, run_check, set_language

__all__ = ["check", "names", "list_exercises", "describe", "skeleton", "solution", "set_language", "get_language",
           "Verdict"]


class Code(str):
    """A text shown as itself, not as a quoted string, at the end of a notebook cell."""

    def __repr__(self) -> str:
        return str(self)


def _catalog():
    from . import catalog  # the references import attnlab's layers: only when an exercise is asked for

    return catalog


def _get(name: Any) -> Exercise:
    by_name = _catalog().BY_NAME
    if not isinstance(name, str) or name not in by_name:
        raise InputError(f"name must be the name of an exercise, such as 'attention-1'; got {name!r}"
                         f"{did_you_mean(name, by_name, 'exercises')}")
    return by_name[name]


def names(tutorial: str | None = None) -> list[str]:
    """The exercises' names in the tutorials' order; ``tutorial`` (``"attention"``, ``"lm"``,
    ...): that tutorial's only."""
    catalog = _catalog()
    if tutorial is None:
        return [ex.name for ex in catalog.EXERCISES]
    if tutorial not in catalog.TUTORIALS:
        raise InputError(f"tutorial must be one of {', '.join(catalog.TUTORIALS)}; got {tutorial!r}"
                         f"{did_you_mean(tutorial, catalog.TUTORIALS, 'tutorials')}")
    return [ex.name for ex in catalog.EXERCISES if ex.tutorial == tutorial]


list_exercises = names


def _signature(ex: Exercise, lang: str) -> str:
    doc = "\n".join(("    " + line) if line else "" for line in ex.doc[0 if lang == "en" else 1].split("\n"))
    return f'def {ex.func}({ex.params}):\n    """{doc.lstrip()}\n    """\n'


def describe(name: str, lang: str | None = None) -> Code:
    """What exercise ``name`` asks, in a sentence or two, and the function's signature with its shapes."""
    ex = _get(name)
    lang = resolve_language(lang)
    i = 0 if lang == "en" else 1
    stem, en_title, zh_title = _catalog().TUTORIALS[ex.tutorial]
    if lang == "en":
        where = f"It practises {ex.section[0]}, of the tutorial “{en_title}” ({stem}.md)."
    else:
        where = f"对应教程《{zh_title}》（{stem}.md）的{ex.section[1]}。"
    return Code(f"{ex.name}: {ex.title[i]}\n{ex.task[i]}\n{where}\n\n{_signature(ex, lang)}")


def skeleton(name: str, lang: str | None = None) -> Code:
    """The code to start exercise ``name`` from: the function with its docstring (shapes) and
    ``raise NotImplementedError(...)`` where your code goes."""
    ex = _get(name)
    lang = resolve_language(lang)
    here = "your code here" if lang == "en" else "在这里写你的代码"
    return Code(f'{_signature(ex, lang)}    raise NotImplementedError("{here}")\n')


def solution(name: str) -> Code:
    """The reference solution of exercise ``name`` (for after trying): its source, in plain torch."""
    ex = _get(name)
    return Code(inspect.getsource(getattr(solutions, ex.func)))


def check(name: str, fn: Callable[..., Any], *, lang: str | None = None) -> Verdict:
    """Runs ``fn`` against exercise ``name``'s reference on its cases and prints the verdict:
    ``✓`` and the cases when every one is right, else ``✗``, the first case that went wrong
    (in words, with its shapes), what is wrong (shape, dtype, NaN, the largest difference)
    and, when your answer equals a typical mistake of the exercise, which one. Returns the
    :class:`Verdict` (true when right). ``lang``: ``"en"`` or ``"zh"``; default the language of
    :func:`set_language`."""
    ex = _get(name)
    lang = resolve_language(lang)
    if not callable(fn):
        raise InputError(f"fn must be your function (a callable), such as {ex.func}; got {type(fn).__name__}")
    verdict = run_check(ex, fn, lang)
    # The caller's print: a page built by markdown-exec gives its blocks a print of its own that
    # collects what the block shows (a notebook's cell has the builtin one).
    sys._getframe(1).f_globals.get("print", print)(verdict.message)
    object.__setattr__(verdict, "_printed_in", current_cell())
    return verdict
