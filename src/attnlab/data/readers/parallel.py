"""Sentence pairs for translation, from a user's files.

Two layouts, each file UTF-8 and optionally gzip-compressed (a ``.gz`` suffix):

* two line-aligned files, ``train.de`` and ``train.en`` say: one sentence per line, line
  ``i`` of the target the translation of line ``i`` of the source (as Multi30k, WMT and
  OPUS "Moses" downloads are laid out);
* one TSV file, ``train.tsv``: ``source<TAB>target`` on each line, no header, no quoting
  (a tab cannot occur inside a sentence).

Sentences are stripped of surrounding whitespace. A pair with a blank side is an error
unless ``skip_blank=True``, which drops it; the readers return a :class:`SentencePairs`,
which is a plain list of ``(source, target)`` tuples that also records how many pairs
were dropped (``.skipped``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ...errors import InputError
from .multi30k import read_gzip_lines
from ..paths import not_a_file
from .text import MAX_LINE_CHARS, check_max_line_chars, read_lines

__all__ = [
    "MAX_LINE_CHARS",
    "SentencePairs",
    "find_parallel",
    "load_parallel",
    "read_pairs_tsv",
    "read_parallel",
    "read_text_lines",
]

_SKIP_HINT = ("set data.skip_blank=true (skip_blank=True in Python) to drop pairs with a blank side (their number "
              "is kept in .skipped)")


class SentencePairs(list[tuple[str, str]]):
    """A list of ``(source, target)`` string tuples, with ``skipped``: how many pairs
    ``skip_blank=True`` dropped (0 otherwise)."""

    def __init__(self, pairs: Iterable[tuple[str, str]] = (), skipped: int = 0) -> None:
        super().__init__(pairs)
        self.skipped = skipped

    def __repr__(self) -> str:
        return f"SentencePairs(n={len(self)}, skipped={self.skipped})"


def read_text_lines(path: str | Path, *, max_line_chars: int = MAX_LINE_CHARS) -> list[str]:
    """The lines of a UTF-8 text file, gzip-compressed when its name ends in ``.gz``.

    Line endings are removed and nothing else, so ``result[i]`` is line ``i + 1``. Raises
    ``FileNotFoundError`` when ``path`` is not a file, and :class:`~attnlab.errors.InputError`
    naming the file (and the 1-based line) for a broken gzip file, bytes that are not UTF-8,
    or a line longer than ``max_line_chars`` characters (``data.max_line_chars`` in a recipe),
    which is refused after reading at most ``4 * max_line_chars + 4`` bytes of it.
    """
    check_max_line_chars(max_line_chars)
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path} {not_a_file(path)}; a text file was expected")
    if path.name.lower().endswith(".gz"):
        return read_gzip_lines(path, max_line_chars=max_line_chars)
    return read_lines(path, max_line_chars=max_line_chars)


def _pair(pairs: SentencePairs, line: int, source: str, target: str, skip_blank: bool, where: str) -> None:
    source, target = source.strip(), target.strip()
    if source and target:
        pairs.append((source, target))
    elif skip_blank:
        pairs.skipped += 1
    else:
        side = "both sides are" if not (source or target) else ("the source is" if not source else "the target is")
        raise InputError(f"{where}: line {line}: {side} blank; every line must hold a sentence pair; {_SKIP_HINT}")


def _blank_tail(lines: list[str]) -> int:
    n = 0
    while n < len(lines) and not lines[-1 - n].strip():
        n += 1
    return n


def read_parallel(src_path: str | Path, tgt_path: str | Path, *, skip_blank: bool = False,
                  max_line_chars: int = MAX_LINE_CHARS) -> SentencePairs:
    """``(source, target)`` pairs from two line-aligned files (each plain or ``.gz``).

    Raises :class:`~attnlab.errors.InputError` naming both files and both line counts when
    they differ, and naming both files and the line when a side is blank (unless
    ``skip_blank``, which drops that pair and counts it in ``.skipped``), and naming the
    file and line of a line longer than ``max_line_chars`` (see :func:`read_text_lines`).
    """
    src_path, tgt_path = Path(src_path).expanduser(), Path(tgt_path).expanduser()
    sources = read_text_lines(src_path, max_line_chars=max_line_chars)
    targets = read_text_lines(tgt_path, max_line_chars=max_line_chars)
    if len(sources) != len(targets):
        longer = sources if len(sources) > len(targets) else targets
        blank = _blank_tail(longer)
        hint = f" (its last {blank} lines are blank)" if blank >= abs(len(sources) - len(targets)) else ""
        raise InputError(
            f"{src_path} has {len(sources)} lines but {tgt_path} has {len(targets)}{hint}; "
            f"parallel files must have one line per sentence pair"
        )
    pairs = SentencePairs()
    where = f"{src_path} and {tgt_path}"
    for line, (source, target) in enumerate(zip(sources, targets), 1):
        _pair(pairs, line, source, target, skip_blank, where)
    return pairs


def read_pairs_tsv(path: str | Path, *, skip_blank: bool = False,
                   max_line_chars: int = MAX_LINE_CHARS) -> SentencePairs:
    """``(source, target)`` pairs from a TSV file (plain or ``.gz``) of ``source<TAB>target``
    lines, no header.

    A line with other than exactly 2 tab-separated fields raises
    :class:`~attnlab.errors.InputError` naming the file and line; an empty line, or one
    with a blank side, too unless ``skip_blank`` (then it is dropped and counted); so does
    a line longer than ``max_line_chars`` (see :func:`read_text_lines`).
    """
    path = Path(path).expanduser()
    pairs = SentencePairs()
    for line, text in enumerate(read_text_lines(path, max_line_chars=max_line_chars), 1):
        if not text.strip():
            _pair(pairs, line, "", "", skip_blank, str(path))
            continue
        fields = text.split("\t")
        if len(fields) != 2:
            raise InputError(
                f"{path}: line {line} has {len(fields)} tab-separated fields; expected 2, source<TAB>target "
                f"(a sentence cannot hold a tab)"
            )
        _pair(pairs, line, fields[0], fields[1], skip_blank, str(path))
    return pairs


_BAD_CODE = re.compile(r"[/\\.\s]")


def _check_names(split: str, src: str, tgt: str) -> None:
    for name, value in (("src", src), ("tgt", tgt)):
        if not isinstance(value, str) or not value or _BAD_CODE.search(value):
            raise InputError(
                f"{name} must be a language code such as 'de' or 'en' (no '/', '.' or spaces); got {value!r}"
            )
    if src == tgt:
        raise InputError(f"src and tgt must be different languages; got {src!r} for both")
    if not isinstance(split, str) or not split or re.search(r"[/\\\s]", split):
        raise InputError(f"split must be a file-name prefix such as 'train' (no '/' or spaces); got {split!r}")


def _first(root: Path, names: list[str]) -> Path | None:
    return next((root / n for n in names if (root / n).is_file()), None)


def find_parallel(root: str | Path, split: str, src: str, tgt: str) -> tuple[Path, Path] | Path:
    """The files of one split in folder ``root``.

    Looks for ``{split}.{src}`` and ``{split}.{tgt}`` (each, failing that, with ``.gz``)
    and returns both paths; when not both exist, for ``{split}.tsv`` (or ``.tsv.gz``) and
    returns that one path. Raises ``FileNotFoundError`` naming ``root``, the split and
    every file name looked for, and :class:`~attnlab.errors.InputError` for a language
    code that is empty or holds ``/``, ``.`` or whitespace, or ``src == tgt``.
    """
    _check_names(split, src, tgt)
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"root must be an existing folder holding the {split!r} files; got {root}")
    src_names = [f"{split}.{src}", f"{split}.{src}.gz"]
    tgt_names = [f"{split}.{tgt}", f"{split}.{tgt}.gz"]
    tsv_names = [f"{split}.tsv", f"{split}.tsv.gz"]
    src_file, tgt_file = _first(root, src_names), _first(root, tgt_names)
    if src_file and tgt_file:
        return src_file, tgt_file
    tsv_file = _first(root, tsv_names)
    if tsv_file:
        return tsv_file
    half = ""
    if src_file or tgt_file:
        found, missing = (src_file, tgt_names) if src_file else (tgt_file, src_names)
        half = f" (found {found.name} but not {' or '.join(missing)})"
    raise FileNotFoundError(
        f"no {split!r} data for {src}->{tgt} in {root}{half}: looked for {' or '.join(src_names)} with "
        f"{' or '.join(tgt_names)}, or else {' or '.join(tsv_names)}"
    )


def load_parallel(root: str | Path, split: str, src: str, tgt: str, skip_blank: bool = False, *,
                  max_line_chars: int = MAX_LINE_CHARS) -> SentencePairs:
    """:func:`find_parallel`, then :func:`read_parallel` or :func:`read_pairs_tsv`."""
    found = find_parallel(root, split, src, tgt)
    if isinstance(found, tuple):
        return read_parallel(*found, skip_blank=skip_blank, max_line_chars=max_line_chars)
    return read_pairs_tsv(found, skip_blank=skip_blank, max_line_chars=max_line_chars)
