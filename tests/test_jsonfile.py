"""JSON read with limits (attnlab.jsonfile): its depth is counted before it is parsed, and text
larger or nested deeper than attnlab reads is refused naming the file."""

from __future__ import annotations

import pytest

from attnlab.errors import InputError
from attnlab.jsonfile import json_depth, parse_json, read_json
from attnlab.limits import JSON_MAX_DEPTH


def test_json_depth_counts_brackets_outside_strings():
    assert json_depth(b'{"a": [1, {"b": "]]]][[[["}], "c": "\\"[[["}') == 3
    assert json_depth(b'["\\\\", [["x"]]]') == 3  # an escaped backslash ends no string
    assert json_depth(b"17") == 0 and json_depth(b"[]") == 1


def test_deep_or_large_json_is_refused_before_it_is_parsed(tmp_path):
    deep = "[" * 200_000 + "]" * 200_000  # Python's own parser dies of a RecursionError on it
    with pytest.raises(InputError, match=f"x.json nests its JSON 200000 levels deep, more than the {JSON_MAX_DEPTH}"):
        parse_json(deep, "x.json")
    assert parse_json("[" * JSON_MAX_DEPTH + "]" * JSON_MAX_DEPTH, "ok") is not None
    with pytest.raises(InputError, match="y.json is 2,001 bytes of JSON, more than the 2,000 attnlab reads"):
        parse_json(b" " * 2001, "y.json", max_bytes=2000)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:  # a sparse file: 200 MB on paper, nothing on the disk; refused before it is read
        f.truncate(200 * 2**20)
    with pytest.raises(InputError, match="huge.json is 209,715,200 bytes of JSON, more than the 134,217,728"):
        read_json(huge)
    with pytest.raises(InputError, match=r"z.json is not JSON attnlab reads: .*digits"):
        parse_json("1" * 5000, "z.json")  # more digits than Python converts
