"""One way to say "unknown name, did you mean ...?" across the library, and one way to read a
name that was renamed."""

from __future__ import annotations

import difflib
import functools
import warnings
from typing import Any, Callable, Iterable, Mapping

from .errors import InputError

__all__ = ["did_you_mean", "rename_former", "former_function", "FORMER_NAMES_GO_IN"]

# The version that stops reading the former names rename_former reads (an option's ``was``, a config
# class's ``deprecated`` map): each notice names it, and a test fails once attnlab reaches it, so the
# names are removed, not kept for ever.
FORMER_NAMES_GO_IN = "0.4.0"


def did_you_mean(name: object, choices: Iterable[str], what: str = "known") -> str:
    """``"; did you mean a, b?"`` when ``name`` is close to some of ``choices``, else
    ``"; <what>: <all choices>"``; meant to end an error message."""
    choices = sorted(choices)
    close = difflib.get_close_matches(str(name), choices, n=3)
    return f"; did you mean {', '.join(close)}?" if close else f"; {what}: {', '.join(choices)}"


def rename_former(given: Mapping[str, Any], former: Mapping[str, str], said: Callable[[str], str], *,
                  notice: bool = True) -> dict[str, Any]:
    """``given`` with the keys under a former name (``former``: old name -> new name) renamed, in
    the same order; each with a one-line :class:`FutureWarning` ``"<said(old)> is now called
    'new'; the old name works until attnlab <FORMER_NAMES_GO_IN>"`` when ``notice`` (a saved run
    is read without one). Both names at once is an
    error naming them."""
    if not any(key in former for key in given):
        return dict(given)
    out: dict[str, Any] = {}
    for key, value in given.items():
        new = former.get(key)
        if new is None:
            out[key] = value
            continue
        if new in given:
            raise InputError(f"{said(key)} and {new!r} are the same (its former name and its name): give {new!r} alone")
        if notice:
            warnings.warn(f"{said(key)} is now called {new!r}; the old name works until attnlab "
                          f"{FORMER_NAMES_GO_IN}", FutureWarning, stacklevel=4)
        out[new] = value
    return out


def former_function(function: Callable[..., Any], former: str) -> Callable[..., Any]:
    """``function`` under its ``former`` name (``"module.old_name"``): the same call, with a
    one-line :class:`FutureWarning` naming the new name and the version that removes the old."""
    new = f"{function.__module__}.{function.__name__}"

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"{former} is now called {new}; the old name works until attnlab {FORMER_NAMES_GO_IN}",
                      FutureWarning, stacklevel=2)
        return function(*args, **kwargs)

    call.__name__ = call.__qualname__ = former.rsplit(".", 1)[-1]
    return call
