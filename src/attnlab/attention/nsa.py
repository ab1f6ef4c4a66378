"""Native sparse attention (Yuan et al., 2025, "Native Sparse Attention: Hardware-Aligned and
Natively Trainable Sparse Attention", DeepSeek): each query attends through three branches whose
outputs a learned gate mixes,

    o_t = g_cmp * attn(q_t, compressed blocks) + g_slc * attn(q_t, selected blocks)
          + g_win * attn(q_t, the last ``branch_window`` keys),

* **compressed**: the keys and values of each complete block of ``block`` positions, with a
  learned position embedding inside the block, flattened and mapped by a learned linear layer
  to one key and one value (a block is seen by the queries after its last position);
* **selected**: the query's attention over the compressed keys, summed over the query heads
  that share a key/value head, scores the blocks; the query attends, token by token, to the
  ``num_selected`` best complete blocks and to the block it is in (the paper keeps the local
  blocks always);
* **window**: the last ``branch_window`` keys, itself included.

The gates are ``sigmoid`` of a learned linear map of each head's query (``(D, 3)`` per head,
the paper's gate MLP on the input made per head and linear). The three branches share the
query, key and value projections, as the public implementations (flash-linear-attention's
``parallel_nsa``, lucidrains' ``native-sparse-attention-pytorch``) do; the paper also allows
separate keys per branch.

Nothing of ``n x n`` is formed, forward or backward: the compressed branch and the selection run
a chunk of queries at a time over the block summaries; the selected blocks go through
:func:`~attnlab.attention.blocksparse.selected_block_attention`, which gathers for each key
block the queries that picked it and attends in one product; the window is a band of
``branch_window`` keys, every chunk of queries against its stretch of keys in one call of the
fused kernel. Time and memory grow as ``n x (num_selected + 1) x block + n x branch_window``
(plus the compressed branch's ``n x n / block``). Equal to the dense form with masks it had
before, gradients included (tested against it). With ``num_selected`` at least the number of
blocks and the gates at (0, 1, 0) it is exact causal attention (tested). Causal only; a row
padded on the left counts its blocks from its first real position (as alone).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import InputError
from .cache import DecodingCache
from .blocksparse import selected_block_attention, window_attention
from .functional import check_positive_int, scaled_dot_product_attention
from .contract import Option
from .exact import EXACT_OPTIONS, GroupedQueryAttention
from .registry import check_attention_options, register_attention

__all__ = ["NativeSparseAttention"]


# branch_window is the sliding branch's, not a sliding window of the whole layer (nsa has none).
NSA_OPTIONS = EXACT_OPTIONS.extend(
    Option("block", int, 16, "the positions a compressed and a selectable block hold", low=1, counts_positions=True),
    Option("num_selected", int, 4, "the blocks each query selects besides its own", low=1),
    Option("branch_window", int, 64, "the keys of the sliding branch", low=1, counts_positions=True, was="window"),
    drop=("alibi", "softcap", "sinks", "output_gate", "sliding_window", "kernel"))


@register_attention("nsa", options=NSA_OPTIONS, keeps_cache=True, decode_step=True, takes_positions=True, causal=True,
                    padding=True, causal_only=True, lora_roles=("attention",),
                    summary="native sparse attention: compressed blocks, selected blocks and a window, gated")
class NativeSparseAttention(GroupedQueryAttention):
    """Native sparse attention (see the module docstring) with the exact kind's projections,
    grouped key/value heads, rotary positions, QK-norm and cache, and ``block`` (positions a
    compressed and a selectable block hold, 16), ``num_selected`` (blocks each query selects
    besides its own, 4) and ``branch_window`` (the sliding branch's keys, 64). It forms no weight
    matrix over the tokens (three branches, one of them over blocks)."""

    def __init__(self, embed_dim: int, num_heads: int, *, block: int = 16, num_selected: int = 4, branch_window: int = 64,
                 **options: object) -> None:
        check_attention_options("nsa", options)
        super().__init__(embed_dim, num_heads, **options)
        self.block = check_positive_int("block", block)
        self.num_selected = check_positive_int("num_selected", num_selected)
        self.branch_window = check_positive_int("branch_window", branch_window)
        d = self.head_dim
        self.block_pos = nn.Parameter(torch.zeros(self.block, d))  # the position inside a block, learned
        self.compress_k = nn.Linear(self.block * d, d, bias=False)
        self.compress_v = nn.Linear(self.block * d, d, bias=False)
        with torch.no_grad():  # the mean of the block at the start: a compressed key is its block's average
            for layer in (self.compress_k, self.compress_v):
                layer.weight.copy_(torch.eye(d).repeat(1, self.block) / self.block)
        self.gate = nn.Parameter(torch.zeros(self.num_heads, d, 3))
        self.gate_bias = nn.Parameter(torch.zeros(self.num_heads, 3))

    # ------------------------------------------------------------------ the cache (the decoder contract)
    def new_cache(self, batch: int, capacity: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, cache_window: int | None = None,
                  sink_tokens: int = 0) -> DecodingCache:
        """A cache of every position's keys and values (the selection may pick any block)."""
        if cache_window is not None or sink_tokens:
            raise InputError("nsa keeps every key (its selection may pick any block): a streaming cache (cache_window, "
                             "sink_tokens) is not supported")
        return DecodingCache(capacity)

    def cache_bytes(self, batch: int, positions: int, dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * batch * self.num_kv_heads * self.head_dim * positions * itemsize

    # ------------------------------------------------------------------ the three branches
    def _compressed(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """One key and one value per complete block: ``(B, H, L // block, D)`` each."""
        batch, heads, lk, d = k.shape
        nb = lk // self.block
        blocks = [(t[:, :, : nb * self.block].reshape(batch, heads, nb, self.block, d) + self.block_pos)
                  .flatten(-2) for t in (k, v)]
        return self.compress_k(blocks[0]), self.compress_v(blocks[1])

    def _branches(self, q: Tensor, k: Tensor, v: Tensor, pad: Tensor | None) -> Tensor:
        """NSA's output ``(B, H, Lq, D)`` for queries at the last ``Lq`` of the ``Lk`` positions;
        ``pad`` ``(B, Lk)`` (``True`` = padding) may only pad a row on the left: its keys are then
        moved to the front (the padding behind every real query, where causality hides it), so
        that each row's blocks start at its first real position, as without the padding.

        Nothing of ``Lq x Lk`` is formed: the compressed branch and the selection run a chunk of
        queries at a time over the blocks they may see, the selected blocks go through
        :func:`selected_block_attention`, the window through the fused kernel a chunk at a time."""
        batch, h, lq, d = q.shape
        lk, b = k.shape[2], self.block
        if q.numel() == 0 or lk == 0:  # no query, or nothing to see: zeros, which the gradient reaches
            return q * 0.0
        device = q.device
        t = torch.arange(lk - lq, lk, device=device).expand(batch, lq)  # (B, Lq): the queries' positions
        if pad is not None and bool(pad.any()):
            j = torch.arange(lk, device=device)
            offset = pad.sum(-1)  # (B,)
            if not torch.equal(pad, j[None, :] < offset[:, None]):
                raise InputError("nsa takes padding on the left of a row only (its blocks count from the row's "
                                 "first real position)")
            index = ((j[None, :] + offset[:, None]) % lk)[:, None, :, None].expand(-1, h, -1, d)
            k, v = k.gather(2, index), v.gather(2, index)
            t = t - offset[:, None]  # a padded query's is negative: it sees nothing
        drop = self.dropout if self.training else 0.0
        scale = d ** -0.5 if self.scale is None else self.scale
        hkv = self.num_kv_heads
        group = h // hkv
        k_kv, v_kv = k[:, ::group], v[:, ::group]  # the key/value heads (repeated per query head by the caller)
        k_cmp, v_cmp = (c.repeat_interleave(group, dim=1) for c in self._compressed(k_kv, v_kv))
        o_cmp, sel = self._compressed_and_selection(q, k_cmp, v_cmp, t)
        z = batch * hkv
        o_slc = selected_block_attention(
            q.view(batch, hkv, group, lq, d).permute(0, 1, 3, 2, 4).reshape(z, lq, group, d),
            k_kv.reshape(z, lk, d), v_kv.reshape(z, lk, d), t.repeat_interleave(hkv, dim=0), sel.reshape(z, lq, -1),
            block=b, scale=scale, dropout_p=drop)
        o_slc = o_slc.view(batch, hkv, lq, group, d).permute(0, 1, 3, 2, 4).reshape(batch, h, lq, d)
        o_win = window_attention(q, k, v, self.branch_window, first=t[:, :1], scale=self.scale, dropout_p=drop)
        g = torch.sigmoid(torch.einsum("bhld,hdc->bhlc", q, self.gate.to(q.dtype)) + self.gate_bias[:, None].to(q.dtype))
        return g[..., :1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:] * o_win

    # Queries a chunk of the compressed branch and the selection holds: its scores are chunk x blocks.
    COMPRESSED_CHUNK = 512

    def _compressed_and_selection(self, q: Tensor, k_cmp: Tensor, v_cmp: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """The compressed branch's output ``(B, H, Lq, D)`` and the blocks each query attends to,
        ``(B, Hkv, Lq, num_selected)`` long (-1: none): the best complete blocks it has seen by the
        compressed attention of its group of heads, its own block left out (it attends to that
        one always)."""
        batch, h, lq, d = q.shape
        b, nb, hkv = self.block, k_cmp.shape[2], self.num_kv_heads
        group = h // hkv
        size = self.COMPRESSED_CHUNK
        outs, sel = [], torch.full((batch, hkv, lq, self.num_selected), -1, dtype=torch.long, device=q.device)
        blocks = torch.arange(nb, device=q.device)
        # split, not sliced: the backward of each slice would fill a gradient of the whole q
        for start, qc in zip(range(0, lq, size), q.split(size, dim=2)):
            tc = t[:, start: start + size]
            own = (tc // b).clamp(min=0)  # (B, C): the query's own block, which it always attends to
            seen = min(nb, (int(tc.max()) + 1) // b)  # the blocks some query of the chunk has seen
            if not seen:
                outs.append(torch.zeros_like(qc))
                continue
            unseen = (blocks[:seen] + 1) * b - 1 > tc[:, :, None]  # (B, C, seen)
            learning = torch.is_grad_enabled() and any(x.requires_grad for x in (qc, k_cmp, v_cmp))
            if learning:  # the fused kernel, whose backward keeps no weights
                outs.append(scaled_dot_product_attention(qc, k_cmp[:, :, :seen], v_cmp[:, :, :seen],
                                                         attn_mask=unseen[:, None], scale=self.scale)[0])
            with torch.no_grad():  # the selection is not differentiable
                o, p = scaled_dot_product_attention(qc, k_cmp[:, :, :seen], v_cmp[:, :, :seen],
                                                    attn_mask=unseen[:, None], scale=self.scale, need_weights=True)
                if not learning:  # without autograd one call gives both
                    outs.append(o)
                score = p.view(batch, hkv, group, -1, seen).sum(2).masked_fill(unseen[:, None], float("-inf"))
                top = score.topk(min(self.num_selected, seen), dim=-1)
                best = top.indices.masked_fill((top.values == float("-inf")) | (top.indices == own[:, None, :, None]), -1)
                sel[:, :, start: start + size, : best.shape[-1]] = best
        return torch.cat(outs, dim=2), sel

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, key_padding_mask: Tensor | None,
                is_causal: bool, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        if not is_causal:
            raise InputError("nsa attention is causal only (its blocks are seen once complete): use it in a decoder "
                             "(is_causal=True)")
        if mask is not None:
            raise InputError("nsa attention takes no attn_mask (it builds its own from its blocks and window)")
        if need_weights:
            raise InputError("nsa attention forms no weight matrix over the tokens (three branches, one over blocks)")
        return self._branches(q, k, v, key_padding_mask), None

    def _attend_step(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
        batch, hkv, group, d = q.shape
        q = q.reshape(batch, hkv * group, 1, d)  # query head i: row i % group of key/value head i // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return self._branches(q, k, v, None if keep is None else ~keep[:, 0, 0]).reshape(batch, -1)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, block={self.block}, num_selected={self.num_selected}, "
                f"branch_window={self.branch_window}")
