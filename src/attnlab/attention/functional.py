"""Scaled dot-product attention and the library's one mask convention.

Mask convention (used everywhere in attnlab)
--------------------------------------------
* A **boolean** mask marks positions that are *blocked*: ``True`` means "this query
  may not look at this key". This is the convention of ``torch.nn.MultiheadAttention``
  and ``torch.nn.Transformer``; ``torch.nn.functional.scaled_dot_product_attention``
  uses the opposite one, and this module converts at that boundary only.
* A **floating** mask is *added* to the attention logits: ``0`` keeps a position,
  ``-inf`` blocks it, anything in between biases it.
* ``key_padding_mask`` has shape ``(B, Lk)`` and marks padded keys (``True`` = padding).
* ``attn_mask`` has shape ``(Lq, Lk)`` or the full rank of the query, broadcastable to
  ``(B, H, Lq, Lk)`` (``(B, Lq, Lk)`` for 3-D inputs).
* ``is_causal`` blocks keys in the future. It is aligned to the *bottom right*: query
  ``i`` may see key ``j`` when ``j <= i + (Lk - Lq)``. With ``Lq == Lk`` that is the
  usual lower triangle; with a key/value cache (``Lk > Lq``) the new queries see the
  whole prefix.
* A query whose keys are *all* blocked gets an output of zeros and a zero gradient,
  never NaN (a fully padded sequence is legal input).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..dropout import dropout
from ..cpu import native_bf16_cpu
from ..errors import InputError, shape_str

__all__ = ["check_heads", "scaled_dot_product_attention", "merge_masks", "combine_masks", "causal_mask",
           "masked_softmax"]


def check_positive_int(name: str, value: object) -> int:
    """``value``, refused in one line naming ``name`` unless it is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive integer; got {value!r}")
    return value


def check_heads(embed_dim: int, num_heads: int, dropout: float = 0.0) -> None:
    """The arguments every attention module shares, checked once for all of them:
    ``embed_dim`` and ``num_heads`` positive integers, ``num_heads`` dividing ``embed_dim``,
    ``dropout`` in ``[0, 1)``."""
    if isinstance(embed_dim, bool) or isinstance(num_heads, bool) or not isinstance(embed_dim, int) \
            or not isinstance(num_heads, int) or embed_dim <= 0 or num_heads <= 0:
        raise InputError(f"embed_dim and num_heads must be positive integers; got embed_dim={embed_dim!r}, "
                         f"num_heads={num_heads!r}")
    if embed_dim % num_heads:
        raise InputError(f"embed_dim must be divisible by num_heads; got embed_dim={embed_dim}, num_heads={num_heads}")
    if not 0.0 <= dropout < 1.0:
        raise InputError(f"dropout must be in [0, 1); got {dropout}")


def masked_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis of ``scores`` whose masked entries are ``-inf``; a row
    with no finite score (a query that sees no key) gives zeros, and no NaN reaches the
    backward pass. For the kinds that mask their own score blocks (top-k, LSH)."""
    dead = torch.isinf(scores).all(dim=-1, keepdim=True)
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


def causal_mask(lq: int, lk: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean ``(Lq, Lk)`` mask, ``True`` above the bottom-right-aligned diagonal."""
    return torch.ones(lq, lk, dtype=torch.bool, device=device).triu(lk - lq + 1)


def combine_masks(mask: Tensor | None, extra: Tensor | None) -> Tensor | None:
    """Two attention masks as one, broadcast together: boolean when both are (``True`` =
    blocked, either blocks), else a float mask (a blocked position gets ``-inf``, biases add)."""
    if mask is None or extra is None:
        return extra if mask is None else mask
    if mask.dtype == torch.bool and extra.dtype == torch.bool:
        return mask | extra
    if mask.dtype == torch.bool:
        mask, extra = extra, mask
    return mask.masked_fill(extra, -math.inf) if extra.dtype == torch.bool else mask + extra


def _check_mask_dtype(name: str, mask: Tensor) -> None:
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise InputError(
            f"{name} must be a torch.bool mask (True = blocked) or a floating additive mask; "
            f"got dtype {mask.dtype}"
        )


def merge_masks(
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    is_causal: bool,
    batch: int,
    heads: int,
    lq: int,
    lk: int,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor | None:
    """Combine the three ways of masking into one 4-D mask broadcastable to (B, H, Lq, Lk).

    The result is boolean (``True`` = blocked) when every input is boolean, else an
    additive float mask of ``dtype``. ``None`` when nothing is masked. The attention
    masks must already be validated (see :func:`scaled_dot_product_attention`).
    """
    parts: list[Tensor] = []
    if attn_mask is not None:
        parts.append(attn_mask if attn_mask.dim() == 4 else attn_mask.view(1, 1, lq, lk))
    if key_padding_mask is not None:
        parts.append(key_padding_mask.view(batch, 1, 1, lk))
    if is_causal and lq > 1:  # a single query sees the whole (cached) prefix
        parts.append(causal_mask(lq, lk, device).view(1, 1, lq, lk))
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        mask = parts[0]
        for p in parts[1:]:
            mask = mask | p
        return mask
    mask = None
    for p in parts:
        p = torch.zeros(p.shape, dtype=dtype, device=device).masked_fill(p, -math.inf) if p.dtype == torch.bool else p.to(dtype)
        mask = p if mask is None else mask + p
    return mask


def _validate(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None) -> None:
    if q.dim() not in (3, 4):
        raise InputError(f"q must be (B, Lq, D) or (B, H, Lq, D); got shape {shape_str(q)}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise InputError(f"{name} must have the rank of q ({q.dim()}); got shape {shape_str(t)}")
        if t.shape[:-2] != q.shape[:-2]:
            raise InputError(
                f"{name} must share the batch/head sizes {tuple(q.shape[:-2])} of q; got shape {shape_str(t)}"
            )
    if k.shape[-1] != q.shape[-1]:
        raise InputError(f"k must have q's feature size {q.shape[-1]}; got shape {shape_str(k)}")
    if v.shape[-2] != k.shape[-2]:
        raise InputError(f"v must have k's length {k.shape[-2]}; got shape {shape_str(v)} for k {shape_str(k)}")
    lq, lk = q.shape[-2], k.shape[-2]
    if key_padding_mask is not None:
        _check_mask_dtype("key_padding_mask", key_padding_mask)
        if tuple(key_padding_mask.shape) != (q.shape[0], lk):
            raise InputError(
                f"key_padding_mask must have shape (B, Lk) = ({q.shape[0]}, {lk}); got {shape_str(key_padding_mask)}"
            )
    if attn_mask is not None:
        _check_mask_dtype("attn_mask", attn_mask)
        full = tuple(q.shape[:-2]) + (lq, lk)
        ok = attn_mask.dim() == 2 and tuple(attn_mask.shape) == (lq, lk)
        ok = ok or (
            attn_mask.dim() == q.dim()
            and attn_mask.shape[-2:] == (lq, lk)
            and all(m in (1, f) for m, f in zip(attn_mask.shape, full))
        )
        if not ok:
            raise InputError(
                f"attn_mask must have shape (Lq, Lk) = ({lq}, {lk}) or be broadcastable to {full}; "
                f"got {shape_str(attn_mask)}"
            )


# On a CPU with native bfloat16, torch's flash kernel is slow in bfloat16/float16 for short
# rows: forward + backward of (B, 4, L, 32) with B*L = 16,384, 2 cores of an AMD EPYC with
# avx512_bf16, torch 2.13: L=64 flash 83 ms vs explicit 29 ms; L=128 91 vs 102; L=256 83 vs
# 223 (head size 64: L=64 96 vs 47, L=128 125 vs 92, L=256 122 vs 226), the explicit path
# with a float32 softmax. Without native bfloat16 it is the other way round (AVX2-only EPYC:
# L=64 flash 163 ms vs explicit 649; L=128 280 vs 1,117): the rule holds only where the CPU
# has avx512_bf16 or amx_bf16. Below this many keys such CPUs take the explicit path.
SHORT_HALF_KEYS_CPU = 128


def _short_half_on_cpu(q: Tensor, lk: int) -> bool:
    return (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and lk < SHORT_HALF_KEYS_CPU
            and native_bf16_cpu())


def _attend_with_sink_key(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, mask: Tensor | None, causal: bool,
                          dropout_p: float, scale: float) -> Tensor:
    """Attention with a sink logit per head through torch's fused kernel: the sink becomes one
    more key, first, whose logit is ``sinks[h]`` for every query and whose value is zero. Each
    query gets one more feature, 1, and each key 0 (the sink key: ``sinks[h] / scale``), so the
    real keys' logits are unchanged. The weights never exist: memory stays linear in the
    length, where the explicit path forms the ``(Lq, Lk + 1)`` logits (8 heads at 16,384
    positions: 24 GiB). A row whose real keys are all blocked gives its whole weight to the
    sink and outputs 0, as the explicit path does.

    ``mask``: merged, ``True`` = blocked (or additive), broadcastable to ``(B, H, Lq, Lk)``: it
    gains the sink's column, never blocked. ``causal`` (no mask, ``Lq == Lk``): the kernel's
    triangle, which is aligned top-left, so a query row is put first too (it sees the sink
    alone) for query ``i`` to see the sink and keys ``0..i``; that row is then dropped."""
    batch, heads, lq, d = q.shape
    dv = v.shape[-1]
    width = max(d + 1, dv)  # one head size for q, k and v: the CPU kernel's fast path wants it
    if q.device.type != "cpu":  # CUDA's kernels want multiples of 8; the CPU's take any (65 against 72 for heads
        width += -width % 8  # of 64, causal, n = 8,192, 8 heads: 642 against 671 ms, AMD EPYC, 2 threads)
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
    return out[:, :, 1:, :dv] if causal else out[..., :dv]


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q kᵀ · scale + mask) v, through torch's fused kernel unless weights are wanted.

    Args:
        q: ``(B, H, Lq, D)`` or ``(B, Lq, D)``.
        k: ``(B, H, Lk, D)`` or ``(B, Lk, D)``.
        v: ``(B, H, Lk, Dv)`` or ``(B, Lk, Dv)``.
        attn_mask: ``(Lq, Lk)`` or broadcastable to ``(B, H, Lq, Lk)``; bool (``True`` =
            blocked) or float (added to the logits). See the module docstring.
        key_padding_mask: ``(B, Lk)``; bool (``True`` = padding) or float (added).
        is_causal: block future keys, aligned bottom-right (see the module docstring).
        dropout_p: dropout probability on the attention weights. Pass 0 in eval mode.
        scale: logit scale; default ``1 / sqrt(D)``.
        softcap: squash the scaled logits into ``(-softcap, softcap)`` as
            ``softcap * tanh(logits / softcap)`` before the mask (Gemma 2's attention-logit
            soft-capping); torch's fused kernel has no such step, so it takes the explicit path.
        sinks: a learned logit per head, ``(H,)`` (gpt-oss's attention sinks): a key that every
            query sees, with no value, so that a query can give part of its weight to nothing;
            the weights returned are those of the real keys (they sum to less than 1). Without
            weights wanted, torch's fused kernel computes it with one key more (:func:`_sink_key`).
        need_weights: also return the attention weights (disables the fused kernel).

    Returns:
        ``(output, weights)``: output ``(B, H, Lq, Dv)`` (or ``(B, Lq, Dv)``); weights
        ``(B, H, Lq, Lk)`` (or ``(B, Lq, Lk)``) before dropout, or ``None`` when
        ``need_weights`` is False. Rows whose keys are all blocked are zero.
    """
    _validate(q, k, v, attn_mask, key_padding_mask)
    unbatched_heads = q.dim() == 3
    if unbatched_heads:  # treat (B, L, D) as one head
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        if attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask.unsqueeze(1)
    batch, heads, lq, d = q.shape
    lk = k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale

    # On the CPU torch's kernel draws attention dropout with its slow bernoulli_ (and
    # materializes the weights anyway): the explicit path below with attnlab's dropout
    # is faster there.
    if softcap is not None and not softcap > 0:
        raise InputError(f"softcap must be a positive number; got {softcap}")
    if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != heads):
        raise InputError(f"sinks must have shape (H,) = ({heads},); got {shape_str(sinks)}")
    explicit = need_weights or softcap is not None or (dropout_p > 0 and q.device.type == "cpu") \
        or _short_half_on_cpu(q, lk)
    # Fast path for the most common causal case: let the kernel build the triangle.
    fused_causal = is_causal and lq == lk and attn_mask is None and key_padding_mask is None and not explicit
    mask = None if fused_causal else merge_masks(
        attn_mask, key_padding_mask, is_causal, batch, heads, lq, lk, q.dtype, q.device
    )
    # Rows with every key blocked: softmax would be 0/0. Compute them on an unblocked row
    # (finite, no NaN in forward or backward) and zero the result.
    dead = None
    if mask is not None:
        blocked = mask if mask.dtype == torch.bool else mask == -math.inf
        dead = blocked.all(dim=-1, keepdim=True)  # (b, h, Lq, 1), b/h may be 1

    if not explicit and sinks is not None:
        out = _attend_with_sink_key(q, k, v, sinks, mask, fused_causal, dropout_p, scale)
        weights = None
    elif not explicit:
        if mask is not None and mask.dtype == torch.bool:
            mask = ~mask if dead is None else ~mask | dead  # torch: True = may attend
        elif mask is not None:
            mask = mask.masked_fill(dead, 0.0)
        dv = v.shape[-1]
        if dv != d and q.device.type == "cpu":
            # torch's CPU kernel takes one head size for queries, keys and values; given two it falls
            # back to its math path, which forms the (Lq, Lk) weights. Zeros appended to the shorter
            # side change no dot product (the scale is explicit) and no output column that is kept.
            # Differential attention (values of 2 x 64, 8 heads, causal), forward at n = 16,384, AMD
            # EPYC, 2 threads: 41.7 s and 19.7 GB through the math path, 4.5 s and 365 MB padded.
            width = max(d, dv)
            if d < width:
                q, k = F.pad(q, (0, width - d)), F.pad(k, (0, width - d))
            else:
                v = F.pad(v, (0, width - dv))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=fused_causal, scale=scale
        )
        if out.shape[-1] != dv:
            out = out[..., :dv]
        weights = None
    else:
        # Scale the smaller of the queries (Lq, D) and the logits (Lq, Lk).
        if d <= lk:
            logits = torch.matmul(q * scale, k.transpose(-2, -1))
        else:
            logits = torch.matmul(q, k.transpose(-2, -1)) * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        if mask is not None:
            logits = logits.masked_fill(mask, -math.inf) if mask.dtype == torch.bool else logits + mask
            logits = logits.masked_fill(dead, 0.0)
        # float16's exp overflows for long rows: its softmax runs in float32. bfloat16 has float32's
        # range, and torch's softmax accumulates it in float32 on CPU and CUDA, so its output equals
        # float32's rounded to bfloat16, without the two casts. On the CPU that pays from rows of 32
        # (4 M elements, forward + backward, AVX512 EPYC: 64 keys 3.3 ms vs 7.5 ms, 96 keys 3.0 vs
        # 6.7) but not below them (24 keys: 24 ms vs 9.5), where torch's bfloat16 kernel is not vectorized.
        bf16_soft = q.dtype == torch.bfloat16 and (lk >= 32 or q.device.type != "cpu")
        soft_dtype = q.dtype if bf16_soft else torch.promote_types(q.dtype, torch.float32)
        if sinks is None:
            weights = torch.softmax(logits, dim=-1, dtype=soft_dtype).to(q.dtype)
        else:  # one more column, the sink's, in the softmax; then left out
            column = sinks.to(logits.dtype).view(1, heads, 1, 1).expand(*logits.shape[:-1], 1)
            weights = torch.softmax(torch.cat([logits, column], dim=-1), dim=-1, dtype=soft_dtype)[..., :-1].to(q.dtype)
        if dead is not None:
            weights = weights.masked_fill(dead, 0.0)
        dropped = dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        out = torch.matmul(dropped, v)
        if not need_weights:
            weights = None
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    if unbatched_heads:
        out = out.squeeze(1)
        weights = None if weights is None else weights.squeeze(1)
    return out, weights
