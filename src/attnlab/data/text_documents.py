"""The source ``text``: text of one's own for a language model, at ``data.path``.

What ``data.path`` may be (``data.format``: ``auto``, by the extension, or one named):

* a ``.txt`` file (``format=txt``: any name): one document, the whole file;
* a folder: one document per ``.txt`` file (``.TXT`` too) in it or in its sub-folders, in the
  order of their paths below the folder, compared as strings (``a.txt``, ``b/c.txt``, ``b/d.txt``);
  files and folders whose names start with ``.`` are left out, symbolic links to folders
  are not followed; an empty (or all white-space) file is skipped and counted;
* a JSON Lines (``.jsonl``, ``.ndjson``), CSV (``.csv``) or TSV (``.tsv``) file, each
  optionally gzipped (``.gz``): one document per row, its column (JSONL: key)
  ``data.text_column``; a CSV/TSV file starts with a header row. A row whose text is empty
  or white space is skipped and counted; a missing or non-string text is an error.

Every file is UTF-8, read strictly (:func:`~attnlab.data.text_corpus.read_text`; a
``.txt`` keeps its text exactly, save that line endings become ``\\n``), its lines at most
``data.max_line_chars`` characters. A text of a table is kept as it is, not stripped.

Held-out parts (``data.val_size``, ``data.test_size``: a fraction below 1 of the whole, or
a whole count; a fraction rounds to at least one; ``val_size=0``: no validation part):

* one document (a ``.txt`` file, or a folder or table that gives one): split by characters
  at its end, as ``tinyshakespeare`` is: the test part is its last ``test_size``
  characters, the validation part the ``val_size`` characters before them, the training
  part the rest, from the start;
* several documents: whole documents are held out at random, drawn with ``data.seed`` (one
  permutation: its first ``test_size`` documents are the test part, the next ``val_size``
  the validation part); each part keeps the documents in the order read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import torch

from ..errors import InputError
from .source import Splits, register_source
from .tables import EXTENSIONS, read_text_column
from .text import MAX_LINE_CHARS
from .text_corpus import CorpusSource, CorpusSourceConfig, Documents, read_text

__all__ = ["DOCUMENT_FORMATS", "TextDocumentsConfig", "TextDocuments", "read_documents", "held_out_count"]

DOCUMENT_FORMATS = ("txt", "jsonl", "csv", "tsv")


@dataclass
class TextDocumentsConfig(CorpusSourceConfig):
    changeable: ClassVar[tuple[str, ...]] = CorpusSourceConfig.changeable + ("format",)

    name: str = "text"
    path: str | None = None  # a .txt file, a folder of .txt files, or a JSONL, CSV or TSV file
    text_column: str = "text"  # JSONL, CSV, TSV: the column (JSONL: key) of the texts
    format: Literal["auto", "txt", "jsonl", "csv", "tsv"] = "auto"  # auto: a folder, else by extension
    # held out, a fraction below 1 or a count: of the characters of one document, else of the documents
    val_size: float = field(default=0.05, metadata={"min": 0.0})
    test_size: float = field(default=0.05, metadata={"min": 0.0})
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the held-out documents

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_held_out(("val_size", "test_size"), "characters (one document) or documents")
        if self.test_size == 0:
            raise InputError("data.test_size must be above 0: a language model is tested on text it has not seen; "
                             "got 0")


def held_out_count(size: float, n: int) -> int:
    """``size`` (a whole count, or a fraction below 1 of ``n``) as a count: a fraction is
    rounded, and is at least 1 unless it is 0."""
    if size == 0:
        return 0
    return int(size) if size >= 1 else max(1, round(size * n))


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
    """``(documents, skipped)``: the documents at ``path`` as the module docstring says, and
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


def _split_characters(text: str, config: TextDocumentsConfig, where: str) -> tuple[str, str | None, str]:
    n = len(text)
    n_val, n_test = held_out_count(config.val_size, n), held_out_count(config.test_size, n)
    if n_val + n_test >= n:
        raise InputError(f"data.val_size={config.val_size:g} and data.test_size={config.test_size:g} hold out "
                         f"{n_val + n_test:,} of the {n:,} characters of {where}, leaving nothing to train on; "
                         f"lower them")
    train_end = n - n_val - n_test
    return text[:train_end], text[train_end:n - n_test] if n_val else None, text[n - n_test:]


def _split_documents(documents: Documents, config: TextDocumentsConfig,
                     where: str) -> tuple[Documents, Documents | None, Documents]:
    n = len(documents)
    n_val, n_test = held_out_count(config.val_size, n), held_out_count(config.test_size, n)
    if n_val + n_test >= n:
        raise InputError(f"data.val_size={config.val_size:g} and data.test_size={config.test_size:g} hold out "
                         f"{n_val + n_test} of the {n} documents of {where}, leaving nothing to train on; lower them")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(config.seed)).tolist()
    test, val, train = (sorted(order[:n_test]), sorted(order[n_test:n_test + n_val]),
                        sorted(order[n_test + n_val:]))
    take = lambda rows: [documents[i] for i in rows]  # noqa: E731
    return take(train), take(val) if n_val else None, take(test)


@register_source
class TextDocuments(CorpusSource):
    name = "text"
    config_class = TextDocumentsConfig
    summary = "text of one's own (data.path): a .txt file, a folder of .txt files, or a JSONL/CSV/TSV text column"

    def check(self, config: TextDocumentsConfig) -> None:
        if not config.path:
            raise InputError("data.path must name a .txt file, a folder of .txt files or a JSONL, CSV or TSV file "
                             "when data.name is 'text' (for example data.path=book.txt)")
        path = Path(config.path).expanduser()
        if not path.exists():
            raise InputError(f"data.path must be a text file or a folder of them; {path} does not exist")

    def load(self, config: TextDocumentsConfig) -> Splits[Documents]:
        self.check(config)
        path = Path(config.path).expanduser()
        try:
            documents, skipped = read_documents(path, config.text_column, format=config.format,
                                                max_line_chars=config.max_line_chars)
        except InputError as exc:
            raise InputError(f"data.path: {exc}") from None
        if len(documents) == 1:
            train, val, test = (None if part is None else [part]
                                for part in _split_characters(documents[0], config, str(path)))
            unit = "split by characters at the end"
        else:
            train, val, test = _split_documents(documents, config, str(path))
            unit = f"{len(train)}, {len(val or [])} and {len(test)} documents, held out at random"
        sizes = [sum(map(len, part or [])) for part in (train, val, test)]
        notes = [f"data: {path.name}: {len(documents)} document{'s' if len(documents) > 1 else ''}, "
                 f"{sum(sizes):,} characters: {sizes[0]:,} training, {sizes[1]:,} validation, {sizes[2]:,} test "
                 f"({unit})"]
        if skipped:
            notes.append(f"data: skipped {skipped} blank document{'s' if skipped > 1 else ''} (empty or white space)")
        return Splits(train, val, test, notes=notes, skipped=skipped)

    def describe(self, config: TextDocumentsConfig) -> str:
        return Path(config.path or "").name
