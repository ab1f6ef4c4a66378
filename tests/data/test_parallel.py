"""Sentence pairs from line-aligned files or a TSV (attnlab.data.readers.parallel)."""

import gzip

import pytest

from attnlab.data.readers.parallel import (
    SentencePairs,
    find_parallel,
    load_parallel,
    read_pairs_tsv,
    read_parallel,
    read_text_lines,
)
from attnlab.errors import InputError


def _write(path, text: str):
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def test_read_text_lines_plain_and_gz(tmp_path):
    assert read_text_lines(_write(tmp_path / "a.txt", "eins\r\n zwei \n")) == ["eins", " zwei "]
    assert read_text_lines(_write(tmp_path / "a.de.gz", "eins\n\ndrei\n")) == ["eins", "", "drei"]


def test_read_text_lines_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.de"):
        read_text_lines(tmp_path / "nope.de")
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    with pytest.raises(InputError, match=r"bad\.gz must be a whole gzip file"):
        read_text_lines(tmp_path / "bad.gz")
    (tmp_path / "latin.de").write_bytes("ok\nsch\xf6n\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin\.de: line 2 is not valid utf-8"):
        read_text_lines(tmp_path / "latin.de")


def test_read_parallel_plain(tmp_path):
    src = _write(tmp_path / "train.de", "ein Hund\n zwei Katzen \n")
    tgt = _write(tmp_path / "train.en", "a dog\ntwo cats\n")
    pairs = read_parallel(src, tgt)
    assert pairs == [("ein Hund", "a dog"), ("zwei Katzen", "two cats")]
    assert isinstance(pairs, list) and isinstance(pairs, SentencePairs)
    assert pairs.skipped == 0


def test_read_parallel_gz(tmp_path):
    src = _write(tmp_path / "train.de.gz", "ja\nnein\n")
    tgt = _write(tmp_path / "train.en.gz", "yes\nno\n")
    assert read_parallel(src, tgt) == [("ja", "yes"), ("nein", "no")]


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    src = _write(tmp_path / "train.de", "a\nb\nc\n")
    tgt = _write(tmp_path / "train.en", "a\nb\n")
    with pytest.raises(InputError, match=r"train\.de has 3 lines but .*train\.en has 2"):
        read_parallel(src, tgt)


def test_mismatch_from_trailing_blank_lines_says_so(tmp_path):
    src = _write(tmp_path / "train.de", "a\nb\n\n")
    tgt = _write(tmp_path / "train.en", "a\nb\n")
    with pytest.raises(InputError, match=r"has 3 lines but .* has 2 \(its last 1 lines are blank\)"):
        read_parallel(src, tgt)


def test_blank_side_names_both_files_and_line(tmp_path):
    src = _write(tmp_path / "train.de", "a\n  \nc\n")
    tgt = _write(tmp_path / "train.en", "A\nB\nC\n")
    with pytest.raises(InputError, match=r"train\.de and .*train\.en: line 2: the source is blank.*skip_blank=True"):
        read_parallel(src, tgt)


def test_skip_blank_drops_and_counts(tmp_path):
    src = _write(tmp_path / "train.de", "a\n  \nc\n\nd\n")
    tgt = _write(tmp_path / "train.en", "A\nB\n\n\nD\n")
    pairs = read_parallel(src, tgt, skip_blank=True)
    assert pairs == [("a", "A"), ("d", "D")]
    assert pairs.skipped == 3


def test_read_pairs_tsv(tmp_path):
    f = _write(tmp_path / "train.tsv.gz", "ein Hund\ta dog\r\nja\tyes\n")
    assert read_pairs_tsv(f) == [("ein Hund", "a dog"), ("ja", "yes")]


def test_tsv_line_without_two_fields(tmp_path):
    f = _write(tmp_path / "train.tsv", "a\tA\nb\tB\tC\n")
    with pytest.raises(InputError, match=r"train\.tsv: line 2 has 3 tab-separated fields; expected 2"):
        read_pairs_tsv(f)
    f = _write(tmp_path / "one.tsv", "a\tA\nno tab here\n")
    with pytest.raises(InputError, match=r"one\.tsv: line 2 has 1 tab-separated fields"):
        read_pairs_tsv(f)


def test_tsv_blank_sides(tmp_path):
    f = _write(tmp_path / "train.tsv", "a\tA\nb\t \n\nc\tC\n")
    with pytest.raises(InputError, match=r"train\.tsv: line 2: the target is blank"):
        read_pairs_tsv(f)
    pairs = read_pairs_tsv(f, skip_blank=True)
    assert pairs == [("a", "A"), ("c", "C")]
    assert pairs.skipped == 2


def test_find_parallel_prefers_line_aligned_files(tmp_path):
    _write(tmp_path / "train.de", "a\n")
    _write(tmp_path / "train.en.gz", "A\n")
    _write(tmp_path / "train.tsv", "a\tA\n")
    assert find_parallel(tmp_path, "train", "de", "en") == (tmp_path / "train.de", tmp_path / "train.en.gz")


def test_find_parallel_falls_back_to_tsv(tmp_path):
    _write(tmp_path / "val.de", "a\n")  # only one side: not a pair
    _write(tmp_path / "val.tsv.gz", "a\tA\n")
    assert find_parallel(tmp_path, "val", "de", "en") == tmp_path / "val.tsv.gz"
    assert load_parallel(tmp_path, "val", "de", "en") == [("a", "A")]


def test_find_parallel_not_found_names_root_split_and_files(tmp_path):
    _write(tmp_path / "test.de", "a\n")
    with pytest.raises(FileNotFoundError) as info:
        find_parallel(tmp_path, "test", "de", "en")
    message = str(info.value)
    assert str(tmp_path) in message and "'test'" in message
    assert "found test.de but not test.en or test.en.gz" in message
    for name in ("test.de", "test.de.gz", "test.en", "test.en.gz", "test.tsv", "test.tsv.gz"):
        assert name in message


def test_find_parallel_root_must_be_a_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"root must be an existing folder.*nope"):
        find_parallel(tmp_path / "nope", "train", "de", "en")


@pytest.mark.parametrize("code", ["", "d.e", "../x", "e n"])
def test_bad_language_code(tmp_path, code):
    with pytest.raises(InputError, match=r"src must be a language code"):
        find_parallel(tmp_path, "train", code, "en")


def test_same_language_twice(tmp_path):
    with pytest.raises(InputError, match="src and tgt must be different languages; got 'en' for both"):
        load_parallel(tmp_path, "train", "en", "en")


def test_load_parallel_line_aligned_with_skip_blank(tmp_path):
    _write(tmp_path / "train.fr", "un\n\ntrois\n")
    _write(tmp_path / "train.en", "one\ntwo\nthree\n")
    pairs = load_parallel(tmp_path, "train", "fr", "en", skip_blank=True)
    assert pairs == [("un", "one"), ("trois", "three")]
    assert pairs.skipped == 1
