"""Multi-head attention with torch's parameters: self-, cross-attention, masks and a key/value
cache. :class:`MultiHeadAttention` is the module of cross-attention (an encoder-decoder's)
and the one equal to ``torch.nn.MultiheadAttention`` (:meth:`MultiHeadAttention.from_torch`);
the ``"exact"`` self-attention kind that models build is
:class:`~attnlab.attention.grouped.GroupedQueryAttention`, the same computation with any
number of key/value heads and a cache of its own."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError, shape_str
from .alibi import alibi_bias
from .cache import KVCache
from .functional import check_heads, combine_masks, scaled_dot_product_attention
from .positions import init_inner_positions, inner_positions_repr

__all__ = ["MultiHeadAttention", "SelfAttention", "CrossAttention"]


def linear_rows(layer: nn.Linear, x: Tensor, lo: int, hi: int) -> Tensor:
    """``layer(x)[..., lo:hi]`` without computing the other output rows (the query alone of a
    packed projection). A layer that adds to its product (LoRA's
    :class:`~attnlab.layers.lora.LoRALinear`) computes it with its ``forward_rows``."""
    rows = getattr(layer, "forward_rows", None)
    if rows is not None:
        return rows(x, lo, hi)
    return F.linear(x, layer.weight[lo:hi], None if layer.bias is None else layer.bias[lo:hi])


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention (Vaswani et al., 2017), batch-first.

    ``out = W_o · concat_h softmax(q_h k_hᵀ / sqrt(D) + mask) v_h`` with ``D = E / H``.

    Args:
        embed_dim: model width ``E`` (query features and output features).
        num_heads: ``H``; must divide ``embed_dim``.
        dropout: dropout on the attention weights, in training mode.
        bias: add biases to the four projections.
        kdim: feature size of the key input (default ``embed_dim``).
        vdim: feature size of the value input (default ``embed_dim``).
        rope: rotate queries and keys by their positions (rotary embeddings,
            :class:`~attnlab.attention.rotary.RotaryEmbedding`); self-attention only.
        rope_theta: the base of their wavelengths.
        alibi: add ALiBi's per-head penalty ``-slope · |i - j|`` to the logits; self-attention
            only.

    With ``rope`` or ``alibi`` the queries are at positions ``past .. past + Lq - 1`` and the
    keys at ``0 .. Lk_total - 1``, ``past`` being the positions a :class:`KVCache` already
    holds, so decoding step by step gives what one call on the whole sequence gives.

    Shapes (``need_weights`` and the masks follow :mod:`attnlab.attention.functional`):

    ======================  =========================================================
    query                   ``(B, Lq, E)``
    key / value             ``(B, Lk, kdim)`` / ``(B, Lk, vdim)``; default: ``query``
    key_padding_mask        ``(B, Lk_total)``, bool ``True`` = padding, or float added
    attn_mask               ``(Lq, Lk_total)``, ``(B*H, Lq, Lk_total)`` or 4-D
                            broadcastable to ``(B, H, Lq, Lk_total)``
    output                  ``(B, Lq, E)``
    weights                 ``(B, Lq, Lk_total)`` averaged over heads, or
                            ``(B, H, Lq, Lk_total)`` with ``average_attn_weights=False``
    ======================  =========================================================

    Inside :func:`~attnlab.attention.capture_attention` the module also hands its
    per-head weights to the recorder (``_attn_capture``); its results do not change.

    ``Lk_total`` counts the cached positions too. With a :class:`KVCache`, the new keys
    and values are appended to it (self-attention) or, for a static cache
    (cross-attention), computed on the first call and reused afterwards.

    When ``kdim == vdim == embed_dim`` the three input projections are stored packed in
    ``in_proj`` (one matrix multiply for self-attention, as torch does); otherwise as
    ``q_proj``, ``k_proj`` and ``v_proj``.
    """

    # LoRA (attnlab.layers.lora): this module's linear layers are attention projections; the
    # packed in_proj holds three (query, key, value), each adapted on its own.
    lora_role = "attention"
    lora_parts = {"in_proj": 3}

    # A recorder of the weights, set on an instance by capture_attention only.
    _attn_capture: Callable[[Tensor], None] | None = None
    forms_weights = True  # capture_attention records this module (cross-attention too)

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        rope: bool = False,
        rope_theta: float = 10000.0,
        alibi: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        check_heads(embed_dim, num_heads, dropout)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.kdim = kdim or embed_dim
        self.vdim = vdim or embed_dim
        self.packed = self.kdim == embed_dim and self.vdim == embed_dim
        kw = {"bias": bias, "device": device, "dtype": dtype}
        if self.packed:
            self.in_proj = nn.Linear(embed_dim, 3 * embed_dim, **kw)
        else:
            self.q_proj = nn.Linear(embed_dim, embed_dim, **kw)
            self.k_proj = nn.Linear(self.kdim, embed_dim, **kw)
            self.v_proj = nn.Linear(self.vdim, embed_dim, **kw)
        self.out_proj = nn.Linear(embed_dim, embed_dim, **kw)
        init_inner_positions(self, self.head_dim, num_heads, rope=rope, rope_theta=rope_theta, alibi=alibi)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # torch's initialisation: Xavier on the input projections, zero biases.
        for lin in self._in_linears():
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    def _in_linears(self) -> list[nn.Linear]:
        return [self.in_proj] if self.packed else [self.q_proj, self.k_proj, self.v_proj]

    # ------------------------------------------------------------------ projections
    def _project(
        self, query: Tensor, key: Tensor | None, value: Tensor | None, skip_kv: bool
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        if not self.packed:
            q = self.q_proj(query)
            if skip_kv:
                return q, None, None
            return q, self.k_proj(key), self.v_proj(value)
        e, proj = self.embed_dim, self.in_proj
        if key is query and value is query and not skip_kv:  # self-attention: one matmul
            return proj(query).chunk(3, dim=-1)  # type: ignore[return-value]
        q = linear_rows(proj, query, 0, e)
        if skip_kv:
            return q, None, None
        if key is value:
            k, v = linear_rows(proj, key, e, 3 * e).chunk(2, dim=-1)
            return q, k, v
        return q, linear_rows(proj, key, e, 2 * e), linear_rows(proj, value, 2 * e, 3 * e)

    def _split_heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, L, D)

    # ------------------------------------------------------------------ checks
    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, cache: KVCache | None) -> None:
        if query.dim() != 3 or query.shape[-1] != self.embed_dim:
            raise InputError(f"query must have shape (B, Lq, {self.embed_dim}); got {shape_str(query)}")
        skip_kv = cache is not None and cache.static and cache.filled
        if not skip_kv:
            for name, t, dim in (("key", key, self.kdim), ("value", value, self.vdim)):
                if t.dim() != 3 or t.shape[-1] != dim:
                    raise InputError(f"{name} must have shape (B, Lk, {dim}); got {shape_str(t)}")
                if t.shape[0] != query.shape[0]:
                    raise InputError(
                        f"{name} must have the batch size {query.shape[0]} of query; got shape {shape_str(t)}"
                    )
            if value.shape[1] != key.shape[1]:
                raise InputError(f"value must have key's length {key.shape[1]}; got {shape_str(value)} for key {shape_str(key)}")
        if cache is not None and cache.filled and cache.batch_size != query.shape[0]:
            raise InputError(
                f"cache holds batch size {cache.batch_size} but query has shape {shape_str(query)}; "
                "use a fresh KVCache, or reorder it, for a new batch"
            )

    def _heads_mask(self, attn_mask: Tensor | None, batch: int) -> Tensor | None:
        # torch's 3-D convention (B*H, Lq, Lk) -> (B, H, Lq, Lk)
        if attn_mask is None or attn_mask.dim() != 3:
            return attn_mask
        if attn_mask.shape[0] != batch * self.num_heads:
            raise InputError(
                f"a 3-D attn_mask must have shape (B*H, Lq, Lk) with B*H = {batch * self.num_heads}; "
                f"got {shape_str(attn_mask)}"
            )
        return attn_mask.view(batch, self.num_heads, *attn_mask.shape[1:])

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_attn_weights: bool = True,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value`` (both default to ``query``).

        Returns ``(output, weights)``; ``weights`` is ``None`` unless ``need_weights``.
        """
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value, cache)
        batch, lq, _ = query.shape
        skip_kv = cache is not None and cache.static and cache.filled
        q, k, v = self._project(query, key, value, skip_kv)
        q = self._split_heads(q)
        if k is not None:
            k, v = self._split_heads(k), self._split_heads(v)  # type: ignore[arg-type]
        past = 0 if cache is None else cache.seq_len
        positioned = self.rotary is not None or self.alibi_slopes is not None
        if positioned and (key is not query or (cache is not None and cache.static)):
            raise InputError("rope and alibi give the positions of one sequence's queries and keys: they apply to "
                             "self-attention, not to attention over another sequence (cross-attention)")
        if self.rotary is not None:
            q, k = self.rotary(q, k, torch.arange(past, past + lq, device=q.device))
        if cache is not None:
            k, v = cache.update(k, v)
        mask = self._heads_mask(attn_mask, batch)
        if self.alibi_slopes is not None:
            slots = torch.arange(k.shape[2], device=q.device)  # type: ignore[union-attr]
            mask = combine_masks(mask, alibi_bias(self.alibi_slopes, slots[past:past + lq], slots).to(q.dtype))
        capture = self._attn_capture  # set only inside capture_attention
        out, weights = scaled_dot_product_attention(
            q,
            k,  # type: ignore[arg-type]
            v,  # type: ignore[arg-type]
            attn_mask=mask,
            key_padding_mask=key_padding_mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights or capture is not None,
        )
        if capture is not None:
            capture(weights)  # (B, H, Lq, Lk_total), per head
            if not need_weights:
                weights = None
        out = self.out_proj(out.transpose(1, 2).reshape(batch, lq, self.embed_dim))
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    # ------------------------------------------------------------------ interop
    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> "MultiHeadAttention":
        """An equal module from a ``torch.nn.MultiheadAttention`` (weights copied).

        attnlab is always batch-first; ``module.batch_first`` does not change the weights.
        """
        if module.bias_k is not None or module.add_zero_attn:
            raise InputError("from_torch: add_bias_kv and add_zero_attn are not supported")
        p = module.in_proj_weight if module.in_proj_weight is not None else module.q_proj_weight
        new = cls(
            module.embed_dim,
            module.num_heads,
            dropout=module.dropout,
            bias=module.in_proj_bias is not None,
            kdim=module.kdim,
            vdim=module.vdim,
            device=p.device,
            dtype=p.dtype,
        )
        sd = new.state_dict()
        src = module.state_dict()
        with torch.no_grad():
            if new.packed:
                sd["in_proj.weight"] = src["in_proj_weight"]  # torch packs exactly when we do
                if "in_proj_bias" in src:
                    sd["in_proj.bias"] = src["in_proj_bias"]
            else:
                e = module.embed_dim
                for i, name in enumerate("qkv"):
                    sd[f"{name}_proj.weight"] = src[f"{name}_proj_weight"]
                    if "in_proj_bias" in src:
                        sd[f"{name}_proj.bias"] = src["in_proj_bias"][i * e : (i + 1) * e]
            sd["out_proj.weight"] = src["out_proj.weight"]
            if "out_proj.bias" in src:
                sd["out_proj.bias"] = src["out_proj.bias"]
        new.load_state_dict(sd)
        return new.train(module.training)

    def new_cache(self, batch: int | None = None, capacity: int | None = None, *, static: bool = False,
                  dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> KVCache:
        """A cache of this module's projected keys and values (the decoder contract of
        :mod:`~attnlab.attention.registry`): growing as steps are decoded, or ``static``
        (cross-attention: the encoder memory projected once and reused). Its storage grows by
        doubling, so ``batch`` and ``capacity`` size nothing ahead."""
        return KVCache(static=static)

    def extra_repr(self) -> str:
        s = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"
        if not self.packed:
            s += f", kdim={self.kdim}, vdim={self.vdim}"
        return ", ".join([s, *inner_positions_repr(self)])


class SelfAttention(MultiHeadAttention):
    """Multi-head self-attention with torch's parameters: queries, keys and values all come
    from ``x`` (the ``"exact"`` kind is :class:`~attnlab.attention.grouped.GroupedQueryAttention`)."""

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_attn_weights: bool = True,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``x``: ``(B, L, E)`` -> ``(B, L, E)`` and optional weights (see the parent)."""
        return super().forward(
            x,
            x,
            x,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            is_causal=is_causal,
            need_weights=need_weights,
            average_attn_weights=average_attn_weights,
            cache=cache,
        )


class CrossAttention(MultiHeadAttention):
    """Multi-head cross-attention: queries from ``x``, keys and values from ``context``."""

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        context: Tensor | None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        average_attn_weights: bool = True,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``x``: ``(B, Lq, E)``; ``context``: ``(B, Lk, kdim)`` (``None`` when a filled
        static cache holds its keys and values) -> ``(B, Lq, E)``."""
        if context is None and not (cache is not None and cache.static and cache.filled):
            raise InputError("context is required unless a filled static cache is given")
        return super().forward(
            x,
            x if context is None else context,
            None,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            need_weights=need_weights,
            average_attn_weights=average_attn_weights,
            cache=cache,
        )
