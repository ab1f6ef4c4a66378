"""Multi30k task 1 (Elliott et al., 2016): image captions in German, English, French, Czech.

Files ``multi30k/{train,val,test_2016_flickr}.{de,en,fr,cs}.gz`` under the data
directory: gzip-compressed UTF-8, one caption per line, line ``i`` of one language the
translation of line ``i`` of another; untokenized, original casing. 29,000 / 1,014 /
1,000 lines. The standard task is German to English, scored with detokenized,
case-sensitive sacreBLEU on ``test_2016_flickr``.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from ...errors import InputError
from ..paths import data_dir, require
from .text import MAX_LINE_CHARS, iter_lines

__all__ = ["MULTI30K_SPLITS", "MULTI30K_LANGUAGES", "load_multi30k", "read_gzip_lines"]

# split name -> file prefix; "test" is the standard 2016 Flickr test set
MULTI30K_SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr", "test_2016_flickr": "test_2016_flickr"}
MULTI30K_LANGUAGES = ("de", "en", "fr", "cs")


def read_gzip_lines(path: str | Path, *, max_line_chars: int = MAX_LINE_CHARS) -> list[str]:
    """Lines of a gzip-compressed UTF-8 text file, line endings removed and nothing else.

    Raises ``ValueError`` naming the file when it is not gzip (or is cut short), and
    naming the file and 1-based line when a line is not valid UTF-8 or is longer than
    ``max_line_chars`` characters (``data.max_line_chars``; it is decompressed a bounded
    block at a time, so a hostile line is refused without being held in memory).
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as f:
            return list(iter_lines(f, path, "utf-8", max_line_chars=max_line_chars))
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise InputError(f"{path} must be a whole gzip file; reading it failed: {exc}") from None


def load_multi30k(
    split: str, root: str | Path | None = None, src: str = "de", tgt: str = "en", *,
    max_line_chars: int = MAX_LINE_CHARS,
) -> list[tuple[str, str]]:
    """``(source, target)`` caption pairs of one split, in file order.

    Args:
        split: ``"train"``, ``"val"`` or ``"test"`` (= ``"test_2016_flickr"``).
        root: the data directory (default :func:`~attnlab.data.paths.data_dir`), holding
            ``multi30k/<split>.<lang>.gz``.
        src: the source language, one of ``de``, ``en``, ``fr``, ``cs``.
        tgt: the target language, another one of them.
        max_line_chars: a longer line is an error (``data.max_line_chars``; see
            :func:`read_gzip_lines`).

    Raises ``FileNotFoundError`` with the download command when a file is missing and
    ``ValueError`` naming both files when their line counts differ.
    """
    if split not in MULTI30K_SPLITS:
        raise InputError(f"split must be one of {', '.join(map(repr, MULTI30K_SPLITS))}; got {split!r}")
    for name, lang in (("src", src), ("tgt", tgt)):
        if lang not in MULTI30K_LANGUAGES:
            raise InputError(f"{name} must be one of {', '.join(map(repr, MULTI30K_LANGUAGES))}; got {lang!r}")
    if src == tgt:
        raise InputError(f"src and tgt must be different languages; got {src!r} for both")
    root = data_dir(root)
    prefix = MULTI30K_SPLITS[split]
    src_path, tgt_path = (require(root / "multi30k" / f"{prefix}.{lang}.gz", "multi30k", root) for lang in (src, tgt))
    sources = read_gzip_lines(src_path, max_line_chars=max_line_chars)
    targets = read_gzip_lines(tgt_path, max_line_chars=max_line_chars)
    if len(sources) != len(targets):
        raise InputError(
            f"{src_path} has {len(sources)} lines but {tgt_path} has {len(targets)}; "
            f"parallel files must have one line per sentence pair"
        )
    return list(zip(sources, targets))
