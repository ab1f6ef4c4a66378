"""Linformer attention (Wang et al., 2020, "Linformer: Self-Attention with Linear Complexity").

Keys and values are projected *along the sequence* to ``k`` slots by learned matrices
``E`` and ``F`` of shape ``(k, seq_len)``, shared across heads (the paper's headwise
sharing; with ``share_kv=True`` also ``F = E``, key-value sharing)::

    out = softmax(q (E k)ᵀ / sqrt(D)) (F v)        q: (L, D), E k, F v: (k, D)

so the weights are ``(L, k)`` and memory is ``O(L · k)`` rather than ``O(L²)``.

* **Length.** ``E`` and ``F`` are built for ``seq_len`` positions. An input of length
  ``L < seq_len`` uses the first ``L`` columns ``E[:, :L]``, ``F[:, :L]`` (as if it were
  padded with zero keys and values up to ``seq_len``); ``L > seq_len`` raises a
  ``ValueError`` naming ``seq_len``.
* **Padding.** A softmax over ``k`` projected slots cannot mask individual keys.
  Padding is honoured by zeroing the padded keys and values (after the input
  projection, so biases too) before projecting: padded positions then contribute
  nothing to ``E k`` or ``F v``, and outputs at real positions do not depend on what
  the padded positions hold. The softmax is still over all ``k`` slots.
* **Causal** attention is not possible (each slot mixes every position):
  ``is_causal=True`` raises a ``ValueError``.
* **Initialisation.** ``E``, ``F`` ~ ``N(0, 1/k)`` (standard deviation ``1/sqrt(k)``).
* **Dropout** is on the ``(L, k)`` attention weights, in training mode.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...errors import InputError
from ..functional import scaled_dot_product_attention
from ..contract import Option
from ..registry import register_attention
from .base import TOKEN_OPTIONS, TokenAttention

__all__ = ["LinformerAttention"]


LINFORMER_OPTIONS = TOKEN_OPTIONS.extend(
    Option("seq_len", int, 512, "the longest sequence (the projections' width)", low=1, counts_positions=True),
    Option("k", int, 64, "the length keys and values are projected to", low=1, counts_positions=True),
    Option("share_kv", bool, False, "one projection for keys and values"))


@register_attention("linformer", options=LINFORMER_OPTIONS, takes_positions=True, causal=False, padding=True,
                    lora_roles=("attention",),
                    summary="Linformer: keys and values projected to a fixed length k along the sequence")
class LinformerAttention(TokenAttention):
    """Linformer self-attention; see the module docstring.

    Args:
        embed_dim: as for exact self-attention.
        num_heads: as for exact self-attention.
        dropout: as for exact self-attention.
        bias: as for exact self-attention.
        rope: rotary positions on queries and keys, as :class:`~.base.TokenAttention`.
        rope_theta: the base of the rotary wavelengths.
        seq_len: the longest input length (columns of ``E`` and ``F``).
        k: the number of projected key/value slots.
        share_kv: use one projection for keys and values (``F = E``).
    """

    kind = "linformer"

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rope: bool = False, rope_theta: float = 10000.0,
                 seq_len: int = 512, k: int = 64, share_kv: bool = False) -> None:
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, rope=rope, rope_theta=rope_theta)
        if seq_len <= 0 or k <= 0:
            raise InputError(f"{self.kind}: seq_len and k must be positive; got seq_len={seq_len}, k={k}")
        self.check_positions(seq_len=seq_len, k=k)  # E and F are (k, seq_len)
        self.seq_len, self.k, self.share_kv = seq_len, k, share_kv
        self.E = nn.Parameter(torch.randn(k, seq_len) / math.sqrt(k))
        self.F = None if share_kv else nn.Parameter(torch.randn(k, seq_len) / math.sqrt(k))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        n = k.shape[-2]
        if n > self.seq_len:
            raise InputError(f"{self.kind}: input length {n} exceeds seq_len={self.seq_len}; "
                             f"build the module with seq_len >= {n}")
        if key_padding_mask is not None:
            pad = key_padding_mask[:, None, :, None]  # (B, 1, L, 1)
            k, v = k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
        e = self.E[:, :n].to(k.dtype)
        f = e if self.F is None else self.F[:, :n].to(v.dtype)
        kp = torch.matmul(e, k)  # (k, L) @ (B, H, L, D) -> (B, H, k, D)
        vp = torch.matmul(f, v)
        out, _ = scaled_dot_product_attention(q, kp, vp, dropout_p=self.dropout if self.training else 0.0)
        return out

    def extra_repr(self) -> str:
        return super().extra_repr() + f", seq_len={self.seq_len}, k={self.k}, share_kv={self.share_kv}"
