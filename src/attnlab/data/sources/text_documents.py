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

Every file is UTF-8, read strictly (:func:`~attnlab.data.kinds.text_corpus.read_text`; a
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

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import torch

from ...errors import InputError
from ..source import Splits, register_source
from ..kinds.text_corpus import DOCUMENT_FORMATS, CorpusSource, CorpusSourceConfig, Documents, NamedDocuments, read_documents

__all__ = ["DOCUMENT_FORMATS", "TextDocumentsConfig", "TextDocuments", "read_documents", "held_out_count"]

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
        # each part names itself (the file, the part, its key) if LMDataset finds it too short
        held = f"data.val_size={config.val_size:g}, data.test_size={config.test_size:g}"
        train, val, test = (None if part is None else NamedDocuments(part, f"the {what} part of data.path={path} "
                                                                           f"({key})")
                            for part, what, key in ((train, "training", f"what {held} leave"),
                                                    (val, "validation", f"data.val_size={config.val_size:g}"),
                                                    (test, "test", f"data.test_size={config.test_size:g}")))
        notes = [f"data: {path.name}: {len(documents)} document{'s' if len(documents) > 1 else ''}, "
                 f"{sum(sizes):,} characters: {sizes[0]:,} training, {sizes[1]:,} validation, {sizes[2]:,} test "
                 f"({unit})"]
        if skipped:
            notes.append(f"data: skipped {skipped} blank document{'s' if skipped > 1 else ''} (empty or white space)")
        return Splits(train, val, test, notes=notes, skipped=skipped)

    def describe(self, config: TextDocumentsConfig) -> str:
        return Path(config.path or "").name
