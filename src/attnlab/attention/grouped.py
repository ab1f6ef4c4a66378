"""Grouped-query self-attention, the attention of today's decoder-only language models:
``num_kv_heads`` key/value heads shared by groups of query heads (1: multi-query; equal
to ``num_heads``: ordinary multi-head), rotary positions or ALiBi, a sliding window,
QK-norm, and a key/value cache (:class:`~attnlab.attention.cache.DecodingCache`)
that stores only the key/value heads.

Registered as the ``"gqa"`` tokens kind, so every token model can use it; with none of
its options it is exact multi-head self-attention.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError, shape_str
from .alibi import alibi_bias
from .cache import DecodingCache
from .functional import check_heads, combine_masks, scaled_dot_product_attention
from .positions import init_inner_positions, inner_positions_repr
from .registry import register_attention
from .rotary import apply_rotary

__all__ = ["GroupedQueryAttention", "RMSNorm", "band_mask", "fused_linear", "joined_weight", "product"]

_RMS_NORM = getattr(F, "rms_norm", None)  # torch >= 2.4


class RMSNorm(nn.Module):
    """``x / rms(x) · weight`` (Zhang and Sennrich, 2019), computed in float32 and cast back
    (as Llama does, so half-precision inputs keep their accuracy). ``(..., dim)``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        if x.dtype == torch.float32 and _RMS_NORM is not None:  # one kernel: 25 µs against 50 (width 256, AVX2)
            return _RMS_NORM(x, (x.shape[-1],), self.weight, self.eps)
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def band_mask(q_slots: Tensor, k_slots: Tensor, *, causal: bool, window: int | None) -> Tensor | None:
    """Bool ``(Lq, Lk)``, ``True`` = blocked: future keys (``causal``) and keys ``window`` or
    more positions away (behind, and ahead when not causal); ``None`` when nothing is blocked."""
    if not causal and window is None:
        return None
    distance = q_slots[:, None] - k_slots[None, :]  # query minus key
    blocked = torch.zeros(distance.shape, dtype=torch.bool, device=distance.device)
    if causal:
        blocked |= distance < 0
    if window is not None:
        blocked |= distance >= window
        if not causal:
            blocked |= distance <= -window
    return blocked


def _weight_of(layer: nn.Linear) -> Tensor:
    merged = getattr(layer, "merged_weight", None)
    return layer.weight if merged is None else merged()


def joined_weight(owner: nn.Module, name: str, layers: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor | None]:
    """The layers' weights joined and transposed, ``(in, sum of out)``, and their joined bias
    (or None): kept on ``owner`` under ``name`` and joined again when a weight changes (its
    version counter moves on an optimizer step or a load). A layer with a low-rank update
    (LoRA's :class:`~attnlab.layers.lora.LoRALinear`) gives its ``merged_weight``: what it
    computes in eval mode, the only mode these joined weights serve."""
    key = tuple((p.data_ptr(), p._version) for layer in layers for p in layer.parameters(recurse=False))
    cached = owner.__dict__.get(f"_fused_{name}")
    if cached is None or cached[0] != key:
        with torch.no_grad():
            weight = torch.cat([_weight_of(layer) for layer in layers]).t().contiguous()
            bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])  # type: ignore[misc]
        cached = (key, weight, bias)
        owner.__dict__[f"_fused_{name}"] = cached
    return cached[1], cached[2]


def product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight + bias`` for ``x`` ``(..., in)`` and a joined ``weight`` ``(in, out)``."""
    flat = x.reshape(-1, x.shape[-1])
    out = flat @ weight if bias is None else torch.addmm(bias, flat, weight)
    return out.view(*x.shape[:-1], out.shape[-1])


def fused_linear(owner: nn.Module, name: str, layers: tuple[nn.Linear, ...], x: Tensor) -> tuple[Tensor, ...]:
    """``tuple(layer(x) for layer in layers)``; when no gradient is wanted (decoding), as one
    product ``x @ W`` with the layers' weights joined and kept transposed
    (:func:`joined_weight`). On the CPU a product with one or a few rows costs 20 µs against
    ``F.linear``'s 30 µs for a width-256 layer (AVX2 EPYC, ``benchmarks/lm_generate.py``),
    and joining the query, key and value projections makes three such products one."""
    if torch.is_grad_enabled() or owner.training:
        return tuple(layer(x) for layer in layers)
    out = product(x, *joined_weight(owner, name, layers))
    if len(layers) == 1:
        return (out,)
    return tuple(out.split([layer.out_features for layer in layers], dim=-1))


@register_attention("gqa", forms_weights=True)
class GroupedQueryAttention(nn.Module):
    r"""Self-attention with grouped key/value heads, batch-first.

    Args:
        embed_dim: ``E``.
        num_heads: query heads ``H``; divides ``E`` (head size ``D = E / H``).
        num_kv_heads: key/value heads ``Hkv``, dividing ``H`` (default ``H``; 1 is
            multi-query attention).
        dropout: on the attention weights, in training mode.
        bias: biases on the query, key and value projections.
        out_bias: a bias on the output projection (default ``bias``).
        rope: rotate queries and keys by their positions (:class:`RotaryEmbedding`).
        rope_theta: its base.
        alibi: add ALiBi's per-head distance penalty to the logits.
        window: each query sees the ``window`` latest keys, itself included (a sliding
            window; both sides when not causal). With a cache, only those are stored.
        qk_norm: RMSNorm on each head's queries and keys before the product.

    ``forward(x, *, key_padding_mask, attn_mask, is_causal, need_weights,
    average_attn_weights, positions, cache)``: ``x`` ``(B, L, E)``; ``positions`` ``(L,)``
    or ``(B, L)``: the rotary positions of the new tokens (default: the next ones after
    the cache's, or ``0..L-1``); ``key_padding_mask`` ``(B, Lk_total)`` over the cached
    and new keys. Returns ``(out (B, L, E), weights (B, Lq, Lk) averaged over heads or
    (B, H, Lq, Lk), or None)``.

    The projections are ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``, as in Llama.
    """

    lora_role = "attention"  # LoRA (attnlab.layers.lora): its linear layers are attention projections

    _attn_capture: Callable[[Tensor], None] | None = None

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 num_kv_heads: int | None = None, out_bias: bool | None = None, rope: bool = False,
                 rope_theta: float = 10000.0, alibi: bool = False, window: int | None = None,
                 qk_norm: bool = False) -> None:
        super().__init__()
        check_heads(embed_dim, num_heads, dropout)
        kv = num_heads if num_kv_heads is None else num_kv_heads
        if not isinstance(kv, int) or kv < 1 or num_heads % kv:
            raise InputError(f"num_kv_heads must be a positive divisor of num_heads={num_heads}; got {num_kv_heads!r}")
        if window is not None and (not isinstance(window, int) or window < 1):
            raise InputError(f"window must be a positive number of positions; got {window!r}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, kv
        self.head_dim = embed_dim // num_heads
        self.dropout, self.window = dropout, window
        self.q_proj = nn.Linear(embed_dim, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, embed_dim, bias=bias if out_bias is None else out_bias)
        init_inner_positions(self, self.head_dim, num_heads, rope=rope, rope_theta=rope_theta, alibi=alibi)
        self.q_norm = RMSNorm(self.head_dim) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim) if qk_norm else None

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, heads, self.head_dim).transpose(1, 2)  # (B, heads, L, D)

    def forward(self, x: Tensor, *, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                is_causal: bool = False, need_weights: bool = False, average_attn_weights: bool = True,
                positions: Tensor | None = None, cache: DecodingCache | None = None,
                ) -> tuple[Tensor, Tensor | None]:
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise InputError(f"x must have shape (B, L, {self.embed_dim}); got {shape_str(x)}")
        batch, n, _ = x.shape
        past = cache.seq_len if cache is not None else 0
        q, k, v = fused_linear(self, "qkv", (self.q_proj, self.k_proj, self.v_proj), x)
        q, k, v = self._heads(q, self.num_heads), self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # type: ignore[misc]
        if self.rotary is not None:
            if positions is None:
                positions = torch.arange(past, past + n, device=x.device)
            q, k = self.rotary(q, k, positions)
        start = 0
        if cache is not None:
            k, v, start = cache.update(k, v)
        lk = k.shape[2]
        q_slots = torch.arange(past, past + n, device=x.device)
        k_slots = torch.arange(start, start + lk, device=x.device)
        mask = attn_mask
        if self.alibi_slopes is not None:
            mask = combine_masks(mask, alibi_bias(self.alibi_slopes, q_slots, k_slots).to(q.dtype))
        if self.window is not None:
            mask = combine_masks(mask, band_mask(q_slots, k_slots, causal=is_causal, window=self.window))
            is_causal = False  # the band holds the causal part too
        if key_padding_mask is not None and key_padding_mask.shape[-1] != lk:
            if cache is not None and self.window is not None and key_padding_mask.shape[-1] > lk:
                key_padding_mask = key_padding_mask[:, -lk:]  # the keys a sliding window still holds
            else:
                raise InputError(f"key_padding_mask must cover the {lk} keys of this step; got "
                                 f"{shape_str(key_padding_mask)}")
        if self.num_kv_heads != self.num_heads:  # each key/value head serves a group of query heads
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        capture = self._attn_capture
        out, weights = scaled_dot_product_attention(
            q, k, v, attn_mask=mask, key_padding_mask=key_padding_mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights or capture is not None)
        if capture is not None:
            capture(weights)
            if not need_weights:
                weights = None
        out = out.transpose(1, 2).reshape(batch, n, self.num_heads * self.head_dim)
        out = fused_linear(self, "o", (self.o_proj,), out)[0]
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    def decode_weights(self) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """The joined query/key/value projection and the output projection for
        :meth:`decode_step`, ``(qkv weight, bias, o weight, bias)``: fetched once per generation."""
        return (*joined_weight(self, "qkv", (self.q_proj, self.k_proj, self.v_proj)),
                *joined_weight(self, "o", (self.o_proj,)))

    def decode_step(self, x: Tensor, cache: DecodingCache, weights: tuple[Tensor, Tensor | None, Tensor, Tensor | None],
                    rope: tuple[Tensor, Tensor] | None = None, key_padding_mask: Tensor | None = None) -> Tensor:
        """One token per row while generating, in eval mode: ``x`` ``(B, E)`` -> ``(B, E)``, what
        :meth:`forward` gives for ``x[:, None]`` with this ``cache`` and ``is_causal=True``.

        ``weights``: :meth:`decode_weights`. ``rope``: the ``(cos, sin)`` of the new position,
        ``(B or 1, 1, D)``, computed once for all layers; ``key_padding_mask`` ``(B, keys
        seen)``. A single query sees every cached key (a sliding-window cache holds only those
        in its window), so no causal or band mask is built, and the query heads of a group are
        laid out as rows of their key/value head instead of copying the keys once per query
        head. :meth:`forward`'s checks, masks and weights cost as much as the arithmetic at
        this size: a step of a 4-layer width-256 model took 6.4 ms through it at batch 1
        against 3.5 ms so (AVX2 EPYC; ``benchmarks/lm_generate.py``). ALiBi goes through
        :meth:`forward`.
        """
        batch = x.shape[0]
        hkv, d = self.num_kv_heads, self.head_dim
        qkv = product(x, weights[0], weights[1])
        heads = self.num_heads + hkv
        if self.q_norm is not None:
            q, k, v = qkv.split((self.num_heads * d, hkv * d, hkv * d), dim=-1)
            qk = torch.cat([self.q_norm(q.view(batch, -1, d)), self.k_norm(k.view(batch, -1, d))], dim=1)  # type: ignore[misc]
        else:
            qk, v = qkv[:, : heads * d].view(batch, heads, d), qkv[:, heads * d :]
        if rope is not None:  # queries and keys rotated together: one product per term
            qk = apply_rotary(qk, *rope)
        q = qk[:, : self.num_heads].view(batch, hkv, self.num_heads // hkv, d)  # query head h: kv head h // group
        k, v = qk[:, self.num_heads :].view(batch, hkv, 1, d), v.reshape(batch, hkv, 1, d)
        k, v, _ = cache.update(k, v)
        mask = None
        if key_padding_mask is not None:
            mask = ~key_padding_mask[:, -k.shape[2]:][:, None, None, :]  # True = may attend (torch's)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, Hkv, group, D)
        return product(out.reshape(batch, self.num_heads * d), weights[2], weights[3])

    def extra_repr(self) -> str:
        parts = [f"embed_dim={self.embed_dim}", f"num_heads={self.num_heads}", f"num_kv_heads={self.num_kv_heads}"]
        parts += inner_positions_repr(self)
        if self.window is not None:
            parts.append(f"window={self.window}")
        return ", ".join(parts)
