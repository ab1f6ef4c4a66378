"""Text files read strictly (:func:`read_lines`): a user's text file, one input per line; a
byte that is not valid in the file's encoding raises ``ValueError`` naming the file and the
1-based line, instead of turning into a silent replacement character."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ...errors import InputError
from ...limits import MAX_LINE_CHARS
from ...moved import former_names
from ..paths import not_a_file

__all__ = ["MAX_LINE_CHARS", "read_lines", "iter_lines", "decode_lines"]


_LIMIT_KEY = "data.max_line_chars"


def check_max_line_chars(max_line_chars: int) -> int:
    """``max_line_chars`` when it is a positive ``int``, else :class:`~attnlab.errors.InputError`."""
    if isinstance(max_line_chars, bool) or not isinstance(max_line_chars, int) or max_line_chars < 1:
        raise InputError(f"max_line_chars ({_LIMIT_KEY}) must be a positive integer; got {max_line_chars!r}")
    return max_line_chars


def line_too_long(source: str | Path, line: int, length: str, max_line_chars: int) -> InputError:
    """The error for line ``line`` of ``source`` being over the limit; ``length`` says how long it is."""
    return InputError(
        f"{source}: line {line} is too long: {length}; the limit of {max_line_chars:,} characters per line is "
        f"{_LIMIT_KEY} in a recipe (max_line_chars in Python): raise it to read this file if its lines are meant "
        f"to be that long"
    )


def _not_encoded(source: str | Path, line: int, column: int, byte: int, encoding: str) -> InputError:
    utf8 = encoding.lower().replace("-", "").replace("_", "") == "utf8"
    hint = " (re-save it as UTF-8, e.g. iconv -f cp1252 -t utf-8)" if utf8 else ""
    return InputError(
        f"{source}: line {line} is not valid {encoding}: byte 0x{byte:02x} at column {column}; "
        f"the file must be {encoding}-encoded text{hint}"
    )


def decode_lines(data: bytes, source: str | Path, encoding: str = "utf-8") -> list[str]:
    """``data`` decoded with ``encoding`` and split into lines (``\\n`` or ``\\r\\n``).

    The line ending is removed and nothing else; a final newline does not make an extra
    empty line. A UTF-8 byte-order mark at the start is dropped. ``source`` (a file name)
    is only used in the error raised for bytes that are not valid ``encoding``. (For a
    file, :func:`iter_lines` is the reader that bounds the length of a line.)
    """
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _not_encoded(source, line, column, data[exc.start], encoding) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [s[:-1] if s.endswith("\r") else s for s in lines]


def _ascii_newlines(encoding: str) -> bool:
    """Whether ``encoding`` writes ``\\r`` and ``\\n`` as those ASCII bytes (UTF-8, cp1252, Latin-1
    do; UTF-16 does not), so that a file can be split into lines before it is decoded."""
    try:
        return "\r\n".encode(encoding) == b"\r\n"
    except LookupError:
        raise InputError(f"encoding must be a text encoding Python knows, such as 'utf-8'; got {encoding!r}") from None


def iter_lines(stream: BinaryIO, source: str | Path, encoding: str = "utf-8", *,
               max_line_chars: int = MAX_LINE_CHARS) -> Iterator[str]:
    """The lines of a binary ``stream`` (a file, a gzip file), decoded one at a time, with the
    semantics of :func:`decode_lines`.

    A line of more than ``max_line_chars`` characters raises
    :class:`~attnlab.errors.InputError` naming ``source``, the 1-based line, its length and
    the limit; at most ``4 * max_line_chars + 4`` bytes of a line are ever read into memory
    (a character takes up to 4 bytes in UTF-8, the line ending 2), so a hostile line costs
    no more memory than a line at the limit.
    """
    check_max_line_chars(max_line_chars)
    if not _ascii_newlines(encoding):
        yield from _iter_wide_lines(stream, source, encoding, max_line_chars)
        return
    max_bytes = 4 * max_line_chars + 4
    line = 0
    while raw := stream.readline(max_bytes + 1):
        line += 1
        if len(raw) > max_bytes:
            length = f"more than {max_bytes:,} bytes, so more than {max_line_chars:,} characters"
            raise line_too_long(source, line, length, max_line_chars)
        raw = raw[:-1] if raw.endswith(b"\n") else raw
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise _not_encoded(source, line, exc.start + 1, raw[exc.start], encoding) from None
        if line == 1 and text.startswith("\ufeff"):
            text = text[1:]
        if len(text) > max_line_chars:
            raise line_too_long(source, line, f"{len(text):,} characters", max_line_chars)
        yield text


def _iter_wide_lines(stream: BinaryIO, source: str | Path, encoding: str, max_line_chars: int) -> Iterator[str]:
    """:func:`iter_lines` for encodings such as UTF-16, whose line endings are not single bytes:
    decoded by a text wrapper, which decodes a block of 8 KiB at a time."""
    text_stream = io.TextIOWrapper(stream, encoding=encoding, newline="\n")
    most = max_line_chars + 3  # the line, "\r\n" and, on line 1, a byte-order mark
    line = 0
    try:
        while text := text_stream.readline(most):
            line += 1
            whole = text.endswith("\n") or len(text) < most
            text = text[:-1] if text.endswith("\n") else text
            text = text[:-1] if text.endswith("\r") else text
            if line == 1 and text.startswith("\ufeff"):
                text = text[1:]
            if len(text) > max_line_chars:
                length = f"{'' if whole else 'more than '}{len(text):,} characters"
                raise line_too_long(source, line, length, max_line_chars)
            yield text
    except UnicodeDecodeError as exc:
        # (the wrapper decodes blocks ahead of the line it returns: the bad byte may lie further on)
        raise InputError(f"{source}: not valid {encoding} at or after line {line + 1} ({exc.reason}); "
                         f"the file must be {encoding}-encoded text") from None
    finally:
        text_stream.detach()  # the caller closes the stream it opened


def read_lines(path: str | Path, encoding: str = "utf-8", *, max_line_chars: int = MAX_LINE_CHARS) -> list[str]:
    """The lines of a text file (e.g. sentences to classify), without line endings.

    Every line is kept, empty ones included, so that ``result[i]`` is line ``i + 1``.
    Raises ``FileNotFoundError`` when ``path`` does not exist and ``ValueError`` naming
    the file and the 1-based line when a line is not valid ``encoding`` (a file saved as
    Latin-1 or Windows-1252 read as UTF-8, say) or is longer than ``max_line_chars``
    characters (``data.max_line_chars`` in a recipe; see :func:`iter_lines`).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{path} {not_a_file(path)}; a text file was expected")
    with open(path, "rb") as f:
        return list(iter_lines(f, path, encoding, max_line_chars=max_line_chars))


__getattr__ = former_names(__name__)  # SentimentDataset, now in attnlab.data.batches.texts
