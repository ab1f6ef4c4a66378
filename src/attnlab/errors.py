"""What a caller can get wrong, as one family of errors.

:class:`InputError` is raised for a value that the caller gave and that does not fit: an
argument, a recipe setting, a file or a run directory. It is a ``ValueError``, so code
that catches ``ValueError`` keeps working, and its message names the argument, what was
given and what was expected. The command line prints it as one line and exits 2; any
other exception that escapes a command is a bug in attnlab, shown with its traceback
(exit 1).
"""

from __future__ import annotations

__all__ = ["InputError", "shape_str"]


class InputError(ValueError):
    """A value given by the caller (argument, setting, file) that does not fit."""


def shape_str(t: object) -> str:
    """A tensor's shape as error messages write it: ``(2, 8, 64)``."""
    return "(" + ", ".join(str(s) for s in getattr(t, "shape", ())) + ")"
