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
from torch import Tensor

from ..errors import InputError, shape_str
from . import kernels

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
            weights wanted, torch's fused kernel computes it with one key more
            (:func:`~attnlab.attention.kernels.fused_sink_key`).
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
    if softcap is not None and not softcap > 0:
        raise InputError(f"softcap must be a positive number; got {softcap}")
    if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != heads):
        raise InputError(f"sinks must have shape (H,) = ({heads},); got {shape_str(sinks)}")
    logits = kernels.Logits(1.0 / math.sqrt(d) if scale is None else scale, softcap, sinks)
    kernel = kernels.choose(q, lk, logits, dropout_p=dropout_p, need_weights=need_weights)
    # The most common causal case: a fused kernel builds the triangle itself.
    causal = (is_causal and lq == lk and attn_mask is None and key_padding_mask is None
              and kernel is not kernels.explicit)
    mask = None if causal else merge_masks(attn_mask, key_padding_mask, is_causal, batch, heads, lq, lk, q.dtype,
                                           q.device)
    dead = None  # rows with every key blocked, where the softmax would be 0/0: their output is 0
    if mask is not None:
        dead = (mask if mask.dtype == torch.bool else mask == -math.inf).all(dim=-1, keepdim=True)
    out, weights = kernel(q, k, v, mask=mask, dead=dead, causal=causal, logits=logits, dropout_p=dropout_p,
                          need_weights=need_weights)
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    if unbatched_heads:
        out = out.squeeze(1)
        weights = None if weights is None else weights.squeeze(1)
    return out, weights
