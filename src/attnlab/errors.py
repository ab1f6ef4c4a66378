"""What a caller can get wrong, as one family of errors.

:class:`InputError` is raised for a value that the caller gave and that does not fit: an
argument, a recipe setting, a file or a run directory. It is a ``ValueError``, so code
that catches ``ValueError`` keeps working, and its message names the argument, what was
given and what was expected. The command line prints it as one line and exits 2; any
other exception that escapes a command is a bug in attnlab, shown with its traceback
(exit 1).
"""

from __future__ import annotations

__all__ = ["InputError", "AttentionUnavailable", "WriteError", "NonFiniteLossError", "LostProcessError", "shape_str",
           "yaml_problem"]


class InputError(ValueError):
    """A value given by the caller (argument, setting, file) that does not fit."""


class AttentionUnavailable(InputError):
    """A model whose attention cannot be shown: its attention forms no weight matrix, it has
    none, or its family has no drawing of it. A fact of the model, not a fault: the command
    line prints the message as it prints any :class:`InputError`; the run report writes
    ``reason`` and ``instead`` where the pictures would be.

    ``reason``: what the model lacks, said of the model ("its attention (linear) never forms
    the weight matrix"), no run directory; ``instead``: what to train to see attention."""

    def __init__(self, message: str, *, reason: str = "", instead: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message
        self.instead = instead


def shape_str(t: object) -> str:
    """A tensor's shape as error messages write it: ``(2, 8, 64)``."""
    return "(" + ", ".join(str(s) for s in getattr(t, "shape", ())) + ")"


class WriteError(OSError):
    """A file that could not be written: ``could not write PATH (12.3 MB): No space left
    on device (1.1 MB free there)``.

    An :class:`OSError` with ``errno``, ``strerror`` and ``filename`` set, so callers can
    tell a full disk (``errno.ENOSPC``) from a read-only file system (``errno.EROFS``);
    ``size``: the bytes it needed, when known; ``free``: the bytes free on its file system.
    (Here rather than in :mod:`attnlab.io`, beside the other errors the command line tells
    apart, so that the command imports no torch before it knows it needs it.)"""

    size: int | None = None
    free: int | None = None

    def __str__(self) -> str:
        size = "" if self.size is None else f" ({_mb(self.size)})"
        free = "" if self.free is None else f" ({_mb(self.free)} free there)"
        return f"could not write {self.filename}{size}: {self.strerror}{free}"


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} bytes"


class NonFiniteLossError(RuntimeError):
    """Training stopped: a step's loss or gradient norm was NaN or infinite (the weights
    were not updated by that step), or the weights themselves were about to be saved with
    a NaN or an infinity. No checkpoint holds non-finite weights."""


class LostProcessError(RuntimeError):
    """A process of a run under torchrun ended (killed, crashed) while the others trained: they
    stop too. The message names it and says how to resume; the checkpoints saved before are
    intact."""


def yaml_problem(exc: Exception) -> str:
    """A YAML parser's error in one line: ``at line 3, column 5: found a tab`` (PyYAML's own
    message spans lines, quoting the text under a caret)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"at line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    return where + problem
