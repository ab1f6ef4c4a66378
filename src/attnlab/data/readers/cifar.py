"""CIFAR-10 (:class:`CIFAR10`): the original pickled batches, read with a restricted
unpickler that refuses every global but numpy's array machinery (:func:`load_cifar_batch`),
or image folders ``cifar10/{train,test}/<class>/*.jpg``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...errors import InputError
from .image_sets import ImageFolder, ImageTensorDataset, Transform, _describe
from .image_decode import _check_choice
from ..paths import data_dir, require

__all__ = ["CIFAR10_CLASSES", "CIFAR10", "load_cifar_batch", "CifarBatchError"]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


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
