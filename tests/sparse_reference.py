"""The dense implementations of the sparse kinds, as they were before their blocked forms: the
tests' reference. Each forms masks or scores of ``Lq x Lk`` and is written for clarity: every
branch a masked attention over all the keys."""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.attention.functional import scaled_dot_product_attention
from attnlab.errors import InputError


def nsa_dense(self, q: Tensor, k: Tensor, v: Tensor, pad: Tensor | None) -> Tensor:
    """NSA's output ``(B, H, Lq, D)`` for queries at the last ``Lq`` of the ``Lk`` positions;
    ``pad`` ``(B, Lk)`` (``True`` = padding) may only pad a row on the left: its keys are then
    moved to the front (the padding behind every real query, where causality hides it), so
    that each row's blocks start at its first real position, as without the padding."""
    batch, h, lq, d = q.shape
    lk, b = k.shape[2], self.block
    device = q.device
    j = torch.arange(lk, device=device)
    t = torch.arange(lk - lq, lk, device=device).expand(batch, lq)  # (B, Lq): the queries' positions
    if pad is not None and bool(pad.any()):
        offset = pad.sum(-1)  # (B,)
        if not torch.equal(pad, j[None, :] < offset[:, None]):
            raise InputError("nsa takes padding on the left of a row only (its blocks count from the row's "
                             "first real position)")
        index = ((j[None, :] + offset[:, None]) % lk)[:, None, :, None].expand(-1, h, -1, d)
        k, v = k.gather(2, index), v.gather(2, index)
        t = t - offset[:, None]  # a padded query's is negative: it sees nothing
    drop = self.dropout if self.training else 0.0
    # compressed: block m is seen once its last position (m + 1) b - 1 is
    k_cmp, v_cmp = self._compressed(k, v)
    nb = k_cmp.shape[2]
    m = torch.arange(nb, device=device)
    unseen = (m + 1) * b - 1 > t[:, :, None]  # (B, Lq, nb)
    if nb:
        o_cmp, p_cmp = scaled_dot_product_attention(q, k_cmp, v_cmp, attn_mask=unseen[:, None], scale=self.scale,
                                                    need_weights=True)
        o_cmp, p_cmp = o_cmp.nan_to_num(0.0), p_cmp.nan_to_num(0.0)  # a query before the first block: none
    else:
        o_cmp = torch.zeros_like(q)
        p_cmp = q.new_zeros(batch, h, lq, 0)
    # selected: the best complete blocks by the group's compressed attention, and the query's own block
    hkv = self.num_kv_heads
    group = h // hkv
    score = p_cmp.view(batch, hkv, group, lq, nb).sum(2)  # (B, Hkv, Lq, nb)
    own = (t // b).clamp(min=0)  # (B, Lq)
    chosen = torch.zeros(batch, hkv, lq, nb + 1, dtype=torch.bool, device=device)
    if nb:
        top = score.masked_fill(unseen[:, None], float("-inf")).topk(min(self.num_selected, nb), dim=-1)
        chosen[..., :nb] = torch.zeros_like(score, dtype=torch.bool).scatter(-1, top.indices, True) & ~unseen[:, None]
    chosen.scatter_(-1, own[:, None, :, None].expand(batch, hkv, lq, 1), True)
    keys_block = (j // b).clamp(max=nb)  # (Lk,): each key's block, the incomplete last one as nb
    keep = chosen.gather(-1, keys_block.view(1, 1, 1, lk).expand(batch, hkv, lq, lk))
    keep &= (j[None, None, :] <= t[:, :, None])[:, None]
    blocked = ~keep.repeat_interleave(group, dim=1)  # (B, H, Lq, Lk)
    o_slc, _ = scaled_dot_product_attention(q, k, v, attn_mask=blocked, scale=self.scale, dropout_p=drop)
    # window: the last `branch_window` keys
    distance = t[:, :, None] - j[None, None, :]  # (B, Lq, Lk)
    band = (distance < 0) | (distance >= self.branch_window)
    o_win, _ = scaled_dot_product_attention(q, k, v, attn_mask=band[:, None], scale=self.scale, dropout_p=drop)
    g = torch.sigmoid(torch.einsum("bhld,hdc->bhlc", q, self.gate.to(q.dtype)) + self.gate_bias[:, None].to(q.dtype))
    return g[..., :1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:] * o_win
