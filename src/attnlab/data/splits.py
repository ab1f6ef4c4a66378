"""How a source splits its examples: stratified hold-outs, per-class caps, random hold-outs."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError

__all__ = ["stratified_split", "cap_per_class", "random_held_out"]


def stratified_split(targets: Tensor, size: float, seed: int,
                     what: str = "data.val_size") -> tuple[Tensor, Tensor | None]:
    """``(kept indices, held-out indices or None)`` of ``targets``: ``size`` of them (a
    count, or a fraction below 1; 0: none) held out, stratified by class with ``seed``
    (at random when a class has a single sample or the hold-out is smaller than the
    number of classes). ``what`` names the setting in errors."""
    if size == 0:
        return torch.arange(len(targets)), None
    from sklearn.model_selection import train_test_split  # sklearn is slow to import: only when splitting

    n = int(size) if size >= 1 else size
    if isinstance(n, int) and not 0 < n < len(targets):
        raise InputError(f"{what} must be below the {len(targets)} samples it is taken from; got {n}")
    counts = torch.bincount(targets)
    counts = counts[counts > 0]
    held = n if isinstance(n, int) else int(np.ceil(n * len(targets)))
    stratify = targets.numpy() if int(counts.min()) >= 2 and held >= len(counts) else None  # too few to stratify
    keep, out = train_test_split(np.arange(len(targets)), test_size=n, stratify=stratify, random_state=seed)
    return torch.from_numpy(np.sort(keep)), torch.from_numpy(np.sort(out))


def cap_per_class(indices: Tensor, targets: Tensor, cap: int, seed: int) -> Tensor:
    """At most ``cap`` of ``indices`` per class, drawn with ``seed`` (``cap`` 0: all)."""
    if cap == 0:
        return indices
    gen = torch.Generator().manual_seed(seed)
    order = indices[torch.randperm(len(indices), generator=gen)]
    kept = torch.cat([order[targets[order] == c][:cap] for c in targets[indices].unique()])
    return kept.sort().values


def random_held_out(n: int, size: float, seed: int, what: str, unit: str = "examples") -> tuple[list[int], list[int]]:
    """``(kept, held out)`` indices of ``range(n)``: ``size`` of them (a count, or a fraction
    below 1) at random with ``seed`` (examples without labels to stratify by)."""
    count = int(size) if size >= 1 else round(size * n)
    if not 0 < count < n:
        raise InputError(f"{what} must leave some of the {n} {unit} and hold out at least one; got {size!r}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[count:]), sorted(order[:count])
