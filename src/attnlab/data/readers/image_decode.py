"""Decoding image files safely with Pillow: any mode to ``"RGB"`` or ``"L"``, EXIF
orientation, resizing (:func:`decode_image`); a decompression bomb or a damaged file named
in one line (:func:`decompression_bomb_sizes`); many files on a pool of threads, raising for
or skipping those that cannot be decoded (:func:`decode_images`).
"""

from __future__ import annotations

import io
import os
import re
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

from ...errors import InputError

__all__ = ["decode_image", "decode_images", "decompression_bomb_sizes"]

Images = Tensor | list[Tensor]


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")


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


def _readable(path: str) -> Exception | None:
    """``None`` when Pillow recognizes ``path`` as an image (its header only: cheap), else the error."""
    try:
        with Image.open(path) as im:
            im.size  # noqa: B018  (parsed with the header)
        return None
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ... for bad files
        return e
