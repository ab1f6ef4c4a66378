"""Dropout that is cheap on the CPU.

``torch.nn.functional.dropout`` on the CPU draws one Bernoulli sample per element through
``bernoulli_``, which costs several times a matrix multiply over the same tensor: for a
small Transformer it was a large share of the training step (``benchmarks/dropout.py``).

Here one 64-bit random integer is drawn per four elements and each 16-bit lane is
compared with a threshold, so an element is dropped with probability
``round(p * 65536) / 65536`` (within 8e-6 of ``p``). Forward and backward together run
faster than torch's on activation-sized tensors (``benchmarks/dropout.py``).
The draws come from torch's default CPU generator, so ``torch.manual_seed`` and saved
RNG states reproduce them exactly. On other devices, and for ``p`` outside ``(0, 1)``,
this is ``torch.nn.functional.dropout``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Dropout", "dropout", "dropout_mask"]

_LANES = 65536  # 16-bit lanes


def dropout_mask(shape: torch.Size | tuple[int, ...], p: float) -> Tensor:
    """A CPU bool tensor of ``shape``, ``True`` (kept) with probability ``1 - p``."""
    n = 1
    for s in shape:
        n *= s
    # int64 drawn over its full range (from=-2**63, to=None): every 16-bit lane is uniform.
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    lanes = bits.view(torch.int16)[:n].view(shape)
    return lanes >= round(p * _LANES) - _LANES // 2


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return (x * keep).mul_(scale)  # in place on the fresh product: one pass less

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """``torch.nn.functional.dropout`` with the fast CPU mask described in the module docstring."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0 or x.numel() == 0:
        return F.dropout(x, p, training, inplace)
    return _MaskedScale.apply(x, dropout_mask(x.shape, p), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` using :func:`dropout` (same arguments, same state dict)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training, self.inplace)
