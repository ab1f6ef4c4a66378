"""The data of language modelling: text corpora (tinyshakespeare, text of one's own),
tokenizers for language models (characters, bytes, byte-level BPE) and LMDataset's
windows, labels and document ids."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.data import (BPETokenizer, ByteTokenizer, CharTokenizer, CorpusSourceConfig, LMDataset, TextTokenizer,
                          load_tokenizer, source_of, train_tokenizer)
from attnlab.data.tokenizers import lm as lm_tokenize
from attnlab.data.sources.text_documents import TextDocumentsConfig
from attnlab.engine.config import ConfigError, from_dict
from attnlab.engine.trainer import IGNORE_INDEX
from attnlab.errors import InputError


def _real_root(folder: str) -> Path | None:
    env = os.environ.get("ATTNLAB_DATA_DIR")
    return Path(env) if env and (Path(env) / folder).is_dir() else None


_needs_tinyshakespeare = pytest.mark.skipif(
    _real_root("tinyshakespeare") is None,
    reason="real Tiny Shakespeare absent: set ATTNLAB_DATA_DIR to a folder holding tinyshakespeare/ (make test uses "
           "../shared/data)",
)

MIXED = "Crème brûlée, naïve café.\n中文的句子。\nemoji 😀👍🏽 and a\ttab  \n\n  spaces "


def _load(**data):
    config = from_dict(CorpusSourceConfig, data, "data")
    return source_of(config).load(config)


@pytest.fixture(scope="module")
def shakespeare():
    return _load(data_dir=str(_real_root("tinyshakespeare")))


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train([MIXED * 3, "the cat sat on the mat\nthe dog sat on the log\n" * 20], 300)


# ---------------------------------------------------------------------------- tinyshakespeare
@_needs_tinyshakespeare
def test_tinyshakespeare_is_the_first_90_percent_for_training_then_halves_of_the_rest(shakespeare):
    whole = (_real_root("tinyshakespeare") / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    assert [len(part) for part in (shakespeare.train, shakespeare.val, shakespeare.test)] == [1, 1, 1]
    train, val, test = shakespeare.train[0], shakespeare.val[0], shakespeare.test[0]
    assert (len(whole), len(train), len(val), len(test)) == (1_115_394, 1_003_854, 55_770, 55_770)
    assert train + val + test == whole and train.startswith("First Citizen:")


@_needs_tinyshakespeare
def test_tinyshakespeare_training_text_has_its_65_characters_as_nanogpt_numbers_them(shakespeare):
    tok = CharTokenizer.train(shakespeare.train, eos=False)
    assert tok.vocab_size == 65 and tok.chars[:3] == ["\n", " ", "!"] and tok.encode("First") == [18, 47, 56, 57, 58]


@_needs_tinyshakespeare
def test_tinyshakespeare_training_part_gives_3922_windows_of_256_characters(shakespeare):
    ds = LMDataset(shakespeare.train, CharTokenizer.train(shakespeare.train), 256)
    assert (len(ds), ds.num_tokens, ds.num_chars, ds.num_targets) == (3922, 1_003_854, 1_003_854, 1_003_853)


@_needs_tinyshakespeare
def test_a_copy_of_tinyshakespeare_as_ones_own_text_splits_as_the_built_in_does(shakespeare):
    own = _load(name="text", path=str(_real_root("tinyshakespeare") / "tinyshakespeare" / "input.txt"))
    assert (own.train, own.val, own.test) == (shakespeare.train, shakespeare.val, shakespeare.test)


def test_tinyshakespeare_absent_names_the_file_it_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tinyshakespeare data not found: .*tinyshakespeare/input\.txt"):
        _load(data_dir=str(tmp_path))


# ---------------------------------------------------------------------------- tokenizers
def test_char_tokenizer_numbers_the_sorted_characters_of_its_training_text_then_eos():
    tok = CharTokenizer.train(["hello", "hole"])
    assert tok.chars == ["e", "h", "l", "o"] and tok.encode("hole") == [1, 3, 2, 0]
    assert (tok.eos_id, tok.unk_id, tok.vocab_size) == (4, None, 5)


def test_char_tokenizer_round_trips_accents_chinese_and_emoji():
    tok = CharTokenizer.train(MIXED)
    assert tok.decode(tok.encode(MIXED)) == MIXED and len(tok.encode(MIXED)) == len(MIXED)


def test_char_tokenizer_refuses_an_unknown_character_naming_it():
    with pytest.raises(InputError, match=r"text holds 2 characters outside this char tokenizer's 4 \(the first at "
                                         r"index 1\): 'é' \(U\+00E9\), '😀' \(U\+1F600\); train it on text"):
        CharTokenizer.train("hello").encode("hé😀")


def test_char_tokenizer_with_unk_reads_an_unknown_character_as_unk():
    tok = CharTokenizer.train("hello", unk=True)
    assert tok.encode("hé") == [1, 5] and tok.decode([1, 5, 4]) == "h\ufffd"


def test_byte_tokenizer_gives_the_utf8_bytes_of_any_string_and_round_trips_it():
    tok = ByteTokenizer()
    assert tok.encode("é中") == [0xC3, 0xA9, 0xE4, 0xB8, 0xAD] and (tok.vocab_size, tok.eos_id) == (257, 256)
    for text in (MIXED, "", "\x00\x7f", "\ud800 lone surrogate", "👍🏽" * 3):
        assert tok.decode(tok.encode(text)) == text


def test_byte_tokenizer_decodes_bytes_that_are_not_utf8_as_replacement_characters():
    assert ByteTokenizer().decode([0xFF, 65, 256, 0xC3]) == "\ufffdA\ufffd"


def test_bpe_round_trips_text_exactly_with_its_end_of_document_token_first(bpe):
    ids = bpe.encode(MIXED)
    assert bpe.decode(ids) == MIXED and len(ids) < len(MIXED.encode("utf-8"))
    assert (bpe.eos_id, bpe.vocab_size) == (0, 300) and bpe.decode(bpe.encode("mat😀 \n")) == "mat😀 \n"


def test_bpe_encodes_an_end_of_text_token_written_in_a_text_as_text(bpe):
    ids = bpe.encode("a <|endoftext|> b")
    assert bpe.eos_id not in ids and bpe.decode(ids) == "a <|endoftext|> b"


def test_bpe_vocab_size_above_what_the_text_gives_is_capped_with_a_warning():
    # words "abcabc" and " abcabc": merges ab (4 times), abc (4), abcabc (2); " " + "abcabc" occurs once
    with pytest.warns(UserWarning, match=r"vocab_size=5000: the training text gives 260 tokens \(256 bytes, "
                                         r"<\|endoftext\|> and 3 merges of pairs seen at least 2 times\)"):
        tok = BPETokenizer.train("abcabc abcabc", 5000)
    assert tok.vocab_size == 260


def test_bpe_vocab_size_below_the_256_bytes_and_end_of_text_is_an_error():
    with pytest.raises(InputError, match=r"vocab_size must be an integer >= 257 for byte-level BPE"):
        BPETokenizer.train("some text", 256)


def test_bpe_encodes_a_long_text_in_pieces_to_the_ids_of_the_whole(bpe, monkeypatch):
    text = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n  All:\nSpeak, speak. \n" * 30)
    monkeypatch.setattr(lm_tokenize, "_PIECE", 100)
    assert bpe._cuttable and len(list(lm_tokenize._pieces(text))) > 10
    assert bpe.encode(text) == bpe.tokenizer.encode(text, add_special_tokens=False).ids


def test_train_tokenizer_makes_each_kind_from_the_training_text_and_refuses_an_unknown_one():
    kinds = [train_tokenizer(kind, ["abcabc abcabc"] * 4, vocab_size=258) for kind in ("char", "byte", "bpe")]
    assert [(type(t), t.vocab_size) for t in kinds] == [(CharTokenizer, 5), (ByteTokenizer, 257), (BPETokenizer, 258)]
    with pytest.raises(InputError, match=r"kind must be one of 'char', 'byte', 'bpe'; got 'wordpiece'"):
        train_tokenizer("wordpiece", ["abc"])


def test_each_tokenizer_saved_loads_back_as_the_same_tokenizer(bpe, tmp_path):
    for tok in (CharTokenizer.train(MIXED, unk=True), ByteTokenizer(eos=False), bpe):
        file = tok.save(tmp_path / tok.kind)
        back = load_tokenizer(tmp_path / tok.kind)
        assert file == tmp_path / tok.kind / "tokenizer.json" and type(back) is type(tok)
        assert (back.vocab_size, back.eos_id, back.encode(MIXED)) == (tok.vocab_size, tok.eos_id, tok.encode(MIXED))


def test_a_tokenizer_json_of_ones_own_loads_with_its_end_of_document_token(tmp_path):
    theirs = TextTokenizer.train(["a small text", "another small text"], kind="bpe", vocab_size=280, min_frequency=1)
    tok = load_tokenizer(theirs.save(tmp_path / "theirs.json"))
    assert type(tok) is BPETokenizer and (tok.vocab_size, tok.eos_id) == (theirs.vocab_size, 2)


def test_a_file_that_is_not_a_tokenizer_or_of_another_kind_is_one_clear_error(tmp_path):
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(InputError, match=r"could not read .*bad\.json as a Hugging Face tokenizer\.json: it must hold "
                                         r"a JSON object"):
        load_tokenizer(tmp_path / "bad.json")
    ByteTokenizer().save(tmp_path / "bytes.json")
    with pytest.raises(InputError, match=r"path must hold a char tokenizer for CharTokenizer\.load; .*bytes\.json "
                                         r"holds a byte one"):
        CharTokenizer.load(tmp_path / "bytes.json")


# ---------------------------------------------------------------------------- LMDataset
def test_windows_are_context_plus_one_tokens_and_the_labels_the_inputs_shifted_by_one():
    ds = LMDataset(["abcdefghij"], ByteTokenizer(), 4)
    x, y = ds.get_batch([0, 1])
    assert len(ds) == 3 and x["input_ids"].dtype == y.dtype == torch.long
    assert x["input_ids"].tolist() == [[97, 98, 99, 100], [101, 102, 103, 104]]
    assert y.tolist() == [[98, 99, 100, 101], [102, 103, 104, 105]]


def test_a_short_last_window_is_padded_with_doc_id_minus_one_and_ignored_labels():
    x, y = LMDataset(["abcdefghij"], ByteTokenizer(), 4).get_batch([2])
    assert x["input_ids"].tolist() == [[105, 106, 0, 0]] and x["doc_ids"].tolist() == [[0, 0, -1, -1]]
    assert y.tolist() == [[106, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]


def test_documents_are_joined_by_the_end_of_document_token_which_belongs_to_the_one_it_ends():
    ds = LMDataset(["ab", "", "cde"], ByteTokenizer(), 8)
    assert ds.tokens.tolist() == [97, 98, 256, 99, 100, 101] and ds.doc_of.tolist() == [0, 0, 0, 2, 2, 2]


def test_doc_ids_change_at_a_document_boundary_and_the_label_across_it_is_ignored():
    x, y = LMDataset(["ab", "cde"], ByteTokenizer(), 5).get_batch([0])
    assert x["input_ids"].tolist() == [[97, 98, 256, 99, 100]] and x["doc_ids"].tolist() == [[0, 0, 0, 1, 1]]
    assert y.tolist() == [[98, 256, IGNORE_INDEX, 100, 101]]


def test_without_an_end_of_document_token_the_label_across_a_boundary_is_ignored():
    x, y = LMDataset(["ab", "cde"], ByteTokenizer(eos=False), 4).get_batch([0])
    assert x["input_ids"].tolist() == [[97, 98, 99, 100]] and x["doc_ids"].tolist() == [[0, 0, 1, 1]]
    assert y.tolist() == [[98, IGNORE_INDEX, 100, 101]]


def test_the_dataset_counts_the_characters_tokens_and_labels_of_its_split():
    ds = LMDataset(["héllo", "中文😀"], ByteTokenizer(), 4)
    assert (ds.num_chars, ds.num_tokens, ds.num_targets, ds.num_documents) == (8, 17, 15, 2)
    assert ds.bits_per_char(math.log(2)) == pytest.approx(15 / 8)
    labels = torch.cat([ds.get_batch([i])[1] for i in range(len(ds))], 1)
    assert int((labels != IGNORE_INDEX).sum()) == 15


def test_every_label_is_the_next_token_of_the_stream_exactly_once():
    ds = LMDataset(["First Citizen:\nspeak", "All:\nSpeak, speak."], CharTokenizer.train(["First Citizen:\nAll:\nSpeak"
                                                                                        "speak,."]), 7)
    x, y = ds.get_batch(list(range(len(ds))))
    kept = y[y != IGNORE_INDEX]
    expected = ds.tokens[1:][ds.doc_of[1:] == ds.doc_of[:-1]]
    assert kept.tolist() == expected.tolist() and x["input_ids"].shape == (len(ds), 7)


def test_get_batch_gives_the_same_windows_every_time():
    ds = LMDataset([MIXED], ByteTokenizer(), 16)
    (a, ya), (b, yb) = ds.get_batch([3, 0, 3]), ds.get_batch([3, 0, 3])
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(ya, yb)
    assert torch.equal(a["input_ids"][0], a["input_ids"][2])


def test_a_window_index_out_of_range_is_an_error():
    ds = LMDataset(["abcdefghij"], ByteTokenizer(), 4)
    with pytest.raises(InputError, match=r"indices must lie in \[0, 3\) \(the number of windows\); got \[3\]"):
        ds.get_batch([0, 3])


# ---------------------------------------------------------------------------- text of one's own
def test_a_txt_file_is_one_document_split_by_characters_at_its_end(tmp_path):
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    (tmp_path / "book.txt").write_text(text, encoding="utf-8")
    splits = _load(name="text", path=str(tmp_path / "book.txt"), val_size=10, test_size=0.2)
    assert (splits.train, splits.val, splits.test) == ([text[:70]], [text[70:80]], [text[80:]])
    assert splits.notes == ["data: book.txt: 1 document, 100 characters: 70 training, 10 validation, 20 test "
                            "(split by characters at the end)"]


def test_a_txt_file_keeps_its_text_save_that_line_endings_become_newlines(tmp_path):
    (tmp_path / "crlf.txt").write_bytes("\ufeffline one\r\nligne deux été\r\n\r\n".encode("utf-8"))
    splits = _load(name="text", path=str(tmp_path / "crlf.txt"), val_size=1, test_size=1)
    assert splits.train[0] + splits.val[0] + splits.test[0] == "line one\nligne deux été\n\n"


def test_a_folder_is_one_document_per_txt_file_in_the_order_of_their_paths(tmp_path):
    for name, text in [("b.txt", "bee"), ("a.txt", "ay"), ("sub/c.txt", "sea"), ("sub/d.TXT", "dee"),
                       (".hidden.txt", "no"), (".git/e.txt", "no"), ("notes.md", "no"), ("empty.txt", " \n")]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    splits = _load(name="text", path=str(tmp_path), val_size=0, test_size=1, seed=0)
    assert splits.val is None and splits.skipped == 1
    assert (splits.train, splits.test) == (["bee", "sea", "dee"], ["ay"])  # randperm(4, seed 0) starts with 0


def test_several_documents_are_held_out_whole_at_random_with_the_seed(tmp_path):
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(10)))
    splits = _load(name="text", path=str(tmp_path / "docs.jsonl"), val_size=0.2, test_size=2)
    # randperm(10, seed 0) = 4 1 | 7 5 | 3 9 0 8 6 2: the test part, the validation part, the training part
    assert (splits.train, splits.val, splits.test) == (["doc 0", "doc 2", "doc 3", "doc 6", "doc 8", "doc 9"],
                                                       ["doc 5", "doc 7"], ["doc 1", "doc 4"])
    other = _load(name="text", path=str(tmp_path / "docs.jsonl"), val_size=0.2, test_size=2, seed=1)
    assert other.test != splits.test and sorted(other.train + other.val + other.test) == sorted(
        splits.train + splits.val + splits.test)


def test_a_jsonl_file_is_one_document_per_row_of_its_text_column_blank_ones_skipped(tmp_path):
    rows = [{"body": "  first, kept as it is \n", "id": 1}, {"body": " "}, {"body": "second"}, {"body": "third"}]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    splits = _load(name="text", path=str(tmp_path / "rows.jsonl"), text_column="body", val_size=0, test_size=1)
    assert sorted(splits.train + splits.test) == ["  first, kept as it is \n", "second", "third"]
    assert splits.skipped == 1 and splits.notes[1] == "data: skipped 1 blank document (empty or white space)"


def test_a_csv_file_is_one_document_per_row_quoted_newlines_kept(tmp_path):
    (tmp_path / "rows.csv").write_text('id,text\n1,"one, with\na newline"\n2,two\n3,three\n', encoding="utf-8")
    splits = _load(name="text", path=str(tmp_path / "rows.csv"), val_size=0, test_size=1)
    assert sorted(splits.train + splits.test) == ["one, with\na newline", "three", "two"]


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if data is not None:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("files, keys, message", [
    ({}, {}, r"^data\.path must name a \.txt file, a folder of \.txt files or a JSONL, CSV or TSV file when "
             r"data\.name is 'text'"),
    ({}, {"path": "nope.txt"}, r"^data\.path must be a text file or a folder of them; .*nope\.txt does not exist$"),
    ({"empty.txt": b""}, {"path": "empty.txt"}, r"^data\.path: .*empty\.txt holds no text \(it is empty\)$"),
    ({"blank.txt": b" \n\t\n"}, {"path": "blank.txt"},
     r"^data\.path: .*blank\.txt holds no text \(only white space\)$"),
    ({"d/sub/x.md": b"text"}, {"path": "d"}, r"^data\.path: .*d holds no \.txt files \(sub-folders included\)"),
    ({"d/a.txt": b"", "d/b.txt": b"\n"}, {"path": "d"},
     r"^data\.path: .*d holds no text: its 2 \.txt files are all empty or white space$"),
    ({"latin.txt": b"ok\ncaf\xe9\n"}, {"path": "latin.txt"},
     r"^data\.path: .*latin\.txt: line 2 is not valid utf-8: byte 0xe9 at column 4"),
    ({"long.txt": b"short\nmuch too long\n"}, {"path": "long.txt", "max_line_chars": 8},
     r"^data\.path: .*long\.txt: line 2 is too long: 13 characters; the limit of 8 characters per line is "
     r"data\.max_line_chars"),
    ({"rows.jsonl": b'{"txt": "a"}\n'}, {"path": "rows.jsonl"},
     r"^data\.path: .*rows\.jsonl: every object has no column 'text' \(text_column, data\.text_column in a "
     r"recipe\); did you mean txt\? \(columns: txt\)$"),
    ({"rows.jsonl": b'{"text": "a"}\n{"text": 3}\n'}, {"path": "rows.jsonl"},
     r"^data\.path: .*rows\.jsonl: line 2: the text \('text'\) must be a string; got a JSON number$"),
    ({"book.md": b"text"}, {"path": "book.md"}, r"^data\.path: cannot tell the format of .*book\.md from its name"),
    ({"tiny.txt": b"0123456789"}, {"path": "tiny.txt", "val_size": 0.5, "test_size": 0.5},
     r"^data\.val_size=0\.5 and data\.test_size=0\.5 hold out 10 of the 10 characters of .*tiny\.txt, leaving "
     r"nothing to train on; lower them$"),
    ({"d/a.txt": b"a", "d/b.txt": b"b", "d/c.txt": b"c"}, {"path": "d", "val_size": 1, "test_size": 0.5},
     r"^data\.val_size=1 and data\.test_size=0\.5 hold out 3 of the 3 documents of .*d, leaving nothing to train on"),
])
def test_bad_own_text_is_one_line_error_naming_the_setting_and_the_file(tmp_path, monkeypatch, files, keys, message):
    for name, data in files.items():
        _write(tmp_path, name, data)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=message) as caught:
        _load(name="text", **keys)
    assert "\n" not in str(caught.value)


def test_a_test_size_of_zero_is_refused_when_the_data_section_is_read():
    with pytest.raises(InputError, match=r"data\.test_size must be above 0"):
        from_dict(CorpusSourceConfig, {"name": "text", "path": "book.txt", "test_size": 0}, "data")


# ---------------------------------------------------------------------------- the registry
def test_an_unknown_corpus_name_lists_the_corpus_sources_and_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"data\.name must be one of 'tinyshakespeare', 'text'; got 'tinyshakespear'"
                                          r"; did you mean tinyshakespeare\?"):
        from_dict(CorpusSourceConfig, {"name": "tinyshakespear"}, "data")


def test_a_key_of_ones_own_text_given_to_tinyshakespeare_is_named_as_such():
    with pytest.raises(ConfigError, match=r"data\.path applies to data\.name=text; got data\.name='tinyshakespeare'"):
        from_dict(CorpusSourceConfig, {"path": "book.txt"}, "data")
    assert type(from_dict(CorpusSourceConfig, {"name": "text", "path": "b.txt"}, "data")) is TextDocumentsConfig


def test_the_command_lists_the_corpus_sources_with_their_keys():
    r = subprocess.run([sys.executable, "-m", "attnlab", "sources"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rows = {tuple(line.split()[:2]): i for i, line in enumerate(lines) if line.startswith("text_corpus")}
    assert set(rows) == {("text_corpus", "tinyshakespeare"), ("text_corpus", "text")}
    assert lines[rows["text_corpus", "tinyshakespeare"] + 1].split() == ["data", "keys:", "max_line_chars"]
    assert lines[rows["text_corpus", "text"] + 1].split() == ["data", "keys:", "max_line_chars,", "path,",
                                                              "text_column,", "format,", "val_size,", "test_size,",
                                                              "seed"]


# ---------------------------------------------------------------------------- too short, and outside a char vocabulary


def test_lm_dataset_too_short_names_what_it_is_told_and_the_context():
    tok = CharTokenizer.train("abc")
    with pytest.raises(InputError, match=r"^the test part of data\.path=story\.txt gives 1 token \(1 character\); "
                                         r".*windows of text\.context=8 tokens"):
        LMDataset(["a"], tok, 8, name="the test part of data.path=story.txt")
    with pytest.raises(InputError, match=r"^documents must give at least 2 tokens .*context=8 tokens.*they give 1 "
                                         r"token \(1 character\)"):
        LMDataset(["a"], tok, 8)


def test_a_char_tokenizer_built_in_python_still_suggests_unk():
    with pytest.raises(InputError, match=r"train it on text that holds it, or with unk=True"):
        CharTokenizer.train("hello").encode("hé")
    with pytest.raises(InputError, match=r"^text holds 1 character .*; my advice$"):
        CharTokenizer.train("hello", advice="my advice").encode("hé")
