"""ALiBi (Press et al., 2022, "Train Short, Test Long"): no position embedding at all;
each head adds ``-slope_h · |i - j|`` to the logit of query ``i`` for key ``j``, a linear
penalty on distance with a slope per head (a geometric sequence), which lets a model
read longer sequences than it trained on. In a causal model the keys ahead are blocked,
so the penalty is the paper's ``-slope_h · (i - j)``; an encoder, which sees both sides,
gets the same penalty for a key as far ahead as behind (the symmetric form of encoders
such as MosaicBERT's)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["alibi_slopes", "alibi_bias"]


def alibi_slopes(num_heads: int) -> Tensor:
    """The paper's slopes: ``2^(-8/n), 2^(-16/n), ...`` for ``n`` heads a power of two; for
    other counts those of the power of two below, then every other slope of the one above."""
    def powers(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    low = 2 ** math.floor(math.log2(num_heads))
    slopes = powers(low)
    if low < num_heads:
        slopes += powers(2 * low)[0::2][: num_heads - low]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """The additive bias ``(1 or B, H, Lq, Lk)``: ``-slope · |q_pos - k_pos|`` (float32), for
    positions ``(Lq,)``/``(Lk,)`` or ``(B, Lq)``/``(B, Lk)``."""
    qp = q_positions if q_positions.dim() == 2 else q_positions[None]
    kp = k_positions if k_positions.dim() == 2 else k_positions[None]
    distance = (qp[:, :, None] - kp[:, None, :]).abs().to(torch.float32)  # (B, Lq, Lk)
    return -slopes.to(distance.device)[None, :, None, None] * distance[:, None]
