"""Locality-sensitive-hashing attention (Reformer: Kitaev et al., 2020), registered as ``"lsh"``.

A query attends to the keys that hash into its bucket, a sparsity chosen by content: the
positions that would score high are found by hashing instead of by scoring all of them.
As in the Reformer, queries and keys are shared (``k`` is ``q`` normalised to unit
length: the key projection ``k_proj`` is not used), so that a query and the keys close
to it in direction land in the same bucket:

1. each vector is hashed by a random rotation ``R`` (``D x n_buckets/2``, fixed at
   construction, a buffer of the module): ``bucket = argmax([x R, -x R])``;
2. positions are sorted by (bucket, position) and cut into chunks of ``bucket_size``;
3. each chunk attends to itself and to the chunk before it, under the masks, with
   softmax over those ``2 x bucket_size`` keys. Padding sorts after every bucket, so a
   sentence's chunks do not depend on how much padding follows it.

A query never attends to itself while another key is visible (its own key would win
every time; the Reformer's rule), and a query's keys outside its two chunks get weight
zero even when they share its bucket: the chunks bound the cost, which is
``O(n · bucket_size · d)`` time and ``O(n · bucket_size)`` memory plus a sort,
``O(n log n)``. One round of hashing (the Reformer averages several).

Masks: ``key_padding_mask`` ``(B, L)`` bool (``True`` = padding) and ``is_causal`` (by the
original positions) are honoured; a query with no visible key outputs zeros. When one
chunk covers the sequence (``bucket_size >= L``) every query sees every key: exact
attention with shared keys and no self-attention. What it cannot do: attend with keys of
their own projection (shared query-key only), give the weights (never formed). With rotary
positions (``rope=True``) its scores depend on relative positions, but its buckets hash the
rotated vectors, so which keys a query sees moves with the absolute position.
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from ...dropout import dropout
from ...errors import InputError
from ..functional import masked_softmax
from ..contract import Option
from ..registry import register_attention
from .base import TOKEN_OPTIONS, TokenAttention

__all__ = ["LSHAttention", "lsh_attention", "lsh_buckets"]

_SELF = -1e4  # a query's own key: kept only when no other key is visible


def lsh_buckets(x: Tensor, rotations: Tensor) -> Tensor:
    """``(..., L, D)`` -> ``(..., L)`` int64 buckets in ``[0, 2 * rotations.shape[1])``:
    the arg-max of ``[x R, -x R]`` (angular LSH)."""
    rotated = x @ rotations.to(x.dtype)
    return torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)


def lsh_attention(qk: Tensor, v: Tensor, rotations: Tensor, bucket_size: int, *,
                  key_padding_mask: Tensor | None = None, is_causal: bool = False, dropout_p: float = 0.0) -> Tensor:
    """Shared query-key LSH attention on ``(B, H, L, D)`` tensors (see the module
    docstring): ``(B, H, L, Dv)``. ``rotations``: ``(D, n_buckets / 2)``."""
    b, h, n, d = qk.shape
    if b == 0 or n == 0:
        return v.clone()
    c = min(bucket_size, n)
    chunks = -(-n // c)
    length = chunks * c
    pos = torch.arange(length, device=qk.device)
    last = torch.iinfo(torch.int64).max // (2 * length)  # a bucket after all others
    buckets = lsh_buckets(qk, rotations)  # (B, H, L)
    if key_padding_mask is not None:  # padding sorts last, so the real positions' chunks do not depend on it
        buckets = buckets.masked_fill(key_padding_mask[:, None, :], last)
    buckets = F.pad(buckets, (0, length - n), value=last)  # and so does the filler up to whole chunks
    order = torch.argsort(buckets * length + pos, dim=-1)  # by bucket, then position: (B, H, length)

    def take(t: Tensor) -> Tensor:  # (B, H, L, X) -> (B, H, chunks, c, X), in sorted order
        t = F.pad(t, (0, 0, 0, length - n))
        return torch.gather(t, 2, order.unsqueeze(-1).expand(-1, -1, -1, t.shape[-1])).view(b, h, chunks, c, -1)

    q_s = take(qk)
    k_s = take(F.normalize(qk, dim=-1))
    v_s = take(v)
    p_s = order.view(b, h, chunks, c)  # original positions
    blocked_pos = pos >= n  # the filler
    if key_padding_mask is not None:
        blocked_pos = blocked_pos | F.pad(key_padding_mask, (0, length - n), value=True)  # (B, length)
    else:
        blocked_pos = blocked_pos.unsqueeze(0)
    blocked_s = torch.gather(blocked_pos.unsqueeze(1).expand(b, h, length), 2, order).view(b, h, chunks, c)

    def with_previous(t: Tensor) -> Tensor:  # keys of each chunk: the chunk before it, then itself
        return t if chunks == 1 else torch.cat([t.roll(1, dims=2), t], dim=3)

    k_c, v_c, p_c, blocked_c = (with_previous(t) for t in (k_s, v_s, p_s.unsqueeze(-1), blocked_s.unsqueeze(-1)))
    p_c, blocked_c = p_c.squeeze(-1), blocked_c.squeeze(-1)  # (B, H, chunks, K)
    if chunks > 1:  # the first chunk has none before it
        blocked_c = blocked_c.clone()
        blocked_c[:, :, 0, :c] = True
    scores = torch.matmul(q_s, k_c.transpose(-2, -1)).to(torch.promote_types(qk.dtype, torch.float32))
    scores = scores * (1.0 / math.sqrt(d))  # (B, H, chunks, c, K)
    q_pos = p_s.unsqueeze(-1)
    blocked = blocked_c.unsqueeze(-2)
    if is_causal:
        blocked = blocked | (p_c.unsqueeze(-2) > q_pos)
    scores = scores.masked_fill(p_c.unsqueeze(-2) == q_pos, _SELF).masked_fill(blocked, -math.inf)
    weights = masked_softmax(scores)  # rows without a visible key (padding, the filler past L): zeros
    if dropout_p > 0:
        weights = dropout(weights, p=dropout_p)
    out_s = torch.matmul(weights.to(v.dtype), v_c).view(b, h, length, -1)
    out = torch.empty_like(out_s).scatter_(2, order.unsqueeze(-1).expand_as(out_s), out_s)  # back to positions
    return out[:, :, :n]


LSH_OPTIONS = TOKEN_OPTIONS.extend(
    Option("bucket_size", int, 64, "the chunk length, and so each query's 2 x bucket_size keys", low=1,
           counts_positions=True),
    Option("n_buckets", int, 16, "the hash buckets, even", low=2, counts_positions=True),
    Option("seed", int, 0, "the random rotations' seed"))


@register_attention("lsh", options=LSH_OPTIONS, takes_positions=True, causal=True, padding=True,
                    lora_roles=("attention",),
                    summary="Reformer's LSH attention: queries and keys hashed into buckets, attended within each")
class LSHAttention(TokenAttention):
    """LSH self-attention with shared queries and keys (see the module docstring).

    Args:
        embed_dim: as :class:`~.base.TokenAttention`.
        num_heads: as :class:`~.base.TokenAttention`.
        dropout: as :class:`~.base.TokenAttention`.
        bias: as :class:`~.base.TokenAttention`.
        rope: rotary positions on queries and keys, as :class:`~.base.TokenAttention`.
        rope_theta: the base of the rotary wavelengths.
        bucket_size: positive int: the chunk length, and so each query's ``2 x bucket_size`` keys.
        n_buckets: even int >= 2: the hash buckets (the Reformer takes about ``L / bucket_size``).
        seed: the random rotations' seed (a buffer: saved and loaded with the model).
    """

    kind = "lsh"

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rope: bool = False, rope_theta: float = 10000.0,
                 bucket_size: int = 64, n_buckets: int = 16, seed: int = 0) -> None:
        for name, value, ok in (("bucket_size", bucket_size, lambda x: x > 0),
                                ("n_buckets", n_buckets, lambda x: x >= 2 and x % 2 == 0)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not ok(value):
                rule = "a positive int" if name == "bucket_size" else "an even int >= 2"
                raise InputError(f"{self.kind}: {name} must be {rule}; got {name}={value!r}")
        self.check_positions(bucket_size=bucket_size, n_buckets=n_buckets)  # n_buckets sizes the rotations
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, rope=rope, rope_theta=rope_theta)
        self.bucket_size, self.n_buckets = int(bucket_size), int(n_buckets)
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("rotations", torch.randn(self.head_dim, self.n_buckets // 2, generator=gen))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        return lsh_attention(q, v, self.rotations, self.bucket_size, key_padding_mask=key_padding_mask,
                             is_causal=is_causal, dropout_p=self.dropout if self.training else 0.0)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", bucket_size={self.bucket_size}, n_buckets={self.n_buckets}"
