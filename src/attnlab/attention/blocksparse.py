"""Attention of each query over a few blocks of keys that it picks, without an n x n tensor.

Native sparse attention's selected branch (:mod:`attnlab.attention.nsa`): every query ``i`` of a
stream (a batch row and key/value head) names up to ``S`` blocks of ``block`` keys, and attends,
with the ``G`` query heads that share those keys, to the keys of its blocks that it may see
(key ``j`` when ``j <= t_i``, ``t_i`` the query's position). Dense attention with a mask costs
``n x n``; this costs ``n x S x block``.

:func:`selected_block_attention` turns the selection around (:class:`_BlockMajor`): for each key
block, the queries that picked it are gathered and attend to it in one matrix product, so a
block's keys are read once for all its queries (gathering ``S x block`` keys for each query
instead reads 64 times more: for heads of 64, blocks of 64, 17 picked, 8 heads at 16,384
positions, 36 GB of keys against 0.6 GB of queries). One pass over the blocks adds each block's
share to its queries' running sums, as FlashAttention's online softmax adds a tile's; the
backward recomputes the scores block by block from the log-sum-exp the forward kept, so what is
kept is the size of the inputs and the output. A few queries (a decoding step) take
:func:`_gathered` instead: one gather, no loop over the blocks.

DeepSeek's sparse attention (:class:`~attnlab.attention.latent.IndexedSparseAttention`) picks
single keys, not blocks: :func:`picked_key_attention` gathers each query's picked latents a
chunk of queries at a time and attends to them with every head at once, recomputing each chunk
in the backward.

A sliding window is a band of blocks: :func:`window_attention` cuts the queries into chunks and
has each chunk attend, in one call of the fused kernel for all chunks, to the stretch of keys
its window covers (a view of the keys, no copy per chunk), so it reads ``chunk + window - 1``
keys a query (twice the window both ways), not the ``n`` of a dense mask. The ``local`` kind,
the sliding window of the ``exact`` kind and native sparse attention's window branch all run on it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .functional import scaled_dot_product_attention

__all__ = ["picked_key_attention", "selected_block_attention", "window_attention"]

# Up to this many queries a stream, the selected keys are gathered per query (one step of
# decoding reads S x block keys instead of looping over every block of the cache).
GATHER_QUERIES = 16


def window_chunk(window: int, causal: bool = True) -> int:
    """The queries a chunk of :func:`window_attention` holds: it reads ``chunk + window - 1``
    keys (``+ window - 1`` more both ways): a quarter of the window when causal and half of it
    both ways were the fastest chunks measured, the keys read twice being few against the
    products' sizes."""
    return max(64, window // 4 if causal else window // 2)


def window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, *, causal: bool = True,
                     key_padding_mask: Tensor | None = None, first: Tensor | None = None,
                     scale: float | None = None, dropout_p: float = 0.0) -> Tensor:
    """Attention of each query over the keys less than ``window`` positions from it, without an
    ``(Lq, Lk)`` mask: ``causal``, query ``i`` sees keys ``i - window < j <= i``; otherwise
    ``|i - j| < window``. ``q`` ``(B, H, Lq, D)``, ``k`` ``(B, H, Lk, D)``, ``v`` ``(B, H, Lk, Dv)``
    (key/value heads repeated per query head) -> ``(B, H, Lq, Dv)``. ``key_padding_mask``
    ``(B, Lk)`` bool, ``True`` = padding, never seen. ``first`` ``(B, 1)``: the key index of each
    row's first query (queries follow on from it; default 0, the keys are the queries' own). A
    query whose window holds no real key gets zeros.

    The keys are laid out for the queries (key ``u`` of query row ``i``'s band at ``i + u``),
    cut into overlapping stretches of ``chunk + band - 1`` (one view), and every chunk of
    queries attends to its stretch in one call of the fused kernel: no Python loop, and no
    slice whose backward fills a gradient of the whole keys (once per chunk: quadratic in the
    length)."""
    batch, h, lq, d = q.shape
    lk, dv, size = k.shape[2], v.shape[-1], window_chunk(window, causal)
    if batch == 0 or lq == 0 or lk == 0:  # nothing to attend: the empty (or all-zero) result, on the graph
        return q.new_zeros(batch, h, lq, dv) + 0 * v.sum()
    if first is None:
        first = torch.zeros(batch, 1, dtype=torch.long, device=q.device)
    ahead = 0 if causal else window - 1  # the keys after the query its band holds
    chunks = -(-lq // size)
    span = size + window - 1 + ahead
    # key slot u of row b is key j = u + first[b] - (window - 1): the band of query i is slots i .. i + window - 1 + ahead
    j = torch.arange(chunks * size + window - 1 + ahead, device=q.device) + (first - (window - 1))  # (B, slots)
    key = j.clamp(0, lk - 1)
    real = (j >= 0) & (j < lk)
    if key_padding_mask is not None:
        real = real & ~key_padding_mask.gather(1, key)
    windows = [x.gather(2, key[:, None, :, None].expand(-1, h, -1, x.shape[-1])).unfold(2, span, size)
               .transpose(-1, -2) for x in (k, v)]  # (B, H, chunks, span, D)
    rows = torch.arange(size, device=q.device)
    slots = torch.arange(span, device=q.device)
    band = (slots[None, :] < rows[:, None]) | (slots[None, :] > rows[:, None] + window - 1 + ahead)  # (size, span)
    starts = torch.arange(chunks, device=q.device)[:, None] * size
    unreal = ~real.gather(1, (starts + slots).view(1, -1).expand(batch, -1)).view(batch, chunks, 1, span)
    blocked = (band | unreal).view(batch * chunks, 1, size, span)
    qc = F.pad(q, (0, 0, 0, chunks * size - lq)).view(batch, h, chunks, size, d).transpose(1, 2)
    kc, vc = (x.transpose(1, 2).reshape(batch * chunks, h, span, x.shape[-1]) for x in windows)
    o, _ = scaled_dot_product_attention(qc.reshape(batch * chunks, h, size, d), kc, vc, attn_mask=blocked,
                                        scale=scale, dropout_p=dropout_p)
    return o.view(batch, chunks, h, size, dv).transpose(1, 2).reshape(batch, h, chunks * size, dv)[:, :, :lq]


def _wide(t: Tensor) -> torch.dtype:
    """The dtype of the scores and sums: float32 for half inputs, the input's otherwise."""
    return torch.promote_types(t.dtype, torch.float32)


def _gathered(q: Tensor, k: Tensor, v: Tensor, t: Tensor, sel: Tensor, block: int, scale: float) -> Tensor:
    """The selected-block attention with each query's keys gathered (see the module); the
    arguments and the result as :func:`selected_block_attention`'s."""
    z, n, g, d = q.shape
    lk = k.shape[1]
    keys = sel.clamp(min=0)[..., None] * block + torch.arange(block, device=q.device)  # (Z, n, S, block)
    blocked = (sel[..., None] < 0) | (keys > t[:, :, None, None]) | (keys >= lk)
    keys, blocked = keys.flatten(2).clamp(max=lk - 1), blocked.flatten(2)  # (Z, n, S * block)
    index = keys.reshape(z, -1, 1)
    kg = k.gather(1, index.expand(-1, -1, d)).view(z, n, -1, d)
    vg = v.gather(1, index.expand(-1, -1, v.shape[-1])).view(z, n, -1, v.shape[-1])
    logits = torch.einsum("zngd,znkd->zngk", q, kg).to(_wide(q)) * scale
    logits = logits.masked_fill(blocked[:, :, None], -math.inf)
    dead = blocked.all(-1)[:, :, None, None]  # a query that sees none of its keys (a padded one): zeros
    weights = torch.softmax(logits.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return torch.einsum("zngk,znkd->zngd", weights.to(v.dtype), vg)


class _Layout:
    """The selection turned around: for each key block, the queries that picked it, stream by
    stream, as ``(Z, cap)`` query indices padded with -1 (``cap``: the most a stream gives it)."""

    def __init__(self, sel: Tensor, blocks: int) -> None:
        z, n, s = sel.shape
        device = sel.device
        # (block, stream) of each pick, the unpicked after every block; sorted (a boolean selection
        # of the picks instead takes most of the layer's time), in 32 bits: half the bytes to sort
        # (results page "Why the fast paths", sort-int32)
        stream = torch.arange(z, device=device, dtype=torch.int32).view(z, 1, 1)
        key = torch.where(sel >= 0, sel.int() * z + stream, blocks * z).view(-1)
        key, order = torch.sort(key)  # the order of a group's queries does not matter
        counts = torch.bincount(key, minlength=blocks * z + 1)[: blocks * z]
        picks = int(counts.sum())
        key, query = key[:picks].long(), (order[:picks] // s) % n
        rank = torch.arange(picks, device=device) - (counts.cumsum(0) - counts)[key]
        cap = counts.view(blocks, z).amax(1)
        offset = (cap * z).cumsum(0) - cap * z
        slots = torch.full((int((cap * z).sum()),), -1, dtype=torch.long, device=device)
        block = key // z
        slots[offset[block] + (key - block * z) * cap[block] + rank] = query
        self.streams, self.queries = z, n
        self.slots, self.cap, self.offset = slots, cap.tolist(), offset.tolist()

    def rows(self, m: int) -> Tensor | None:
        """Block ``m``'s ``(Z, cap)`` rows of the flattened queries (``stream * n + query``; the
        padding points at the row ``Z * n``, one past the last), or None when no query picked it."""
        cap = self.cap[m]
        if not cap:
            return None
        z, n = self.streams, self.queries
        query = self.slots[self.offset[m]: self.offset[m] + z * cap].view(z, cap)
        start = torch.arange(z, device=query.device)[:, None] * n
        return torch.where(query >= 0, query + start, z * n)

    def group_rows(self, first: int, last: int) -> Tensor | None:
        """The rows of blocks ``first`` to ``last - 1`` together, ``(Z, last - first, cap)`` (``cap``
        their largest), or None when no query picked any of them."""
        cap = max(self.cap[first:last])
        if not cap:
            return None
        z, n = self.streams, self.queries
        pad = z * n
        rows = [F.pad(self.rows(m), (0, cap - self.cap[m]), value=pad) if self.cap[m] else
                torch.full((z, cap), pad, dtype=torch.long, device=self.slots.device) for m in range(first, last)]
        return torch.stack(rows, 1)


def _logits(qg: Tensor, kb: Tensor, shift: Tensor | None) -> Tensor:
    """``qg @ kb^T - shift`` (the queries already scaled), in the scores' dtype: one fused
    product where the inputs are that wide."""
    if shift is None:
        return torch.bmm(qg, kb.transpose(1, 2)).to(_wide(qg))
    if qg.dtype == shift.dtype:
        return torch.baddbmm(shift.neg().unsqueeze(-1), qg, kb.transpose(1, 2))
    return torch.bmm(qg, kb.transpose(1, 2)).to(shift.dtype) - shift.unsqueeze(-1)


def _dropped(weights: Tensor, p: float, seed: int, m: int) -> tuple[Tensor, Tensor | None]:
    """``weights`` with dropout (draw ``m`` from ``seed``, drawn again in the backward)."""
    if not p:
        return weights, None
    gen = torch.Generator(device=weights.device)
    gen.manual_seed(seed + m)
    keep = (torch.rand(weights.shape, generator=gen, device=weights.device) >= p).to(weights.dtype) / (1 - p)
    return weights * keep, keep


# Own blocks taken together, this many at a time: a query is in one own block only, so they can
# share a product (one block at a time, the own blocks cost 250 small steps at 16,384 positions).
OWN_GROUP = 64


class _Span:
    """Keys ``first * block`` to ``last * block - 1`` of every stream, as ``last - first`` blocks,
    and the queries that attend to them, ``rows`` ``(Z * blocks, cap)`` of the flattened queries
    (each at most once); ``causal``: keys after a query are masked (its own block)."""

    def __init__(self, first: int, last: int, rows: Tensor, causal: bool, draw: int) -> None:
        self.first, self.last, self.causal, self.draw = first, last, causal, draw
        self.rows = rows.reshape(-1, rows.shape[-1])

    def keys(self, k: Tensor, block: int) -> Tensor:
        """The span's keys (or values, or their gradients) ``(Z * blocks, block, D)``."""
        z = k.shape[0]
        return k.view(z, -1, block, k.shape[-1])[:, self.first: self.last].reshape(-1, block, k.shape[-1])

    def add_to(self, grad: Tensor, value: Tensor, block: int) -> None:
        """Add ``value`` ``(Z * blocks, block, D)`` to the span's keys of ``grad`` ``(Z, L, D)``."""
        z, d = grad.shape[0], grad.shape[-1]
        grad.view(z, -1, block, d)[:, self.first: self.last] += value.view(z, -1, block, d)

    def logits(self, qf: Tensor, tf: Tensor, k: Tensor, block: int, g: int, shift: Tensor | None) -> tuple[Tensor, Tensor]:
        """``(logits or logits - shift (Z * blocks, cap * G, block), the gathered queries)``, the keys
        a query may not see at -inf (or their weights at 0 once ``shift`` is taken off)."""
        zb, cap = self.rows.shape
        flat = self.rows.view(-1)
        qg = qf.index_select(0, flat).view(zb, cap * g, -1)
        logits = _logits(qg, self.keys(k, block), shift)
        if self.causal:
            blocks = self.last - self.first
            keys = (torch.arange(self.first, self.last, device=k.device)[:, None] * block
                    + torch.arange(block, device=k.device)).repeat(zb // blocks, 1)  # (Z * blocks, block)
            late = keys[:, None, None, :] > tf.index_select(0, flat).view(zb, cap, 1, 1)  # padding's t is -1
            logits.masked_fill_(late.expand(zb, cap, g, block).reshape(zb, cap * g, block), -math.inf)
        return logits, qg


def _spans(own: _Layout, picked: _Layout, blocks: int):
    """The spans of a selection: the own blocks a group at a time, then each picked block."""
    for first in range(0, blocks, OWN_GROUP):
        rows = own.group_rows(first, min(blocks, first + OWN_GROUP))
        if rows is not None:
            yield _Span(first, min(blocks, first + OWN_GROUP), rows, True, first)
    for m in range(blocks):
        rows = picked.rows(m)
        if rows is not None:
            yield _Span(m, m + 1, rows, False, blocks + m)


class _BlockMajor(torch.autograd.Function):
    """The selected-block attention block by block (see the module). Each query's own block, which
    it sees up to itself, and the complete blocks it picked, which it sees whole."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, t: Tensor, sel: Tensor, own: Tensor,  # type: ignore[override]
                block: int, scale: float, dropout_p: float) -> Tensor:
        z, n, g, d = q.shape
        blocks = -(-k.shape[1] // block)
        tail = blocks * block - k.shape[1]
        k, v = F.pad(k, (0, 0, 0, tail)), F.pad(v, (0, 0, 0, tail))  # the last block whole: its keys masked
        layouts = (_Layout(own, blocks), _Layout(sel, blocks))
        qf = torch.cat([q.reshape(z * n, g, d) * scale, q.new_zeros(1, g, d)])  # row z * n: the padding's
        tf = torch.cat([t.reshape(-1), t.new_full((1,), -1)])
        wide = _wide(q)
        top = q.new_full((z * n + 1, g), -math.inf, dtype=wide)  # each query's largest logit so far
        total = q.new_zeros(z * n + 1, g, dtype=wide)  # its weights' sum, relative to that
        out = q.new_zeros(z * n + 1, g, v.shape[-1], dtype=wide)  # its output, unnormalised
        seed = int(torch.randint(2**62, (1,)).item()) if dropout_p else 0
        # One pass, each span's share added to the running sums of its queries as FlashAttention's
        # online softmax adds a tile's (two passes, the log-sum-exp first, cost 10% more at 16,384).
        for span in _spans(*layouts, blocks):
            flat = span.rows.view(-1)
            zb = span.rows.shape[0]
            logits, _ = span.logits(qf, tf, k, block, g, None)
            before = top.index_select(0, flat).view(zb, -1)
            now = torch.maximum(before, logits.amax(-1))
            now_safe = now.masked_fill(now == -math.inf, 0.0)
            weights = logits.sub_(now_safe[..., None]).exp_()
            fade = torch.exp(before - now_safe)  # the earlier sums, moved to the new largest logit
            top.index_copy_(0, flat, now.view(-1, g))
            total.index_copy_(0, flat, (total.index_select(0, flat).view(zb, -1) * fade + weights.sum(-1)).view(-1, g))
            weights, _ = _dropped(weights, dropout_p, seed, span.draw)
            share = torch.bmm(weights.to(v.dtype), span.keys(v, block)).to(wide)
            width = out.shape[-1]
            mixed = torch.addcmul(share, out.index_select(0, flat).view(zb, -1, width), fade[..., None])
            out.index_copy_(0, flat, mixed.view(-1, g, width))
        lse = top + torch.log(total)  # -inf for a query that sees nothing
        safe = lse.masked_fill(lse == -math.inf, 0.0)  # all its weights are 0
        out = (out / total.clamp_min(torch.finfo(wide).tiny)[..., None])[:-1].view(z, n, g, -1).to(v.dtype)
        ctx.save_for_backward(q, k, v, t, out, safe)
        ctx.layouts, ctx.block, ctx.scale, ctx.dropout_p, ctx.seed, ctx.tail = layouts, block, scale, dropout_p, seed, tail
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        q, k, v, t, out, safe = ctx.saved_tensors
        block, scale, p, seed = ctx.block, ctx.scale, ctx.dropout_p, ctx.seed
        z, n, g, d = q.shape
        qf = torch.cat([q.reshape(z * n, g, d) * scale, q.new_zeros(1, g, d)])
        tf = torch.cat([t.reshape(-1), t.new_full((1,), -1)])
        gf = torch.cat([grad.reshape(z * n, g, -1), grad.new_zeros(1, g, grad.shape[-1])])
        delta = torch.cat([(grad.to(safe.dtype) * out.to(safe.dtype)).sum(-1).view(z * n, g), safe.new_zeros(1, g)])
        dq = torch.zeros(z * n + 1, g, d, dtype=safe.dtype, device=q.device)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for span in _spans(*ctx.layouts, k.shape[1] // block):
            flat = span.rows.view(-1)
            zb = span.rows.shape[0]
            weights, qg = span.logits(qf, tf, k, block, g, safe.index_select(0, flat).view(zb, -1))
            weights = weights.exp_()  # masked: exp(-inf) = 0
            dropped, keep = _dropped(weights, p, seed, span.draw)
            go = gf.index_select(0, flat).view(zb, -1, gf.shape[-1])
            span.add_to(dv, torch.bmm(dropped.transpose(1, 2).to(v.dtype), go), block)
            dw = torch.bmm(go, span.keys(v, block).transpose(1, 2)).to(weights.dtype)
            if keep is not None:
                dw = dw * keep
            ds = weights.mul_(dw.sub_(delta.index_select(0, flat).view(zb, -1, 1)))
            dq.index_add_(0, flat, torch.bmm(ds.to(k.dtype), span.keys(k, block)).view(-1, g, d).to(dq.dtype))
            span.add_to(dk, torch.bmm(ds.transpose(1, 2).to(q.dtype), qg), block)  # qg is scaled: the logits' scale
        end = k.shape[1] - ctx.tail
        return ((dq[:-1].view(z, n, g, d) * scale).to(q.dtype), dk[:, :end], dv[:, :end],
                None, None, None, None, None, None)


def selected_block_attention(q: Tensor, k: Tensor, v: Tensor, t: Tensor, sel: Tensor, *, block: int, scale: float,
                             dropout_p: float = 0.0) -> Tensor:
    """Each query's attention over the key blocks it selected.

    Args:
        q: ``(Z, n, G, D)``: ``Z`` streams (batch rows x key/value heads), ``n`` queries, ``G``
            query heads sharing a stream's keys.
        k, v: ``(Z, Lk, D)`` and ``(Z, Lk, Dv)``.
        t: ``(Z, n)``: each query's position; it sees key ``j`` only when ``j <= t`` (a negative
            ``t``: a padded query, which sees nothing and gets zeros).
        sel: ``(Z, n, S)`` long: the complete blocks before the query's own (of keys ``block * m``
            to ``block * (m + 1) - 1``) it attends to besides its own block (which it always
            attends to, up to itself), each at most once, -1 for none.
        block: the keys a block holds.
        scale: the logit scale.
        dropout_p: dropout on the weights (training).

    Returns:
        ``(Z, n, G, Dv)``.
    """
    own = (t // block).masked_fill(t < 0, -1)  # the block a query is in, seen up to the query (a padded one: none)
    if q.shape[1] <= GATHER_QUERIES and not dropout_p:
        return _gathered(q, k, v, t, torch.cat([sel, own[..., None]], -1), block, scale)
    return _BlockMajor.apply(q, k.contiguous(), v.contiguous(), t, sel, own[..., None], block, scale, dropout_p)


class _PickedKeys(torch.autograd.Function):
    """:func:`picked_key_attention` a chunk of queries at a time; the backward recomputes each
    chunk's weights from the log-sum-exp kept by the forward."""

    @staticmethod
    def forward(ctx, q: Tensor, kv: Tensor, idx: Tensor, valid: Tensor, width: int,  # type: ignore[override]
                dropout_p: float) -> tuple[Tensor, Tensor]:
        batch, n, h, w = q.shape
        lk = kv.shape[1]
        size = _chunk_of(batch, idx.shape[-1], w)
        flat = kv.reshape(batch * lk, w)
        starts = torch.arange(batch, device=q.device).view(batch, 1, 1) * lk
        seed = int(torch.randint(2**62, (1,)).item()) if dropout_p else 0
        out = q.new_empty(batch, n, h, width)
        lse = q.new_empty(batch, n, h, dtype=_wide(q))
        shares = q.new_empty(batch, n, idx.shape[-1], dtype=_wide(q))
        for i, start in enumerate(range(0, n, size)):
            span = slice(start, start + size)
            kg = flat.index_select(0, (idx[:, span] + starts).view(-1)).view(batch, -1, idx.shape[-1], w)
            logits = torch.matmul(q[:, span], kg.transpose(-1, -2)).to(lse.dtype)  # (B, C, H, K)
            logits.masked_fill_(~valid[:, span, None, :], -math.inf)
            top = torch.logsumexp(logits, -1)
            lse[:, span] = top
            weights = torch.exp(logits - top.masked_fill(top == -math.inf, 0.0)[..., None])
            shares[:, span] = weights.sum(2)
            weights, _ = _dropped(weights, dropout_p, seed, i)
            out[:, span] = torch.matmul(weights.to(kv.dtype), kg[..., :width])
        ctx.save_for_backward(q, kv, idx, valid, out, lse.masked_fill(lse == -math.inf, 0.0))
        ctx.width, ctx.dropout_p, ctx.seed, ctx.size = width, dropout_p, seed, size
        ctx.mark_non_differentiable(shares)
        return out, shares

    @staticmethod
    def backward(ctx, grad: Tensor, _shares: Tensor):  # type: ignore[override]
        q, kv, idx, valid, out, safe = ctx.saved_tensors
        width, p, seed, size = ctx.width, ctx.dropout_p, ctx.seed, ctx.size
        batch, n, h, w = q.shape
        lk = kv.shape[1]
        flat = kv.reshape(batch * lk, w)
        starts = torch.arange(batch, device=q.device).view(batch, 1, 1) * lk
        dq = torch.empty_like(q)
        dkv = torch.zeros(batch * lk, w, dtype=safe.dtype, device=kv.device)
        for i, start in enumerate(range(0, n, size)):
            span = slice(start, start + size)
            rows = (idx[:, span] + starts).view(-1)
            kg = flat.index_select(0, rows).view(batch, -1, idx.shape[-1], w)
            weights = torch.matmul(q[:, span], kg.transpose(-1, -2)).to(safe.dtype)
            weights = weights.masked_fill_(~valid[:, span, None, :], -math.inf).sub_(safe[:, span, :, None]).exp_()
            dropped, keep = _dropped(weights, p, seed, i)
            go = grad[:, span]
            dw = torch.matmul(go, kg[..., :width].transpose(-1, -2)).to(weights.dtype)
            if keep is not None:
                dw = dw * keep
            dropped = dropped.to(q.dtype)
            if dropped is weights:  # kept apart: the weights become their gradient in place
                dropped = dropped.clone()
            delta = (go.to(safe.dtype) * out[:, span].to(safe.dtype)).sum(-1, keepdim=True)
            ds = weights.mul_(dw.sub_(delta)).to(q.dtype)  # (B, C, H, K)
            dq[:, span] = torch.matmul(ds, kg)
            # a key's gradient as a key and as a value in one product, not two products and a sum
            lhs = torch.cat([ds, dropped], dim=2).transpose(-1, -2)  # (B, C, K, 2H)
            rhs = torch.cat([q[:, span], F.pad(go, (0, w - width))], dim=2)  # (B, C, 2H, W)
            dkg = torch.matmul(lhs, rhs).to(dkv.dtype)  # (B, C, K, W)
            dkv.index_add_(0, rows, dkg.view(-1, w))
        return dq, dkv.view(batch, lk, w).to(kv.dtype), None, None, None, None


def _chunk_of(batch: int, picks: int, width: int) -> int:
    """Queries a chunk of :func:`picked_key_attention` holds: its gathered keys ``(B, C, K, W)``
    about 2 M numbers (8 MB in float32) whatever the length: larger blocks are mapped afresh by
    the allocator at every allocation, smaller ones cost more calls."""
    return max(1, (1 << 21) // max(1, batch * picks * width))


def picked_key_attention(q: Tensor, kv: Tensor, idx: Tensor, valid: Tensor, *, width: int,
                         dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """Each query's attention over the keys it picked, every head of it over the same keys.

    Args:
        q: ``(B, n, H, W)``, already scaled.
        kv: ``(B, Lk, W)``: a key of ``W`` a position, whose first ``width`` numbers are also its
            value (latent attention moved into its latent space: the keys and values of every
            head are products of one latent).
        idx: ``(B, n, K)`` long: the keys each query attends to.
        valid: ``(B, n, K)`` bool: which of them it may see (a query with none gets zeros).
        width: the values' size.
        dropout_p: dropout on the weights (training).

    Returns:
        ``(out (B, n, H, width), shares (B, n, K))``: ``shares`` the heads' weights summed
        (before dropout; no gradient), for a loss that teaches the picking.
    """
    return _PickedKeys.apply(q, kv, idx, valid, width, dropout_p)
