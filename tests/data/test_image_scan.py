"""An image folder is read as the files it holds, once each: symbolic links to folders are
followed but never into a folder already visited, a file reached by two names counts once,
broken links are skipped, and class names that are not UTF-8 are refused."""

import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from attnlab.data.readers.images import ImageFolder, scan_images
from attnlab.errors import InputError


def _image(path: Path, value: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((3, 4), value, np.uint8)).save(path)
    return path


@pytest.fixture
def root(tmp_path):
    """cat/a.png cat/b.png cat/sub/c.png dog/d.png dog/e.png: 5 images, 2 classes."""
    root = tmp_path / "imgs"
    for i, rel in enumerate(["cat/a.png", "cat/b.png", "cat/sub/c.png", "dog/d.png", "dog/e.png"]):
        _image(root / rel, 10 * i)
    return root


def _names(samples, root):
    return [(os.path.relpath(p, root), label) for p, label in samples]


EXPECTED = [("cat/a.png", 0), ("cat/b.png", 0), ("cat/sub/c.png", 0), ("dog/d.png", 1), ("dog/e.png", 1)]


def _quiet_folder(root, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return ImageFolder(root, **kwargs)


def test_a_link_to_its_own_folder_lists_each_image_once(root):
    os.symlink(".", root / "cat" / "self")
    os.symlink("..", root / "cat" / "sub" / "up")
    ds = _quiet_folder(root)
    assert _names(ds.samples, root) == EXPECTED and ds.skipped == 0


def test_a_link_to_the_root_or_another_class_is_not_entered(root):
    os.symlink("../..", root / "dog" / "top")
    os.symlink("../cat", root / "dog" / "cats")
    assert _names(_quiet_folder(root).samples, root) == EXPECTED


def test_two_loop_links_finish_quickly_and_list_each_image_once(root):
    os.symlink(".", root / "cat" / "x")
    os.symlink(".", root / "cat" / "y")
    os.symlink("..", root / "cat" / "sub" / "z")
    start = time.perf_counter()
    classes, samples, found = scan_images(root)
    assert time.perf_counter() - start < 1.0
    assert _names(samples, root) == EXPECTED and classes == found == ["cat", "dog"]


def test_a_symlink_to_an_image_of_the_same_class_counts_once_with_a_warning(root):
    os.symlink("a.png", root / "cat" / "z.png")
    with pytest.warns(UserWarning) as record:
        ds = ImageFolder(root)
    assert _names(ds.samples, root) == EXPECTED and len(ds) == 5 and ds.skipped == 1
    assert len(record) == 1
    message = str(record[0].message)
    assert "skipping 1 duplicate image file" in message and "cat/z.png is cat/a.png" in message


def test_a_hard_link_counts_once(root):
    os.link(root / "dog" / "d.png", root / "dog" / "f.png")
    with pytest.warns(UserWarning, match=r"skipping 1 duplicate image file .*dog/f\.png is dog/d\.png"):
        ds = ImageFolder(root)
    assert _names(ds.samples, root) == EXPECTED


def test_one_file_in_two_class_folders_stays_in_the_first_class_and_the_warning_says_so(root):
    os.symlink("../cat/b.png", root / "dog" / "b.png")
    with pytest.warns(UserWarning) as record:
        ds = ImageFolder(root)
    assert _names(ds.samples, root) == EXPECTED and ds.targets.tolist() == [0, 0, 0, 1, 1]
    assert len(record) == 1
    message = str(record[0].message)
    assert "1 of them is in another class" in message
    assert "dog/b.png (class 'dog') is cat/b.png (class 'cat')" in message


def test_many_duplicates_give_one_warning_with_the_count_and_two_names(root):
    for i in range(5):
        os.symlink("a.png", root / "cat" / f"z{i}.png")
    with pytest.warns(UserWarning) as record:
        ds = ImageFolder(root, cache=False)
    assert len(ds) == 5 and len(record) == 1
    message = str(record[0].message)
    assert "skipping 5 duplicate image files" in message and message.count(" is cat/a.png") == 2


def test_a_link_to_a_folder_outside_the_root_is_followed(root, tmp_path):
    elsewhere = tmp_path / "dataset"
    _image(elsewhere / "cats" / "p.png", 200)
    _image(elsewhere / "cats" / "q.png", 210)
    _image(elsewhere / "birds" / "r.png", 220)
    os.symlink(elsewhere / "cats", root / "cat" / "more")
    os.symlink(elsewhere / "birds", root / "bird")  # a class folder that is a link
    ds = _quiet_folder(root)
    assert ds.classes == ["bird", "cat", "dog"]
    assert _names(ds.samples, root) == [("bird/r.png", 0), ("cat/a.png", 1), ("cat/b.png", 1), ("cat/more/p.png", 1),
                                        ("cat/more/q.png", 1), ("cat/sub/c.png", 1), ("dog/d.png", 2),
                                        ("dog/e.png", 2)]
    assert int(ds[3][0][0, 0, 0]) == 200


def test_a_broken_link_is_skipped_with_a_warning(root):
    os.symlink("gone.png", root / "cat" / "lost.png")
    with pytest.warns(UserWarning) as record:
        ds = ImageFolder(root, on_error="skip")
    assert _names(ds.samples, root) == EXPECTED and ds.skipped == 1
    assert len(record) == 1 and "1 broken symbolic link" in str(record[0].message)
    assert "cat/lost.png -> gone.png" in str(record[0].message)


def test_a_broken_link_is_an_error_naming_it_when_errors_raise(root):
    os.symlink("gone.png", root / "cat" / "lost.png")
    with pytest.raises(InputError, match=r"cat/lost\.png is a broken symbolic link"):
        ImageFolder(root)


def test_scan_images_leaves_broken_links_and_duplicates_out(root):
    os.symlink("gone.png", root / "cat" / "lost.png")
    os.symlink("a.png", root / "cat" / "z.png")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _names(scan_images(root)[1], root) == EXPECTED


def test_a_class_folder_whose_name_is_not_utf8_is_refused(tmp_path):
    _image(tmp_path / "dog" / "d.png", 1)
    bad = os.path.join(os.fsencode(tmp_path), b"caf\xff")
    os.mkdir(bad)
    _image(Path(os.fsdecode(bad)) / "c.png", 2)
    with pytest.raises(InputError) as info:
        scan_images(tmp_path)
    assert str(info.value).startswith(f"class folder b'caf\\xff' in {tmp_path}: its name is not valid UTF-8; rename it")
    with pytest.raises(InputError, match="not valid UTF-8"):
        ImageFolder(tmp_path)


def test_an_image_whose_file_name_is_not_utf8_is_read(tmp_path):
    _image(tmp_path / "dog" / "d.png", 1)
    odd = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"cat", b"caf\xe9.png"))
    _image(Path(odd), 99)
    ds = _quiet_folder(tmp_path)
    assert ds.classes == ["cat", "dog"] and int(ds[0][0][0, 0, 0]) == 99 and ds.samples[0][0] == odd
