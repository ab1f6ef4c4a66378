"""MR: Movie Review sentence polarity v1.0 (Pang & Lee, 2005).

10,662 sentences, 5,331 positive (``mr/rt-polarity.pos``) and 5,331 negative
(``mr/rt-polarity.neg``), already lower-cased and tokenized. The files are
Windows-1252 bytes, not UTF-8: ``clich\\xe9s`` is "clichés", and ``0x85``, ``0x91``,
``0x96``, ``0x97`` are "…", "‘", "–", "—" (Latin-1 would make these control characters).

There is no official split. The standard protocol (Kim, 2014) is 10-fold
cross-validation: :func:`mr_folds`. :func:`mr_split` is a fixed 80/10/10
train/dev/test split for quick runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from torch import Tensor

from ...errors import InputError
from ..paths import data_dir, require
from .text import MAX_LINE_CHARS, read_lines

__all__ = ["MR_ENCODING", "load_mr", "mr_folds", "mr_split"]

MR_ENCODING = "cp1252"


def load_mr(root: str | Path | None = None, *, max_line_chars: int = MAX_LINE_CHARS) -> tuple[list[str], list[int]]:
    """``(sentences, labels)``: the 5,331 positive sentences (label 1) in file order,
    then the 5,331 negative ones (label 0).

    ``root`` is the data directory (default :func:`~attnlab.data.paths.data_dir`),
    holding ``mr/rt-polarity.pos`` and ``mr/rt-polarity.neg``. Each line is stripped of
    surrounding whitespace (most end with a space). A line longer than ``max_line_chars``
    characters is an error (``data.max_line_chars``; see :func:`~attnlab.data.readers.text.iter_lines`).
    """
    root = data_dir(root)
    sentences: list[str] = []
    labels: list[int] = []
    for name, label in (("rt-polarity.pos", 1), ("rt-polarity.neg", 0)):
        path = require(root / "mr" / name, "mr", root)
        lines = [line.strip() for line in read_lines(path, MR_ENCODING, max_line_chars=max_line_chars)]
        sentences += lines
        labels += [label] * len(lines)
    return sentences, labels


def _labels(labels: Sequence[int] | Tensor | np.ndarray) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or len(y) == 0 or not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"labels must be a non-empty 1-D sequence of integers; got {y.dtype} of shape {y.shape}")
    return y


def mr_folds(
    labels: Sequence[int] | Tensor | np.ndarray, k: int = 10, seed: int = 0
) -> list[tuple[list[int], list[int]]]:
    """Stratified ``k``-fold cross-validation: ``k`` pairs ``(train_idx, test_idx)``.

    Every index lies in exactly one ``test_idx``, and in the ``train_idx`` of every other
    fold; each fold keeps the class proportions of ``labels`` (within one sentence per
    class). Indices are sorted ``int`` lists; the folds depend only on ``labels``, ``k``
    and ``seed``. Works for any labels, e.g. ``mr_folds(load_mr()[1])``.
    """
    y = _labels(labels)
    counts = np.bincount(y - y.min())
    smallest = int(counts[counts > 0].min())
    if not isinstance(k, int) or k < 2 or k > smallest:
        raise InputError(f"k must be an integer in [2, {smallest}] (the smallest class size); got {k!r}")
    from sklearn.model_selection import StratifiedKFold  # imported here: sklearn is slow to import

    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    return [(sorted(tr.tolist()), sorted(te.tolist())) for tr, te in splitter.split(np.zeros(len(y)), y)]


def mr_split(
    labels: Sequence[int] | Tensor | np.ndarray, seed: int = 0, dev_fraction: float = 0.1, test_fraction: float = 0.1
) -> tuple[list[int], list[int], list[int]]:
    """A fixed stratified ``(train_idx, dev_idx, test_idx)`` split, by default 80/10/10.

    The three parts partition ``range(len(labels))``; indices are sorted ``int`` lists
    that depend only on ``labels``, the fractions and ``seed``. For MR's 10,662
    sentences: 8,530 / 1,066 / 1,066.
    """
    y = _labels(labels)
    for name, value in (("dev_fraction", dev_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < value < 1.0:
            raise InputError(f"{name} must be in (0, 1); got {value!r}")
    if dev_fraction + test_fraction >= 1.0:
        raise InputError(f"dev_fraction + test_fraction must be below 1; got {dev_fraction} + {test_fraction}")
    from sklearn.model_selection import train_test_split

    index = np.arange(len(y))
    n_test = max(1, round(test_fraction * len(y)))
    n_dev = max(1, round(dev_fraction * len(y)))
    rest, test = train_test_split(index, test_size=n_test, stratify=y, random_state=seed)
    train, dev = train_test_split(rest, test_size=n_dev, stratify=y[rest], random_state=seed)
    return sorted(train.tolist()), sorted(dev.tolist()), sorted(test.tolist())
