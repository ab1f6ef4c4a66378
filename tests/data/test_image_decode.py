"""Images over Pillow's pixel limit are named with their size, the limit and what to do (by
decode_images, a lazy ImageFolder and the task's read_image), and an image that is skipped
says what to do about it."""

import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from attnlab.data import ImageFolder, decode_images


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


# ---------------------------------------------------------------------------- images skipped


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
