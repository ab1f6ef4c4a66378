"""DeepSeek's sparse attention (DeepSeek-V3.2, 2025), the ``"dsa"`` kind: latent attention
(:mod:`~attnlab.attention.latent`) in which each query attends only to the keys a light indexer
scores highest (:class:`IndexedSparseAttention`), and the top-k selection it needs
(:func:`top_keys`), tie-breaking as DeepSeek's reference does."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..errors import InputError, shape_str
from .blocksparse import picked_key_attention
from .cache import DecodingCache
from .contract import Option
from .functional import check_positive_int
from .latent import LATENT_OPTIONS, LatentAttention
from .registry import check_attention_options, register_attention

__all__ = ["IndexedSparseAttention", "DSA_OPTIONS", "top_keys", "GROUP"]


def top_keys(index: Tensor, k: int, width: int | None = None) -> tuple[Tensor, Tensor]:
    """The ``k`` best keys of each row of ``index`` ``(..., L)``, as ``(values, indices)`` in no
    order. Keys of equal score at the k-th place are chosen as ``torch.topk`` chooses them in a row
    of ``width`` keys (default ``L``) whose keys past ``L`` are masked: DeepSeek's reference and
    transformers take ``torch.topk`` over every key of the call, masked ones included, and the
    indexer's ReLU makes exact ties at 0 common (with 4 heads, one key in 16 scores 0). So a row
    cut to the keys a chunk of queries may see picks what the whole row picks.

    A long row is narrowed first to the ``k`` groups of :data:`GROUP` neighbours whose best key
    ranks highest, which hold every key above the k-th score and enough equal to it (each key is
    at most its group's best); the rows where equal scores straddle the k-th place are then
    chosen again over the whole row."""
    length = index.shape[-1]
    best = (_top_keys_grouped(index, k) if k > 0 and length >= 24 * k and index.numel()
            else index.topk(k, dim=-1, sorted=False))
    if best.values.numel() == 0:
        return best
    last = best.values.amin(-1, keepdim=True)  # the k-th score
    # rows where the k-th score is shared by a key left out; among masked keys (-inf) the choice is moot
    shared = ((index == last).sum(-1) > (best.values == last).sum(-1)) & last[..., 0].isfinite()
    if bool(shared.any()):
        rows = index[shared]
        if width is not None and width > length:
            rows = F.pad(rows, (0, width - length), value=float("-inf"))
        again = rows.topk(k, dim=-1, sorted=False)
        best.indices[shared], best.values[shared] = again.indices, again.values
    return best


GROUP = 8  # neighbouring keys narrowed as one by top_keys (its speed against other sizes: the results pages)


def _top_keys_grouped(index: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` best keys of rows of at least ``k`` groups, as :func:`top_keys` before its ties
    are settled: the best groups, then the best of their keys."""
    lead, length = index.shape[:-1], index.shape[-1]
    rows = index.reshape(-1, length)
    front = (-length) % GROUP  # -inf before the row: a key of the row is never a padded one
    if front:
        rows = F.pad(rows, (front, 0), value=float("-inf"))
    groups = rows.view(rows.shape[0], -1, GROUP)
    order = groups.amax(-1).topk(k, dim=-1, sorted=False).indices
    candidates = groups.gather(1, order[..., None].expand(-1, -1, GROUP)).view(-1, k * GROUP)
    best = candidates.topk(k, dim=-1, sorted=False)
    at = order.gather(1, best.indices // GROUP) * GROUP + best.indices % GROUP - front
    return torch.return_types.topk((best.values.view(*lead, k), at.view(*lead, k)))


DSA_OPTIONS = LATENT_OPTIONS.extend(
    Option("q_rank", int, None, "the queries' compression, which the indexer reads (None: embed_dim / 2)", low=1),
    Option("index_topk", int, 64, "the keys each query attends to, those the indexer scores highest (at least the "
           "sequence's length: latent attention exactly)", low=1),
    Option("index_heads", int, 4, "the indexer's heads", low=1),
    Option("index_head_dim", int, None, "the size of the indexer's heads (None: head_dim)", low=1),
    Option("index_loss", float, 1.0, "the weight of the indexer's own loss in training (0: none)", low=0))


@register_attention("dsa", options=DSA_OPTIONS, forms_weights=True, keeps_cache=True, decode_step=True,
                    takes_positions=True, causal=True, padding=True, lora_roles=("attention",),
                    summary="DeepSeek's sparse attention (V3.2): an indexer picks each query's top-k keys")
class IndexedSparseAttention(LatentAttention):
    """DeepSeek's sparse attention (DeepSeek-V3.2, 2025): latent attention in which each query
    attends only to the ``index_topk`` keys that a light indexer scores highest.

    The indexer has heads of its own (``index_heads`` of ``index_head_dim``): queries from the
    compressed query (so ``q_rank`` is needed), one key a position from ``x`` (layer-normed), the
    first ``rope_dim`` of both rotated (in halves, not DeepSeek's pairs), and a weight per head
    and token. A key's score for a query is ``sum_h w_h relu(q_h . k / sqrt(index_head_dim)) /
    sqrt(index_heads)``; causal and padding masks apply before the top-k, and the attention
    then sees the selected keys only. With ``index_topk`` at least the sequence's length it is
    latent attention exactly (tested). The cache holds each position's indexer key beside its
    latent.

    The selection is not differentiable, so the indexer learns only through a loss of its own, as
    DeepSeek trains it (V3.2's sparse stage): in a training forward with gradients, the KL
    divergence from the attention's distribution over the selected keys (summed over heads and
    renormalised, detached) to the softmax of the indexer's scores over them, averaged over the
    queries and weighted by ``index_loss`` (0: none), is kept for the trainer
    (:meth:`take_aux_loss`, the engine's protocol for a module's own loss). The indexer reads
    detached inputs, so that loss trains the indexer alone and the language-model loss the rest;
    the forward's output does not depend on it. Without it (``index_loss=0``, or transformers'
    reference, which has no such loss) the indexer keeps its initial weights and selects keys
    at random as far as the text is concerned.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, q_rank: int | None = None, index_topk: int = 64,
                 index_heads: int = 4, index_head_dim: int | None = None, index_loss: float = 1.0,
                 **options: object) -> None:
        check_attention_options("dsa", options)
        super().__init__(embed_dim, num_heads, q_rank=embed_dim // 2 if q_rank is None else q_rank, **options)
        self.index_topk = check_positive_int("index_topk", index_topk)
        self.index_heads = check_positive_int("index_heads", index_heads)
        self.index_head_dim = check_positive_int("index_head_dim", self.head_dim if index_head_dim is None else index_head_dim)
        if self.index_head_dim < self.rope_dim:
            raise InputError(f"index_head_dim ({self.index_head_dim}) must hold the rotary part, rope_dim "
                             f"({self.rope_dim})")
        if not (isinstance(index_loss, (int, float)) and not isinstance(index_loss, bool)
                and math.isfinite(index_loss) and index_loss >= 0):
            raise InputError(f"index_loss must be a finite number >= 0 (the weight of the indexer's own loss in "
                             f"training; 0: none); got {index_loss!r}")
        self.index_loss = float(index_loss)
        self._aux_loss: Tensor | None = None
        self.indexer = nn.Module()
        self.indexer.wq_b = nn.Linear(self.q_rank, self.index_heads * self.index_head_dim, bias=False)
        self.indexer.wk = nn.Linear(embed_dim, self.index_head_dim, bias=False)
        self.indexer.k_norm = nn.LayerNorm(self.index_head_dim, eps=1e-6)
        self.indexer.weights_proj = nn.Linear(embed_dim, self.index_heads, bias=False)

    def cache_bytes(self, batch: int, positions: int, dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return batch * (self.kv_rank + self.rope_width + self.index_head_dim) * positions * itemsize

    def _latents(self, x: Tensor, positions: Tensor, q_rot: Tensor) -> tuple[Tensor, Tensor]:
        latent, q_rot = super()._latents(x, positions, q_rot)
        k = self.indexer.k_norm(self.indexer.wk(x.detach()))[:, None]  # (B, 1, L, index_head_dim); its own loss only
        if self.rotary is not None:
            r = self.rope_dim
            k_rot, _ = self.rotary(k[..., :r], k[..., :r], positions)
            k = torch.cat([k_rot, k[..., r:]], dim=-1)
        return torch.cat([latent, k], dim=-1), q_rot

    def _index_scores(self, x: Tensor, positions: Tensor, index_keys: Tensor, blocked: Tensor) -> Tensor:
        """The indexer's float scores ``(B, Lq, Lk)`` (from detached inputs), ``-inf`` where
        ``blocked`` ``(B, 1, Lq, Lk)``."""
        q, weights = self._index_queries(x, positions)
        return self._index_of(q, weights, index_keys).masked_fill(blocked[:, 0], float("-inf"))

    def _selected(self, x: Tensor, positions: Tensor, index_keys: Tensor, blocked: Tensor) -> tuple[Tensor, Tensor]:
        """``(mask, scores)``: bool ``(B, 1, Lq, Lk)``, ``True`` at the keys each query does not attend
        to (those outside its top ``index_topk`` by the indexer's score, and ``blocked`` ``(B, 1, Lq,
        Lk)``), and the indexer's scores (:meth:`_index_scores`)."""
        index = self._index_scores(x, positions, index_keys, blocked)
        top = top_keys(index, min(self.index_topk, index.shape[-1])).indices
        outside = torch.ones_like(index, dtype=torch.bool).scatter(-1, top, False)
        return (outside | blocked[:, 0])[:, None], index

    def _index_kl(self, q: Tensor, k: Tensor, mask: Tensor, index: Tensor) -> Tensor:
        """The indexer's loss (see the class): mean over the queries that attend to any key of
        ``KL(p || softmax(index))`` over the selected keys, ``p`` the heads' attention summed."""
        with torch.no_grad():
            logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) * self.scale
            p = logits.masked_fill(mask, float("-inf")).softmax(-1).nan_to_num(0.0).sum(1)  # (B, Lq, Lk)
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
        low = torch.finfo(index.dtype).min  # not -inf: a query with no key left stays finite (and counts 0)
        log_q = index.masked_fill(mask[:, 0], low).log_softmax(-1)
        kl = torch.where(p > 0, p * (p.clamp_min(1e-30).log() - log_q), 0.0).sum(-1)  # (B, Lq)
        rows = (~mask[:, 0]).any(-1)
        return kl.sum() / rows.sum().clamp_min(1)

    def take_aux_loss(self) -> Tensor | None:
        """The weighted indexer loss of the last training forward, forgotten once taken (the
        trainer adds it to the task's loss); ``None`` when there is none."""
        loss, self._aux_loss = self._aux_loss, None
        return loss

    def forward(self, x: Tensor, *, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                is_causal: bool = False, need_weights: bool = False, average_attn_weights: bool = True,
                positions: Tensor | None = None, cache: DecodingCache | None = None,
                ) -> tuple[Tensor, Tensor | None]:
        if attn_mask is not None:
            raise InputError("dsa attention takes no attn_mask (it builds its own from the indexer); use is_causal "
                             "and key_padding_mask")
        q, stored, positions, c = self._stored(x, positions, cache)
        batch, n, lk = x.shape[0], x.shape[1], c.shape[1]
        if key_padding_mask is not None and key_padding_mask.shape != (batch, lk):
            raise InputError(f"key_padding_mask must have shape (B, Lk) = ({batch}, {lk}); got "
                             f"{shape_str(key_padding_mask)}")
        if need_weights or self._attn_capture is not None:
            return self._forward_weights(x, q, stored, positions, c, key_padding_mask, is_causal, need_weights,
                                         average_attn_weights)
        if x.shape[0] == 0 or n == 0:  # no query: the form with weights handles the empty shapes
            return self._forward_weights(x, q, stored, positions, c, key_padding_mask, is_causal, need_weights,
                                         average_attn_weights)
        r = self.kv_rank + self.rope_width
        idx, valid = self._pick(x, positions, stored[:, 0, :, r:], key_padding_mask, is_causal)
        q_nope, q_rot = q.split([self.head_dim, self.rope_dim], dim=-1)
        w_uk, w_uv = self._absorbed(q.dtype, q.device)
        h, g = self.num_heads, self.rope_heads
        # each head's query in the latent space, beside its rotary part placed at its group's rotary key
        q_lat = torch.einsum("bhnd,hdr->bnhr", q_nope, w_uk)
        parts = [q_lat]
        if self.rope_width:
            rot = q_rot.transpose(1, 2).reshape(batch, n, g, h // g, 1, self.rope_dim)
            rot = rot * torch.eye(g, dtype=q.dtype, device=q.device).view(1, 1, g, 1, g, 1)  # zero off its group
            parts.append(rot.reshape(batch, n, h, self.rope_width))
        ctx, shares = picked_key_attention(torch.cat(parts, -1) * self.scale, stored[:, 0, :, :r], idx, valid,
                                           width=self.kv_rank, dropout_p=self.dropout if self.training else 0.0)
        out = torch.einsum("bnhr,hvr->bnhv", ctx, w_uv).reshape(batch, n, h * self.v_head_dim)
        if self.index_loss and self.training and torch.is_grad_enabled():
            self._aux_loss = self.index_loss * self._picked_kl(x, positions, stored[:, 0, :, r:], idx, valid, shares)
        return self.o_proj(out), None

    def _forward_weights(self, x: Tensor, q: Tensor, stored: Tensor, positions: Tensor, c: Tensor,
                         key_padding_mask: Tensor | None, is_causal: bool, need_weights: bool,
                         average_attn_weights: bool) -> tuple[Tensor, Tensor | None]:
        """The forward that forms the ``(B, H, Lq, Lk)`` weights, asked for (``need_weights``, or
        captured): the indexer's scores and the selection as ``Lq x Lk`` masks, every head's keys
        and values expanded from the latents. The same output as :meth:`forward`'s (tested)."""
        batch, n, lk = x.shape[0], x.shape[1], c.shape[1]
        blocked = torch.zeros(batch, 1, n, lk, dtype=torch.bool, device=x.device)
        if is_causal:  # aligned bottom-right, as the mask convention says
            blocked |= torch.ones(n, lk, dtype=torch.bool, device=x.device).triu(lk - n + 1)
        if key_padding_mask is not None:
            blocked |= key_padding_mask[:, None, None, :]
        r = self.kv_rank + self.rope_width
        mask, index = self._selected(x, positions, stored[..., r:], blocked)
        k, v = self._keys_values(c, stored[:, 0, :, self.kv_rank: r])
        if self.index_loss and self.training and torch.is_grad_enabled():
            self._aux_loss = self.index_loss * self._index_kl(q, k, mask, index)
        return self._attend_heads(q, k, v, mask=mask, key_padding_mask=None, is_causal=False,
                                  need_weights=need_weights, average_attn_weights=average_attn_weights)

    def _absorbed(self, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
        """``W_UK`` ``(H, head_dim, kv_rank)`` and ``W_UV`` ``(H, v_head_dim, kv_rank)`` with their
        gradients: ``kv_b_proj`` applied to the identity, so that any layer in its place (LoRA's,
        an 8-bit one) gives its own."""
        eye = torch.eye(self.kv_rank, dtype=dtype, device=device)
        w = self.kv_b_proj(eye).view(self.kv_rank, self.num_heads, self.head_dim + self.v_head_dim)
        return w[..., : self.head_dim].permute(1, 2, 0), w[..., self.head_dim:].permute(1, 2, 0)

    def _index_queries(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The indexer's queries ``(B, Hi, Lq, index_head_dim)`` (float32, rotated) and each head's
        weight ``(B, Lq, Hi)`` (float32, ``1 / sqrt(Hi)`` in it), from detached inputs."""
        batch, n, _ = x.shape
        hi, di, r = self.index_heads, self.index_head_dim, self.rope_dim
        x = x.detach()
        compressed = self.q_a_layernorm(self.q_a_proj(x)).detach()  # the attention's, not the indexer's to train
        q = self.indexer.wq_b(compressed).view(batch, n, hi, di).transpose(1, 2)
        if self.rotary is not None:
            q_rot, _ = self.rotary(q[..., :r], q[..., :r], positions)
            q = torch.cat([q_rot, q[..., r:]], dim=-1)
        return q.float(), self.indexer.weights_proj(x).float() * hi ** -0.5

    def _index_of(self, q: Tensor, weights: Tensor, keys: Tensor) -> Tensor:
        """The indexer's scores ``(B, Lq, Lk)`` of queries ``q`` ``(B, Hi, Lq, Di)`` with
        ``weights`` ``(B, Lq, Hi)`` for ``keys`` ``(B, 1, Lk, Di)``: ``sum_h w_h relu(q_h . k) /
        sqrt(Di)``, a head at a time into one sum: faster than the heads' scores formed together
        and weighted by a product, which makes an ``(Hi, Lq, Lk)`` tensor."""
        weights = weights * self.index_head_dim ** -0.5  # relu(a s) = a relu(s) for a > 0
        keys = keys[:, 0].float().transpose(-1, -2)
        index = None
        if torch.is_grad_enabled() and (q.requires_grad or keys.requires_grad or weights.requires_grad):
            for h in range(q.shape[1]):  # the indexer's own loss: no step in place
                term = F.relu(torch.matmul(q[:, h], keys)) * weights[:, :, h, None]
                index = term if index is None else index + term
            return index
        for h in range(q.shape[1]):
            scores = torch.matmul(q[:, h], keys).clamp_min_(0.0)
            w = weights[:, :, h, None]
            index = scores.mul_(w) if index is None else index.addcmul_(scores, w)
        return index

    def _pick(self, x: Tensor, positions: Tensor, keys: Tensor, key_padding_mask: Tensor | None, is_causal: bool,
              ) -> tuple[Tensor, Tensor]:
        """The keys each query attends to, ``(idx, valid)`` ``(B, Lq, K)`` (``K = min(index_topk,
        Lk)``; ``valid`` False where a query has fewer keys to see): the indexer scored a chunk of
        queries at a time over the keys they may see, never ``Lq x Lk`` at once."""
        batch, n, _ = x.shape
        lk = keys.shape[1]
        q, weights = self._index_queries(x, positions)
        top = min(self.index_topk, lk)
        idx = torch.zeros(batch, n, top, dtype=torch.long, device=x.device)
        valid = torch.zeros(batch, n, top, dtype=torch.bool, device=x.device)
        size = max(1, (1 << 23) // max(1, batch * self.index_heads * lk))  # the chunk's scores: 8 M numbers
        with torch.no_grad():  # the selection is not differentiable
            for start in range(0, n, size):
                end = min(n, start + size)
                seen = lk - n + end if is_causal else lk  # the keys some query of the chunk may see
                if seen <= top:  # it picks every key it may see: nothing to score
                    cols = torch.arange(seen, device=x.device)
                    ok = torch.ones(batch, end - start, seen, dtype=torch.bool, device=x.device)
                    if is_causal:
                        ok &= cols <= torch.arange(lk - n + start, lk - n + end, device=x.device)[:, None]
                    if key_padding_mask is not None:
                        ok &= ~key_padding_mask[:, None, :seen]
                    idx[:, start:end, :seen] = cols
                    valid[:, start:end, :seen] = ok
                    continue
                index = self._index_of(q[:, :, start:end], weights[:, start:end], keys[:, None, :seen])
                if is_causal:  # aligned bottom-right: only the chunk's own keys can be late
                    own = index[..., lk - n + start:]
                    own.masked_fill_(torch.ones(own.shape[-2:], dtype=torch.bool, device=x.device).triu(1),
                                     float("-inf"))
                if key_padding_mask is not None:
                    index.masked_fill_(key_padding_mask[:, None, :seen], float("-inf"))
                best = top_keys(index, min(top, seen), width=lk)
                idx[:, start:end, : best.indices.shape[-1]] = best.indices
                valid[:, start:end, : best.indices.shape[-1]] = best.values > float("-inf")
        return idx, valid

    def _picked_kl(self, x: Tensor, positions: Tensor, keys: Tensor, idx: Tensor, valid: Tensor, shares: Tensor,
                   ) -> Tensor:
        """The indexer's loss (see the class) over the picked keys, a chunk of queries at a time
        (each recomputed in the backward): ``shares`` ``(B, Lq, K)``, the heads' weights summed."""
        q, weights = self._index_queries(x, positions)
        p = shares / shares.sum(-1, keepdim=True).clamp_min(1e-30)
        batch, n, top = idx.shape
        lk = keys.shape[1]
        starts = torch.arange(batch, device=x.device).view(batch, 1, 1) * lk
        flat = keys.reshape(batch * lk, -1)

        def chunk(q_c: Tensor, w_c: Tensor, idx_c: Tensor, valid_c: Tensor, p_c: Tensor) -> Tensor:
            kg = flat.index_select(0, (idx_c + starts).view(-1)).view(batch, -1, top, flat.shape[-1]).float()
            scores = F.relu(torch.einsum("bhcd,bckd->bhck", q_c, kg) * self.index_head_dim ** -0.5)
            index = torch.einsum("bch,bhck->bck", w_c, scores)
            log_q = index.masked_fill(~valid_c, torch.finfo(index.dtype).min).log_softmax(-1)
            return torch.where(p_c > 0, p_c * (p_c.clamp_min(1e-30).log() - log_q), 0.0).sum()

        size = max(1, (1 << 22) // max(1, batch * top * max(flat.shape[-1], self.index_heads)))
        # split, not sliced: the backward of each slice would fill a gradient of the whole tensor
        total = sum(checkpoint(chunk, *parts, use_reentrant=False)
                    for parts in zip(q.split(size, dim=2), weights.split(size, dim=1), idx.split(size, dim=1),
                                     valid.split(size, dim=1), p.split(size, dim=1)))
        return total / valid.any(-1).sum().clamp_min(1)

    def decode_step(self, x: Tensor, cache: DecodingCache, *, positions: Tensor | None = None,
                    key_padding_mask: Tensor | None = None) -> Tensor:
        """One token per row, ``x`` ``(B, E)`` -> ``(B, E)``, in eval mode: the indexer scores
        every cached position, the ``index_topk`` best latents are gathered, and the query,
        moved into the latent space as in :meth:`LatentAttention.decode_step`, attends to those
        alone (the step's attention costs ``index_topk`` keys however long the cache; the
        indexer's scoring still reads every position)."""
        q_nope, q_rot, stored, pos = self._step_stored(x, cache, positions)  # (B, 1, Lk, latent, rotary, indexer key)
        batch, lk, width = x.shape[0], stored.shape[2], self.kv_rank + self.rope_width
        blocked = torch.zeros(batch, 1, 1, lk, dtype=torch.bool, device=x.device) if key_padding_mask is None \
            else key_padding_mask[:, None, None, -lk:]
        index = self._index_scores(x[:, None], pos, stored[..., width:], blocked)  # (B, 1, Lk)
        best = top_keys(index, min(self.index_topk, lk))
        picked = stored[:, 0].gather(1, best.indices[:, 0, :, None].expand(-1, -1, width))[:, None]  # (B, 1, k, .)
        keep = (best.values > float("-inf"))[:, :, None, :]  # (B, 1, 1, k): a padded row's few real keys
        return self._latent_attend(q_nope, q_rot, picked, keep, cache)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, index_topk={self.index_topk}, index_heads={self.index_heads}, "
                f"index_head_dim={self.index_head_dim}, index_loss={self.index_loss:g}")
