"""The kernels of softmax attention on a dense mask, under one signature, and the one place
that chooses between them.

Every kernel computes the same thing, ``softmax(transform(q kᵀ) + mask) v``, on heads made
ready (``q`` ``(B, H, Lq, D)``, ``k`` ``(B, H, Lk, D)``, ``v`` ``(B, H, Lk, Dv)``)::

    kernel(q, k, v, *, mask, dead, causal, logits, dropout_p, need_weights) -> (out, weights or None)

``mask`` is the merged mask (:func:`~attnlab.attention.functional.merge_masks`: bool,
``True`` = blocked, or added to the logits) or ``None``; ``dead`` marks the query rows whose
keys are all blocked (their output is zeroed by the caller); ``causal`` asks the kernel for its
own triangle (only when there is no mask and ``Lq == Lk``); ``logits`` says what happens
between the product and the softmax (:class:`Logits`). :func:`explicit` is the definition,
written as the formula reads; :func:`fused` and :func:`fused_sink_key` compute the same
numbers through torch's fused kernel without forming the weights. :func:`choose` is the only
place that picks one, each condition with its reason. The structured forms that never build a
dense mask (the banded window, FlexAttention) are chosen a level above, by the attention
module that knows the structure (:class:`~attnlab.attention.exact.GroupedQueryAttention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cpu import native_bf16_cpu
from ..dropout import dropout

__all__ = ["Logits", "Kernel", "explicit", "fused", "fused_sink_key", "choose", "SHORT_HALF_KEYS_CPU"]


@dataclass(frozen=True)
class Logits:
    """What happens to the logits between ``q kᵀ`` and the softmax: times ``scale``, squashed to
    ``softcap * tanh(logits / softcap)`` (Gemma 2), and, with ``sinks`` ``(H,)``, one more column
    per head, a key with no value that takes part of each query's weight (gpt-oss)."""

    scale: float
    softcap: float | None = None
    sinks: Tensor | None = None


Kernel = Callable[..., "tuple[Tensor, Tensor | None]"]


def explicit(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, dead: Tensor | None, causal: bool,
             logits: Logits, dropout_p: float, need_weights: bool) -> tuple[Tensor, Tensor | None]:
    """The definition: the logits formed, transformed, masked, a softmax, dropout, the product
    with the values. The only kernel that returns the weights (before dropout)."""
    if causal:  # not asked of it by choose(); kept so that the signature means the same for every kernel
        lq, lk = q.shape[-2], k.shape[-2]
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(lk - lq + 1)
        dead = None
    d, lk = q.shape[-1], k.shape[-2]
    # The scale multiplies the smaller of the queries (Lq, D) and the logits (Lq, Lk).
    scores = torch.matmul(q * logits.scale, k.transpose(-2, -1)) if d <= lk else \
        torch.matmul(q, k.transpose(-2, -1)) * logits.scale
    if logits.softcap is not None:
        scores = torch.tanh(scores / logits.softcap) * logits.softcap
    if mask is not None:
        scores = scores.masked_fill(mask, -math.inf) if mask.dtype == torch.bool else scores + mask
        if dead is not None:
            scores = scores.masked_fill(dead, 0.0)  # a finite row, zeroed below: no NaN forward or backward
    # float16's exp overflows for long rows: its softmax runs in float32. bfloat16 has float32's range and
    # torch's softmax accumulates it in float32, so its output equals float32's rounded, without the two
    # casts; on the CPU that pays only from rows of 32 keys, below which torch's bfloat16 softmax is not
    # vectorized (results page "Why the fast paths", bf16-softmax).
    bf16_soft = q.dtype == torch.bfloat16 and (lk >= 32 or q.device.type != "cpu")
    soft_dtype = q.dtype if bf16_soft else torch.promote_types(q.dtype, torch.float32)
    if logits.sinks is None:
        weights = torch.softmax(scores, dim=-1, dtype=soft_dtype).to(q.dtype)
    else:  # one more column, the sink's, in the softmax; then left out
        column = logits.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1, dtype=soft_dtype)[..., :-1].to(q.dtype)
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)
    out = torch.matmul(dropout(weights, p=dropout_p) if dropout_p > 0 else weights, v)
    return out, weights if need_weights else None


def fused(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, dead: Tensor | None, causal: bool,
          logits: Logits, dropout_p: float, need_weights: bool = False) -> tuple[Tensor, None]:
    """torch's ``F.scaled_dot_product_attention``: no soft-cap, no sinks, no weights."""
    if mask is not None and mask.dtype == torch.bool:
        mask = ~mask if dead is None else ~mask | dead  # torch's bool masks say True = may attend
    elif mask is not None and dead is not None:
        mask = mask.masked_fill(dead, 0.0)
    d, dv = q.shape[-1], v.shape[-1]
    if dv != d and q.device.type == "cpu":
        # torch's CPU kernel takes one head size for queries, keys and values; given two it falls back to its
        # math path, which forms the (Lq, Lk) weights. Zeros appended to the shorter side change no dot product
        # (the scale is explicit) and no output column that is kept (results page, sdpa-unequal-head-sizes).
        width = max(d, dv)
        if d < width:
            q, k = F.pad(q, (0, width - d)), F.pad(k, (0, width - d))
        else:
            v = F.pad(v, (0, width - dv))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal,
                                         scale=logits.scale)
    return (out[..., :dv] if out.shape[-1] != dv else out), None


def fused_sink_key(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, dead: Tensor | None, causal: bool,
                   logits: Logits, dropout_p: float, need_weights: bool = False) -> tuple[Tensor, None]:
    """Attention with a sink logit per head through torch's fused kernel: the sink becomes one
    more key, first, whose logit is ``sinks[h]`` for every query and whose value is zero. Each
    query gets one more feature, 1, and each key 0 (the sink key: ``sinks[h] / scale``), so the
    real keys' logits are unchanged. The weights never exist: memory stays linear in the length,
    where :func:`explicit` forms the ``(Lq, Lk + 1)`` logits. A row whose real keys are all
    blocked gives its whole weight to the sink and outputs 0, as :func:`explicit` does.

    The mask gains the sink's column, never blocked. ``causal``: the kernel's triangle is
    aligned top-left, so a query row is put first too (it sees the sink alone) for query ``i`` to
    see the sink and keys ``0..i``; that row is then dropped."""
    batch, heads, lq, d = q.shape
    dv, scale, sinks = v.shape[-1], logits.scale, logits.sinks
    assert sinks is not None
    width = max(d + 1, dv)  # one head size for q, k and v: the CPU kernel's fast path wants it
    if q.device.type != "cpu":  # CUDA's kernels want multiples of 8; the CPU's take any width
        width += -width % 8
    q1 = F.pad(torch.cat([q, q.new_ones(batch, heads, lq, 1)], dim=-1), (0, width - d - 1))
    if causal:
        q1 = torch.cat([q1.new_zeros(batch, heads, 1, width), q1], dim=2)
    sink_key = torch.cat([q.new_zeros(batch, heads, 1, d),
                          (sinks.to(q.dtype) / scale).view(1, heads, 1, 1).expand(batch, heads, 1, 1)], dim=-1)
    k1 = F.pad(torch.cat([sink_key, F.pad(k, (0, 1))], dim=2), (0, width - d - 1))
    v1 = F.pad(torch.cat([v.new_zeros(batch, heads, 1, dv), v], dim=2), (0, width - dv))
    attn_mask = None
    if mask is not None:  # torch's bool masks say True = may attend
        attn_mask = F.pad(~mask, (1, 0), value=True) if mask.dtype == torch.bool else F.pad(mask, (1, 0), value=0.0)
    out = F.scaled_dot_product_attention(q1, k1, v1, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=causal,
                                         scale=scale)
    return (out[:, :, 1:, :dv] if causal else out[..., :dv]), None


# On a CPU with native bfloat16, torch's flash kernel is slower than the explicit path in bfloat16 and
# float16 for short rows, and faster for long ones; without native bfloat16 it is faster at every length
# (results page "Why the fast paths", short-bf16-rows). Below this many keys such CPUs take the explicit path.
SHORT_HALF_KEYS_CPU = 128


def _short_half_on_cpu(q: Tensor, lk: int) -> bool:
    return (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and lk < SHORT_HALF_KEYS_CPU
            and native_bf16_cpu())


def choose(q: Tensor, lk: int, logits: Logits, *, dropout_p: float, need_weights: bool) -> Kernel:
    """The kernel for this call: :func:`explicit` where the fused kernel cannot give the answer or
    is slower, else :func:`fused` (:func:`fused_sink_key` with sinks)."""
    if need_weights:  # only the definition forms them
        return explicit
    if logits.softcap is not None:  # torch's kernel has no step between the product and the softmax
        return explicit
    if dropout_p > 0 and q.device.type == "cpu":  # torch's CPU kernel draws its dropout with the slow bernoulli_
        return explicit  # and forms the weights anyway: attnlab's dropout on the explicit path is faster
    if _short_half_on_cpu(q, lk):
        return explicit
    return fused if logits.sinks is None else fused_sink_key
