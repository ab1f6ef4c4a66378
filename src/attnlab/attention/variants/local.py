"""Local (sliding-window) self-attention, registered as ``"local"``.

Each query attends only to the keys near it in the sequence: the banded attention of
the Sparse Transformer's local pattern (Child et al., 2019) and of Longformer's
sliding window (Beltagy et al., 2020), without their global or strided tokens.

Band (``w`` = ``sliding_window``), for query position ``i`` and key position ``j``:

* bidirectional: ``j`` is seen when ``|i - j| < w`` (``2w - 1`` keys, ``w - 1`` on
  each side); so ``w >= L`` is exact (full) attention;
* causal (``is_causal=True``): ``j`` is seen when ``0 <= i - j < w`` (the query itself
  and the ``w - 1`` keys before it); ``w >= L`` is exact causal attention.

Padded keys (``key_padding_mask`` ``True``) are never seen; a query whose window holds
no real key outputs zeros (zero gradient), as in :mod:`attnlab.attention.functional`.

Computation is blocked: the sequence is cut into blocks of ``b = min(w, L)`` positions
(the length padded up to a multiple of ``b`` with masked keys) and each query block
attends to its own block and its neighbours (the previous one when causal; the previous
and the next one otherwise) under an exact band mask. Since ``b <= w`` when ``w < L``,
every key in the band lies in those neighbours; when ``w >= L`` there is one block.

Shapes: ``x`` ``(B, L, E)`` -> ``(B, L, E)``; :meth:`LocalAttention.attend` works on
per-head ``(B, H, L, D)``. Cost for ``n = L``: ``O(n · w · d)`` time and ``O(n · w)``
memory for the attention weights (about ``3 n w`` logits per head bidirectional,
``2 n w`` causal); the ``n x n`` matrix is never formed. Softmax runs in float32 for
half-precision inputs.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from ...dropout import dropout
from ...errors import InputError
from ..contract import Option
from ..registry import register_attention
from .base import TOKEN_OPTIONS, TokenAttention

__all__ = ["LocalAttention", "local_attention"]


def _blocks(t: Tensor, nb: int, bs: int, offsets: tuple[int, ...]) -> Tensor:
    """``t`` ``(..., (nb + 2) * bs, D)`` (one sentinel block each side) ->
    ``(..., nb, len(offsets) * bs, D)``: for each block, its neighbours at ``offsets``."""
    t = t.reshape(*t.shape[:-2], nb + 2, bs, t.shape[-1])
    return torch.cat([t[..., 1 + o : 1 + o + nb, :, :] for o in offsets], dim=-2)


def local_attention(q: Tensor, k: Tensor, v: Tensor, window: int, *, key_padding_mask: Tensor | None = None,
                    is_causal: bool = False, dropout_p: float = 0.0) -> Tensor:
    """Sliding-window attention on ``(B, H, L, D)`` tensors; see the module docstring.

    ``key_padding_mask``: ``(B, L)`` bool, ``True`` = padding. ``dropout_p``: dropout on
    the attention weights (pass 0 in eval mode). Returns ``(B, H, L, Dv)``.
    """
    batch, heads, n, d = q.shape
    if batch == 0 or n == 0:  # nothing to attend; the blocking below needs a position and a batch
        return v.clone()  # the empty (B, H, L, Dv) result, on the autograd graph
    bs = min(window, n)
    nb = -(-n // bs)
    lp = nb * bs
    offsets = (0,) if nb == 1 else ((-1, 0) if is_causal else (-1, 0, 1))

    # Pad to nb blocks plus one sentinel block on each side; padded keys are blocked.
    def pad(t: Tensor) -> Tensor:
        return torch.nn.functional.pad(t, (0, 0, bs, lp - n + bs))

    qb = torch.nn.functional.pad(q, (0, 0, 0, lp - n)).reshape(batch, heads, nb, bs, d)
    kb = _blocks(pad(k), nb, bs, offsets)  # (B, H, nb, K, D), K = len(offsets) * bs
    vb = _blocks(pad(v), nb, bs, offsets)
    pad_mask = torch.ones(key_padding_mask.shape[0] if key_padding_mask is not None else 1, lp + 2 * bs,
                          dtype=torch.bool, device=q.device)
    pad_mask[:, bs : bs + n] = False if key_padding_mask is None else key_padding_mask
    key_blocked = _blocks(pad_mask.unsqueeze(-1), nb, bs, offsets).squeeze(-1)  # (B|1, nb, K)

    # Exact band inside the blocks: query bs*m + a, key bs*(m + o) + c, so i - j = a - c - o*bs.
    a = torch.arange(bs, device=q.device).view(bs, 1)
    c = torch.cat([torch.arange(bs, device=q.device) + o * bs for o in offsets]).view(1, -1)
    rel = a - c  # (bs, K)
    band_blocked = ~((rel >= 0) & (rel < window)) if is_causal else rel.abs() >= window
    blocked = band_blocked | key_blocked.unsqueeze(-2).unsqueeze(1)  # (B|1, 1, nb, bs, K)

    if key_padding_mask is None and dropout_p == 0.0:
        # Fast path: every query sees at least itself, so no row is empty, and the blocks
        # are one batch of small dense attentions under one (nb, bs, K) mask: the fused
        # kernel (flash on CPU and CUDA), which never stores the (bs, K) weights for backward.
        keep = ~blocked[0]  # (1, nb, bs, K), True = attend; 4-D, or the flash kernel is not chosen
        out = F.scaled_dot_product_attention(qb.reshape(batch * heads, nb, bs, d),
                                             kb.reshape(batch * heads, nb, -1, d),
                                             vb.reshape(batch * heads, nb, -1, v.shape[-1]), attn_mask=keep)
        return out.reshape(batch, heads, lp, v.shape[-1])[:, :, :n]

    dead = blocked.all(dim=-1, keepdim=True)
    logits = torch.matmul(qb * (1.0 / math.sqrt(d)), kb.transpose(-2, -1))  # (B, H, nb, bs, K)
    logits = logits.masked_fill(blocked, -math.inf).masked_fill(dead, 0.0)
    weights = torch.softmax(logits, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32))
    weights = weights.masked_fill(dead, 0.0).to(v.dtype)
    if dropout_p > 0:
        weights = dropout(weights, p=dropout_p)
    out = torch.matmul(weights, vb)  # (B, H, nb, bs, Dv)
    return out.reshape(batch, heads, lp, v.shape[-1])[:, :, :n]


# The same band as the exact kind's sliding_window (causal: itself and the w - 1 keys before it), so the same name.
LOCAL_OPTIONS = TOKEN_OPTIONS.extend(Option("sliding_window", int, 128, "each query sees the keys less than "
                                            "sliding_window positions away", low=1, counts_positions=True, was="window"))


@register_attention("local", options=LOCAL_OPTIONS, takes_positions=True, causal=True, padding=True,
                    lora_roles=("attention",),
                    summary="sliding-window attention: each query sees the keys within w of it")
class LocalAttention(TokenAttention):
    """Sliding-window self-attention (see the module docstring).

    Args:
        embed_dim: as :class:`~.base.TokenAttention`.
        num_heads: as :class:`~.base.TokenAttention`.
        dropout: as :class:`~.base.TokenAttention`.
        bias: as :class:`~.base.TokenAttention`.
        rope: rotary positions on queries and keys, as :class:`~.base.TokenAttention`.
        rope_theta: the base of the rotary wavelengths.
        sliding_window: positive int ``w``; bidirectional queries see ``|i - j| < w``, causal
            ones ``0 <= i - j < w``.
    """

    kind = "local"

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rope: bool = False, rope_theta: float = 10000.0, sliding_window: int = 128) -> None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, numbers.Integral) or sliding_window <= 0:
            raise InputError(f"{self.kind}: sliding_window must be a positive int; got {sliding_window!r}")
        self.check_positions(sliding_window=sliding_window)
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, rope=rope, rope_theta=rope_theta)
        self.sliding_window = int(sliding_window)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        return local_attention(q, k, v, self.sliding_window, key_padding_mask=key_padding_mask, is_causal=is_causal,
                               dropout_p=self.dropout if self.training else 0.0)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", sliding_window={self.sliding_window}"
