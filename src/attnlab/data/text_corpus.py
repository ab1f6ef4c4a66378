"""Text corpora, the data of language modelling: the keys every corpus source has, the
splits a source gives (lists of documents, each a string), the strict reading of a whole
text file (:func:`read_text`), and the built-in source ``tinyshakespeare``.

A corpus source gives :class:`~attnlab.data.source.Splits` whose ``train``, ``val`` and
``test`` parts are lists of documents. A document is text that a model reads in one piece:
an :class:`~attnlab.data.lm_dataset.LMDataset` packs the documents of a split into one
stream of tokens, and no token attends across a document boundary.

``tinyshakespeare`` (Karpathy, 2015: ``tinyshakespeare/input.txt`` under the data
directory, 1,115,394 characters) is one document, split by characters as nanoGPT's
``shakespeare_char`` splits it: the first ``int(0.9 * n)`` characters are the training part
(1,003,854), exactly nanoGPT's. nanoGPT validates on the last 10%; a test part is needed
too, so that last 10% (111,540 characters) is cut in two: its first half (rounded down,
55,770) is the validation part, its second half (55,770) the test part. The cuts fall
wherever the counts say, inside a word if need be; nothing is random.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .paths import data_dir, require
from .source import Source, SourceConfig, Splits, register_source
from .text import MAX_LINE_CHARS, check_max_line_chars, iter_lines

__all__ = ["Documents", "CorpusSourceConfig", "CorpusSource", "TinyShakespeare", "read_text",
           "TINYSHAKESPEARE_FILE"]

Documents = list[str]  # the documents of one split, in order

TINYSHAKESPEARE_FILE = Path("tinyshakespeare") / "input.txt"  # under the data directory


@dataclass
class CorpusSourceConfig(SourceConfig):
    """The ``data`` keys of every text-corpus source."""

    kind: ClassVar[str] = "text_corpus"
    changeable: ClassVar[tuple[str, ...]] = ("data_dir", "max_line_chars")

    name: str = "tinyshakespeare"
    # the longest line read, in characters: a longer one is refused before it is held in memory
    max_line_chars: int = field(default=MAX_LINE_CHARS, metadata={"min": 1})


class CorpusSource(Source):
    """A source of text corpora: :meth:`load` gives :class:`Splits` of document lists."""

    kind = "text_corpus"
    config_class = CorpusSourceConfig

    def load(self, config: Any) -> Splits[Documents]:
        raise NotImplementedError


def read_text(path: str | Path, *, max_line_chars: int = MAX_LINE_CHARS) -> str:
    """The whole of a UTF-8 text file, as one string.

    Read with :func:`~attnlab.data.text.iter_lines`, so strictly: a byte that is not UTF-8
    or a line longer than ``max_line_chars`` characters (``data.max_line_chars``) raises
    :class:`~attnlab.errors.InputError` naming the file and the 1-based line. Line endings
    become ``\\n`` (``\\r\\n`` too) and a byte-order mark at the start is dropped; every other
    character, a final newline included, is kept. Raises ``FileNotFoundError`` when
    ``path`` is not a file.
    """
    check_max_line_chars(max_line_chars)
    path = Path(path).expanduser()
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"{path} {what}; a text file was expected")
    with open(path, "rb") as f:
        lines = list(iter_lines(f, path, max_line_chars=max_line_chars))
        size = f.tell()
        final_newline = False
        if size:
            f.seek(size - 1)
            final_newline = f.read(1) == b"\n"
    return "\n".join(lines) + ("\n" if final_newline else "")


@register_source
class TinyShakespeare(CorpusSource):
    name = "tinyshakespeare"
    summary = "Tiny Shakespeare (char-rnn), 1,115,394 characters: 90% train, then 5% validation, 5% test"

    def check(self, config: CorpusSourceConfig) -> None:
        root = data_dir(config.data_dir)
        require(root / TINYSHAKESPEARE_FILE, "tinyshakespeare", root)

    def load(self, config: CorpusSourceConfig) -> Splits[Documents]:
        root = data_dir(config.data_dir)
        text = read_text(require(root / TINYSHAKESPEARE_FILE, "tinyshakespeare", root),
                         max_line_chars=config.max_line_chars)
        train_end = int(0.9 * len(text))  # nanoGPT's shakespeare_char
        val_end = train_end + (len(text) - train_end) // 2
        train, val, test = text[:train_end], text[train_end:val_end], text[val_end:]
        note = (f"data: tinyshakespeare, {len(text):,} characters: {len(train):,} training, {len(val):,} validation, "
                f"{len(test):,} test")
        return Splits([train], [val], [test], notes=[note])

    def describe(self, config: Any) -> str:
        return "Tiny Shakespeare"
