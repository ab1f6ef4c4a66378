"""Data sets: paths, digits, ImageFolder, CIFAR-10 (pickled fixtures, safe unpickling, real data)."""

import collections
import io
import os
import pickle
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.data import (
    CIFAR10,
    CIFAR10_CLASSES,
    ImageFolder,
    ImageTensorDataset,
    data_dir,
    decode_images,
    load_cifar_batch,
    load_digits_dataset,
    require,
)
from attnlab.data.readers.images import decode_image

# ---------------------------------------------------------------------------- paths


def test_data_dir_prefers_explicit_then_env_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_DATA_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert data_dir() == tmp_path / "env"
    monkeypatch.delenv("ATTNLAB_DATA_DIR")
    assert data_dir() == tmp_path / "home" / ".cache" / "attnlab"


def test_require_returns_first_existing_candidate(tmp_path):
    (tmp_path / "b").mkdir()
    assert require([tmp_path / "a", tmp_path / "b"], "thing") == tmp_path / "b"


def test_require_names_missing_path_and_download_command(tmp_path):
    missing = tmp_path / "cifar10"
    with pytest.raises(FileNotFoundError) as info:
        require(missing, "cifar10", tmp_path)
    message = str(info.value)
    assert str(missing) in message
    assert f"attnlab data download cifar10 --data-dir {tmp_path}" in message


# ---------------------------------------------------------------------------- digits


def test_digits_splits_partition_all_1797_images():
    train, test, full = (load_digits_dataset(s) for s in ("train", "test", "all"))
    assert (len(train), len(test), len(full)) == (1437, 360, 1797)

    def rows(ds):
        return collections.Counter((ds.images[i].numpy().tobytes(), int(ds.targets[i])) for i in range(len(ds)))

    assert rows(train) + rows(test) == rows(full)


def test_digits_split_is_stratified():
    full = torch.bincount(load_digits_dataset("all").targets, minlength=10).double()
    for split, share in (("train", 0.8), ("test", 0.2)):
        counts = torch.bincount(load_digits_dataset(split).targets, minlength=10).double()
        assert torch.all((counts - share * full).abs() <= 1.0), (split, counts, share * full)


def test_digits_split_is_deterministic_and_follows_the_seed():
    a, b = load_digits_dataset("test", seed=3), load_digits_dataset("test", seed=3)
    c = load_digits_dataset("test", seed=4)
    assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.images, c.images)


def test_digits_images_are_uint8_1x8x8_scaled_to_255():
    from sklearn.datasets import load_digits

    raw = load_digits()
    ds = load_digits_dataset("all")
    assert ds.images.shape == (1797, 1, 8, 8) and ds.images.dtype == torch.uint8
    assert ds.classes == [str(d) for d in range(10)]
    i = 5
    expected = np.rint(raw.images[i] * 255 / 16)
    assert np.array_equal(ds.images[i, 0].numpy(), expected)
    assert int(ds.images.max()) == 255 and int(ds.images.min()) == 0
    assert torch.equal(ds.targets, torch.from_numpy(raw.target).long())
    image, label = ds[i]
    assert image.shape == (1, 8, 8) and label == int(raw.target[i])


@pytest.mark.parametrize("kwargs", [{"split": "val"}, {"test_fraction": 0.0}, {"test_fraction": 1.0}])
def test_digits_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError, match="split|test_fraction"):
        load_digits_dataset(**kwargs)


def test_digits_applies_transform():
    ds = load_digits_dataset("test", transform=lambda x: x.float() / 255)
    image, _ = ds[0]
    assert image.dtype == torch.float32 and float(image.max()) <= 1.0


# ---------------------------------------------------------------------------- ImageFolder


def _save(path: Path, array: np.ndarray, fmt: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path, format=fmt)


def _solid(rgb, h=4, w=5):
    return np.broadcast_to(np.array(rgb, dtype=np.uint8), (h, w, 3)).copy()


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "imgs"
    _save(root / "cat" / "a.png", _solid((255, 0, 0)))
    _save(root / "cat" / "b.JPG", _solid((0, 255, 0)), "JPEG")
    _save(root / "dog" / "c.jpeg", _solid((0, 0, 255)), "JPEG")
    _save(root / "dog" / "nested" / "d.bmp", _solid((10, 20, 30)))
    _save(root / "bird" / "e.png", np.full((4, 5), 77, np.uint8))  # greyscale file
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def test_image_folder_finds_sorted_classes_and_labels(folder):
    ds = ImageFolder(folder)
    assert ds.classes == ["bird", "cat", "dog"]
    assert ds.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    names = [Path(p).name for p, _ in ds.samples]
    assert names == ["e.png", "a.png", "b.JPG", "c.jpeg", "d.bmp"]
    assert ds.targets.tolist() == [0, 1, 1, 2, 2]


def test_image_folder_caches_one_uint8_tensor(folder):
    ds = ImageFolder(folder)
    assert isinstance(ds.images, torch.Tensor)
    assert ds.images.shape == (5, 3, 4, 5) and ds.images.dtype == torch.uint8
    image, label = ds[1]  # a.png: lossless pure red
    assert label == 1
    assert image[:, 2, 3].tolist() == [255, 0, 0]
    assert ds[0][0][:, 0, 0].tolist() == [77, 77, 77]  # grey file expanded to RGB
    assert ds[4][0][:, 1, 1].tolist() == [10, 20, 30]  # BMP, lossless


def test_image_folder_grey_mode_gives_one_channel(folder):
    ds = ImageFolder(folder, mode="L")
    assert ds.images.shape == (5, 1, 4, 5)
    assert int(ds.images[0, 0, 0, 0]) == 77


def test_image_folder_without_cache_decodes_on_access(folder):
    cached, lazy = ImageFolder(folder), ImageFolder(folder, cache=False)
    assert lazy.images is None and len(lazy) == 5
    for i in range(5):
        assert torch.equal(lazy[i][0], cached[i][0])


def test_image_folder_keeps_a_list_when_sizes_differ(tmp_path):
    _save(tmp_path / "a" / "1.png", _solid((1, 2, 3), 4, 4))
    _save(tmp_path / "a" / "2.png", _solid((1, 2, 3), 6, 3))
    ds = ImageFolder(tmp_path)
    assert isinstance(ds.images, list)
    assert [tuple(im.shape) for im in ds.images] == [(3, 4, 4), (3, 6, 3)]
    assert ds[1][0].shape == (3, 6, 3)


def test_image_folder_transform_cannot_corrupt_cache(folder):
    ds = ImageFolder(folder, transform=lambda x: x.zero_())
    assert int(ds[1][0].sum()) == 0
    assert ds.images[1, 0, 0, 0] == 255


def test_image_folder_explicit_classes_fix_the_order(folder):
    ds = ImageFolder(folder, classes=["dog", "cat"])
    assert ds.classes == ["dog", "cat"]
    assert ds.targets.tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="missing: horse"):
        ImageFolder(folder, classes=["dog", "horse"])


def test_image_folder_corrupt_file_raises_naming_it(folder):
    bad = folder / "cat" / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    with pytest.raises(ValueError, match="broken.jpg"):
        ImageFolder(folder)
    lazy = ImageFolder(folder, cache=False)
    index = [Path(p).name for p, _ in lazy.samples].index("broken.jpg")
    with pytest.raises(ValueError, match="broken.jpg"):
        lazy[index]


def test_image_folder_truncated_file_raises_naming_it(folder):
    good = io.BytesIO()
    Image.fromarray(_solid((9, 9, 9), 16, 16)).save(good, format="PNG")
    (folder / "cat" / "cut.png").write_bytes(good.getvalue()[:-30])
    with pytest.raises(ValueError, match="cut.png"):
        ImageFolder(folder)


@pytest.mark.parametrize("cache", [True, False])
def test_image_folder_skip_mode_warns_and_drops_the_file(folder, cache):
    (folder / "cat" / "broken.png").write_bytes(b"garbage")
    with pytest.warns(UserWarning) as caught:
        ds = ImageFolder(folder, on_error="skip", cache=cache)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2 and "broken.png" in messages[0] and "not images" in messages[1]  # one line each kind
    assert "notes.txt" in messages[1] and ds.skipped == 2
    assert len(ds) == 5
    assert "broken.png" not in [Path(p).name for p, _ in ds.samples]
    assert ds.targets.tolist() == [0, 1, 1, 2, 2]


def test_image_folder_parallel_decoding_matches_serial(tmp_path):
    gen = np.random.default_rng(0)
    for i in range(80):
        _save(tmp_path / f"c{i % 3}" / f"{i:03d}.png", gen.integers(0, 256, (6, 7, 3), dtype=np.uint8))
    serial, parallel = ImageFolder(tmp_path, workers=1), ImageFolder(tmp_path, workers=2)
    assert torch.equal(serial.images, parallel.images) and serial.images.shape == (80, 3, 6, 7)
    (tmp_path / "c1" / "050.png").write_bytes(b"nope")
    with pytest.raises(ValueError, match="050.png"):
        ImageFolder(tmp_path, workers=2)


def test_decode_images_reports_kept_indices(tmp_path):
    _save(tmp_path / "a.png", _solid((1, 1, 1)))
    (tmp_path / "b.png").write_bytes(b"x")
    _save(tmp_path / "c.png", _solid((2, 2, 2)))
    with pytest.warns(UserWarning, match="b.png"):
        images, kept = decode_images([tmp_path / n for n in ("a.png", "b.png", "c.png")], on_error="skip")
    assert kept == [0, 2] and images.shape == (2, 3, 4, 5)


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_a_decoded_image_is_writable_and_turns_into_a_tensor_silently(tmp_path, mode):
    Image.new(mode, (5, 4), 7).save(tmp_path / "x.png")
    with Image.open(tmp_path / "x.png") as im:
        arr = decode_image(im, mode)
    assert arr.flags.writeable and arr.flags.c_contiguous and arr.shape == (len(mode), 4, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a read-only array
        torch.from_numpy(arr)


def test_image_folder_errors_for_missing_empty_or_classless_roots(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ImageFolder(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="no class folders"):
        ImageFolder(tmp_path)
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(ValueError, match="empty_class"):
        ImageFolder(tmp_path)


def test_image_tensor_dataset_checks_lengths_and_labels():
    images = torch.zeros(3, 1, 2, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match="targets must have shape"):
        ImageTensorDataset(images, [0, 1], ["a", "b"])
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 2\)"):
        ImageTensorDataset(images, [0, 1, 2], ["a", "b"])


# ---------------------------------------------------------------------------- CIFAR-10 pickles


class _Py2Pickler(pickle._Pickler):
    """Writes Python-2-style protocol-2 pickles, as the original CIFAR files are: every
    string is a py2 `str` (BINSTRING), arrays come from `numpy.core.multiarray`."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = _save_py2_str
    dispatch[bytes] = _save_py2_str


def _dump(obj, path: Path, style: str) -> None:
    if style == "py3":  # pickle protocol 2 from Python 3: bytes go through _codecs.encode
        path.write_bytes(pickle.dumps(obj, protocol=2))
    else:
        buf = io.BytesIO()
        _Py2Pickler(buf, protocol=2).dump(obj)
        path.write_bytes(buf.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n"))


def _write_cifar_pickles(root: Path, rows: int = 3, style: str = "py3") -> dict[str, tuple[np.ndarray, list[int]]]:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    gen = np.random.default_rng(1)
    written = {}
    for n, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        data = gen.integers(0, 256, (rows, 3072), dtype=np.uint8)
        labels = [int(v) for v in (np.arange(rows) + n) % 10]
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [f"{name}_{i}.png".encode() for i in range(rows)]}
        _dump(batch, folder / name, style)
        written[name] = (data, labels)
    meta = {b"num_cases_per_batch": rows, b"label_names": [c.encode() for c in CIFAR10_CLASSES], b"num_vis": 3072}
    _dump(meta, folder / "batches.meta", style)
    return written


@pytest.mark.parametrize("style", ["py3", "py2"])
def test_cifar_pickles_load_with_planar_rgb_layout(tmp_path, style):
    written = _write_cifar_pickles(tmp_path, rows=3, style=style)
    test = CIFAR10(tmp_path, split="test")
    assert test.format == "pickle" and len(test) == 3
    assert test.images.shape == (3, 3, 32, 32) and test.images.dtype == torch.uint8
    data, labels = written["test_batch"]
    assert test.targets.tolist() == labels
    # A row is 1024 red values, then 1024 green, then 1024 blue, each 32x32 row-major.
    for c, y, x in [(0, 0, 0), (0, 1, 2), (1, 3, 4), (2, 31, 30), (2, 5, 0)]:
        assert int(test.images[2, c, y, x]) == int(data[2, c * 1024 + y * 32 + x]), (c, y, x)
    assert test.classes == list(CIFAR10_CLASSES)


def test_cifar_pickled_red_pixel_reads_as_red(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    row = np.zeros((1, 3072), np.uint8)
    row[0, 0 * 1024 + 7 * 32 + 9] = 255  # red plane, y=7, x=9
    row[0, 2 * 1024 + 0 * 32 + 31] = 200  # blue plane, y=0, x=31
    _dump({b"data": row, b"labels": [3]}, folder / "test_batch", "py3")
    image, label = CIFAR10(tmp_path, split="test")[0]
    pil = Image.fromarray(image.permute(1, 2, 0).numpy())
    assert pil.getpixel((9, 7)) == (255, 0, 0)
    assert pil.getpixel((31, 0)) == (0, 0, 200)
    assert label == 3


def test_cifar_train_concatenates_the_five_batches_in_order(tmp_path):
    written = _write_cifar_pickles(tmp_path, rows=2)
    train = CIFAR10(tmp_path, split="train", format="pickle")
    assert len(train) == 10
    expected = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)]).reshape(10, 3, 32, 32)
    assert np.array_equal(train.images.numpy(), expected)
    assert train.targets.tolist() == sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])


def test_cifar_missing_batch_names_the_file_and_the_download(tmp_path):
    _write_cifar_pickles(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_4.*attnlab data download cifar10"):
        CIFAR10(tmp_path, split="train")


def test_cifar_missing_everything_names_both_layouts(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        CIFAR10(tmp_path)
    assert "cifar-10-batches-py" in str(info.value) and str(tmp_path / "cifar10") in str(info.value)


def test_cifar_rejects_wrong_row_size(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    _dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, folder / "test_batch", "py3")
    with pytest.raises(ValueError, match="test_batch.*3072"):
        CIFAR10(tmp_path, split="test")


def _write_cifar_folder(root: Path, split: str = "test", per_class: int = 2) -> None:
    gen = np.random.default_rng(2)
    for c in CIFAR10_CLASSES:
        for i in range(per_class):
            _save(root / "cifar10" / split / c / f"{i:04d}.png", gen.integers(0, 256, (32, 32, 3), dtype=np.uint8))


def test_cifar_folder_layout_loads(tmp_path):
    _write_cifar_folder(tmp_path)
    ds = CIFAR10(tmp_path, split="test")
    assert ds.format == "folder"
    assert ds.images.shape == (20, 3, 32, 32)
    assert ds.targets.tolist() == [i // 2 for i in range(20)]
    assert ds.classes == list(CIFAR10_CLASSES)


def test_cifar_auto_prefers_pickled_batches(tmp_path):
    _write_cifar_folder(tmp_path)
    _write_cifar_pickles(tmp_path, rows=3)
    assert CIFAR10(tmp_path, split="test").format == "pickle"
    assert len(CIFAR10(tmp_path, split="test", format="folder")) == 20


def test_cifar_default_root_comes_from_env(tmp_path, monkeypatch):
    _write_cifar_pickles(tmp_path, rows=1)
    monkeypatch.setenv("ATTNLAB_DATA_DIR", str(tmp_path))
    assert len(CIFAR10(split="test")) == 1


# ---------------------------------------------------------------------------- unsafe pickles


class _Shell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Exec:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_exec_payload_runs_under_plain_pickle(tmp_path):
    # The control for the tests below: this payload is live when nothing restricts it.
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(_Exec(marker), protocol=2))
    assert marker.exists()


@pytest.mark.parametrize("payload", [_Shell, _Exec])
def test_malicious_cifar_batch_is_refused_and_does_not_run(tmp_path, payload):
    marker = tmp_path / "pwned"
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    evil = {b"data": payload(marker), b"labels": [0]}
    (folder / "test_batch").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load global .*test_batch"):
        CIFAR10(tmp_path, split="test")
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_cifar_batch(folder / "test_batch")
    assert not marker.exists()


@pytest.mark.parametrize(
    "global_name", [b"numpy\nload\n", b"builtins\ngetattr\n", b"numpy.core.multiarray\nfromfile\n", b"posix\nsystem\n"]
)
def test_unpickler_refuses_globals_beyond_array_reconstruction(tmp_path, global_name):
    path = tmp_path / "batch"
    path.write_bytes(b"\x80\x02c" + global_name + b".")
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_cifar_batch(path)


def test_unpickler_refuses_codecs_other_than_latin1(tmp_path):
    path = tmp_path / "batch"
    # _codecs.encode("x", "utf-16"): the only _codecs call py3 pickles need is latin1.
    call = b"c_codecs\nencode\n" + b"X\x01\x00\x00\x00x" + b"X\x06\x00\x00\x00utf-16" + b"\x86R."
    path.write_bytes(b"\x80\x02" + call)
    with pytest.raises(pickle.UnpicklingError, match="latin1"):
        load_cifar_batch(path)


# ---------------------------------------------------------------------------- the real data


def _real_data_root() -> Path | None:
    env = os.environ.get("ATTNLAB_DATA_DIR")
    return Path(env) if env and (Path(env) / "cifar10").is_dir() else None


_needs_real_data = pytest.mark.skipif(
    _real_data_root() is None,
    reason="real CIFAR-10 absent: set ATTNLAB_DATA_DIR to a folder holding cifar10/ (make test uses ../shared/data)",
)


@_needs_real_data
def test_real_cifar10_test_split():
    # ~10,000 JPEG decodes: a few seconds on two cores.
    ds = CIFAR10(_real_data_root(), split="test", format="folder")
    assert ds.images.shape == (10_000, 3, 32, 32) and ds.images.dtype == torch.uint8
    assert torch.bincount(ds.targets, minlength=10).tolist() == [1000] * 10
    image, label = ds[0]
    assert image.shape == (3, 32, 32) and label == 0
    assert 60 < float(ds.images.float().mean()) < 190  # real pictures, not blank decodes


@pytest.mark.slow
@_needs_real_data
def test_real_cifar10_train_split():
    # Slow (opt-in with -m slow): 50,000 JPEG decodes take 10-20 s on two cores.
    ds = CIFAR10(_real_data_root(), split="train", format="folder")
    assert ds.images.shape == (50_000, 3, 32, 32)
    assert torch.bincount(ds.targets, minlength=10).tolist() == [5000] * 10
