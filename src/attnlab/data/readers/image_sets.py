"""Image classification data sets in memory (:class:`ImageTensorDataset`), scikit-learn's
digits (:func:`load_digits_dataset`) and any image folder (:class:`ImageFolder`); CIFAR-10
is in :mod:`attnlab.data.readers.cifar`.

Every data set here yields ``(image, label)`` pairs where ``image`` is a ``uint8``
tensor ``(C, H, W)`` (RGB, or one grey channel) before ``transform``, and ``label``
an ``int``. A ``transform`` is any callable taking and returning a tensor (see
:mod:`attnlab.data.transforms.images`; its ``ToFloat`` turns ``uint8`` into ``float``).

All data sets expose ``.classes`` (names; index = label), ``.targets`` (an ``int64``
tensor ``(N,)``) and ``.images``: one ``uint8`` tensor ``(N, C, H, W)`` when every
image has the same size, else a list of ``(C, H, W)`` tensors. Images are decoded
once, when the data set is built, so an epoch never decodes a file again.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ...errors import InputError
from .image_decode import Images, _check_choice, _decode_or_raise, _readable, _warn_skipped, decode_images
from .image_extensions import IMG_EXTENSIONS
from .image_scan import _broken_links, _duplicates, _scan

__all__ = ["ImageTensorDataset", "ImageFolder", "load_digits_dataset"]

Transform = Callable[[Tensor], Tensor]


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


# ---------------------------------------------------------------------------- image folder


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
