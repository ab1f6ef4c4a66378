"""Labelled texts from a user's file, for text classification.

Three formats, given by ``format`` or, with ``format="auto"``, by the file's extension:

* CSV (``.csv``) and TSV (``.tsv``): the first row is a header naming the columns; the
  other rows are one text each. Fields are quoted as Excel, pandas and Python's ``csv``
  module write them (``"a, b"``, ``"she said ""hi"" twice"``), so a quoted field may hold the
  delimiter and newlines. Rows whose fields are all blank are ignored.
* JSON lines (``.jsonl``, ``.ndjson``): one JSON object per line, e.g.
  ``{"text": "a fine film", "label": "pos"}``; blank lines are ignored. A text is a
  JSON string, a label a string or an integer.

Files are UTF-8 (a byte-order mark is fine) and may be gzip-compressed, with ``.gz``
after the extension (``reviews.csv.gz``). Texts and labels are stripped of surrounding
whitespace. Labels are kept as strings (``3`` and ``"3"`` both become ``"3"``);
:func:`label_names` puts them in class-index order.

A row whose text or label is missing or blank, or a CSV/TSV row with the wrong number
of fields, is a "bad row": an error naming the file and line, or, with
``skip_bad_rows=True`` (``data.skip_bad_rows=true`` in a recipe), skipped and counted.
"""

from __future__ import annotations

import csv
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError
from ...jsonfile import parse_json
from ...suggest import did_you_mean
from .parallel import MAX_LINE_CHARS, read_text_lines
from ..paths import folder_contents

__all__ = ["EXTENSIONS", "FORMATS", "LabelledTexts", "label_names", "read_labelled_texts", "read_text_column"]

FORMATS = ("csv", "tsv", "jsonl")
# file extension (before an optional .gz) -> format
EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}

_INTEGER = re.compile(r"[+-]?[0-9]+")
# a decimal number as a person writes it: 1, 01, 1.0, .5, 1e0 (not nan, inf or 1_000)
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_SKIP_HINT = "set data.skip_bad_rows=true (skip_bad_rows=True in Python) to skip such rows and count them"


@dataclass(repr=False)
class LabelledTexts:
    """Texts and their labels, as read from ``path``.

    ``texts[i]`` has label ``labels[i]`` (a string) and starts on line ``lines[i]`` (1-based)
    of the file; ``skipped`` bad rows were left out (``skip_bad_rows=True``).
    """

    texts: list[str]
    labels: list[str]
    lines: list[int]
    path: Path
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        return f"LabelledTexts(path={str(self.path)!r}, n={len(self)}, skipped={self.skipped})"

    def label_names(self) -> list[str]:
        """:func:`label_names` of :attr:`labels`, naming this file in its error."""
        return label_names(self.labels, source=self.path)


def label_names(labels: Sequence[str], source: str | Path | None = None) -> list[str]:
    """The distinct labels, sorted: numerically when all are integers (``"2"`` before
    ``"10"``), else as strings; a label's class id is its index in this list.

    Raises :class:`~attnlab.errors.InputError` when there are fewer than 2; ``source``
    (a file name, say) names where the labels came from in that message. Warns when two
    labels are two spellings of one number (``"1"`` and ``"1.0"``): they stay two classes.
    """
    names = {str(label) for label in labels}
    _warn_same_numbers(names, source)
    if all(_INTEGER.fullmatch(name) for name in names):
        ordered = sorted(names, key=lambda name: (int(name), name))
    else:
        ordered = sorted(names)
    if len(ordered) < 2:
        has = f"only {ordered[0]!r}" if ordered else "no labels"
        where = source if source is not None else "labels"
        raise InputError(f"a classifier needs at least 2 classes; {where} has {has}")
    return ordered


def _warn_same_numbers(names: set[str], source: str | Path | None) -> None:
    """One warning naming the labels that write one number in several ways (``"1"``, ``"01"``,
    ``"1.0"``, ``"1e0"``): a file written by two tools, or a column pandas read as floats, gives
    two classes that are one, and nothing else would tell."""
    spellings: dict[float, list[str]] = {}
    for name in names:
        if _NUMBER.fullmatch(name):
            spellings.setdefault(float(name), []).append(name)
    clashes = [sorted(group) for _, group in sorted(spellings.items()) if len(group) > 1]
    if not clashes:
        return
    listed = "; ".join(" and ".join(repr(n) for n in group) for group in clashes[:3])
    more = f" (and {len(clashes) - 3} more numbers)" if len(clashes) > 3 else ""
    where = f" in {source}" if source is not None else ""
    warnings.warn(f"labels {listed}{more}{where} are the same number written differently, yet each is a class of "
                  f"its own; write each label one way if they are meant to be one class", stacklevel=3)


def _format_of(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    for extension, fmt in EXTENSIONS.items():
        if name.endswith(extension):
            return fmt
    accepted = ", ".join(EXTENSIONS)
    raise InputError(
        f"cannot tell the format of {path} from its name; accepted extensions are {accepted} (each optionally "
        f"followed by .gz); rename the file or set format to one of {', '.join(map(repr, FORMATS))}"
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _missing_column(path: Path, column: str, parameter: str, columns: Sequence[str], where: str) -> InputError:
    hint = did_you_mean(column, columns, "columns") if columns else "; it has none"
    if hint.startswith("; did you mean"):
        hint += f" (columns: {', '.join(sorted(columns))})"
    return InputError(f"{path}: {where} has no column {column!r} ({parameter}, data.{parameter} in a recipe){hint}")


class _Collector:
    """Takes rows one at a time; keeps the good ones, raises or counts the bad."""

    def __init__(self, path: Path, text_column: str, label_column: str, skip_bad_rows: bool) -> None:
        self.path, self.text_column, self.label_column = path, text_column, label_column
        self.skip_bad_rows = skip_bad_rows
        self.result = LabelledTexts([], [], [], path)
        self.rows = 0

    def bad(self, line: int, problem: str) -> None:
        self.rows += 1
        if not self.skip_bad_rows:
            raise InputError(f"{self.path}: line {line}: {problem}; {_SKIP_HINT}")
        self.result.skipped += 1

    def add(self, line: int, text: str | None, label: str | None) -> None:
        for value, what, column in ((text, "text", self.text_column), (label, "label", self.label_column)):
            if value is None or not value.strip():
                return self.bad(line, f"the {what} (column {column!r}) is {'missing' if value is None else 'empty'}")
        self.rows += 1
        self.result.texts.append(text.strip())
        self.result.labels.append(label.strip())
        self.result.lines.append(line)

    def done(self, expected: str) -> LabelledTexts:
        if self.rows == 0:
            raise InputError(f"{self.path} has no rows; expected {expected}")
        if not self.result.texts:
            raise InputError(
                f"{self.path} has no rows left: all {self.result.skipped} were bad (a missing or empty text or "
                f"label, or the wrong number of fields) and skip_bad_rows skipped them"
            )
        return self.result


@contextmanager
def _csv_field_limit(limit: int) -> Iterator[None]:
    # csv.field_size_limit is one process-wide setting: set it for this read, then put it back
    previous = csv.field_size_limit(limit)
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def _csv_error(path: Path, fmt: str, start: int, line: int, exc: csv.Error, max_line_chars: int) -> InputError:
    """The error for ``exc``, raised reading line ``line`` of the row that starts on line ``start``."""
    if "field limit" in str(exc):  # "field larger than field limit (N)": a quoted field over many lines
        return InputError(
            f"{path}: line {start}: a field is longer than the limit of {max_line_chars:,} characters (it runs on "
            f"past line {line}: is a double quote left open?); the limit is data.max_line_chars in a recipe "
            f"(max_line_chars in Python): raise it to read this file if its texts are meant to be that long"
        )
    return InputError(f"{path}: line {line} is not valid {fmt.upper()}: {exc}")


def _read_table(lines: list[str], fmt: str, rows: _Collector, max_line_chars: int = MAX_LINE_CHARS) -> LabelledTexts:
    path, delimiter = rows.path, "\t" if fmt == "tsv" else ","
    reader = csv.reader((line + "\n" for line in lines), delimiter=delimiter)
    expected = f"a header line ({rows.text_column}{delimiter}{rows.label_column}, say) and at least one row"
    start = 1
    try:
        header: list[str] | None = None
        while True:
            start = reader.line_num + 1
            row = next(reader, None)
            if row is None:
                break
            if not any(field.strip() for field in row):
                continue
            if header is None:
                header = [name.strip() for name in row]
                index = []
                for column, parameter in ((rows.text_column, "text_column"), (rows.label_column, "label_column")):
                    if column not in header:
                        raise _missing_column(path, column, parameter, header, f"the header (line {start})")
                    if header.count(column) > 1:
                        raise InputError(f"{path}: the header names column {column!r} {header.count(column)} times")
                    index.append(header.index(column))
                continue
            if len(row) != len(header):
                hint = ""
                if reader.line_num > start:
                    hint = f" (the row runs on to line {reader.line_num}: is a double quote left open?)"
                elif len(row) > len(header):
                    hint = f" (a text that holds {'a tab' if fmt == 'tsv' else 'a comma'} must be in double quotes)"
                rows.bad(start, f"has {len(row)} fields but the header has {len(header)}{hint}")
                continue
            rows.add(start, row[index[0]], row[index[1]])
    except csv.Error as exc:
        raise _csv_error(path, fmt, start, reader.line_num, exc, max_line_chars) from None
    return rows.done(expected)


_JSON_TYPES = {str: "string", int: "number", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_type(value: object) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def _objects(lines: list[str], path: Path) -> Iterator[tuple[int, dict]]:
    for line, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = parse_json(text, f"{path}: line {line}")  # its depth bounded, as every JSON attnlab reads
        except InputError as exc:
            raise InputError(f"{exc}; a JSON-lines file holds one JSON object per line") from None
        if not isinstance(obj, dict):
            raise InputError(
                f"{path}: line {line} is a JSON {_json_type(obj)}, not an object; expected one object per line "
                f'such as {{"text": "...", "label": "..."}}'
            )
        yield line, obj


def _read_jsonl(lines: list[str], rows: _Collector) -> LabelledTexts:
    path = rows.path
    objects = list(_objects(lines, path))
    keys = set().union(*(obj.keys() for _, obj in objects))
    for column, parameter in ((rows.text_column, "text_column"), (rows.label_column, "label_column")):
        if objects and column not in keys:
            raise _missing_column(path, column, parameter, sorted(keys), "no object")
    for line, obj in objects:
        text, label = obj.get(rows.text_column), obj.get(rows.label_column)
        if text is not None and not isinstance(text, str):
            raise InputError(
                f"{path}: line {line}: the text ({rows.text_column!r}) must be a string; "
                f"got {_short(text)}, a {_json_type(text)}"
            )
        if isinstance(label, int) and not isinstance(label, bool):
            label = str(label)
        elif label is not None and not isinstance(label, str):
            raise InputError(
                f"{path}: line {line}: the label ({rows.label_column!r}) must be a string or an integer; "
                f"got {_short(label)}, a {_json_type(label)}"
            )
        rows.add(line, text, label)
    return rows.done(f"at least one JSON object such as {{{rows.text_column!r}: ..., {rows.label_column!r}: ...}}")


def read_labelled_texts(
    path: str | Path,
    text_column: str = "text",
    label_column: str = "label",
    *,
    format: str = "auto",
    skip_bad_rows: bool = False,
    max_line_chars: int = MAX_LINE_CHARS,
) -> LabelledTexts:
    """Texts and labels from a CSV, TSV or JSON-lines file (see the module docstring).

    Args:
        path: the file; ``.gz`` at the end of its name means gzip-compressed.
        text_column: the text's column name in the header (CSV, TSV) or key in the
            objects (JSON lines).
        label_column: the same for the label.
        format: ``"csv"``, ``"tsv"``, ``"jsonl"`` or ``"auto"`` (from the extension:
            ``.csv``, ``.tsv``, ``.jsonl``, ``.ndjson``, each optionally followed by ``.gz``).
        skip_bad_rows: skip rows with a missing or blank text or label (or the wrong
            number of fields) and count them in ``skipped``, instead of raising.
        max_line_chars: the longest line, and CSV/TSV field, read (``data.max_line_chars``
            in a recipe); a longer one is an error, found without reading it whole.

    Raises ``FileNotFoundError`` when ``path`` is not a file, and
    :class:`~attnlab.errors.InputError` naming the file (and the 1-based line) for an
    unknown extension, bytes that are not UTF-8, a line or field over ``max_line_chars``,
    a missing column, a bad row, a line of invalid JSON or a label of another type, and a
    file with no rows.
    """
    path = Path(path).expanduser()
    if format != "auto" and format not in FORMATS:
        raise InputError(f"format must be 'auto' or one of {', '.join(map(repr, FORMATS))}; got {format!r}")
    for name, value in (("text_column", text_column), ("label_column", label_column)):
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"{name} must be a column name; got {value!r}")
    if text_column == label_column:
        raise InputError(f"text_column and label_column must be different columns; got {text_column!r} for both")
    if path.is_dir():
        raise InputError(f"{path} is {folder_contents(path)}; a CSV, TSV or JSON Lines file of labelled texts was "
                         f"expected")
    fmt = _format_of(path) if format == "auto" else format
    lines = read_text_lines(path, max_line_chars=max_line_chars)
    rows = _Collector(path, text_column, label_column, skip_bad_rows)
    if fmt == "jsonl":
        return _read_jsonl(lines, rows)
    with _csv_field_limit(max_line_chars):  # a quoted field may run over many lines: the limit holds for it too
        return _read_table(lines, fmt, rows, max_line_chars)


def read_text_column(path: Path, fmt: str, column: str, max_line_chars: int = MAX_LINE_CHARS) -> list[str]:
    """Every row's text in ``column``, blank ones included, from a JSONL, CSV or TSV file
    (``fmt``) without labels: the documents of a language-modelling corpus."""
    lines = read_text_lines(path, max_line_chars=max_line_chars)
    texts: list[str] = []
    if fmt == "jsonl":
        objects = list(_objects(lines, path))
        keys = set().union(*(obj.keys() for _, obj in objects))
        if objects and column not in keys:
            raise _missing_column(path, column, "text_column", sorted(keys), "every object")
        for line, obj in objects:
            text = obj.get(column)
            if not isinstance(text, str):
                got = "it is missing" if column not in obj else f"got a JSON {_json_type(text)}"
                raise InputError(f"{path}: line {line}: the text ({column!r}) must be a string; {got}")
            texts.append(text)
        return texts
    reader = csv.reader((line + "\n" for line in lines), delimiter="\t" if fmt == "tsv" else ",")
    header: list[str] | None = None
    index = start = 0
    with _csv_field_limit(max_line_chars):  # a quoted field may run over many lines: the limit holds for it too
        try:
            while True:
                start = reader.line_num + 1
                row = next(reader, None)
                if row is None:
                    break
                if not any(cell.strip() for cell in row):
                    continue
                if header is None:
                    header = [name.strip() for name in row]
                    if column not in header:
                        raise _missing_column(path, column, "text_column", header, f"the header (line {start})")
                    if header.count(column) > 1:
                        raise InputError(f"{path}: the header names column {column!r} {header.count(column)} times")
                    index = header.index(column)
                elif len(row) != len(header):
                    raise InputError(f"{path}: line {start} has {len(row)} fields but the header has {len(header)} "
                                     f"(a text that holds the delimiter or a newline must be in double quotes)")
                else:
                    texts.append(row[index])
        except csv.Error as exc:
            raise _csv_error(path, fmt, start, reader.line_num, exc, max_line_chars) from None
    return texts
