"""Scanning a folder of class folders, ``root/<class>/...``, without opening a file
(:func:`scan_images`): hidden names left out, links followed but never in a loop, each file
listed once under its first name. What else it finds is reported once for the whole scan:
broken links (:func:`_broken_links`: an error, or one warning) and second names of a file
listed already (:func:`_duplicates`: one warning).
"""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import InputError
from .image_extensions import IMG_EXTENSIONS

__all__ = ["scan_images"]


@dataclass
class _Found:
    """What a scan of an image folder found besides the images it lists."""

    others: list[str] = field(default_factory=list)  # files that are not images (by extension)
    broken: list[str] = field(default_factory=list)  # image names that are links to nothing
    # (path, its class, the path listed first for the same file, that one's class)
    duplicates: list[tuple[str, int, str, int]] = field(default_factory=list)


def _class_folders(root: Path) -> list[str]:
    """The class folders of ``root``, sorted, hidden ones left out. A name that is not valid
    UTF-8 (Linux hands it over with surrogate escapes) trains, then breaks the report and
    ``predict --json``, which write class names out: refused here, naming its bytes."""
    with os.scandir(root) as entries:
        found = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    for name in found:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"class folder {os.fsencode(name)!r} in {root}: its name is not valid UTF-8; rename it "
                             f"(class names are written into reports and JSON)") from None
    return found


def _key(path: str | Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of what ``path`` resolves to (``None``: it resolves to nothing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _take_file(entry: os.DirEntry, label: int, seen: dict[tuple[int, int], tuple[str, int]],
               images: list[str], found: _Found) -> None:
    """Sort one file of a class folder into ``images`` or one of ``found``'s lists."""
    if not entry.name.lower().endswith(IMG_EXTENSIONS):
        found.others.append(entry.path)
        return
    try:
        st = entry.stat()  # (of the target, for a link)
    except OSError:
        if entry.is_symlink():  # its target is gone, or it is a loop of links
            found.broken.append(entry.path)
        else:  # (decoding will name what is wrong with it)
            images.append(entry.path)
        return
    if not stat.S_ISREG(st.st_mode):  # a pipe or device named like an image: opening it could block
        found.others.append(entry.path)
        return
    first = seen.setdefault((st.st_dev, st.st_ino), (entry.path, label))
    if first[0] != entry.path:  # a link, or a hard link, to a file listed already
        found.duplicates.append((entry.path, label, *first))
        return
    images.append(entry.path)


def _walk(top: str, label: int, visited: set[tuple[int, int]], seen: dict[tuple[int, int], tuple[str, int]],
          found: _Found) -> list[str]:
    """The images under ``top`` in ``os.walk``'s order with sorted names (a folder's files, then
    its sub-folders one by one). Links to files and folders are followed, but never into a folder
    in ``visited`` (which this extends): a link to a parent would repeat the tree ~40 times, and
    two such links never end."""
    images: list[str] = []
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:  # a folder that cannot be listed is passed over, as os.walk does
            continue
        subfolders = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if not entry.is_dir():
                _take_file(entry, label, seen, images, found)
                continue
            key = _key(entry.path)
            if key is not None and key not in visited:
                visited.add(key)
                subfolders.append(entry.path)
        pending += reversed(subfolders)
    return images


def _scan(root: Path, classes: Sequence[str] | None, missing_ok: bool = False,
          ) -> tuple[list[str], list[tuple[str, int]], _Found]:
    """``(classes, [(file, label), ...], what else was found)`` of ``root/<class>/...``; each file
    is listed once, under its first name in that order (see :class:`_Found` for the others).
    ``missing_ok``: classes given without a folder (or with an empty one) have no samples
    instead of an error."""
    if not root.exists():
        raise FileNotFoundError(f"root must be an existing folder of class folders; {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"root must be a folder of class folders (root/<class>/<image>); {root} is a file")
    found = _class_folders(root)
    if classes is None:
        if not found:
            raise InputError(
                f"root must hold one folder per class (root/<class>/<image>); found no class folders in {root}"
            )
        classes = found
    else:
        classes = list(classes)
        if len(set(classes)) != len(classes) or not classes:
            raise InputError(f"classes must be a non-empty list of distinct folder names; got {classes}")
        missing = [c for c in classes if c not in found]
        if missing and not missing_ok:
            raise InputError(f"classes must name folders of {root}; missing: {', '.join(missing)}")

    # The root and every class folder count as visited from the start: a link to one of them
    # from inside a class is a loop, or would file another class's images under this one.
    visited = {k for k in map(_key, [root, *(root / name for name in found)]) if k is not None}
    seen: dict[tuple[int, int], tuple[str, int]] = {}
    extra = _Found()
    samples: list[tuple[str, int]] = []
    empty: list[str] = []
    for index, name in enumerate(classes):
        if name not in found:
            continue
        files = _walk(str(root / name), index, visited, seen, extra)
        if not files:
            empty.append(name)
        samples += [(f, index) for f in files]
    if empty and not missing_ok:
        raise InputError(
            f"every class folder must hold images ({', '.join(IMG_EXTENSIONS)}); "
            f"none in {', '.join(str(root / e) for e in empty)}"
        )
    return list(classes), samples, extra


def scan_images(root: str | Path, classes: Sequence[str] | None = None, *,
                missing_ok: bool = False) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """``(classes, [(image file, label), ...], class folders found)`` of ``root/<class>/...``
    without opening a file (see :class:`ImageFolder` for ``classes`` and ``missing_ok``).
    Each file is listed once, as :class:`ImageFolder` lists it; broken links and the second
    names of a file are left out without a warning (:class:`ImageFolder` gives it)."""
    root = Path(root).expanduser()
    classes, samples, _ = _scan(root, classes, missing_ok)
    return classes, samples, _class_folders(root)


def _link_target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _broken_links(root: Path, broken: Sequence[str], on_error: str) -> int:
    """Raise for the first broken link (``on_error="raise"``) or warn once about them all; their number."""
    if not broken:
        return 0
    if on_error == "raise":
        raise InputError(f"image file {broken[0]} is a broken symbolic link: its target {_link_target(broken[0])} "
                         f"does not exist; fix or delete the link, or pass on_error='skip' to skip such files")
    names = ", ".join(f"{os.path.relpath(p, root)} -> {_link_target(p)}" for p in broken[:3])
    more = " ..." if len(broken) > 3 else ""
    warnings.warn(f"skipping {len(broken)} broken symbolic link{'s' if len(broken) > 1 else ''} in {root} "
                  f"(their targets do not exist): {names}{more}", stacklevel=3)
    return len(broken)


def _duplicates(root: Path, classes: Sequence[str], duplicates: Sequence[tuple[str, int, str, int]]) -> int:
    """One warning for the files left out as second names of a file already listed; their number."""
    if not duplicates:
        return 0
    n = len(duplicates)

    def rel(path: str) -> str:
        return os.path.relpath(path, root)

    named = ", ".join(f"{rel(p)} is {rel(first)}" for p, _, first, _ in duplicates[:2]) + (" ..." if n > 2 else "")
    message = (f"skipping {n} duplicate image file{'s' if n > 1 else ''} in {root}, other names (symbolic or hard "
               f"links) of a file listed already, so that each file is read once: {named}")
    conflicts = [d for d in duplicates if d[1] != d[3]]
    if conflicts:
        path, label, first, first_label = conflicts[0]
        verb = "is" if len(conflicts) == 1 else "are"
        message += (f"; {len(conflicts)} of them {verb} in another class folder than the file's first name, and the "
                    f"file counts in that first class only: {rel(path)} (class {classes[label]!r}) is {rel(first)} "
                    f"(class {classes[first_label]!r})")
    warnings.warn(message, stacklevel=3)
    return n
