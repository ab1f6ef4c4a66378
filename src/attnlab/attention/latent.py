"""Multi-head latent attention (DeepSeek-V2, 2024; DeepSeek-V3): keys and values of every head
are made from one shared latent of ``kv_rank`` values a position, and only that latent (plus a
small rotary key shared by the heads) is cached.

For a token ``x`` (``E``)::

    c      = RMSNorm(W_DKV x)               the latent, kv_rank values (cached)
    k_rope = rotate(W_KR x)                 rope_dim values shared by every head (cached)
    k_h    = [W_UK_h c, k_rope]             head h's key: head_dim from the latent, then the rotary part
    v_h    = W_UV_h c                       head h's value, v_head_dim
    q_h    = [W_UQ_h q', rotate(W_QR_h q')] q' = RMSNorm(W_DQ x) (q_rank) or x itself

so the cache holds ``kv_rank + rope_dim`` numbers a position against grouped-query attention's
``2 * Hkv * D`` (DeepSeek-V3: 576 against 2 x 128 x 128 = 32,768 for its multi-head
equivalent). The positions live in the decoupled rotary part only, since a rotation between
``W_UK`` and the latent would stop the two products from being merged.

Two options serve a model converted from grouped-query attention (``model.convert_attention``,
:mod:`attnlab.models.convert`, as MHA2MLA and TransMLA do): ``latent_norm=False`` leaves the
latent's RMSNorm out, so that ``W_UK W_DKV`` can equal a pretrained key projection exactly, and
``rope_heads`` gives each group of ``num_heads / rope_heads`` query heads its own rotary key
(``rope_heads`` of them cached, ``kv_rank + rope_heads * rope_dim`` numbers a position), as the
key/value groups of the model it came from had.

That merge is what :meth:`decode_step` does: ``q_h . W_UK_h c = (W_UK_h^T q_h) . c``, so each
new query is moved into the latent space once and scored against the cached latents directly,
and the heads' outputs are taken from the weighted latents through ``W_UV``: a step reads the
cache once, never expanding it into per-head keys and values. :meth:`forward` (training, a
prompt) expands them, which is cheaper when many queries share the keys.

The parameters have DeepSeek's names (``q_a_proj``, ``q_a_layernorm``, ``q_b_proj`` or
``q_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``), and
``rope_interleave`` reads DeepSeek's rotary layout (pairs ``(x0, x1), (x2, x3), ...``).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError, shape_str
from ..moved import former_names
from .cache import DecodingCache
from .functional import check_heads, check_positive_int, scaled_dot_product_attention
from .joined import _weight_of
from .rmsnorm import RMSNorm
from .positions import init_inner_positions
from .contract import Option, Options
from .registry import register_attention

__all__ = ["LatentAttention", "LATENT_OPTIONS"]



LATENT_OPTIONS = Options(
    Option("dropout", float, 0.0, "on the attention weights, in training mode", low=0, high=1, high_open=True),
    Option("bias", bool, False, "biases of the projections of x and of the output"),
    Option("kv_rank", int, None, "the latent's size (None: 4 * head_dim, DeepSeek-V2's ratio)", low=1),
    Option("q_rank", int, None, "the queries' own compression (None: one projection from x)", low=1),
    Option("head_dim", int, None, "each head's query/key size taken from the latent (None: embed_dim / num_heads)",
           low=1),
    Option("rope_dim", int, None, "the rotary part of each query and key (None: head_dim / 2 with rope, else 0)", low=0),
    Option("v_head_dim", int, None, "each head's value size (None: head_dim)", low=1),
    Option("rope", bool, False, "rotary positions on the rotary part of each query and key"),
    Option("rope_theta", float, 10000.0, "the rotary base", low=0, low_open=True),
    Option("rope_scaling", dict, None, "the rotary scaling, as the exact kind's, which needs max_len"),
    Option("max_len", int, None, "the longest context the model was made for", low=1),
    Option("rope_interleave", bool, False, "DeepSeek's layout of the rotary part (pairs of neighbours)"),
    Option("scale", float, None, "the logit scale (None: (head_dim + rope_dim) ** -0.5)", low=0, low_open=True),
    Option("latent_norm_eps", float, 1e-6, "the eps of the two latents' RMSNorms", low=0, low_open=True),
    Option("latent_norm", bool, True, "the RMSNorm of the key/value latent (off: a model converted from "
           "grouped-query attention, whose keys are a plain product)"),
    Option("rope_heads", int, 1, "the rotary keys a position has, each shared by num_heads / rope_heads query heads "
           "(1: DeepSeek's one shared key)", low=1),
)


@register_attention("latent", options=LATENT_OPTIONS, forms_weights=True, keeps_cache=True, decode_step=True,
                    takes_positions=True, causal=True, padding=True, lora_roles=("attention",),
                    summary="latent attention (DeepSeek-V2/V3): keys and values from one small latent, which is cached")
class LatentAttention(nn.Module):
    """Multi-head latent attention (see the module docstring).

    Args:
        embed_dim: ``E``.
        num_heads: ``H``.
        kv_rank: the latent's size (default ``4 * head_dim``, DeepSeek-V2's ratio).
        q_rank: the queries' own compression (default none: one projection from ``x``).
        head_dim: each head's query/key size taken from the latent (default ``E / H``).
        rope_dim: the rotary part of each query and key (default ``head_dim / 2`` with ``rope``,
            else 0: then positions must come from outside, e.g. learned embeddings).
        v_head_dim: each head's value size (default ``head_dim``).
        rope: rotary positions on the rotary part of each query and key.
        rope_theta: their base.
        rope_scaling: their scaling (as the exact kind's), which needs ``max_len``.
        max_len: the longest context the model was made for.
        rope_interleave: DeepSeek's layout of the rotary part (pairs of neighbours).
        scale: the logit scale (default ``(head_dim + rope_dim) ** -0.5``).
        latent_norm_eps: the eps of the two latents' RMSNorms (DeepSeek: 1e-6).
        latent_norm: the RMSNorm of the key/value latent (off: a converted model's, see the module).
        rope_heads: the rotary keys a position has, each shared by ``num_heads / rope_heads`` query
            heads (DeepSeek: 1; a model converted from grouped-query attention: its key/value heads).
        dropout: on the attention weights, in training mode.
        bias: biases of the projections of ``x`` and of the output.
    """

    _attn_capture: Callable[[Tensor], None] | None = None

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = False,
                 kv_rank: int | None = None, q_rank: int | None = None, head_dim: int | None = None,
                 rope_dim: int | None = None, v_head_dim: int | None = None, rope: bool = False,
                 rope_theta: float = 10000.0, rope_scaling: dict | None = None, max_len: int | None = None,
                 rope_interleave: bool = False, scale: float | None = None, latent_norm_eps: float = 1e-6,
                 latent_norm: bool = True, rope_heads: int = 1) -> None:
        super().__init__()
        if head_dim is None:
            check_heads(embed_dim, num_heads, dropout)
            head_dim = embed_dim // num_heads
        else:
            check_heads(embed_dim, 1, dropout)
            check_positive_int("num_heads", num_heads)
            check_positive_int("head_dim", head_dim)
        kv_rank = check_positive_int("kv_rank", 4 * head_dim if kv_rank is None else kv_rank)
        if q_rank is not None:
            check_positive_int("q_rank", q_rank)
        if rope_dim is None:
            rope_dim = max(2, head_dim // 2) if rope else 0
        if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim < 0 or rope_dim % 2:
            raise InputError(f"rope_dim must be an even number, 0 or more; got {rope_dim!r}")
        if rope and not rope_dim:
            raise InputError("rope needs a rotary part: rope_dim must be positive")
        if rope_dim and not rope:
            raise InputError(f"rope_dim={rope_dim} is the rotary part of each head, and rope is off")
        v_head_dim = check_positive_int("v_head_dim", head_dim if v_head_dim is None else v_head_dim)
        rope_heads = check_positive_int("rope_heads", rope_heads)
        if num_heads % rope_heads:
            raise InputError(f"rope_heads must divide num_heads={num_heads} (each rotary key serves a group of query "
                             f"heads); got {rope_heads}")
        if scale is not None and not (isinstance(scale, (int, float)) and 0 < scale < float("inf")):
            raise InputError(f"scale must be a positive number; got {scale!r}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.kv_rank, self.q_rank, self.rope_dim, self.v_head_dim = kv_rank, q_rank, rope_dim, v_head_dim
        self.rope_heads = rope_heads
        self.rope_width = rope_heads * rope_dim  # the rotary keys' numbers a position, after the latent
        self.dropout, self.rope_interleave = dropout, bool(rope_interleave)
        self.scale = (head_dim + rope_dim) ** -0.5 if scale is None else float(scale)
        qk = head_dim + rope_dim
        if q_rank is None:
            self.q_proj: nn.Linear | None = nn.Linear(embed_dim, num_heads * qk, bias=False)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(embed_dim, q_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(q_rank, latent_norm_eps)
            self.q_b_proj = nn.Linear(q_rank, num_heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(embed_dim, kv_rank + self.rope_width, bias=bias)
        self.kv_a_layernorm = RMSNorm(kv_rank, latent_norm_eps) if latent_norm else None
        self.kv_b_proj = nn.Linear(kv_rank, num_heads * (head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * v_head_dim, embed_dim, bias=bias)
        init_inner_positions(self, max(rope_dim, 2), num_heads, rope=rope, rope_theta=rope_theta, alibi=False,
                             rope_scaling=rope_scaling, max_len=max_len)

    # ------------------------------------------------------------------ the cache (the decoder contract)
    def new_cache(self, batch: int, capacity: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> DecodingCache:
        """A cache of the latents and rotary keys, ``kv_rank + rope_heads * rope_dim`` numbers a position."""
        return DecodingCache(capacity)

    def cache_bytes(self, batch: int, positions: int, dtype: torch.dtype) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return batch * (self.kv_rank + self.rope_width) * positions * itemsize

    # ------------------------------------------------------------------ forward
    def _queries(self, x: Tensor) -> Tensor:
        """``(..., H * (head_dim + rope_dim))``."""
        if self.q_proj is not None:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # type: ignore[misc]

    def _deinterleave(self, t: Tensor) -> Tensor:
        """DeepSeek's rotary pairs ``(x0, x1), (x2, x3)`` as halves ``(x0, x2, ...), (x1, x3, ...)``, the
        layout :class:`RotaryEmbedding` rotates (the same dot products: queries and keys move alike)."""
        return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1) if self.rope_interleave else t

    def _latents(self, x: Tensor, positions: Tensor, q_rot: Tensor) -> tuple[Tensor, Tensor]:
        """``(latent and rotary keys (B, 1, L, kv_rank + rope_heads * rope_dim), rotated q_rot)`` of
        ``x`` ``(B, L, E)``."""
        batch, n, _ = x.shape
        c, k_rot = self.kv_a_proj_with_mqa(x).split([self.kv_rank, self.rope_width], dim=-1)
        if self.kv_a_layernorm is not None:
            c = self.kv_a_layernorm(c)
        k_rot = k_rot.view(batch, n, self.rope_heads, self.rope_dim).transpose(1, 2)  # (B, rope_heads, L, rope_dim)
        if self.rotary is not None:
            q_rot, k_rot = self.rotary(self._deinterleave(q_rot), self._deinterleave(k_rot), positions)
        k_rot = k_rot.transpose(1, 2).reshape(batch, 1, n, self.rope_width)
        return torch.cat([c[:, None], k_rot], dim=-1), q_rot

    def _stored(self, x: Tensor, positions: Tensor | None, cache: DecodingCache | None,
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(queries (B, H, L, head_dim + rope_dim) rotated, what the step attends to (B, 1, Lk, kv_rank +
        rope_heads * rope_dim + ...), the positions, the latents (B, Lk, kv_rank))``, this step's added to
        the cache."""
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise InputError(f"x must have shape (B, L, {self.embed_dim}); got {shape_str(x)}")
        batch, n, _ = x.shape
        h, d, r = self.num_heads, self.head_dim, self.rope_dim
        past = cache.seq_len if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + n, device=x.device)
        q = self._queries(x).view(batch, n, h, d + r).transpose(1, 2)
        q_nope, q_rot = q.split([d, r], dim=-1)
        stored, q_rot = self._latents(x, positions, q_rot)
        if cache is not None:
            stored, _, _ = cache.update(stored, None)
        return torch.cat([q_nope, q_rot], dim=-1), stored, positions, stored[:, 0, :, : self.kv_rank]

    def _keys_values(self, c: Tensor, k_rot: Tensor) -> tuple[Tensor, Tensor]:
        """Every head's keys and values ``(B, H, Lk, .)`` from the latents ``c`` ``(B, Lk, kv_rank)``
        and the rotary keys ``k_rot`` ``(B, 1, Lk, rope_heads * rope_dim)`` (head ``h`` takes key
        ``h // (num_heads / rope_heads)``, as grouped-query attention groups its heads)."""
        batch, lk, _ = c.shape
        h, d, g = self.num_heads, self.head_dim, self.rope_heads
        kv = self.kv_b_proj(c).view(batch, lk, h, d + self.v_head_dim).transpose(1, 2)
        k_nope, v = kv.split([d, self.v_head_dim], dim=-1)
        k_rot = k_rot.view(batch, lk, g, self.rope_dim).transpose(1, 2)  # (B, g, Lk, rope_dim)
        k_rot = k_rot.expand(-1, h, -1, -1) if g == 1 else k_rot.repeat_interleave(h // g, dim=1)
        return torch.cat([k_nope, k_rot], dim=-1), v

    def _attend_heads(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, key_padding_mask: Tensor | None,
                      is_causal: bool, need_weights: bool, average_attn_weights: bool) -> tuple[Tensor, Tensor | None]:
        """The attention of the heads, the weights recorded when captured, and the output projection."""
        batch, _, n, _ = q.shape
        capture = self._attn_capture
        out, weights = scaled_dot_product_attention(
            q, k, v, attn_mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights or capture is not None)
        if capture is not None:
            capture(weights)
            if not need_weights:
                weights = None
        out = self.o_proj(out.transpose(1, 2).reshape(batch, n, self.num_heads * self.v_head_dim))
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    def forward(self, x: Tensor, *, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                is_causal: bool = False, need_weights: bool = False, average_attn_weights: bool = True,
                positions: Tensor | None = None, cache: DecodingCache | None = None,
                ) -> tuple[Tensor, Tensor | None]:
        q, stored, _, c = self._stored(x, positions, cache)
        lk = c.shape[1]
        if key_padding_mask is not None and key_padding_mask.shape[-1] != lk:
            raise InputError(f"key_padding_mask must cover the {lk} keys of this step; got {shape_str(key_padding_mask)}")
        k, v = self._keys_values(c, stored[:, 0, :, self.kv_rank: self.kv_rank + self.rope_width])
        return self._attend_heads(q, k, v, mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                                  need_weights=need_weights, average_attn_weights=average_attn_weights)

    # ------------------------------------------------------------------ one token per row
    def _decode_plan(self) -> tuple:
        """What :meth:`decode_step` fetches once per generation: ``W_UK`` ``(H, head_dim, kv_rank)``
        and ``W_UV`` ``(H, v_head_dim, kv_rank)``, the two halves of ``kv_b_proj``'s weight."""
        h, d = self.num_heads, self.head_dim
        with torch.no_grad():
            w = _weight_of(self.kv_b_proj).detach().view(h, d + self.v_head_dim, self.kv_rank)
            return w[:, :d].contiguous(), w[:, d:].contiguous()

    def decode_step(self, x: Tensor, cache: DecodingCache, *, positions: Tensor | None = None,
                    key_padding_mask: Tensor | None = None) -> Tensor:
        """One token per row, ``x`` ``(B, E)`` -> ``(B, E)``, in eval mode: the query moved into
        the latent space (``W_UK^T q``), scored against the cached latents and rotary keys in
        one product, the weighted latents taken to the heads' values through ``W_UV``."""
        q_nope, q_rot, keys, _ = self._step_stored(x, cache, positions)  # (B, 1, Lk, kv_rank + rope_heads * rope_dim)
        keep = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        return self._latent_attend(q_nope, q_rot, keys, keep, cache)

    def _step_stored(self, x: Tensor, cache: DecodingCache, positions: Tensor | None,
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """A decoding step's ``(q_nope, rotated q_rot (B, H, 1, .), everything the cache holds
        after this step (B, 1, Lk, .), the step's positions)``."""
        batch, h, d, r = x.shape[0], self.num_heads, self.head_dim, self.rope_dim
        q_nope, q_rot = self._queries(x).view(batch, h, 1, d + r).split([d, r], dim=-1)
        pos = torch.full((1,), cache.seq_len, device=x.device) if positions is None else positions
        stored, q_rot = self._latents(x[:, None], pos, q_rot)
        stored, _, _ = cache.update(stored, None)
        return q_nope, q_rot, stored, pos

    def _latent_attend(self, q_nope: Tensor, q_rot: Tensor, keys: Tensor, keep: Tensor | None,
                       cache: DecodingCache) -> Tensor:
        """The step's output ``(B, E)``: the query moved into the latent space (``W_UK^T q``),
        attending over ``keys`` ``(B, 1, Lk, kv_rank + rope_heads * rope_dim)`` (latents and rotary
        keys; ``keep`` ``(B, 1, 1, Lk)``, True = may attend, or None), the weighted latents taken to the
        heads' values through ``W_UV`` (the two fetched once per generation into the cache). With
        several rotary keys, each group of heads attends over the latents and its own key."""
        plan = cache.scratch.get("plan")
        if plan is None:
            plan = cache.scratch["plan"] = self._decode_plan()
        w_uk, w_uv = plan
        batch = q_nope.shape[0]
        g, lk = self.rope_heads, keys.shape[2]
        q_lat = torch.einsum("bhd,hdr->bhr", q_nope[:, :, 0], w_uk)  # (B, H, kv_rank)
        query = torch.cat([q_lat, q_rot[:, :, 0]], dim=-1).view(batch, g, self.num_heads // g, -1)  # heads as rows
        if g > 1:  # group j's keys: the latents and its rotary key
            latent = keys[..., : self.kv_rank].expand(-1, g, -1, -1)
            rotary = keys[:, 0, :, self.kv_rank: self.kv_rank + self.rope_width].view(batch, lk, g, self.rope_dim)
            keys = torch.cat([latent, rotary.transpose(1, 2)], dim=-1)  # (B, g, Lk, kv_rank + rope_dim)
        ctx = F.scaled_dot_product_attention(query, keys, keys[..., : self.kv_rank], attn_mask=keep,
                                             scale=self.scale)  # (B, g, H / g, kv_rank)
        out = torch.einsum("bhr,hvr->bhv", ctx.reshape(batch, self.num_heads, self.kv_rank), w_uv)
        out = out.reshape(batch, self.num_heads * self.v_head_dim)
        return self.o_proj(out)

    def extra_repr(self) -> str:
        parts = [f"embed_dim={self.embed_dim}", f"num_heads={self.num_heads}", f"kv_rank={self.kv_rank}",
                 f"head_dim={self.head_dim}", f"rope_dim={self.rope_dim}", f"v_head_dim={self.v_head_dim}"]
        if self.q_rank is not None:
            parts.append(f"q_rank={self.q_rank}")
        if self.rope_interleave:
            parts.append("rope_interleave=True")
        if self.rope_heads != 1:
            parts.append(f"rope_heads={self.rope_heads}")
        if self.kv_a_layernorm is None:
            parts.append("latent_norm=False")
        return ", ".join(parts)


__getattr__ = former_names(__name__)  # IndexedSparseAttention and top_keys, now in attnlab.attention.dsa
