"""Text corpora, the data of language modelling: the keys every corpus source has, the
splits a source gives (lists of documents, each a string), the strict reading of a whole
text file (:func:`read_text`), and the built-in source ``tinyshakespeare``.

A corpus source gives :class:`~attnlab.data.source.Splits` whose ``train``, ``val`` and
``test`` parts are lists of documents. A document is text that a model reads in one piece:
an :class:`~attnlab.data.batches.lm.LMDataset` packs the documents of a split into one
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

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

from ...errors import InputError
from ..paths import data_dir, folder_contents, not_a_file, require
from ..source import Source, SourceConfig, Splits, register_source
from ..readers.tables import EXTENSIONS, read_text_column
from ..readers.text import MAX_LINE_CHARS, check_max_line_chars, iter_lines

__all__ = ["Documents", "NamedDocuments", "CorpusSourceConfig", "CorpusSource", "TinyShakespeare", "read_text",
           "read_documents", "DOCUMENT_FORMATS", "TINYSHAKESPEARE_FILE"]

Documents = list[str]  # the documents of one split, in order


class NamedDocuments(list):
    """The documents of one split (a list of str) with the words that name them in a message:
    ``name``, the split and where it came from (``"the test part of data.path=story.txt"``),
    which :class:`~attnlab.data.batches.lm.LMDataset` says when they are too short."""

    def __init__(self, documents: Sequence[str] = (), name: str | None = None) -> None:
        super().__init__(documents)
        self.name = name
DOCUMENT_FORMATS = ("txt", "jsonl", "csv", "tsv")

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

    def read_documents(self, config: Any, path: str | Path) -> Documents:
        """Text of one's own to score a run on (``attnlab eval --data``): a ``.txt`` file, a
        folder of them, or a JSONL, CSV or TSV file whose column ``data.text_column`` (when the
        run's source has one, else ``text``) holds the documents; read as :func:`read_documents`
        reads them, lines up to the run's ``data.max_line_chars``; blank documents are left out."""
        folder = Path(path).expanduser()
        if folder.is_dir() and not _folder_files(folder):
            raise InputError(f"--data (data= in Python) must be a .txt file, a folder of .txt files, or a JSONL, CSV "
                             f"or TSV file with a text column for a language model run; {folder} is "
                             f"{folder_contents(folder)}, with no .txt file")
        documents, _ = read_documents(path, getattr(config, "text_column", "text"),
                                      max_line_chars=config.max_line_chars)
        return NamedDocuments(documents, f"--data {path}")


def read_text(path: str | Path, *, max_line_chars: int = MAX_LINE_CHARS) -> str:
    """The whole of a UTF-8 text file, as one string.

    Read with :func:`~attnlab.data.readers.text.iter_lines`, so strictly: a byte that is not UTF-8
    or a line longer than ``max_line_chars`` characters (``data.max_line_chars``) raises
    :class:`~attnlab.errors.InputError` naming the file and the 1-based line. Line endings
    become ``\\n`` (``\\r\\n`` too) and a byte-order mark at the start is dropped; every other
    character, a final newline included, is kept. Raises ``FileNotFoundError`` when
    ``path`` is not a file.
    """
    check_max_line_chars(max_line_chars)
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path} {not_a_file(path)}; a text file was expected")
    with open(path, "rb") as f:
        lines = list(iter_lines(f, path, max_line_chars=max_line_chars))
        size = f.tell()
        final_newline = False
        if size:
            f.seek(size - 1)
            final_newline = f.read(1) == b"\n"
    return "\n".join(lines) + ("\n" if final_newline else "")


def _format_of(path: Path, format: str) -> str:
    if path.is_dir():
        if format not in ("auto", "txt"):
            raise InputError(f"format={format!r} (data.format) takes a file; {path} is a folder (a folder is read as "
                             f"one document per .txt file: leave format at 'auto')")
        return "folder"
    if format != "auto":
        return format
    name = path.name.lower()
    if name.endswith(".txt"):
        return "txt"
    for extension, fmt in EXTENSIONS.items():
        if name.removesuffix(".gz").endswith(extension):
            return fmt
    raise InputError(f"cannot tell the format of {path} from its name; accepted are a folder of .txt files, .txt, "
                     f"{', '.join(EXTENSIONS)} (these optionally followed by .gz); rename the file or set format "
                     f"(data.format) to one of {', '.join(map(repr, DOCUMENT_FORMATS))}")


def _blank(text: str) -> bool:
    return not text.strip()


def _folder_files(root: Path) -> list[Path]:
    found = []
    for folder, subfolders, files in os.walk(root):  # followlinks=False: no cycles through linked folders
        subfolders[:] = [s for s in subfolders if not s.startswith(".")]
        found += [Path(folder) / f for f in files if f.lower().endswith(".txt") and not f.startswith(".")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def read_documents(path: str | Path, text_column: str = "text", *, format: str = "auto",
                   max_line_chars: int = MAX_LINE_CHARS) -> tuple[Documents, int]:
    """``(documents, skipped)``: the documents at ``path`` (as :mod:`attnlab.data.sources.text_documents`
    says: a ``.txt`` file, a folder of them, or a text column of a JSONL, CSV or TSV file), and
    how many blank ones (files of a folder, rows of a table) were left out.

    Raises ``FileNotFoundError`` when ``path`` does not exist, and
    :class:`~attnlab.errors.InputError` naming the file (and line) for an unknown
    extension, bytes that are not UTF-8, a line over ``max_line_chars``, a missing column,
    a row of invalid JSON or CSV, a text that is not a string, and no text at all (an
    empty file, a folder without ``.txt`` files or with blank ones only, a table of blank rows).
    """
    path = Path(path).expanduser()
    if format != "auto" and format not in DOCUMENT_FORMATS:
        raise InputError(f"format must be 'auto' or one of {', '.join(map(repr, DOCUMENT_FORMATS))}; got {format!r}")
    if not isinstance(text_column, str) or not text_column.strip():
        raise InputError(f"text_column must be a column name; got {text_column!r}")
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; a text file, a folder of .txt files or a JSONL, CSV or TSV "
                                f"file was expected")
    fmt = _format_of(path, format)
    if fmt == "txt":
        text = read_text(path, max_line_chars=max_line_chars)
        if _blank(text):
            raise InputError(f"{path} holds no text ({'it is empty' if not text else 'only white space'})")
        return [text], 0
    if fmt == "folder":
        files = _folder_files(path)
        if not files:
            raise InputError(f"{path} holds no .txt files (sub-folders included); a folder is read as one document "
                             f"per .txt file")
        texts = [read_text(f, max_line_chars=max_line_chars) for f in files]
        what = f"its {len(files)} .txt files"
    else:
        texts = read_text_column(path, fmt, text_column, max_line_chars)
        if not texts:
            raise InputError(f"{path} has no rows; expected {'a header line and ' if fmt != 'jsonl' else ''}"
                             f"at least one row with a text in column {text_column!r}")
        what = f"its {len(texts)} rows"
    documents = [t for t in texts if not _blank(t)]
    if not documents:
        raise InputError(f"{path} holds no text: {what} are all empty or white space")
    return documents, len(texts) - len(documents)



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
