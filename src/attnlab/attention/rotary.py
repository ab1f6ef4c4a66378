"""Rotary position embedding (RoPE; Su et al., 2021, "RoFormer").

Each pair of query/key features ``(x_i, x_{i + D/2})`` is rotated by the angle
``position · theta^(-2i/D)``, so that ``q_m · k_n`` depends on the positions only through
``m - n``: attention sees relative positions while each token carries an absolute one.
The pairs are the two halves of the head (GPT-NeoX's and Llama's layout, so Hugging Face
Llama and Mistral weights load as they are), not interleaved neighbours.

Angles are computed in float32 and kept in a table that grows with the longest position
seen, so a decoding step looks its row up instead of computing sines.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["RotaryEmbedding", "rotate_half", "apply_rotary"]


def rotate_half(x: Tensor) -> Tensor:
    """``(x1, x2) -> (-x2, x1)`` over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` ``(B, H, L, D)`` rotated by the angles whose ``cos``/``sin`` are ``(B or 1, 1, L, D)``."""
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by their positions.

    Args:
        head_dim: ``D``, the feature size of one head; even.
        theta: the base of the wavelengths (``rope_theta``; 10,000 in the paper and Llama 2,
            500,000 in Llama 3).

    ``forward(q, k, positions)``: ``q`` ``(B, H, Lq, D)``, ``k`` ``(B, Hkv, Lk, D)`` and
    ``positions`` ``(Lq,)`` or ``(B, Lq)`` (the same positions for ``k``, which must then
    have ``Lk == Lq``: the new keys of this step) -> the rotated ``(q, k)``, in their dtype.
    """

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise InputError(f"head_dim must be even for rotary embeddings; got {head_dim}")
        if not theta > 0:
            raise InputError(f"theta (rope_theta) must be positive; got {theta}")
        self.head_dim, self.theta = head_dim, float(theta)
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cos: Tensor | None = None
        self._sin: Tensor | None = None

    def _table(self, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if self._cos is None or self._cos.shape[0] < length or self._cos.device != device:
            size = max(length, 2 * (0 if self._cos is None else self._cos.shape[0]), 256)
            t = torch.arange(size, device=device, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq.to(device))
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos, self._sin = emb.cos(), emb.sin()
        return self._cos, self._sin  # type: ignore[return-value]

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``cos``/``sin`` ``(B or 1, 1, L, D)`` of ``positions`` ``(L,)`` or ``(B, L)``."""
        if positions.dim() not in (1, 2):
            raise InputError(f"positions must be (L,) or (B, L); got shape {tuple(positions.shape)}")
        cos, sin = self._table(int(positions.max()) + 1 if positions.numel() else 1, positions.device)
        pos = positions if positions.dim() == 2 else positions[None]
        return cos[pos][:, None].to(dtype), sin[pos][:, None].to(dtype)

    def cos_sin_from(self, start: int, length: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
        """``cos``/``sin`` ``(1, length, D)`` of the consecutive positions ``start ..
        start + length - 1``: slices of the table, without indexing by a tensor (a decoding
        step's one new position)."""
        cos, sin = self._table(start + length, device)
        return cos[start : start + length][None].to(dtype), sin[start : start + length][None].to(dtype)

    def forward(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(positions, q.dtype)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta:g}"
