"""Exact attention through torch's FlexAttention, given the mask's *structure* instead of a
dense mask: a causal triangle, a sliding window, packed documents, ALiBi, soft-capping, sinks,
a block-sparse selection and key padding become a score function and a block mask
(``torch.nn.attention.flex_attention``), so no ``(Lq, Lk)`` logits or mask is ever formed
and the blocks that every query of a tile skips are never computed.

The semantics are those of :func:`~attnlab.attention.functional.scaled_dot_product_attention`
with the masks that :class:`~attnlab.attention.exact.GroupedQueryAttention` builds (the
library's mask convention: ``True`` = blocked for ``key_padding_mask``; rows with every key
blocked give zeros). Positions are aligned bottom-right as the causal mask is: query ``i``
sits at slot ``i + Lk - Lq`` among the keys' slots ``0..Lk-1``.

:func:`flex_runs` says whether it can run: on CUDA always (a Triton kernel, forward and
backward); on the CPU only without autograd (torch 2.13 compiles no CPU backward for it) and
only when inductor finds a C++ compiler.
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from typing import Callable

import torch
from torch import Tensor

from ..errors import InputError, shape_str

__all__ = ["flex_attention_forward", "flex_runs", "warn_fallback_once"]

_COMPILED: Callable | None = None
_WARNED: set[str] = set()  # the fallback notices given in this process
_BLOCK_MASKS: dict[tuple, object] = {}  # block masks of the tensor-free patterns (causal, window), by shape
_BLOCK_MASKS_KEPT = 32


def _flex() -> Callable:
    """``torch.compile(flex_attention)``, made once per process: uncompiled, torch runs it as
    plain operators that form the whole score matrix."""
    global _COMPILED
    if _COMPILED is None:
        from torch.nn.attention.flex_attention import flex_attention
        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED


def _cpp_compiler() -> str | None:
    """The C++ compiler inductor would use, found as it searches (``torch._inductor.config.cpp.cxx``,
    which holds ``$CXX`` or ``g++``), by path only: nothing is compiled or run."""
    try:
        from torch._inductor import config
        search = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
    except Exception:  # noqa: BLE001 - an inductor without this config: look for the usual names
        search = (os.environ.get("CXX", "g++"),)
    for name in search:
        if name and shutil.which(name):
            return name
    return None


def flex_runs(device: torch.device | str, needs_grad: bool) -> tuple[bool, str]:
    """Whether FlexAttention runs on ``device`` (with a backward pass when ``needs_grad``), and
    why not in one line when it does not."""
    kind = torch.device(device).type
    if kind == "cuda":
        from torch.utils._triton import has_triton
        return (True, "") if has_triton() else (False, "flex_attention on CUDA needs Triton, which is not installed")
    if kind != "cpu":
        return False, f"flex_attention runs on CUDA and the CPU; the tensors are on {kind}"
    if needs_grad:
        return False, "torch compiles no CPU backward for flex_attention (training on the CPU)"
    if _cpp_compiler() is None:
        return False, "inductor finds no C++ compiler to build flex_attention's CPU kernel (set CXX or install g++)"
    return True, ""


def warn_fallback_once(reason: str) -> None:
    """Say once per process that ``kernel="flex"`` was asked for and the standard path runs instead."""
    if reason in _WARNED:
        return
    _WARNED.add(reason)
    warnings.warn(f"kernel='flex' falls back to the standard attention path: {reason}", stacklevel=3)


def _check(q: Tensor, k: Tensor, v: Tensor, documents: Tensor | None, alibi_slopes: Tensor | None,
           softcap: float | None, sinks: Tensor | None, block_sparse: Tensor | None, key_padding_mask: Tensor | None,
           window: int | None) -> int | None:
    """Refuse bad input in one line naming it; the block-sparse selection's block size (or None)."""
    if q.dim() != 4:
        raise InputError(f"q must be (B, H, Lq, D); got shape {shape_str(q)}")
    batch, heads, lq, d = q.shape
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 4 or t.shape[0] != batch or heads % max(t.shape[1], 1) or t.shape[1] == 0:
            raise InputError(f"{name} must be (B, Hkv, Lk, D) with B = {batch} and Hkv dividing H = {heads}; "
                             f"got shape {shape_str(t)}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2] or k.shape[-1] != d:
        raise InputError(f"k must be (B, Hkv, Lk, {d}) and v (B, Hkv, Lk, Dv) with k's heads and length; got k "
                         f"{shape_str(k)} and v {shape_str(v)}")
    lk = k.shape[2]
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise InputError(f"window must be a positive number of positions; got {window!r}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and 0 < softcap < math.inf):
        raise InputError(f"softcap must be a positive number; got {softcap!r}")
    for name, t in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if t is not None and tuple(t.shape) != (heads,):
            raise InputError(f"{name} must have shape (H,) = ({heads},); got {shape_str(t)}")
    if documents is not None and (tuple(documents.shape) != (batch, lk) or documents.is_floating_point()
                                  or documents.dtype == torch.bool):
        raise InputError(f"documents must be (B, Lk) = ({batch}, {lk}) integer ids; got {shape_str(documents)} "
                         f"{documents.dtype}")
    if key_padding_mask is not None and (tuple(key_padding_mask.shape) != (batch, lk)
                                         or key_padding_mask.dtype != torch.bool):
        raise InputError(f"key_padding_mask must be a torch.bool (B, Lk) = ({batch}, {lk}) mask (True = padding); "
                         f"got {shape_str(key_padding_mask)} {key_padding_mask.dtype}")
    if block_sparse is None:
        return None
    ok = block_sparse.dtype == torch.bool and block_sparse.dim() == 4 and block_sparse.shape[0] == batch \
        and block_sparse.shape[1] in (1, heads) and block_sparse.shape[2] > 0 and block_sparse.shape[3] > 0
    block = lq // block_sparse.shape[2] if ok else 0
    if not ok or block == 0 or block * block_sparse.shape[2] != lq or block * block_sparse.shape[3] != lk:
        raise InputError(f"block_sparse must be a torch.bool (B, H or 1, Lq // block, Lk // block) selection of one "
                         f"block size dividing Lq = {lq} and Lk = {lk}; got {shape_str(block_sparse)} "
                         f"{block_sparse.dtype}")
    return block


def _block_mask(mask_mod: Callable, batch: int | None, heads: int | None, lq: int, lk: int, device: torch.device,
                block: int, key: tuple | None):
    """``create_block_mask`` of ``mask_mod``; kept by ``key`` when one is given (a pattern without
    tensors, whose mask depends on the shape alone)."""
    from torch.nn.attention.flex_attention import create_block_mask
    if key is not None:
        key = (*key, lq, lk, block, str(device))
        hit = _BLOCK_MASKS.get(key)
        if hit is not None:
            return hit
    made = create_block_mask(mask_mod, batch, heads, lq, lk, device=device, BLOCK_SIZE=block)
    if key is not None:
        if len(_BLOCK_MASKS) >= _BLOCK_MASKS_KEPT:
            _BLOCK_MASKS.pop(next(iter(_BLOCK_MASKS)))
        _BLOCK_MASKS[key] = made
    return made


def flex_attention_forward(q: Tensor, k: Tensor, v: Tensor, *, scale: float | None = None, causal: bool = False,
                           window: int | None = None, documents: Tensor | None = None,
                           alibi_slopes: Tensor | None = None, softcap: float | None = None,
                           sinks: Tensor | None = None, block_sparse: Tensor | None = None,
                           key_padding_mask: Tensor | None = None) -> Tensor:
    """softmax(q kᵀ · scale + structure) v through compiled FlexAttention.

    Args:
        q: ``(B, H, Lq, D)``.
        k: ``(B, Hkv, Lk, D)``, ``Hkv`` dividing ``H`` (query head ``h`` reads key/value head
            ``h // (H / Hkv)``).
        v: ``(B, Hkv, Lk, Dv)``.
        scale: logit scale (default ``D ** -0.5``).
        causal: query ``i`` sees key ``j`` when ``j <= i + Lk - Lq`` (bottom-right).
        window: query ``i`` sees keys less than ``window`` slots from its own (behind; also
            ahead when not causal), itself included, as :func:`~attnlab.attention.exact.band_mask`.
        documents: ``(B, Lk)`` integer ids: a query sees a key of its own id only; a negative id
            is padding, which sees nothing.
        alibi_slopes: ``(H,)``: ``-slope_h · |q_slot - k_slot|`` added to the logits
            (:func:`~attnlab.attention.alibi.alibi_bias`).
        softcap: the scaled logits squashed to ``softcap · tanh(logit / softcap)`` before any
            bias or mask, as the standard path does.
        sinks: ``(H,)``: one more logit per head, of a key without value (gpt-oss).
        block_sparse: bool ``(B, H or 1, Lq / blk, Lk / blk)``, ``True`` = the query block may
            see the key block; ``blk`` is read from the shape.
        key_padding_mask: bool ``(B, Lk)``, ``True`` = padding.

    Returns:
        ``(B, H, Lq, Dv)``; a query that sees no key gets zeros.

    The first call of each shape and pattern compiles a kernel (seconds on the CPU); the
    compiled function is made once per process, and the block masks of causal and windowed
    patterns are kept per shape.
    """
    block = _check(q, k, v, documents, alibi_slopes, softcap, sinks, block_sparse, key_padding_mask, window)
    batch, heads, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    offset = lk - lq  # query i sits at key slot i + offset
    scale = d ** -0.5 if scale is None else float(scale)
    # torch's CPU kernel of flex_attention returns no logsumexp (2.13): there the sink is one more
    # key, at slot lk, whose value is zero; on CUDA it is folded in from the logsumexp afterwards.
    sink_key = sinks is not None and q.device.type != "cuda"
    keys = lk + 1 if sink_key else lk

    parts: list[Callable] = []
    if causal:
        parts.append(lambda b, h, qi, kj: kj <= qi + offset)
    if window is not None:
        if causal:
            parts.append(lambda b, h, qi, kj: qi + offset - kj < window)
        else:
            parts.append(lambda b, h, qi, kj: (qi + offset - kj).abs() < window)
    if documents is not None:
        # the last real key when kj is the sink's slot: any index in range, the sink is let through below
        def same_document(b, h, qi, kj):
            dq = documents[b, qi + offset]
            return (dq == documents[b, kj.clamp(max=lk - 1)]) & (dq >= 0)
        parts.append(same_document)
    if key_padding_mask is not None:
        parts.append(lambda b, h, qi, kj: ~key_padding_mask[b, kj.clamp(max=lk - 1)])
    if block_sparse is not None:
        per_head = block_sparse.shape[1] != 1
        parts.append(lambda b, h, qi, kj: block_sparse[b, h if per_head else 0, qi // block,
                                                       kj.clamp(max=lk - 1) // block])

    def real_keys(b, h, qi, kj):
        keep = kj < lk
        for part in parts:
            keep = keep & part(b, h, qi, kj)
        return keep

    mask_mod = (lambda b, h, qi, kj: real_keys(b, h, qi, kj) | (kj == lk)) if sink_key else real_keys
    tensors = documents is not None or key_padding_mask is not None or block_sparse is not None
    mask_batch = batch if tensors else None
    mask_heads = heads if block_sparse is not None and block_sparse.shape[1] != 1 else None
    # Flex's blocks are 128 by 128; a block-sparse selection's own size lines its blocks up with flex's.
    tile = block if block is not None and block >= 16 else 128
    key = None if tensors else ("sink" if sink_key else "", causal, window, offset)
    block_mask = _block_mask(mask_mod, mask_batch, mask_heads, lq, keys, q.device, tile, key)

    def biased(score, b, h, qi, kj):
        if softcap is not None:
            score = torch.tanh(score / softcap) * softcap
        if alibi_slopes is not None:
            distance = (qi + offset - kj).abs().to(torch.float32)
            score = score + (-alibi_slopes[h] * distance).to(score.dtype)
        return score

    score_mod: Callable | None = None
    if sink_key:
        def score_mod(score, b, h, qi, kj):
            return torch.where(kj == lk, sinks[h].to(score.dtype), biased(score, b, h, qi, kj))
    elif softcap is not None or alibi_slopes is not None:
        score_mod = biased

    gqa = k.shape[1] != heads
    if sink_key:
        k = torch.cat([k, k.new_zeros(batch, k.shape[1], 1, d)], dim=2)
        v = torch.cat([v, v.new_zeros(batch, v.shape[1], 1, dv)], dim=2)
    if sinks is not None and not sink_key:
        out, lse = _flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                           return_lse=True)
        return sink_from_lse(out, lse, sinks)
    return _flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)


def sink_from_lse(out: Tensor, lse: Tensor, sinks: Tensor) -> Tensor:
    """Attention with a sink logit per head from attention without it: the sink takes
    ``exp(sink) / (Z + exp(sink))`` of each row's weight, ``Z = exp(lse)`` the row's own sum, so
    the output shrinks by ``Z / (Z + exp(sink)) = sigmoid(lse - sink)``. ``lse`` ``(B, H, Lq)`` is
    flex's, in natural log (torch computes it in base 2 and converts it back). A row that sees no
    key has ``lse = -inf``: its factor is 0, as its output already is."""
    factor = torch.sigmoid(lse.float() - sinks.float().view(1, -1, 1))
    return (out.float() * factor[..., None]).to(out.dtype)
