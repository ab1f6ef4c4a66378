"""JSON read with limits: every JSON attnlab reads (a folder's ``config.json`` and tokenizer
files, a run's results and manifests, a JSON-lines data set) goes through :func:`parse_json`,
which refuses, in one line naming the file, text larger than ``max_bytes`` and nesting
deeper than ``max_depth`` before Python's parser sees it.

Why a depth limit of its own: Python's ``json`` recurses once per level and fails at about
1,000 levels with a ``RecursionError`` (a crash, not a refusal); a hostile 2 MB file of
``[[[[...`` reaches that. The check costs a few passes in C over the text and one in Python
over its brackets outside strings, less than ``json.loads`` of the same text (a regular
expression for the strings cost more than the parse).

Imports nothing heavy: the command line may read JSON before it imports torch.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from pathlib import Path
from typing import Any

from .errors import InputError
from .limits import JSON_MAX_BYTES, JSON_MAX_DEPTH

__all__ = ["parse_json", "read_json", "json_depth", "read_bytes"]

_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # an escaped character: \" and \\ end no string
_KEEP = bytes(range(256)).translate(None, b"[]{}")  # every byte but the brackets
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\x00\x00")


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON ``data`` (0 for a bare value);
    brackets inside strings do not count. Text that is not JSON gives some number: the parser
    says what is wrong with it."""
    if data.count(b"[") + data.count(b"{") <= 1:
        return int(data.count(b"[") + data.count(b"{"))
    outside = b"".join(_ESCAPE.sub(b"", data).split(b'"')[::2])  # every other piece between quotes: no string
    brackets = outside.translate(None, _KEEP).translate(_STEP)
    return max(accumulate(1 if b else -1 for b in brackets), default=0)


def parse_json(data: bytes | str, source: str, *, max_bytes: int = JSON_MAX_BYTES,
               max_depth: int = JSON_MAX_DEPTH) -> Any:
    """The value of JSON ``data``, or an :class:`InputError` naming ``source`` (a file, or
    ``"PATH: line 3"``) when it is larger than ``max_bytes``, nests deeper than
    ``max_depth``, is not UTF-8 or not JSON."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise InputError(f"{source} is {len(raw):,} bytes of JSON, more than the {max_bytes:,} attnlab reads")
    depth = json_depth(raw)
    if depth > max_depth:
        raise InputError(f"{source} nests its JSON {depth} levels deep, more than the {max_depth} attnlab reads")
    try:
        text = raw.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
    except UnicodeDecodeError as exc:
        raise InputError(f"{source} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    try:
        return json.loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{source} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # a number of more digits than Python converts
        raise InputError(f"{source} is not JSON attnlab reads: {exc}") from None


def read_bytes(path: Path, max_bytes: int, what: str = "") -> bytes:
    """The bytes of the file ``path``, its size checked before it is read, with one
    :class:`InputError` naming it for what can go wrong. ``what``: the kind of content the
    refusal of a large file names (``"JSON"``)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise InputError(f"{path} is {size:,} bytes{' of ' + what if what else ''}, more than the {max_bytes:,} "
                             f"attnlab reads")
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a folder, not a file") from None
    except OSError as exc:
        raise InputError(f"{path} cannot be read: {exc.strerror or exc}") from None


def read_json(path: str | Path, *, max_bytes: int = JSON_MAX_BYTES, max_depth: int = JSON_MAX_DEPTH) -> Any:
    """The JSON value of the file ``path`` (:func:`parse_json`), its size checked before it is
    read."""
    path = Path(path)
    return parse_json(read_bytes(path, max_bytes, "JSON"), str(path), max_bytes=max_bytes, max_depth=max_depth)
