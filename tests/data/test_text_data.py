"""Text data: MR (Windows-1252), folds and splits, Multi30k (gzip), strict line reading,
TextTokenizer (train, save/load, encode, decode, bad input) and SentimentDataset."""

import gzip
import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from attnlab.data import (
    SPECIAL_TOKENS,
    SentimentDataset,
    TextTokenizer,
    key_padding_mask,
    load_mr,
    load_multi30k,
    mr_folds,
    mr_split,
    read_lines,
)


def _real_root(folder: str) -> Path | None:
    env = os.environ.get("ATTNLAB_DATA_DIR")
    return Path(env) if env and (Path(env) / folder).is_dir() else None


_needs_mr = pytest.mark.skipif(
    _real_root("mr") is None,
    reason="real MR absent: set ATTNLAB_DATA_DIR to a folder holding mr/ (make test uses ../shared/data)",
)
_needs_multi30k = pytest.mark.skipif(
    _real_root("multi30k") is None,
    reason="real Multi30k absent: set ATTNLAB_DATA_DIR to a folder holding multi30k/ (make test uses ../shared/data)",
)

CORPUS = [
    "the cat sat on the mat .",
    "a dog ran in the park and the cat ran too",
    "hello , world ! what a fine film",
    "ein Mädchen läuft über die Straße",
    "zwei Männer spielen Fußball im Park",
    "the film is a fine , funny and moving story",
] * 4


@pytest.fixture(scope="module")
def wordpiece() -> TextTokenizer:
    return TextTokenizer.train(CORPUS, kind="wordpiece", vocab_size=200, lowercase=True, min_frequency=1)


@pytest.fixture(scope="module")
def bpe() -> TextTokenizer:
    return TextTokenizer.train(CORPUS, kind="bpe", vocab_size=300, min_frequency=1)


# ---------------------------------------------------------------------------- MR


@_needs_mr
def test_real_mr_is_10662_sentences_decoded_as_windows_1252():
    sentences, labels = load_mr(_real_root("mr"))
    assert len(sentences) == 10_662 and labels.count(1) == 5_331 and labels.count(0) == 5_331
    assert labels[:5_331] == [1] * 5_331  # positives first, in file order
    text = "\n".join(sentences)
    assert "the action clichés just pile up ." in sentences  # byte 0xE9
    assert "…" in text and "—" in text  # 0x85, 0x97: Windows-1252, not Latin-1 control characters
    assert "\ufffd" not in text and not any("\x80" <= c <= "\x9f" for c in text)
    assert all(s == s.strip() and s for s in sentences)


def _write_mr(root: Path, pos: bytes, neg: bytes) -> None:
    (root / "mr").mkdir(parents=True)
    (root / "mr" / "rt-polarity.pos").write_bytes(pos)
    (root / "mr" / "rt-polarity.neg").write_bytes(neg)


def test_load_mr_decodes_latin1_bytes_in_a_fixture(tmp_path):
    _write_mr(tmp_path, b"clich\xe9s but fun . \n\x93quoted\x94 and caf\xe9\n", b"na\xefve and dull . \n")
    sentences, labels = load_mr(tmp_path)
    assert sentences == ["clichés but fun .", "\u201cquoted\u201d and café", "naïve and dull ."]
    assert labels == [1, 1, 0]


def test_load_mr_missing_files_name_the_download_command(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_mr(tmp_path)
    assert "rt-polarity.pos" in str(info.value)
    assert f"attnlab data download mr --data-dir {tmp_path}" in str(info.value)


def test_mr_folds_partition_the_data_and_keep_the_class_balance():
    labels = [1] * 5_331 + [0] * 5_331
    folds = mr_folds(labels, k=10, seed=0)
    assert len(folds) == 10
    tests = [i for _, te in folds for i in te]
    assert sorted(tests) == list(range(10_662))  # every sentence in exactly one test fold
    for train, test in folds:
        assert not set(train) & set(test) and len(train) + len(test) == 10_662
        assert sum(labels[i] for i in test) in (533, 534)  # 5,331 / 10 positives per fold
        assert len(test) in (1066, 1067)
    assert mr_folds(labels, k=10, seed=0) == folds
    assert mr_folds(labels, k=10, seed=1) != folds


def test_mr_folds_reject_k_larger_than_a_class():
    with pytest.raises(ValueError, match=r"k must be an integer in \[2, 3\]"):
        mr_folds([0, 0, 0, 1, 1, 1, 1], k=4)


def test_mr_split_is_a_fixed_stratified_80_10_10_partition():
    labels = [1] * 5_331 + [0] * 5_331
    train, dev, test = mr_split(labels, seed=0)
    assert (len(train), len(dev), len(test)) == (8_530, 1_066, 1_066)
    assert sorted(train + dev + test) == list(range(10_662))
    assert sum(labels[i] for i in dev) == 533 and sum(labels[i] for i in test) == 533
    assert mr_split(labels, seed=0) == (train, dev, test)


# ---------------------------------------------------------------------------- Multi30k


@_needs_multi30k
def test_real_multi30k_line_counts_and_utf8():
    root = _real_root("multi30k")
    counts = {split: len(load_multi30k(split, root)) for split in ("train", "val", "test")}
    assert counts == {"train": 29_000, "val": 1_014, "test": 1_000}
    src, tgt = load_multi30k("train", root)[0]
    assert src == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
    assert tgt == "Two young, White males are outside near many bushes."
    assert load_multi30k("train", root, src="en", tgt="de")[0] == (tgt, src)


def _write_gz(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("".join(f"{s}\n" for s in lines).encode("utf-8")))


def test_multi30k_strips_only_the_newline(tmp_path):
    _write_gz(tmp_path / "multi30k" / "val.de.gz", ["  Ein Hund. ", "Straße"])
    _write_gz(tmp_path / "multi30k" / "val.en.gz", ["  A dog. ", "street"])
    assert load_multi30k("val", tmp_path) == [("  Ein Hund. ", "  A dog. "), ("Straße", "street")]


def test_multi30k_mismatched_line_counts_name_both_files(tmp_path):
    _write_gz(tmp_path / "multi30k" / "train.de.gz", ["eins", "zwei", "drei"])
    _write_gz(tmp_path / "multi30k" / "train.en.gz", ["one", "two"])
    with pytest.raises(ValueError) as info:
        load_multi30k("train", tmp_path)
    message = str(info.value)
    assert "train.de.gz has 3 lines" in message and "train.en.gz has 2" in message


def test_multi30k_file_that_is_not_gzip_is_named(tmp_path):
    (tmp_path / "multi30k").mkdir()
    (tmp_path / "multi30k" / "val.de.gz").write_bytes(b"Ein Hund\n")
    _write_gz(tmp_path / "multi30k" / "val.en.gz", ["A dog"])
    with pytest.raises(ValueError, match="val.de.gz must be a whole gzip file"):
        load_multi30k("val", tmp_path)


def test_multi30k_rejects_an_unknown_split(tmp_path):
    with pytest.raises(ValueError, match="split must be one of .*; got 'dev'"):
        load_multi30k("dev", tmp_path)


# ---------------------------------------------------------------------------- read_lines


def test_read_lines_names_file_and_line_of_a_misencoded_byte(tmp_path):
    path = tmp_path / "reviews.txt"
    path.write_bytes("a fine film\nsecond line\n".encode() + b"caf\xe9 ambiance\n")
    with pytest.raises(ValueError) as info:
        read_lines(path)
    message = str(info.value)
    assert str(path) in message and "line 3" in message and "0xe9" in message


def test_read_lines_keeps_empty_lines_and_drops_crlf_and_bom(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("\ufefffirst\r\n\r\n  café  \nlast".encode("utf-8"))
    assert read_lines(path) == ["first", "", "  café  ", "last"]


# ---------------------------------------------------------------------------- TextTokenizer


def test_special_tokens_have_fixed_ids(wordpiece, bpe):
    for tok in (wordpiece, bpe):
        assert [tok.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4, 5]
        assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id, tok.cls_id, tok.sep_id) == (0, 1, 2, 3, 4, 5)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_save_load_round_trip_gives_the_same_ids(kind, wordpiece, bpe, tmp_path):
    tok = wordpiece if kind == "wordpiece" else bpe
    file = tok.save(tmp_path / "tok")
    assert file == tmp_path / "tok" / "tokenizer.json" and json.loads(file.read_text())["model"]["type"]
    again = TextTokenizer.load(tmp_path / "tok")
    texts = ["The cat sat in the park!", "ein Mädchen", ""]
    assert torch.equal(again.encode(texts)["input_ids"], tok.encode(texts)["input_ids"])
    assert again.vocab_size == tok.vocab_size and again.kind == tok.kind


def test_decode_of_encode_is_the_normalized_text(wordpiece, bpe):
    text = "The Cat sat on the mat, and the dog ran!"
    ids = wordpiece.encode([text])["input_ids"][0]
    assert wordpiece.decode(ids) == wordpiece.normalize(text) == "the cat sat on the mat, and the dog ran!"
    text = "Zwei Männer spielen Fußball, 3 Hunde ran."
    assert bpe.decode(bpe.encode(text)["input_ids"][0]) == text  # byte-level: lossless


def test_truncation_keeps_special_tokens_and_warns_once(wordpiece):
    texts = ["the cat sat on the mat", "a dog ran in the park", "the film", "a fine funny film and story"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batch = wordpiece.encode(texts, max_length=5)
    assert len(caught) == 1
    assert "3 of 4 texts" in str(caught[0].message) and "max_length=5" in str(caught[0].message)
    ids = batch["input_ids"]
    assert ids.shape == (4, 5) and ids[:, 0].tolist() == [4] * 4
    assert ids[0, -1] == wordpiece.sep_id and ids[2].tolist()[-1] == 0  # 'the film' is 4 tokens: padded


def test_truncation_false_refuses_a_long_text(wordpiece):
    with pytest.raises(ValueError, match="1 of 1 texts are longer than max_length=4"):
        wordpiece.encode(["the cat sat on the mat"], max_length=4, truncation=False)


def test_empty_and_blank_texts_encode_to_special_tokens_only(wordpiece, bpe):
    for tok in (wordpiece, bpe):
        batch = tok.encode(["", "   ", "\t \n"])
        assert batch["input_ids"].tolist() == [[4, 5]] * 3 and batch["attention_mask"].tolist() == [[1, 1]] * 3
        bare = tok.encode(["", " "], add_cls=False)
        assert bare["input_ids"].tolist() == [[0], [0]] and bare["attention_mask"].tolist() == [[0], [0]]
        assert tok.decode(batch["input_ids"][1]) == ""


def test_characters_outside_the_vocabulary(wordpiece, bpe):
    ids = wordpiece.encode(["the ☃ cat 猫"], add_cls=False)["input_ids"][0].tolist()
    assert ids.count(wordpiece.unk_id) == 2 and len(ids) == 4
    ids = bpe.encode(["the ☃ cat 猫"], add_cls=False)["input_ids"][0]
    assert bpe.unk_id not in ids.tolist()  # every byte is in a byte-level vocabulary
    assert bpe.decode(ids) == "the ☃ cat 猫"


def test_encode_shapes_dtypes_and_the_mask_conversion(wordpiece):
    batch = wordpiece.encode(["the cat", "the cat sat on the mat"], max_length=12, padding="max_length")
    assert batch["input_ids"].shape == (2, 12) and batch["input_ids"].dtype == torch.int64
    assert batch["attention_mask"].dtype == torch.int64 and batch["attention_mask"].sum(1).tolist() == [4, 8]
    kpm = key_padding_mask(batch["attention_mask"])
    assert kpm.dtype == torch.bool and kpm[0].tolist() == [False] * 4 + [True] * 8
    assert torch.equal(batch["input_ids"][kpm], torch.zeros(12, dtype=torch.int64))


def test_bos_eos_for_translation_and_no_mixing_with_cls(bpe):
    ids = bpe.encode(["Ein Hund"], add_cls=False, add_bos=True, add_eos=True)["input_ids"][0].tolist()
    assert ids[0] == bpe.bos_id == 1 and ids[-1] == bpe.eos_id == 2
    with pytest.raises(ValueError, match="add_cls must be False"):
        bpe.encode(["Ein Hund"], add_bos=True)


def test_joint_vocabulary_covers_source_and_target():
    src, tgt = ["ein Hund läuft", "zwei Katzen"] * 3, ["a dog runs", "two cats"] * 3
    tok = TextTokenizer.train(src + tgt, vocab_size=100, min_frequency=1)
    ids = tok.encode(src[:2] + tgt[:2], add_cls=False)["input_ids"]
    assert tok.unk_id not in ids.tolist()[0] + ids.tolist()[3]


def test_decode_drops_padding_and_rejects_ids_outside_the_vocabulary(wordpiece):
    ids = wordpiece.encode(["the cat", "the cat sat on the mat"])["input_ids"]
    assert wordpiece.decode_batch(ids) == ["the cat", "the cat sat on the mat"]
    with pytest.raises(ValueError, match=rf"ids must lie in \[0, {wordpiece.vocab_size}\)"):
        wordpiece.decode([4, 999, 5])


def test_texts_must_be_strings(wordpiece):
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str; got float"):
        wordpiece.encode(["fine", float("nan")])


def _word_level(tmp_path: Path, vocab: dict[str, int]) -> Path:
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>" if "<unk>" in vocab else None))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "user" / "tokenizer.json"
    path.parent.mkdir(parents=True)
    tok.save(str(path))
    return path


def test_load_finds_special_ids_in_a_users_roberta_style_vocabulary(tmp_path):
    path = _word_level(tmp_path, {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "hello": 4, "world": 5})
    tok = TextTokenizer.load(path)
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.bos_id, tok.eos_id, tok.unk_id) == (1, 0, 2, 0, 2, 3)
    assert tok.encode(["hello world", "hello"])["input_ids"].tolist() == [[0, 4, 5, 2], [0, 4, 2, 1]]


def test_load_without_a_padding_token_is_a_clear_error(tmp_path):
    path = _word_level(tmp_path, {"hello": 0, "world": 1})
    with pytest.raises(ValueError, match=r"must have a padding token \(\[PAD\] or <pad>\)") as info:
        TextTokenizer.load(path)
    assert str(path) in str(info.value)
    tok = TextTokenizer.load(_word_level(tmp_path / "b", {"[PAD]": 0, "hello": 1}))
    with pytest.raises(ValueError, match=r"add_cls=True needs \[CLS\] and \[SEP\]"):
        tok.encode(["hello"])


def test_load_of_a_file_that_is_not_a_tokenizer_names_it(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="could not read .*tokenizer.json as a Hugging Face tokenizer.json"):
        TextTokenizer.load(path)


# ---------------------------------------------------------------------------- SentimentDataset


def test_sentiment_dataset_items_are_unpadded_dicts(wordpiece):
    ds = SentimentDataset(["the cat sat", "a fine film and story", ""], [1, 0, 1], wordpiece, max_length=16)
    item = ds[1]
    assert set(item) == {"input_ids", "attention_mask", "label"}
    assert item["input_ids"].dtype == torch.int64 and item["input_ids"].shape == (7,)
    assert item["input_ids"][0] == wordpiece.cls_id and item["input_ids"][-1] == wordpiece.sep_id
    assert item["attention_mask"].tolist() == [1] * 7
    assert item["label"].dtype == torch.int64 and item["label"].shape == () and int(item["label"]) == 0
    assert ds.lengths.tolist() == [5, 7, 2] and len(ds) == 3


def test_sentiment_batches_pad_to_the_longest_in_the_batch(wordpiece):
    ds = SentimentDataset(["the cat sat", "a fine film and story", ""], [1, 0, 1], wordpiece, max_length=16)
    inputs, labels = ds.get_batch([0, 2])
    assert inputs["input_ids"].shape == (2, 5) and inputs["attention_mask"].shape == (2, 5)
    assert inputs["input_ids"].dtype == inputs["attention_mask"].dtype == labels.dtype == torch.int64
    assert inputs["attention_mask"].tolist() == [[1] * 5, [1, 1, 0, 0, 0]]
    assert inputs["input_ids"][1].tolist() == [4, 5, 0, 0, 0] and labels.tolist() == [1, 1]
    assert ds.get_batch([0, 1, 2])[0]["input_ids"].shape == (3, 7)
    collated, collated_labels = ds.collate([ds[0], ds[2]])
    assert torch.equal(collated["input_ids"], inputs["input_ids"]) and torch.equal(collated_labels, labels)
    assert torch.equal(collated["attention_mask"], inputs["attention_mask"])


def test_sentiment_dataset_truncates_with_one_warning(wordpiece):
    with pytest.warns(UserWarning, match="2 of 3 texts were longer than max_length=4") as record:
        ds = SentimentDataset(["the cat sat", "a fine film and story", "the"], [1, 0, 1], wordpiece, max_length=4)
    assert len(record) == 1 and record[0].filename == __file__
    assert ds.lengths.tolist() == [4, 4, 3]


def test_sentiment_dataset_needs_one_label_per_text(wordpiece):
    with pytest.raises(ValueError, match="got 2 texts and 3 labels"):
        SentimentDataset(["a", "b"], [0, 1, 1], wordpiece)
