"""A line longer than max_line_chars (data.max_line_chars) is refused by every line reader,
read in bounded pieces: memory never holds a whole hostile line."""

import csv
import gzip
import tracemalloc

import pytest

from attnlab.data.readers.mr import load_mr
from attnlab.data.readers.multi30k import load_multi30k, read_gzip_lines
from attnlab.data.readers.parallel import MAX_LINE_CHARS, read_pairs_tsv, read_parallel, read_text_lines
from attnlab.data.readers.tables import read_labelled_texts
from attnlab.data.readers.text import read_lines
from attnlab.errors import InputError

LIMIT = 1000


def _jsonl_with_text(n_chars: int) -> bytes:
    return b'{"text": "ok", "label": "a"}\n{"text": "' + b"x" * n_chars + b'", "label": "b"}\n'


def test_the_default_limit_is_a_million_characters():
    assert MAX_LINE_CHARS == 1_000_000


def test_a_jsonl_line_over_the_limit_names_file_line_length_limit_and_key(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_bytes(_jsonl_with_text(2000))
    with pytest.raises(InputError) as info:
        read_labelled_texts(path, max_line_chars=LIMIT)
    message = str(info.value)
    assert f"{path}: line 2 " in message and "2,026 characters" in message
    assert "limit of 1,000 characters" in message and "data.max_line_chars" in message


def test_a_line_far_over_the_limit_in_bytes_says_more_than_the_limit(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_bytes(_jsonl_with_text(50_000))
    with pytest.raises(InputError, match=r"line 2 is too long: more than 4,004 bytes, so more than 1,000 "
                                         r"characters; the limit of 1,000 characters per line is data\.max_line_chars"):
        read_labelled_texts(path, max_line_chars=LIMIT)


def test_a_gzip_jsonl_line_over_the_limit_is_refused(tmp_path):
    path = tmp_path / "texts.jsonl.gz"
    path.write_bytes(gzip.compress(_jsonl_with_text(50_000)))
    with pytest.raises(InputError, match=r"texts\.jsonl\.gz: line 2 .*data\.max_line_chars"):
        read_labelled_texts(path, max_line_chars=LIMIT)


def test_a_line_of_exactly_the_limit_is_read(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"short\r\n" + "\u00e9".encode() * LIMIT + b"\r\n")  # 2 bytes per character
    lines = read_text_lines(path, max_line_chars=LIMIT)
    assert [len(line) for line in lines] == [5, LIMIT]


def test_a_line_of_four_byte_characters_at_the_limit_is_read(tmp_path):
    path = tmp_path / "a.txt.gz"
    path.write_bytes(gzip.compress("\U0001F600".encode() * LIMIT + b"\r\n"))
    assert [len(line) for line in read_text_lines(path, max_line_chars=LIMIT)] == [LIMIT]


def test_one_character_over_the_limit_is_refused(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"y" * (LIMIT + 1))
    with pytest.raises(InputError, match=r"a\.txt: line 1 is too long: 1,001 characters"):
        read_text_lines(path, max_line_chars=LIMIT)


def test_a_csv_field_over_the_limit_names_file_line_limit_and_key(tmp_path):
    path = tmp_path / "t.csv"
    quoted = "\n".join(["z" * 600] * 3)  # one quoted field of 1,802 characters on 3 lines of 600
    path.write_text(f'text,label\nfine,a\n"{quoted}",b\n', encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_labelled_texts(path, max_line_chars=LIMIT)
    message = str(info.value)
    assert f"{path}: line 3" in message and "1,000 characters" in message and "data.max_line_chars" in message


def test_a_csv_field_longer_than_the_csv_module_default_is_read_under_the_default_limit(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(f"text,label\n{'w' * 200_000},a\nshort,b\n", encoding="utf-8")
    assert [len(t) for t in read_labelled_texts(path).texts] == [200_000, 5]


def test_reading_a_csv_file_restores_the_process_wide_field_limit(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text,label\nfine,a\nok,b\n", encoding="utf-8")
    before = csv.field_size_limit()
    read_labelled_texts(path, max_line_chars=LIMIT)
    assert csv.field_size_limit() == before


def test_a_parallel_file_line_over_the_limit_is_refused(tmp_path):
    (tmp_path / "train.de").write_text("ein Hund\n" + "w" * 1500 + "\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("a dog\nwords\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"train\.de: line 2 is too long: 1,500 characters"):
        read_parallel(tmp_path / "train.de", tmp_path / "train.en", max_line_chars=LIMIT)


def test_a_tsv_pair_line_over_the_limit_is_refused(tmp_path):
    (tmp_path / "train.tsv").write_text("ja\tyes\n" + "w" * 1500 + "\tx\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"train\.tsv: line 2 is too long: 1,502 characters"):
        read_pairs_tsv(tmp_path / "train.tsv", max_line_chars=LIMIT)


def test_a_multi30k_line_over_the_limit_is_refused(tmp_path):
    folder = tmp_path / "multi30k"
    folder.mkdir()
    (folder / "val.de.gz").write_bytes(gzip.compress(b"Hund\n" * 3 + b"k" * 1200 + b"\n"))
    (folder / "val.en.gz").write_bytes(gzip.compress(b"dog\n" * 4))
    with pytest.raises(InputError, match=r"val\.de\.gz: line 4 is too long: 1,200 characters"):
        load_multi30k("val", tmp_path, max_line_chars=LIMIT)


def test_a_mr_line_over_the_limit_is_refused(tmp_path):
    (tmp_path / "mr").mkdir()
    (tmp_path / "mr" / "rt-polarity.pos").write_bytes(b"fine .\n" + b"\xe9" * 1100 + b"\n")
    (tmp_path / "mr" / "rt-polarity.neg").write_bytes(b"bad .\n")
    with pytest.raises(InputError, match=r"rt-polarity\.pos: line 2 is too long: 1,100 characters"):
        load_mr(tmp_path, max_line_chars=LIMIT)


def test_read_lines_and_read_gzip_lines_take_the_limit(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"q" * 1001 + b"\n")
    (tmp_path / "a.gz").write_bytes(gzip.compress(b"q" * 1001 + b"\n"))
    with pytest.raises(InputError, match="line 1 is too long: 1,001 characters"):
        read_lines(tmp_path / "a.txt", max_line_chars=LIMIT)
    with pytest.raises(InputError, match="line 1 is too long: 1,001 characters"):
        read_gzip_lines(tmp_path / "a.gz", max_line_chars=LIMIT)


def test_a_utf16_line_over_the_limit_is_refused(tmp_path):
    path = tmp_path / "notepad.txt"
    path.write_bytes(("fine\r\n" + "u" * 1001 + "\r\n").encode("utf-16"))
    assert read_lines(path, "utf-16") == ["fine", "u" * 1001]
    with pytest.raises(InputError, match=r"notepad\.txt: line 2 is too long: 1,001 characters"):
        read_lines(path, "utf-16", max_line_chars=LIMIT)


@pytest.mark.parametrize("limit", [0, -1, 2.5, True])
def test_a_limit_that_is_not_a_positive_integer_is_refused(tmp_path, limit):
    (tmp_path / "a.txt").write_bytes(b"x\n")
    with pytest.raises(InputError, match=rf"max_line_chars \(data\.max_line_chars\) must be a positive integer; "
                                         rf"got {limit!r}"):
        read_text_lines(tmp_path / "a.txt", max_line_chars=limit)


def test_refusing_a_20_mb_line_allocates_far_less_than_the_line(tmp_path):
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b'{"text": "' + b"x" * 20_000_000 + b'", "label": "a"}\n')
    try:
        tracemalloc.start()
        with pytest.raises(InputError, match="line 1 is too long"):
            read_labelled_texts(path, max_line_chars=LIMIT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        path.unlink()
    assert peak < 1_000_000, f"peak {peak:,} bytes"
