"""Position encodings for token sequences ``(B, L, E)``: absolute ones added to the input
(``sinusoidal``, ``learned``), and the choice of positions given inside the attention
instead (``rope``, ``alibi``: :func:`inner_position_options`). One vocabulary,
``pos_embed``, names them in every token model."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..attention.registry import kinds_taking, attention_entry
from ..errors import InputError

__all__ = ["SinusoidalPositionalEncoding", "LearnedPositionalEncoding", "build_pos_encoding", "inner_position_options",
           "ADDED", "INNER"]

ADDED = ("learned", "none", "sinusoidal")  # added to the token embeddings (none: nothing)
INNER = ("rope", "alibi")  # given inside every self-attention layer


def sinusoid_table(length: int, dim: int) -> Tensor:
    """``(length, dim)``: sin on even features, cos on odd, wavelengths 2π … 10000·2π."""
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table


class _PositionalEncoding(nn.Module):
    def __init__(self, dim: int, max_len: int) -> None:
        super().__init__()
        self.dim, self.max_len = dim, max_len

    def _check(self, x: Tensor, offset: int) -> None:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise InputError(f"x must have shape (B, L, {self.dim}); got {tuple(x.shape)}")
        if offset + x.shape[1] > self.max_len:
            raise InputError(
                f"positions {offset}..{offset + x.shape[1] - 1} exceed max_len={self.max_len}; "
                "build the model with a larger max_len"
            )

    def extra_repr(self) -> str:
        return f"dim={self.dim}, max_len={self.max_len}"


class SinusoidalPositionalEncoding(_PositionalEncoding):
    """Fixed sinusoids (Vaswani et al., 2017, §3.5) added to ``x``; ``offset`` is the
    position of ``x[:, 0]`` (non-zero when decoding with a cache)."""

    def __init__(self, dim: int, max_len: int = 4096) -> None:
        super().__init__(dim, max_len)
        self.register_buffer("table", sinusoid_table(max_len, dim), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        self._check(x, offset)
        return x + self.table[offset : offset + x.shape[1]].to(x.dtype)


class LearnedPositionalEncoding(_PositionalEncoding):
    """A learned embedding per position, added to ``x``."""

    def __init__(self, dim: int, max_len: int = 4096) -> None:
        super().__init__(dim, max_len)
        self.weight = nn.Parameter(torch.empty(max_len, dim))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        self._check(x, offset)
        return x + self.weight[offset : offset + x.shape[1]].to(x.dtype)


def build_pos_encoding(name: str, dim: int, max_len: int) -> nn.Module:
    """What is added to the embeddings ``(B, L, dim)`` for ``pos_embed=name``: ``"sinusoidal"``,
    ``"learned"``, or nothing (the identity) for ``"none"`` and the positions given inside
    the attention (``"rope"``, ``"alibi"``)."""
    if name == "sinusoidal":
        return SinusoidalPositionalEncoding(dim, max_len)
    if name == "learned":
        return LearnedPositionalEncoding(dim, max_len)
    if name == "none" or name in INNER:
        return _NoPositions()
    raise InputError(f"pos_embed must be one of {sorted(ADDED + INNER)}; got {name!r}")


def inner_position_options(pos_embed: str, rope_theta: float, attention: str) -> dict:
    """The options that give self-attention kind ``attention`` the positions ``pos_embed``
    names: ``{"rope": True, "rope_theta": ...}``, ``{"alibi": True}``, or none for the
    positions added to the input. A kind that cannot take them is an error naming those
    that can."""
    if pos_embed not in INNER:
        return {}
    if not attention_entry(attention).takes(pos_embed):
        raise InputError(f"pos_embed={pos_embed!r} is given inside the attention, and attention={attention!r} does "
                         f"not take it; kinds that do: {', '.join(kinds_taking(pos_embed))}")
    return {"rope": True, "rope_theta": rope_theta} if pos_embed == "rope" else {"alibi": True}


class _NoPositions(nn.Module):
    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        return x
