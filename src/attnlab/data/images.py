"""Image classification data sets: digits, any image folder, CIFAR-10.

Every data set here yields ``(image, label)`` pairs where ``image`` is a ``uint8``
tensor ``(C, H, W)`` (RGB, or one grey channel) before ``transform``, and ``label``
an ``int``. A ``transform`` is any callable taking and returning a tensor (see
:mod:`attnlab.data.transforms`; its ``ToFloat`` turns ``uint8`` into ``float``).

All data sets expose ``.classes`` (names; index = label), ``.targets`` (an ``int64``
tensor ``(N,)``) and ``.images``: one ``uint8`` tensor ``(N, C, H, W)`` when every
image has the same size, else a list of ``(C, H, W)`` tensors. Images are decoded
once, when the data set is built, so an epoch never decodes a file again.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import stat
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor
from torch.utils.data import Dataset

from ..errors import InputError
from .paths import data_dir, require

__all__ = [
    "IMG_EXTENSIONS",
    "CIFAR10_CLASSES",
    "ImageTensorDataset",
    "ImageFolder",
    "CIFAR10",
    "decode_images",
    "decode_image",
    "scan_images",
    "load_digits_dataset",
    "load_cifar_batch",
    "CifarBatchError",
]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

Transform = Callable[[Tensor], Tensor]
Images = Tensor | list[Tensor]


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")


def _describe(images: Images | None) -> str:
    if images is None:
        return "not cached"
    if isinstance(images, Tensor):
        return "(" + ", ".join(str(s) for s in images.shape) + ") uint8"
    return f"{len(images)} images of mixed sizes"


class ImageTensorDataset(Dataset):
    """Images already in memory, with labels and class names.

    Args:
        images: ``uint8`` tensor ``(N, C, H, W)``, or a list of ``N`` tensors ``(C, H, W)``.
        targets: ``(N,)`` labels in ``[0, len(classes))``.
        classes: class names; label ``i`` is ``classes[i]``.
        transform: applied to each ``(C, H, W)`` image on access.
    """

    def __init__(
        self,
        images: Images,
        targets: Tensor | Sequence[int],
        classes: Sequence[str],
        transform: Transform | None = None,
    ) -> None:
        if isinstance(images, Tensor):
            if images.dim() != 4:
                raise InputError(f"images must be a (N, C, H, W) tensor; got shape {tuple(images.shape)}")
        elif not all(isinstance(im, Tensor) and im.dim() == 3 for im in images):
            raise InputError("images must be a (N, C, H, W) tensor or a list of (C, H, W) tensors")
        targets = torch.as_tensor(targets, dtype=torch.long)
        if targets.dim() != 1 or len(targets) != len(images):
            raise InputError(
                f"targets must have shape ({len(images)},) to match images; got {tuple(targets.shape)}"
            )
        if len(targets) and (int(targets.min()) < 0 or int(targets.max()) >= len(classes)):
            raise InputError(
                f"targets must lie in [0, {len(classes)}) for {len(classes)} classes; "
                f"got values in [{int(targets.min())}, {int(targets.max())}]"
            )
        self.images = images
        self.targets = targets
        self.classes = list(classes)
        self.transform = transform

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        # A copy, so that a transform working in place cannot corrupt the cache.
        image = self.images[index].clone()
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[index])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n={len(self)}, classes={len(self.classes)}, "
            f"images={_describe(self.images)}, transform={self.transform!r})"
        )


# ---------------------------------------------------------------------------- digits


def load_digits_dataset(
    split: str = "train",
    test_fraction: float = 0.2,
    seed: int = 0,
    transform: Transform | None = None,
) -> ImageTensorDataset:
    """scikit-learn's bundled 8x8 digits (1,797 images, 10 classes; no download).

    Images are ``(1, 8, 8)`` ``uint8``, the original 0..16 grey levels scaled to
    0..255. ``split="train"``/``"test"`` is a stratified split (every class keeps its
    share in both parts) that depends only on ``test_fraction`` and ``seed``;
    ``"all"`` is every image in scikit-learn's order. Classes are ``"0"`` .. ``"9"``.
    """
    _check_choice("split", split, ("train", "test", "all"))
    if not 0.0 < test_fraction < 1.0:
        raise InputError(f"test_fraction must be in (0, 1); got {test_fraction!r}")
    from sklearn.datasets import load_digits  # imported here: sklearn is slow to import
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    pixels = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)[:, None]  # (N, 1, 8, 8)
    labels = digits.target.astype(np.int64)
    if split != "all":
        train_idx, test_idx = train_test_split(
            np.arange(len(labels)), test_size=test_fraction, stratify=labels, random_state=seed
        )
        keep = np.sort(train_idx if split == "train" else test_idx)
        pixels, labels = pixels[keep], labels[keep]
    classes = [str(d) for d in range(10)]
    images = torch.from_numpy(np.ascontiguousarray(pixels))
    return ImageTensorDataset(images, torch.from_numpy(labels), classes, transform)


# ---------------------------------------------------------------------------- decoding


def _to_mode(im: Image.Image, mode: str) -> Image.Image:
    """``im`` in ``mode`` ("RGB" or "L"), whatever it was: 16- and 32-bit grey scaled to
    8 bits (Pillow's own conversion clips them to white), palette images through RGBA so
    their transparency is read, alpha dropped."""
    if im.mode == mode:
        return im
    if im.mode.startswith("I"):  # I;16, I;16B, I;16L, I (32-bit): scale the top of the range to 255
        array = np.asarray(im, dtype=np.float64)
        top = 65535.0 if im.mode.startswith("I;16") or array.max(initial=0) <= 65535 else float(array.max())
        im = Image.fromarray(np.clip(np.rint(array * (255.0 / max(top, 1.0))), 0, 255).astype(np.uint8), "L")
    elif im.mode == "F":
        array = np.asarray(im, dtype=np.float64)
        top = 1.0 if array.max(initial=0) <= 1.0 else 255.0
        im = Image.fromarray(np.clip(np.rint(array * (255.0 / top)), 0, 255).astype(np.uint8), "L")
    elif im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    return im if im.mode == mode else im.convert(mode)


def decode_image(im: Image.Image, mode: str, size: int | None = None, resize: str = "crop") -> np.ndarray:
    """An opened PIL image -> ``(C, H, W)`` uint8 array: EXIF orientation applied, converted
    to ``mode`` (any source mode: see ``_to_mode``), and with ``size`` resized to ``size`` x
    ``size`` (``resize="crop"``: the shorter side to ``size``, then the centre cropped;
    ``"squash"``: both sides, the aspect ratio lost). Raises whatever Pillow raises."""
    if size is not None and im.format == "JPEG":
        # Decode at the smallest power-of-two reduction still >= the target (libjpeg's DCT
        # scaling): a 12-megapixel photo read for 64x64 decodes ~40x fewer pixels.
        w, h = im.size
        scale = size / min(w, h)  # both sides stay >= size, for "crop" and "squash" alike
        im.draft(None, (max(1, int(w * scale)), max(1, int(h * scale))))
    if size is not None or im.getexif():
        im = ImageOps.exif_transpose(im)
    im = _to_mode(im, mode)
    if size is not None and im.size != (size, size):
        if resize == "crop":
            w, h = im.size
            side = min(w, h)  # the centred square, then one resize (ImageOps.fit, with reducing_gap)
            box = ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)
            im = im.resize((size, size), Image.BILINEAR, box=box, reducing_gap=3.0)
        else:
            im = im.resize((size, size), Image.BILINEAR, reducing_gap=3.0)
    arr = np.asarray(im)
    arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    # contiguous and writable: a grey image's array is Pillow's own, read-only, and
    # torch.from_numpy warns on it at every prediction
    return np.require(arr, requirements=["C", "W"])


def _decode(path: str, mode: str, size: int | None = None, resize: str = "crop") -> np.ndarray:
    """One image file -> ``(C, H, W)`` uint8 array (see :func:`decode_image`)."""
    with open(path, "rb") as f:
        data = f.read()  # one read, then decode from memory: cheaper than Pillow's small reads
    with Image.open(io.BytesIO(data)) as im:
        return decode_image(im, mode, size, resize)


def decompression_bomb_sizes(exc: Exception) -> tuple[str, str]:
    """``(pixels, limit)`` of a ``DecompressionBombError``, formatted ``"1,234"``, read
    from Pillow's message ("Image size (N pixels) exceeds limit of M pixels, ...")."""
    pixels = re.search(r"\((\d+) pixels\)", str(exc))
    limit = re.search(r"limit of (\d+) pixels", str(exc))
    max_pixels = Image.MAX_IMAGE_PIXELS
    return (
        f"{int(pixels.group(1)):,}" if pixels else "more than that",
        f"{int(limit.group(1)):,}" if limit else f"{2 * max_pixels:,}" if max_pixels else "?",
    )


def _decode_failure(path: str, exc: Exception) -> tuple[str, str]:
    """``(what happened, what the user can do)`` when ``path`` cannot be decoded."""
    if isinstance(exc, Image.DecompressionBombError):
        pixels, limit = decompression_bomb_sizes(exc)
        return (
            f"image file {path} is too large to decode safely: {pixels} pixels, more than Pillow's limit of "
            f"{limit} pixels (2 x PIL.Image.MAX_IMAGE_PIXELS, a guard against decompression bombs)",
            "downscale it, or if you trust the file raise PIL.Image.MAX_IMAGE_PIXELS",
        )
    # Pillow's own message names the in-memory buffer (<_io.BytesIO object at 0x...>), not the file
    detail = "not an image format Pillow recognizes" if isinstance(exc, Image.UnidentifiedImageError) else exc
    return (
        f"cannot decode image file {path}: {type(exc).__name__}: {detail}",
        "replace it with a readable image to use it, or delete it to silence this warning",
    )


def _decode_error(path: str, exc: Exception) -> InputError:
    what, todo = _decode_failure(path, exc)
    if isinstance(exc, Image.DecompressionBombError):
        what = f"{what}; {todo}"
    return InputError(what)


def _decode_or_raise(path: str, mode: str, size: int | None = None, resize: str = "crop") -> np.ndarray:
    try:
        return _decode(path, mode, size, resize)
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ... for bad files
        raise _decode_error(path, e) from e


def _decode_chunk(paths: Sequence[str], mode: str, size: int | None = None,
                  resize: str = "crop") -> list[np.ndarray | Exception]:
    out: list[np.ndarray | Exception] = []
    for p in paths:
        try:
            out.append(_decode(p, mode, size, resize))
        except Exception as e:
            out.append(e)
    return out


def _warn_skipped(failures: Sequence[tuple[str, Exception]], stacklevel: int = 3) -> None:
    """One warning for every file that could not be decoded: the first in full, the next few by name."""
    if not failures:
        return
    what, todo = _decode_failure(*failures[0])
    if len(failures) == 1:
        warnings.warn(f"{what}; skipping it ({todo})", stacklevel=stacklevel)
        return
    names = ", ".join(Path(p).name for p, _ in failures[1:4]) + (" ..." if len(failures) > 4 else "")
    warnings.warn(f"skipping {len(failures)} image files that cannot be decoded; the first: {what}; the others "
                  f"include {names} ({todo})", stacklevel=stacklevel)


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def decode_images(
    paths: Sequence[str | Path],
    mode: str = "RGB",
    *,
    workers: int | None = None,
    on_error: str = "raise",
    size: int | None = None,
    resize: str = "crop",
) -> tuple[Images, list[int]]:
    """Decode image files with Pillow on a pool of threads.

    Args:
        paths: image files.
        mode: ``"RGB"`` (3 channels) or ``"L"`` (1 grey channel); others are converted
            (16-bit grey scaled to 8 bits, EXIF orientation applied when resizing).
        workers: threads; default one per available core. ``0`` or ``1``: this thread only.
        on_error: ``"raise"``: a file that cannot be decoded raises ``ValueError``
            naming it. ``"skip"``: it is left out, with one warning naming the skipped files.
        size: resize every image to ``size`` x ``size`` (``None``: keep each file's size).
        resize: ``"crop"`` (shorter side to ``size``, centre crop) or ``"squash"``.

    Returns:
        ``(images, kept)``: ``images`` is one ``uint8`` tensor ``(N, C, H, W)`` when all
        decoded images share a size, else a list of ``(C, H, W)`` tensors; ``kept``
        holds the index into ``paths`` of each returned image.
    """
    _check_choice("mode", mode, ("RGB", "L"))
    _check_choice("on_error", on_error, ("raise", "skip"))
    _check_choice("resize", resize, ("crop", "squash"))
    paths = [str(p) for p in paths]
    workers = _default_workers() if workers is None else workers
    if workers < 0:
        raise InputError(f"workers must be >= 0; got {workers}")

    # Threads, not processes: Pillow drops the GIL in its C decoder and copies, and a
    # thread pool needs no fork of a process that holds torch's thread pools. Pillow
    # parses JPEG headers in Python, so two threads gain ~1.5x on an idle 2-core box,
    # not 2x (measured on CIFAR-10's 32x32 JPEGs; a process pool did no better).
    if workers <= 1 or len(paths) < 64:
        results: list[np.ndarray | Exception] = _decode_chunk(paths, mode, size, resize)
    else:
        per_chunk = max(16, min(512, -(-len(paths) // (workers * 8))))
        chunks = [paths[i : i + per_chunk] for i in range(0, len(paths), per_chunk)]
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="attnlab-decode") as pool:
            results = [r for chunk in pool.map(_decode_chunk, chunks, [mode] * len(chunks), [size] * len(chunks),
                                               [resize] * len(chunks)) for r in chunk]

    arrays: list[np.ndarray] = []
    kept: list[int] = []
    failures: list[tuple[str, Exception]] = []
    for i, r in enumerate(results):
        if isinstance(r, Exception):
            if on_error == "raise":
                raise _decode_error(paths[i], r) from r
            failures.append((paths[i], r))
            continue
        arrays.append(r)
        kept.append(i)
    del results
    _warn_skipped(failures)
    if arrays and all(a.shape == arrays[0].shape for a in arrays):
        return torch.from_numpy(np.stack(arrays)), kept
    return [torch.from_numpy(a) for a in arrays], kept


# ---------------------------------------------------------------------------- image folder


@dataclass
class _Found:
    """What a scan of an image folder found besides the images it lists."""

    others: list[str] = field(default_factory=list)  # files that are not images (by extension)
    broken: list[str] = field(default_factory=list)  # image names that are links to nothing
    # (path, its class, the path listed first for the same file, that one's class)
    duplicates: list[tuple[str, int, str, int]] = field(default_factory=list)


def _class_folders(root: Path) -> list[str]:
    """The class folders of ``root``, sorted, hidden ones left out. A name that is not valid
    UTF-8 (Linux hands it over with surrogate escapes) trains, then breaks the report and
    ``predict --json``, which write class names out: refused here, naming its bytes."""
    with os.scandir(root) as entries:
        found = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    for name in found:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"class folder {os.fsencode(name)!r} in {root}: its name is not valid UTF-8; rename it "
                             f"(class names are written into reports and JSON)") from None
    return found


def _key(path: str | Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of what ``path`` resolves to (``None``: it resolves to nothing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _take_file(entry: os.DirEntry, label: int, seen: dict[tuple[int, int], tuple[str, int]],
               images: list[str], found: _Found) -> None:
    """Sort one file of a class folder into ``images`` or one of ``found``'s lists."""
    if not entry.name.lower().endswith(IMG_EXTENSIONS):
        found.others.append(entry.path)
        return
    try:
        st = entry.stat()  # (of the target, for a link)
    except OSError:
        if entry.is_symlink():  # its target is gone, or it is a loop of links
            found.broken.append(entry.path)
        else:  # (decoding will name what is wrong with it)
            images.append(entry.path)
        return
    if not stat.S_ISREG(st.st_mode):  # a pipe or device named like an image: opening it could block
        found.others.append(entry.path)
        return
    first = seen.setdefault((st.st_dev, st.st_ino), (entry.path, label))
    if first[0] != entry.path:  # a link, or a hard link, to a file listed already
        found.duplicates.append((entry.path, label, *first))
        return
    images.append(entry.path)


def _walk(top: str, label: int, visited: set[tuple[int, int]], seen: dict[tuple[int, int], tuple[str, int]],
          found: _Found) -> list[str]:
    """The images under ``top`` in ``os.walk``'s order with sorted names (a folder's files, then
    its sub-folders one by one). Links to files and folders are followed, but never into a folder
    in ``visited`` (which this extends): a link to a parent would repeat the tree ~40 times, and
    two such links never end."""
    images: list[str] = []
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:  # a folder that cannot be listed is passed over, as os.walk does
            continue
        subfolders = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if not entry.is_dir():
                _take_file(entry, label, seen, images, found)
                continue
            key = _key(entry.path)
            if key is not None and key not in visited:
                visited.add(key)
                subfolders.append(entry.path)
        pending += reversed(subfolders)
    return images


def _scan(root: Path, classes: Sequence[str] | None, missing_ok: bool = False,
          ) -> tuple[list[str], list[tuple[str, int]], _Found]:
    """``(classes, [(file, label), ...], what else was found)`` of ``root/<class>/...``; each file
    is listed once, under its first name in that order (see :class:`_Found` for the others).
    ``missing_ok``: classes given without a folder (or with an empty one) have no samples
    instead of an error."""
    if not root.exists():
        raise FileNotFoundError(f"root must be an existing folder of class folders; {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"root must be a folder of class folders (root/<class>/<image>); {root} is a file")
    found = _class_folders(root)
    if classes is None:
        if not found:
            raise InputError(
                f"root must hold one folder per class (root/<class>/<image>); found no class folders in {root}"
            )
        classes = found
    else:
        classes = list(classes)
        if len(set(classes)) != len(classes) or not classes:
            raise InputError(f"classes must be a non-empty list of distinct folder names; got {classes}")
        missing = [c for c in classes if c not in found]
        if missing and not missing_ok:
            raise InputError(f"classes must name folders of {root}; missing: {', '.join(missing)}")

    # The root and every class folder count as visited from the start: a link to one of them
    # from inside a class is a loop, or would file another class's images under this one.
    visited = {k for k in map(_key, [root, *(root / name for name in found)]) if k is not None}
    seen: dict[tuple[int, int], tuple[str, int]] = {}
    extra = _Found()
    samples: list[tuple[str, int]] = []
    empty: list[str] = []
    for index, name in enumerate(classes):
        if name not in found:
            continue
        files = _walk(str(root / name), index, visited, seen, extra)
        if not files:
            empty.append(name)
        samples += [(f, index) for f in files]
    if empty and not missing_ok:
        raise InputError(
            f"every class folder must hold images ({', '.join(IMG_EXTENSIONS)}); "
            f"none in {', '.join(str(root / e) for e in empty)}"
        )
    return list(classes), samples, extra


def scan_images(root: str | Path, classes: Sequence[str] | None = None, *,
                missing_ok: bool = False) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """``(classes, [(image file, label), ...], class folders found)`` of ``root/<class>/...``
    without opening a file (see :class:`ImageFolder` for ``classes`` and ``missing_ok``).
    Each file is listed once, as :class:`ImageFolder` lists it; broken links and the second
    names of a file are left out without a warning (:class:`ImageFolder` gives it)."""
    root = Path(root).expanduser()
    classes, samples, _ = _scan(root, classes, missing_ok)
    return classes, samples, _class_folders(root)


def _link_target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _broken_links(root: Path, broken: Sequence[str], on_error: str) -> int:
    """Raise for the first broken link (``on_error="raise"``) or warn once about them all; their number."""
    if not broken:
        return 0
    if on_error == "raise":
        raise InputError(f"image file {broken[0]} is a broken symbolic link: its target {_link_target(broken[0])} "
                         f"does not exist; fix or delete the link, or pass on_error='skip' to skip such files")
    names = ", ".join(f"{os.path.relpath(p, root)} -> {_link_target(p)}" for p in broken[:3])
    more = " ..." if len(broken) > 3 else ""
    warnings.warn(f"skipping {len(broken)} broken symbolic link{'s' if len(broken) > 1 else ''} in {root} "
                  f"(their targets do not exist): {names}{more}", stacklevel=3)
    return len(broken)


def _duplicates(root: Path, classes: Sequence[str], duplicates: Sequence[tuple[str, int, str, int]]) -> int:
    """One warning for the files left out as second names of a file already listed; their number."""
    if not duplicates:
        return 0
    n = len(duplicates)

    def rel(path: str) -> str:
        return os.path.relpath(path, root)

    named = ", ".join(f"{rel(p)} is {rel(first)}" for p, _, first, _ in duplicates[:2]) + (" ..." if n > 2 else "")
    message = (f"skipping {n} duplicate image file{'s' if n > 1 else ''} in {root}, other names (symbolic or hard "
               f"links) of a file listed already, so that each file is read once: {named}")
    conflicts = [d for d in duplicates if d[1] != d[3]]
    if conflicts:
        path, label, first, first_label = conflicts[0]
        verb = "is" if len(conflicts) == 1 else "are"
        message += (f"; {len(conflicts)} of them {verb} in another class folder than the file's first name, and the "
                    f"file counts in that first class only: {rel(path)} (class {classes[label]!r}) is {rel(first)} "
                    f"(class {classes[first_label]!r})")
    warnings.warn(message, stacklevel=3)
    return n


def _readable(path: str) -> Exception | None:
    """``None`` when Pillow recognizes ``path`` as an image (its header only: cheap), else the error."""
    try:
        with Image.open(path) as im:
            im.size  # noqa: B018  (parsed with the header)
        return None
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ... for bad files
        return e


class ImageFolder(ImageTensorDataset):
    """Images laid out as ``root/<class>/<file>`` (nested folders inside a class count too).

    Args:
        root: the folder holding one folder per class.
        transform: applied to each ``uint8`` ``(C, H, W)`` image on access.
        classes: class folder names, in label order. Default: every folder of ``root``,
            sorted. Folders not named here are ignored.
        on_error: ``"raise"``: an unreadable image (or a broken link named like one) raises
            ``ValueError`` naming the file. ``"skip"``: unreadable images, broken links and
            files that are not images are dropped, with one warning for each kind that
            counts them and names the first few (checked while building
            the data set, so ``len`` is final even with ``cache=False``: decoded when
            cached, else by reading each file's header).
        cache: decode every image now and keep them in ``.images`` (one ``uint8``
            tensor ``(N, C, H, W)`` when sizes agree, as in CIFAR-10 or with ``size``;
            else a list). ``False``: decode a file at each access (streaming, for data
            sets larger than memory; use DataLoader workers to decode beside training).
        mode: ``"RGB"`` (3 channels) or ``"L"`` (1 grey channel); any file mode is converted.
        workers: decoding threads; default one per available core.
        size: resize every image to ``size`` x ``size``; ``None``: keep each file's size.
        resize: ``"crop"`` (the shorter side to ``size``, the centre cropped) or ``"squash"``.
        missing_ok: with ``classes``, a class without a folder or images has no samples
            (a test folder that lacks a class) instead of being an error.

    Files are the extensions in ``IMG_EXTENSIONS`` (any case). Symbolic links to files and
    folders are followed, but never into a folder already visited (the root, a class folder,
    or one seen through another link), and a file reached by two names (links, hard links)
    is read once, under the first name in sorted order, with one warning (a file in two
    class folders stays in the first class). A class folder whose name is not valid UTF-8
    is refused. ``samples`` lists ``(path, label)``; ``targets`` is an ``int64`` tensor;
    ``skipped`` the files left out.
    """

    def __init__(
        self,
        root: str | Path,
        transform: Transform | None = None,
        classes: Sequence[str] | None = None,
        on_error: str = "raise",
        cache: bool = True,
        *,
        mode: str = "RGB",
        workers: int | None = None,
        size: int | None = None,
        resize: str = "crop",
        missing_ok: bool = False,
    ) -> None:
        _check_choice("on_error", on_error, ("raise", "skip"))
        _check_choice("mode", mode, ("RGB", "L"))
        _check_choice("resize", resize, ("crop", "squash"))
        if size is not None and (not isinstance(size, int) or size < 1):
            raise InputError(f"size must be a positive number of pixels or None; got {size!r}")
        self.root = Path(root).expanduser()
        self.mode, self.size, self.resize, self.on_error = mode, size, resize, on_error
        classes, samples, found = _scan(self.root, classes, missing_ok)
        left_out = _broken_links(self.root, found.broken, on_error) + _duplicates(self.root, classes, found.duplicates)
        others = found.others if on_error == "skip" else []
        images: Images | None = None
        unreadable = 0
        if cache:
            images, kept = decode_images([p for p, _ in samples], mode, workers=workers, on_error=on_error,
                                         size=size, resize=resize)  # (warns once for what it skips)
            unreadable = len(samples) - len(kept)
            samples = [samples[i] for i in kept]
        elif on_error == "skip":
            checked = [(p, t, _readable(p)) for p, t in samples]
            failures = [(p, e) for p, _, e in checked if e is not None]
            samples = [(p, t) for p, t, e in checked if e is None]
            unreadable = len(failures)
            _warn_skipped(failures, stacklevel=2)
        if others:
            names = ", ".join(Path(p).name for p in others[:3]) + (" ..." if len(others) > 3 else "")
            warnings.warn(f"skipping {len(others)} files of {self.root} that are not images "
                          f"({', '.join(IMG_EXTENSIONS)}): {names}", stacklevel=2)
        if not samples:
            raise InputError(f"root must hold at least one readable image; every image in {self.root} failed")
        self.samples = samples
        self.skipped = len(others) + unreadable + left_out
        targets = torch.tensor([t for _, t in samples], dtype=torch.long)
        if images is not None:
            super().__init__(images, targets, classes, transform)
        else:  # nothing in memory to check against the targets
            self.images, self.targets, self.classes, self.transform = None, targets, list(classes), transform

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        if self.images is not None:
            return super().__getitem__(index)
        path, target = self.samples[index]
        try:
            image = torch.from_numpy(_decode_or_raise(path, self.mode, self.size, self.resize))
        except InputError:
            if self.on_error == "raise" or len(self) == 1:
                raise
            # Its header read, but the file is damaged further in: another image takes its place,
            # so that a long run does not stop here (the skip mode's promise).
            warnings.warn(f"{path} cannot be decoded (its header could); image {index + 1} of {len(self)} "
                          f"is replaced by the next one", stacklevel=2)
            return self[(index + 1) % len(self)]
        if self.transform is not None:
            image = self.transform(image)
        return image, target

    def __repr__(self) -> str:
        return (
            f"ImageFolder(root={str(self.root)!r}, n={len(self)}, classes={len(self.classes)}, "
            f"mode={self.mode!r}, size={self.size}, images={_describe(self.images)}, transform={self.transform!r})"
        )


# ---------------------------------------------------------------------------- CIFAR-10 pickles


def _numpy_global(*candidates: tuple[str, str]) -> Any:
    import importlib

    for module, name in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return None


class CifarBatchError(InputError, pickle.UnpicklingError):
    """A CIFAR batch file that cannot be read safely (refused, truncated, empty or not a
    pickle). A ``ValueError``, so that the command line prints one line, and a
    ``pickle.UnpicklingError``, which :func:`load_cifar_batch` raised before."""


class _Refused(pickle.UnpicklingError):
    """The pickle asks for something a CIFAR batch never needs (raised while unpickling)."""


_REFETCH = "delete it and fetch a fresh copy (attnlab data download cifar10)"


def _latin1_encode(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    # Python 3 writes `bytes` into protocol-2 pickles as _codecs.encode(text, "latin1").
    if encoding.lower().replace("-", "").replace("_", "") not in ("latin1", "iso88591"):
        raise _Refused(f"refusing _codecs.encode with encoding {encoding!r} (only latin1 is allowed)")
    return text.encode("latin1", errors)


def _allowed_globals() -> dict[tuple[str, str], Any]:
    # numpy moved numpy.core to numpy._core in 2.0; pickles name whichever wrote them.
    reconstruct = _numpy_global(("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"))
    scalar = _numpy_global(("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"))
    frombuffer = _numpy_global(("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"))
    table: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for package in ("numpy.core", "numpy._core"):
        table[(f"{package}.multiarray", "_reconstruct")] = reconstruct
        table[(f"{package}.multiarray", "scalar")] = scalar  # numpy scalars, e.g. np.int64 labels
        table[(f"{package}.numeric", "_frombuffer")] = frombuffer  # arrays in protocol-5 pickles
    table[("_codecs", "encode")] = _latin1_encode
    return {k: v for k, v in table.items() if v is not None}


class _RestrictedUnpickler(pickle._Unpickler):
    """Unpickler for CIFAR batches: resolves only the numpy array machinery.

    A pickle runs code by naming a global (``os.system``, ``builtins.eval``) and calling
    it; refusing every global but a handful of constructors makes loading safe. One of
    those, ``numpy.dtype``, applies the state a pickle gives it without checking it, and a
    forged state crashes the interpreter; so a dtype's state must be the one its type
    string gives. That check needs the BUILD opcode, which only the pure-Python unpickler
    lets a subclass see; a batch is one large byte string and two lists, so it costs
    milliseconds.
    """

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: Any, source: str) -> None:
        super().__init__(file, encoding="bytes")  # Python 2 `str` -> bytes, as the original files need
        self.source = source
        self.allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        obj = self.allowed.get((module, name))
        if obj is None:
            raise _Refused(f"refusing to load global {module}.{name}")
        return obj

    def load_build(self) -> None:
        inst, state = self.stack[-2], self.stack[-1]
        if isinstance(inst, np.dtype):
            # (Python 2 pickles, read with encoding="bytes", give the byte order as b'|')
            if type(state) is not tuple or tuple(_text(v) for v in state) != inst.__reduce__()[2]:
                raise _Refused(f"refusing a numpy dtype whose pickled state {state!r} is not that of {inst.str!r}")
            self.stack.pop()  # the state is the one the dtype already has
            return
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def _text(value: Any) -> Any:
    return value.decode("latin1") if isinstance(value, bytes) else value


def _a(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def load_cifar_batch(path: str | Path) -> dict[str, Any]:
    """Read one pickled CIFAR batch safely; keys come back as ``str``.

    Only numpy array reconstruction is allowed while unpickling; any other global
    (e.g. ``os.system``) raises :class:`CifarBatchError` (a ``ValueError`` and a
    ``pickle.UnpicklingError``) before it can run. So does a file that is empty,
    truncated or not a pickle; one that holds no dict raises ``ValueError``.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise CifarBatchError(f"{path} is empty (0 bytes), not a CIFAR-10 batch; {_REFETCH}")
        try:
            obj = _RestrictedUnpickler(f, str(path)).load()
        except _Refused as exc:
            raise CifarBatchError(
                f"{exc} from {path}: a CIFAR batch holds only numpy arrays, lists, dicts and strings, "
                f"so this file is corrupt or malicious; {_REFETCH}"
            ) from None
        except EOFError:
            raise CifarBatchError(
                f"{path} is truncated: its pickle data ends early, at {size:,} bytes; {_REFETCH}"
            ) from None
        # The unpickler, like Pillow, fails on a damaged file with many types (UnpicklingError,
        # ValueError, TypeError, AttributeError, OverflowError, MemoryError, ...).
        except Exception as exc:
            if isinstance(exc, pickle.UnpicklingError) and "truncated" in str(exc):
                raise CifarBatchError(
                    f"{path} is truncated: its pickle data ends early, at {size:,} bytes; {_REFETCH}"
                ) from None
            raise CifarBatchError(
                f"{path} is not a CIFAR-10 batch (a Python pickle of a dict): it is damaged or in another "
                f"format ({type(exc).__name__}: {exc}); {_REFETCH}"
            ) from exc
    if not isinstance(obj, dict):
        raise InputError(
            f"{path} is not a CIFAR-10 batch: it must hold a pickled dict (with keys 'data' and 'labels'); "
            f"got {_a(type(obj).__name__)}"
        )
    return {_text(k): v for k, v in obj.items()}


def _read_batch(path: Path, side: int = 32) -> tuple[np.ndarray, np.ndarray]:
    batch = load_cifar_batch(path)
    if "data" not in batch or "labels" not in batch:
        keys = ", ".join(sorted(repr(k) for k in batch)) or "none"
        raise InputError(f"{path} is not a CIFAR-10 batch: it must hold keys 'data' and 'labels'; it has {keys}")
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * side * side:
        raise InputError(
            f"{path}: data must be a uint8 array (N, {3 * side * side}); got "
            f"{getattr(data, 'dtype', type(data).__name__)} {getattr(data, 'shape', '')}"
        )
    try:
        labels = np.asarray(batch["labels"])
    except ValueError:  # a ragged list of lists
        kind = type(batch["labels"]).__name__
        raise InputError(
            f"{path}: labels must be {len(data)} integers; got {_a(kind)} of items of mixed shapes"
        ) from None
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise InputError(f"{path}: labels must be {len(data)} integers; got {labels.dtype} {labels.shape}")
    # Each row is the R plane, then G, then B, each 32x32 row-major: exactly (3, 32, 32).
    return data.reshape(-1, 3, side, side), labels.astype(np.int64)


class CIFAR10(ImageTensorDataset):
    """CIFAR-10: 50,000 training and 10,000 test images, 32x32 RGB, 10 classes.

    Args:
        root: the data directory (default :func:`attnlab.data.paths.data_dir`). It holds
            ``cifar10/{train,test}/<class>/*.jpg`` (image folders) and/or the original
            ``cifar-10-batches-py/`` (``data_batch_1`` .. ``data_batch_5``, ``test_batch``,
            ``batches.meta``).
        split: ``"train"`` or ``"test"``.
        transform: applied to each ``uint8`` ``(3, 32, 32)`` image on access.
        format: ``"pickle"``, ``"folder"``, or ``"auto"``: the pickled batches when present,
            else the image folders.
        workers: decoding threads for the folder layout.

    ``classes`` is always the standard order (airplane, automobile, ..., truck);
    ``images`` is ``uint8`` ``(N, 3, 32, 32)``; ``format`` says which layout was read.
    The pickles are read with a restricted unpickler (see :func:`load_cifar_batch`).
    """

    def __init__(
        self,
        root: str | Path | None = None,
        split: str = "train",
        transform: Transform | None = None,
        format: str = "auto",
        *,
        workers: int | None = None,
    ) -> None:
        _check_choice("split", split, ("train", "test"))
        _check_choice("format", format, ("auto", "folder", "pickle"))
        self.root = data_dir(root)
        pickled, folder = self.root / "cifar-10-batches-py", self.root / "cifar10"
        if format == "auto":
            format = "pickle" if pickled.is_dir() else "folder"
            require([pickled, folder], "cifar10", self.root)
        self.format = format
        self.split = split
        if format == "pickle":
            images, targets = self._load_pickled(pickled, split)
        else:
            images, targets = self._load_folder(folder, split, workers)
        super().__init__(images, targets, CIFAR10_CLASSES, transform)

    def _load_pickled(self, folder: Path, split: str) -> tuple[Tensor, Tensor]:
        names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        parts = [_read_batch(require(folder / n, "cifar10", self.root)) for n in names]
        meta = folder / "batches.meta"
        if meta.exists():
            label_names = load_cifar_batch(meta).get("label_names", [])
            if not isinstance(label_names, (list, tuple)):
                kind = _a(type(label_names).__name__)
                raise InputError(f"{meta}: label_names must be the list {list(CIFAR10_CLASSES)}; got {kind}")
            label_names = [_text(n) for n in label_names]
            if tuple(label_names) != CIFAR10_CLASSES:
                raise InputError(f"{meta}: label_names must be {list(CIFAR10_CLASSES)}; got {label_names}")
        data = np.concatenate([d for d, _ in parts])
        labels = np.concatenate([lab for _, lab in parts])
        if len(labels) and (labels.min() < 0 or labels.max() >= len(CIFAR10_CLASSES)):
            raise InputError(f"{folder}: labels must lie in [0, 10); got [{labels.min()}, {labels.max()}]")
        return torch.from_numpy(np.ascontiguousarray(data)), torch.from_numpy(labels)

    def _load_folder(self, folder: Path, split: str, workers: int | None) -> tuple[Tensor, Tensor]:
        split_dir = require(folder / split, "cifar10", self.root)
        images = ImageFolder(split_dir, classes=CIFAR10_CLASSES, mode="RGB", workers=workers)
        if not isinstance(images.images, Tensor) or tuple(images.images.shape[1:]) != (3, 32, 32):
            raise InputError(f"{split_dir}: CIFAR-10 images must all be 32x32 RGB; got {_describe(images.images)}")
        return images.images, images.targets

    def __repr__(self) -> str:
        return (
            f"CIFAR10(root={str(self.root)!r}, split={self.split!r}, format={self.format!r}, n={len(self)}, "
            f"transform={self.transform!r})"
        )
