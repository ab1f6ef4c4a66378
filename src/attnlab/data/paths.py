"""Where data sets live on disk, and the error a user sees when one is missing.

The data directory is chosen, first match wins, from:

1. an explicit argument (``--data-dir`` on the command line, ``root=`` in Python);
2. the environment variable ``ATTNLAB_DATA_DIR``;
3. ``~/.cache/attnlab``.

Each data set keeps its original folder name under that directory, e.g.
``DIR/cifar10/{train,test}/<class>/*.jpg`` or ``DIR/cifar-10-batches-py/``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputError
from .readers.image_extensions import IMG_EXTENSIONS

__all__ = ["ENV_VAR", "DEFAULT_DATA_DIR", "data_dir", "require", "folder_contents", "not_a_file"]

ENV_VAR = "ATTNLAB_DATA_DIR"
DEFAULT_DATA_DIR = Path("~/.cache/attnlab")


def data_dir(explicit: str | Path | None = None) -> Path:
    """The data directory: ``explicit``, else ``$ATTNLAB_DATA_DIR``, else ``~/.cache/attnlab``.

    ``~`` is expanded; the directory is not created and need not exist.
    """
    if explicit is not None and str(explicit) != "":
        return Path(explicit).expanduser()
    env = os.environ.get(ENV_VAR, "")
    if env:
        return Path(env).expanduser()
    return DEFAULT_DATA_DIR.expanduser()


def require(path: str | Path | Sequence[str | Path], name: str, root: str | Path | None = None) -> Path:
    """Return the first of ``path`` (one path or several candidates) that exists.

    When none exists, raise ``FileNotFoundError`` naming every candidate and the
    command that fetches data set ``name`` into ``root`` (default: the first
    candidate's parent), ``attnlab data download`` (:mod:`attnlab.data.download`).
    """
    candidates = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
    if not candidates:
        raise InputError(f"path must name at least one candidate for {name!r}; got an empty sequence")
    for candidate in candidates:
        if candidate.exists():
            return candidate
    where = Path(root) if root is not None else candidates[0].parent
    missing = " or ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"{name} data not found: {missing} does not exist; "
        f"to get it, run: attnlab data download {name} --data-dir {where} "
        f"(or point --data-dir / ${ENV_VAR} at a folder that holds it)"
    )


def folder_contents(path: str | Path, limit: int = 10_000) -> str:
    """What the folder ``path`` holds, for a message that refuses it: ``a folder of images
    (8 .png, 4 .jpg files)``, ``a folder (of 3 .bin files)``, ``an empty folder``. Hidden
    files and folders are left out; at most ``limit`` files are counted."""
    counts: dict[str, int] = {}
    seen = 0
    for folder, subfolders, files in os.walk(path):  # followlinks=False: no cycles
        subfolders[:] = sorted(s for s in subfolders if not s.startswith("."))
        for name in files:
            if not name.startswith("."):
                suffix = os.path.splitext(name)[1].lower() or "(no extension)"
                counts[suffix] = counts.get(suffix, 0) + 1
                seen += 1
        if seen >= limit:
            break
    if not counts:
        return "an empty folder"
    common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{'at least ' if seen >= limit and i == 0 else ''}{n} {suffix}" for i, (suffix, n) in
                      enumerate(common[:4])) + (f" and {len(common) - 4} other kinds of" if len(common) > 4 else "")
    images = sum(n for suffix, n in counts.items() if suffix in IMG_EXTENSIONS)
    kind = "a folder of images" if images >= seen / 2 else "a folder"
    return f"{kind} ({shown} files)" if kind != "a folder" else f"a folder (of {shown} files)"


def not_a_file(path: Path) -> str:
    """What ``path``, which is no regular file, is instead, as a message says it: "is a folder",
    "is a named pipe (FIFO)", "is a broken symbolic link", "does not exist", ..."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "is a broken symbolic link" if path.is_symlink() else "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return f"is {what}, not a regular file"
    return "is not a regular file"
