"""Bad data files give one-line ``ValueError``s that name the file and say what is wrong
(CIFAR-10 pickles, images over Pillow's pixel limit, tokenizer.json files), and the data
warnings say what the user can do about them."""

import gzip
import pickle
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from attnlab.data import CIFAR10, ImageFolder, SentimentDataset, TextTokenizer, decode_images, load_cifar_batch
from attnlab.data.batches.translation import TranslationDataset

# ---------------------------------------------------------------------------- CIFAR-10 pickles

UNSAFE_ADVICE = re.compile(r"pickle\.load|allow_pickle|weights_only|unsafe|trust", re.IGNORECASE)


def _batch(n: int = 2) -> dict:
    return {b"batch_label": b"testing batch 1 of 1", b"labels": list(range(n)),
            b"data": np.zeros((n, 3 * 32 * 32), np.uint8), b"filenames": [b"a.png"] * n}


def _write_test_batch(tmp_path: Path, payload: bytes) -> Path:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir(exist_ok=True)
    path = folder / "test_batch"
    path.write_bytes(payload)
    return path


def _cifar_error(tmp_path: Path) -> str:
    with pytest.raises(ValueError) as info:
        CIFAR10(tmp_path, split="test", format="pickle")
    message = str(info.value)
    assert "\n" not in message and not UNSAFE_ADVICE.search(message)
    return message


def test_cifar_batch_naming_a_forbidden_global_is_a_value_error_naming_the_file(tmp_path):
    path = _write_test_batch(tmp_path, b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueq\x00\x85R.")
    message = _cifar_error(tmp_path)
    assert str(path) in message and "os.system" in message and "corrupt or malicious" in message


def test_cifar_batch_cut_in_half_says_it_is_truncated(tmp_path):
    whole = pickle.dumps(_batch(), protocol=2)
    path = _write_test_batch(tmp_path, whole[: len(whole) // 2])
    message = _cifar_error(tmp_path)
    assert str(path) in message and "truncated" in message


def test_cifar_batch_missing_only_its_last_byte_says_it_is_truncated(tmp_path):
    path = _write_test_batch(tmp_path, pickle.dumps(_batch(), protocol=2)[:-1])
    message = _cifar_error(tmp_path)
    assert str(path) in message and "truncated" in message


def test_empty_cifar_batch_says_it_is_empty(tmp_path):
    path = _write_test_batch(tmp_path, b"")
    message = _cifar_error(tmp_path)
    assert str(path) in message and "empty" in message


def test_cifar_batch_that_is_not_a_pickle_names_the_file(tmp_path):
    path = _write_test_batch(tmp_path, gzip.compress(pickle.dumps(_batch(), protocol=2)))
    message = _cifar_error(tmp_path)
    assert str(path) in message and "not a CIFAR-10 batch" in message


def test_cifar_batch_holding_a_list_says_a_dict_with_data_and_labels_is_expected(tmp_path):
    path = _write_test_batch(tmp_path, pickle.dumps([np.zeros((2, 3072), np.uint8), [0, 1]], protocol=2))
    message = _cifar_error(tmp_path)
    assert str(path) in message and "got a list" in message and "'data' and 'labels'" in message


def test_cifar_batch_dict_without_data_and_labels_lists_its_keys(tmp_path):
    # keys of mixed types: the message must still list them
    path = _write_test_batch(tmp_path, pickle.dumps({b"batch_label": b"x", 7: b"y"}, protocol=2))
    message = _cifar_error(tmp_path)
    assert str(path) in message and "'data' and 'labels'" in message and "batch_label" in message


def test_cifar_batch_with_ragged_labels_names_the_file(tmp_path):
    batch = _batch()
    batch[b"labels"] = [[0], [1, 2]]
    path = _write_test_batch(tmp_path, pickle.dumps(batch, protocol=2))
    message = _cifar_error(tmp_path)
    assert str(path) in message and "labels" in message


def test_cifar_meta_with_label_names_not_a_list_names_the_file(tmp_path):
    _write_test_batch(tmp_path, pickle.dumps(_batch(), protocol=2))
    meta = tmp_path / "cifar-10-batches-py" / "batches.meta"
    meta.write_bytes(pickle.dumps({b"label_names": 10, b"num_vis": 3072}, protocol=2))
    message = _cifar_error(tmp_path)
    assert str(meta) in message and "label_names" in message


def test_cifar_batch_with_a_forged_dtype_state_is_refused_before_it_can_crash_python(tmp_path):
    """numpy applies a pickled dtype state unchecked; a forged one crashes the interpreter
    when the dtype is used. Run in a child process, so that a crash fails this test only."""
    batch = tmp_path / "data_batch_1"
    forge = (
        "import pickle, sys, numpy as np\n"
        "class Forged:\n"
        "    def __reduce__(self):\n"
        "        return (np.dtype, ('i8', False, True), (3, '<', None, -1, -1, 0))\n"
        "open(sys.argv[1], 'wb').write(pickle.dumps({b'data': Forged(), b'labels': [0]}, protocol=2))\n"
    )
    subprocess.run([sys.executable, "-c", forge, str(batch)], check=True, timeout=60)
    load = ("import sys\nfrom attnlab.data import load_cifar_batch\n"
            "try:\n    load_cifar_batch(sys.argv[1])['data'].itemsize\n"
            "except ValueError as exc:\n    print(exc)\n")
    r = subprocess.run([sys.executable, "-c", load, str(batch)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"the child process died ({r.returncode}): {r.stderr[-500:]}"
    assert "refusing a numpy dtype whose pickled state" in r.stdout and str(batch) in r.stdout


def test_load_cifar_batch_refusal_is_a_value_error(tmp_path):
    path = tmp_path / "data_batch_1"
    path.write_bytes(b"\x80\x02cbuiltins\neval\n.")
    with pytest.raises(ValueError, match=r"refusing to load global builtins\.eval") as info:
        load_cifar_batch(path)
    assert str(path) in str(info.value) and not UNSAFE_ADVICE.search(str(info.value))


# ---------------------------------------------------------------------------- images over Pillow's limit


@pytest.fixture
def big_png(tmp_path, monkeypatch):
    """A 20x10 PNG (200 pixels) with Pillow's limit lowered to 2 x 40 = 80 pixels."""
    path = tmp_path / "pics" / "cat" / "huge.png"
    path.parent.mkdir(parents=True)
    Image.fromarray(np.full((10, 20, 3), 128, np.uint8)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40)
    return path


def _assert_too_large(message: str, path: Path) -> None:
    assert str(path) in message and "\n" not in message
    assert "200 pixels" in message and "80" in message  # its size and the limit
    assert "downscale" in message


def test_decode_images_names_an_image_over_the_pixel_limit_and_says_what_to_do(big_png):
    with pytest.raises(ValueError) as info:
        decode_images([big_png])
    _assert_too_large(str(info.value), big_png)


def test_lazy_image_folder_names_an_image_over_the_pixel_limit(big_png, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    lazy = ImageFolder(big_png.parent.parent, cache=False)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40)
    with pytest.raises(ValueError) as info:
        lazy[0]
    _assert_too_large(str(info.value), big_png)


def test_read_image_names_an_image_over_the_pixel_limit(big_png):
    from attnlab.tasks.image_classification import read_image

    with pytest.raises(ValueError) as info:
        read_image(big_png, "RGB", (32, 32))
    _assert_too_large(str(info.value), big_png)


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


def test_skipped_image_warning_says_what_to_do(tmp_path):
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(good)
    bad.write_bytes(b"not a png")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, kept = decode_images([good, bad], on_error="skip")
    assert kept == [0] and len(caught) == 1
    message = str(caught[0].message)
    assert str(bad) in message and "skipping it" in message and "replace it with a readable image" in message


def test_image_folder_too_large_image_is_skipped_with_advice(big_png):
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(big_png.parent / "small.png")
    with pytest.warns(UserWarning) as record:
        ds = ImageFolder(big_png.parent.parent, on_error="skip")
    assert len(ds) == 1
    message = str(record[0].message)
    _assert_too_large(message, big_png)
    assert "skipping it" in message
