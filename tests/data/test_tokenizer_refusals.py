"""Tokenizer files and vocabularies: a bad tokenizer.json gives a one-line ``ValueError`` that names
the file and says what is wrong; a vocabulary past the cap (MAX_VOCAB) is refused in files and
in training; a truncation warning says how long max_length must be and which recipe key sets it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.data import SentimentDataset, TextTokenizer
from attnlab.data.batches.translation import TranslationDataset
from attnlab.data.tokenizers.lm import BPETokenizer, load_tokenizer
from attnlab.data.tokenizers.text import MAX_VOCAB, check_vocab_size
from attnlab.errors import InputError


# ---------------------------------------------------------------------------- tokenizer.json


def _load_error(path: Path) -> str:
    with pytest.raises(ValueError) as info:
        TextTokenizer.load(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_empty_tokenizer_json_says_it_is_empty(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"")
    message = _load_error(path)
    assert str(path) in message and "is empty" in message


def test_tokenizer_json_that_is_not_json_says_where(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"version": "1.0",\n "model": oops}')
    message = _load_error(path)
    assert str(path) in message and "not valid JSON" in message and "line 2" in message


@pytest.mark.parametrize("text, got", [("[]", "a JSON array"), ('"tokenizer"', "a JSON string")])
def test_tokenizer_json_that_is_not_an_object_says_what_it_holds(tmp_path, text, got):
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    message = _load_error(path)
    assert str(path) in message and "JSON object" in message and got in message


def test_tokenizer_json_without_a_model_says_so(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("{}")
    message = _load_error(path)
    assert str(path) in message and 'no "model"' in message


def test_tokenizer_json_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes('{"model": {"type": "WordPiece", "vocab": {"caf\xe9": 0}}}'.encode("latin-1"))
    message = _load_error(path)
    assert str(path) in message and "not UTF-8" in message and "0xe9" in message


def test_tokenizer_json_that_is_a_folder_is_a_value_error(tmp_path):
    path = tmp_path / "tok" / "tokenizer.json"
    path.mkdir(parents=True)
    for given in (path, path.parent):
        message = _load_error(given)
        assert str(path) in message and "is a folder" in message


def test_unreadable_tokenizer_json_is_a_value_error_naming_it(tmp_path, monkeypatch):
    good = TextTokenizer.train(["the cat sat on the mat"] * 3, vocab_size=40, min_frequency=1)
    path = good.save(tmp_path / "tok")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    monkeypatch.setattr(Path, "read_text", denied)
    monkeypatch.setattr(Path, "open", denied)
    message = _load_error(path)
    assert str(path) in message and "Permission denied" in message


# ---------------------------------------------------------------------------- vocabularies


def test_the_vocabulary_cap():
    check_vocab_size(MAX_VOCAB, "vocab_size")
    with pytest.raises(InputError, match=r"^vocab_size must be at most 1,048,576 tokens .*; got 1,048,577$"):
        check_vocab_size(MAX_VOCAB + 1, "vocab_size")


@pytest.fixture(scope="module")
def huge_vocab(tmp_path_factory) -> Path:
    """A WordLevel tokenizer.json of MAX_VOCAB + 1 words (about 20 MB)."""
    path = tmp_path_factory.mktemp("vocab") / "tokenizer.json"
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(MAX_VOCAB - 1)}}
    model = {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    path.write_text(json.dumps({"version": "1.0", "model": model}))
    return path


@pytest.mark.parametrize("load", [load_tokenizer, BPETokenizer.load, TextTokenizer.load])
def test_a_tokenizer_file_with_too_many_words_is_refused_naming_it(huge_vocab, load):
    with pytest.raises(InputError, match=rf"^the vocabulary of {huge_vocab} must be at most 1,048,576 tokens "
                                         rf".*; got 1,048,577$"):
        load(huge_vocab)


def test_a_char_tokenizer_file_with_too_many_characters_is_refused(tmp_path):
    chars = [chr(c) for c in range(0x20, 0x110000) if not 0xD800 <= c < 0xE000][:MAX_VOCAB + 1]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"attnlab_tokenizer": "char", "chars": chars}))
    with pytest.raises(InputError, match=r"must be at most 1,048,576 tokens .*; got 1,048,577$"):
        load_tokenizer(path)


def test_a_vocabulary_to_learn_is_capped_too(tmp_path, capsys):
    with pytest.raises(InputError, match=r"^vocab_size must be at most 1,048,576 tokens .*; got 10,000,000,000$"):
        BPETokenizer.train("some text", vocab_size=10**10)
    with pytest.raises(InputError, match=r"^vocab_size must be at most 1,048,576 tokens .*; got 10,000,000,000$"):
        TextTokenizer.train(["some text"], "wordpiece", 10**10)
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"a text {i},{i % 2}\n" for i in range(20)))
    assert main(["recipes", "text-classification", f"data.train={data}", "text.vocab_size=10000000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "text.vocab_size must be <= 1048576; got 10000000000" in err


# ---------------------------------------------------------------------------- warnings that say what to do


@pytest.fixture(scope="module")
def wordpiece():
    texts = ["the cat sat on the mat", "a dog ran in the park", "a fine funny film and story"] * 3
    return TextTokenizer.train(texts, vocab_size=100, min_frequency=1)


def _one_warning(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert "\n" not in message
    return result, message


def test_tokenize_truncation_warning_says_how_long_max_length_must_be(wordpiece):
    _, message = _one_warning(lambda: wordpiece.encode(["the cat sat on the mat", "the film"], max_length=5))
    assert message.startswith("1 of 2 texts were longer than max_length=5 tokens and were truncated")
    assert "pass max_length=8 or more to keep them whole" in message


def test_sentiment_dataset_truncation_warning_names_the_recipe_setting(wordpiece):
    _, message = _one_warning(lambda: SentimentDataset(["the cat sat on the mat", "the"], [1, 0], wordpiece, 4))
    assert message.startswith("1 of 2 texts were longer than max_length=4 tokens and were truncated")
    assert "raise max_length (text.max_length in a recipe) to 8 or more to keep them whole" in message


def test_translation_truncation_warning_names_the_argument_to_raise(wordpiece):
    pairs = [("the cat sat on the mat", "the film"), ("the", "a dog")]
    _, message = _one_warning(lambda: TranslationDataset(pairs, wordpiece, wordpiece, 4, 64))
    assert message.startswith("1 of 2 source texts are longer than 3 tokens and were truncated")
    assert "raise max_source_length (text.max_length in a recipe) to 7 or more to keep them whole" in message
