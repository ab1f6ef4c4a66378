"""One way to say "unknown name, did you mean ...?" across the library."""

from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(name: object, choices: Iterable[str], what: str = "known") -> str:
    """``"; did you mean a, b?"`` when ``name`` is close to some of ``choices``, else
    ``"; <what>: <all choices>"``; meant to end an error message."""
    choices = sorted(choices)
    close = difflib.get_close_matches(str(name), choices, n=3)
    return f"; did you mean {', '.join(close)}?" if close else f"; {what}: {', '.join(choices)}"
