"""Block-sparse self-attention: Sparse Transformer ("fixed", "strided") and BigBird.

The sequence is cut into blocks of ``block`` tokens (``L`` is padded up to a multiple of
``block``; the padded keys are masked, the padded queries dropped). A pattern is a
boolean ``(nb, nb)`` *block layout*, ``True`` where query block ``i`` may attend key
block ``j`` (:meth:`SparseAttention.block_layout`):

* ``"fixed"`` (Child et al., 2019, "Generating Long Sequences with Sparse
  Transformers", fixed pattern): the blocks are grouped in segments of
  ``stride_blocks``; query block ``i`` sees every block of its own segment and the last
  ("summary") block of every earlier segment.
* ``"strided"`` (Child et al., 2019, strided pattern): query block ``i`` sees the
  ``stride_blocks`` blocks ``i - stride_blocks + 1 .. i`` (local: its own and the
  previous ones) and every block ``j`` with ``j ≡ i (mod stride_blocks)``.
* ``"bigbird"`` (Zaheer et al., 2020, "Big Bird: Transformers for Longer Sequences"):
  the first ``global_blocks`` blocks attend to and are attended by every block; a
  window of ``window_blocks`` blocks centred on the query block (offsets
  ``-(w-1)//2 .. w//2``); and ``random_blocks`` random key blocks per query block,
  drawn among the blocks not already covered (earlier blocks only when causal), from
  a table of uniforms seeded by ``seed`` (the non-persistent int64 buffer ``random_u``,
  fixed per layer, grown deterministically for longer sequences).

With ``is_causal=True`` the layout is intersected with the lower block triangle and a
token-level causal mask is applied inside the diagonal blocks. Key padding and
``is_causal`` follow :mod:`attnlab.attention.functional`; a query with every key
blocked outputs zeros.

No ``L x L`` matrix is formed: for every query block its (at most ``count``) key
blocks are gathered from a ``(B, H, nb, block, D)`` view (each row's list padded to
``count`` with a masked dummy block), and the ``block x count·block`` logits are
masked, soft-maxed in float32 and applied to the gathered values: memory
``O(L · count · block)`` per head. BigBird's global query blocks (non-causal), which
see everything, are computed as dense rows against all keys (they are few).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ...dropout import dropout
from ...errors import InputError
from ..contract import Option
from ..registry import register_attention
from .base import TOKEN_OPTIONS, TokenAttention

__all__ = ["SparseAttention"]

_PATTERNS = ("fixed", "strided", "bigbird")
_CHUNK = 256  # rows of the random table drawn per seeded chunk
_CACHE_SIZE = 16


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"sparse: {name} must be an integer >= {minimum}; got {value!r}")
    return value


SPARSE_OPTIONS = TOKEN_OPTIONS.extend(
    Option("pattern", str, "bigbird", "the layout of the blocks", choices=("fixed", "strided", "bigbird")),
    Option("block", int, 32, "positions a block", low=1, counts_positions=True),
    Option("window_blocks", int, 3, "blocks of the window centred on the query's", low=1),
    Option("global_blocks", int, 1, "blocks every query sees and that see every key", low=0),
    Option("random_blocks", int, 2, "random blocks each query block sees (BigBird)", low=0, counts_positions=True),
    Option("stride_blocks", int, 4, "the stride of the strided pattern, in blocks", low=1),
    Option("seed", int, 0, "the random blocks' seed", low=0))


@register_attention("sparse", options=SPARSE_OPTIONS, takes_positions=True, causal=True, padding=True,
                    lora_roles=("attention",),
                    summary="block-sparse patterns: fixed, strided (Sparse Transformer) or BigBird's")
class SparseAttention(TokenAttention):
    """Block-sparse attention over the patterns ``"fixed"``, ``"strided"`` and ``"bigbird"``;
    see the module docstring."""

    kind = "sparse"

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rope: bool = False, rope_theta: float = 10000.0,
                 pattern: str = "bigbird", block: int = 32, window_blocks: int = 3, global_blocks: int = 1,
                 random_blocks: int = 2, stride_blocks: int = 4, seed: int = 0) -> None:
        if pattern not in _PATTERNS:
            raise InputError(f"sparse: pattern must be one of {', '.join(map(repr, _PATTERNS))}; got {pattern!r}")
        self.block = _check_int("block", block, 1)
        self.window_blocks = _check_int("window_blocks", window_blocks, 1)
        self.global_blocks = _check_int("global_blocks", global_blocks, 0)
        self.random_blocks = _check_int("random_blocks", random_blocks, 0)
        self.stride_blocks = _check_int("stride_blocks", stride_blocks, 1)
        self.seed = _check_int("seed", seed, 0)
        self.check_positions(block=block, random_blocks=random_blocks)  # random_blocks sizes the random table
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, rope=rope, rope_theta=rope_theta)
        self.pattern = pattern
        rows = _CHUNK if pattern == "bigbird" else 0
        self.register_buffer("random_u", self._random_rows(0, rows), persistent=False)
        self._plans: dict[tuple, tuple] = {}

    # ----------------------------------------------------------------- the layout
    def _random_rows(self, start_chunk: int, rows: int) -> Tensor:
        """Uniforms for ``rows`` (a multiple of ``_CHUNK``) rows from chunk ``start_chunk``:
        each chunk has its own generator, so a longer table extends a shorter one."""
        parts = []
        for c in range(start_chunk, start_chunk + rows // _CHUNK):
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + c) % (2**63))
            # integers (a dtype cast of the module leaves them alone), read as uniforms in [0, 1)
            parts.append(torch.randint(0, 2**53, (_CHUNK, self.random_blocks), generator=g, dtype=torch.int64))
        if not parts:
            return torch.zeros((0, self.random_blocks), dtype=torch.int64)
        return torch.cat(parts)

    def _random_table(self, rows: int) -> Tensor:
        have = self.random_u.shape[0]
        if rows > have:
            need = -(-rows // _CHUNK) * _CHUNK
            more = self._random_rows(have // _CHUNK, need - have).to(self.random_u.device)
            self.random_u = torch.cat([self.random_u, more])
        return self.random_u[:rows].cpu().double() / 2.0**53

    def block_layout(self, num_blocks: int, causal: bool) -> Tensor:
        """Bool ``(num_blocks, num_blocks)`` CPU tensor, ``True`` = query block may attend key
        block; with ``causal`` intersected with the lower block triangle."""
        nb = _check_int("num_blocks", num_blocks, 0)
        i = torch.arange(nb).view(nb, 1)
        j = torch.arange(nb).view(1, nb)
        tril = j <= i
        s = self.stride_blocks
        if self.pattern == "fixed":
            layout = ((i // s) == (j // s)) | (((j % s) == s - 1) & ((j // s) < (i // s)))
        elif self.pattern == "strided":
            layout = (((i - j) >= 0) & ((i - j) < s)) | ((i - j) % s == 0)
        else:
            w = self.window_blocks
            g = min(self.global_blocks, nb)
            layout = ((j - i) >= -((w - 1) // 2)) & ((j - i) <= w // 2)
            layout = layout | (i < g) | (j < g)
            if self.random_blocks and nb:
                u = self._random_table(nb)  # (nb, R)
                avail = ~layout & tril if causal else ~layout
                rows = torch.arange(nb)
                for r in range(self.random_blocks):
                    n_avail = avail.sum(1)
                    pick = (u[:, r] * n_avail).floor().long().clamp(max=(n_avail - 1).clamp_min(0))
                    # the (pick+1)-th available block of each row
                    col = torch.searchsorted(avail.long().cumsum(1), (pick + 1).view(nb, 1)).view(nb)
                    ok = n_avail > 0
                    col = col.clamp(max=nb - 1)
                    layout[rows[ok], col[ok]] = True
                    avail[rows[ok], col[ok]] = False
        if causal:
            layout = layout & tril
        return layout

    def _plan(self, nb: int, causal: bool, device: torch.device) -> tuple:
        """Index tensors for ``nb`` blocks: (sparse rows, their key-block ids (nr, C) and
        validity, dense rows, order to restore the rows), cached."""
        key = (nb, causal, str(device))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        layout = self.block_layout(nb, causal)
        if self.pattern == "bigbird" and not causal:
            dense = torch.arange(min(self.global_blocks, nb))
        else:
            dense = torch.zeros(0, dtype=torch.long)
        is_dense = torch.zeros(nb, dtype=torch.bool)
        is_dense[dense] = True
        sparse = torch.arange(nb)[~is_dense]
        rows = layout[sparse]  # (nr, nb)
        counts = rows.sum(1)
        c = int(counts.max()) if sparse.numel() else 0
        # allowed blocks first, in order of index (stable sort of 0 = allowed, 1 = not)
        idx = torch.sort((~rows).to(torch.uint8), dim=1, stable=True).indices[:, :c]
        valid = torch.arange(c).view(1, c) < counts.view(-1, 1)
        idx = idx.masked_fill(~valid, 0)  # the dummy: block 0, masked
        diag = (idx == sparse.view(-1, 1)) & valid  # (nr, C): key block is the query's own block
        order = torch.cat([sparse, dense]).argsort()
        plan = tuple(t.to(device) for t in (sparse, idx, valid, diag, dense, order))
        if len(self._plans) >= _CACHE_SIZE:
            self._plans.clear()
        self._plans[key] = plan
        return plan

    # ------------------------------------------------------------------ attention
    def _softmax_apply(self, logits: Tensor, blocked: Tensor, v: Tensor) -> Tensor:
        logits = logits.masked_fill(blocked, -math.inf)
        dead = blocked.all(dim=-1, keepdim=True)
        logits = logits.masked_fill(dead, 0.0)
        w = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32)).to(v.dtype)
        w = w.masked_fill(dead, 0.0)
        w = dropout(w, self.dropout, self.training)
        return torch.matmul(w, v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        b, h, n, d = q.shape
        bs = self.block
        nb = -(-n // bs)
        lp = nb * bs
        device = q.device
        if b == 0 or n == 0:  # nothing to attend; the blocking below needs a position and a batch
            return v.clone()  # the empty (B, H, L, Dv) result, on the autograd graph
        kmask = None  # (B or 1, Lp) bool, True = blocked key
        if lp != n:
            pad = lp - n
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
            kmask = (torch.arange(lp, device=device) >= n).view(1, lp)
        if key_padding_mask is not None:
            kpm = key_padding_mask.to(device=device, dtype=torch.bool)
            if lp != n:
                kpm = torch.cat([kpm, kpm.new_ones(kpm.shape[0], lp - n)], dim=1)
            kmask = kpm if kmask is None else kmask | kpm
        sparse, idx, valid, diag, dense, order = self._plan(nb, is_causal, device)
        # Fast path: without a padding mask every query sees at least one key (its own
        # block holds a real key), so the fused kernel's rows are never empty.
        fast = key_padding_mask is None and not (self.training and self.dropout > 0)
        scale = 1.0 / math.sqrt(d)
        qb, kb, vb = (t.reshape(b, h, nb, bs, t.shape[-1]) for t in (q, k, v))
        outs = []
        nr, c = idx.shape
        if nr:
            flat = idx.reshape(-1)
            kg = kb.index_select(2, flat).view(b, h, nr, c * bs, d)
            vg = vb.index_select(2, flat).view(b, h, nr, c * bs, v.shape[-1])
            qs = qb if nr == nb else qb.index_select(2, sparse)  # (B, H, nr, bs, D)
            blocked = (~valid).view(nr, 1, c, 1).expand(nr, bs, c, bs)
            if is_causal:
                tri = torch.ones(bs, bs, dtype=torch.bool, device=device).triu(1)  # key after query
                blocked = blocked | (diag.view(nr, 1, c, 1) & tri.view(1, bs, 1, bs))
            blocked = blocked.reshape(1, 1, nr, bs, c * bs)
            if kmask is not None:
                kmb = kmask.view(kmask.shape[0], nb, bs).index_select(1, flat).view(kmask.shape[0], 1, nr, 1, c * bs)
                blocked = blocked | kmb
            if fast:  # one batch of dense attentions under a 4-D mask: the fused kernel
                out = F.scaled_dot_product_attention(qs.reshape(b * h, nr, bs, d), kg.reshape(b * h, nr, c * bs, d),
                                                     vg.reshape(b * h, nr, c * bs, -1), attn_mask=~blocked[0])
                outs.append(out.view(b, h, nr, bs, -1))
            else:
                logits = torch.matmul(qs, kg.transpose(-2, -1)) * scale  # (B, H, nr, bs, C*bs)
                outs.append(self._softmax_apply(logits, blocked.expand(b, h, nr, bs, c * bs), vg))
        nd = dense.numel()
        if nd:
            qd = qb.index_select(2, dense).reshape(b, h, nd * bs, d)
            qpos = (dense.view(nd, 1) * bs + torch.arange(bs, device=device).view(1, bs)).view(nd * bs, 1)
            blocked = torch.zeros(1, 1, nd * bs, lp, dtype=torch.bool, device=device)
            if is_causal:
                blocked = blocked | (torch.arange(lp, device=device).view(1, lp) > qpos).view(1, 1, nd * bs, lp)
            if kmask is not None:
                blocked = blocked | kmask.view(kmask.shape[0], 1, 1, lp)
            if fast:
                out = F.scaled_dot_product_attention(qd, k, v, attn_mask=~blocked)
            else:
                logits = torch.matmul(qd, k.transpose(-2, -1)) * scale  # (B, H, nd*bs, Lp)
                out = self._softmax_apply(logits, blocked.expand(b, h, nd * bs, lp), v)
            outs.append(out.view(b, h, nd, bs, v.shape[-1]))
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2).index_select(2, order)
        return out.reshape(b, h, lp, v.shape[-1])[:, :, :n]

    def extra_repr(self) -> str:
        extra = f", pattern={self.pattern!r}, block={self.block}"
        if self.pattern == "bigbird":
            extra += (f", window_blocks={self.window_blocks}, global_blocks={self.global_blocks}, "
                      f"random_blocks={self.random_blocks}, seed={self.seed}")
        else:
            extra += f", stride_blocks={self.stride_blocks}"
        return super().extra_repr() + extra
