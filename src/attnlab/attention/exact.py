"""Exact self-attention, one module for every number of key/value heads: ``num_kv_heads``
key/value heads shared by groups of query heads (equal to ``num_heads``: multi-head
attention; fewer: grouped-query; 1: multi-query), rotary positions or ALiBi, a sliding
window, QK-norm, soft-capping, and a cache of its own
(:class:`~attnlab.attention.cache.DecodingCache`, the key/value heads only).

Registered as the ``"exact"`` tokens kind (``"gqa"``, its older name, still names it), which
every token model uses by default: ViT's and BERT's attention as Llama's. The kernel is not
the module's choice: :func:`~attnlab.attention.functional.scaled_dot_product_attention`
takes torch's fused kernel unless the weights, soft-capping or dropout on the CPU ask for the
explicit path. Checkpoints of earlier versions, which packed exact attention's query, key and
value projections in ``in_proj``, load as they are (:mod:`~attnlab.attention.projections`).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError, shape_str
from ..suggest import did_you_mean
from .alibi import alibi_bias
from .blocksparse import window_attention
from .cache import DecodingCache
from .contract import Option, Options
from .flex import flex_attention_forward, flex_runs, warn_fallback_once
from .functional import check_heads, combine_masks, scaled_dot_product_attention
from .joined import KeepsJoinedWeights, fused_linear, joined_weight, product
from .positions import init_inner_positions, inner_positions_repr
from .projections import UpgradesPackedProjections, init_torch_style
from .registry import register_alias, register_attention
from .rmsnorm import _RMS_NORM, RMSNorm

# KeepsJoinedWeights, RMSNorm, fused_linear, joined_weight and product live in joined.py and rmsnorm.py; named here
# still for code that imported them from this module.
__all__ = ["GroupedQueryAttention", "EXACT_OPTIONS", "band_mask", "KeepsJoinedWeights", "RMSNorm", "fused_linear",
           "joined_weight", "product"]

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


# The options of the exact kind, which the kinds built on it extend (sinks, differential, nsa).
EXACT_OPTIONS = Options(
    Option("dropout", float, 0.0, "on the attention weights, in training mode", low=0, high=1, high_open=True),
    Option("bias", bool, True, "biases on the query, key and value projections"),
    Option("num_kv_heads", int, None, "key/value heads, dividing num_heads (None: num_heads; 1: multi-query)", low=1),
    Option("head_dim", int, None, "the size of one head (None: embed_dim / num_heads)", low=1),
    Option("out_bias", bool, None, "a bias on the output projection (None: bias)"),
    Option("rope", bool, False, "rotate queries and keys by their positions"),
    Option("rope_theta", float, 10000.0, "the rotary base", low=0, low_open=True),
    Option("rope_scaling", dict, None, "the rotary scaling, {'rope_type': ...}, which needs max_len"),
    Option("partial_rotary", float, 1.0, "the share of each head that is rotated", low=0, high=1, low_open=True),
    Option("max_len", int, None, "the longest context the model was made for (the scaling's reference)", low=1),
    Option("alibi", bool, False, "ALiBi's per-head distance penalty on the logits"),
    Option("sliding_window", int, None, "a sliding window: each query sees the sliding_window latest keys, itself "
           "included", low=1, counts_positions=True, was="window"),
    Option("qk_norm", bool, False, "RMSNorm on each head's queries and keys"),
    Option("scale", float, None, "the logit scale (None: head_dim ** -0.5)", low=0, low_open=True),
    Option("softcap", float, None, "logits squashed to softcap * tanh(logits / softcap) (Gemma 2)", low=0,
           low_open=True),
    Option("sinks", bool, False, "a learned sink logit per query head (gpt-oss)"),
    Option("output_gate", bool, False, "each head's output gated by a sigmoid the query projection gives (Qwen3.5)"),
    Option("kernel", str, "auto", "the attention kernel of a full forward: 'standard' (torch's fused kernel or the "
           "explicit path), 'flex' (FlexAttention from the window/ALiBi/soft-cap/sinks structure, no dense mask; "
           "standard where it cannot run, e.g. CPU training), 'auto' (flex on CUDA when the pattern needs more than "
           "the fused kernel; standard on the CPU, where each new shape compiles for seconds)",
           choices=("auto", "flex", "standard")),
)


@register_attention("exact", options=EXACT_OPTIONS, forms_weights=True, keeps_cache=True, streams=True,
                    decode_step=True, takes_positions=True, causal=True, padding=True, lora_roles=("attention",),
                    summary="softmax attention: multi-head, grouped-query or multi-query, any window and positions")
class GroupedQueryAttention(KeepsJoinedWeights, UpgradesPackedProjections, nn.Module):
    r"""Exact self-attention with any number of key/value heads (multi-head, grouped-query,
    multi-query), batch-first, that keeps its own cache: the ``"exact"`` kind (``"gqa"`` is
    its older name).

    Args:
        embed_dim: ``E``.
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads ``Hkv``, dividing ``H`` (default ``H``; 1 is
            multi-query attention).
        head_dim: ``D``, the size of one head (default ``E / H``, which must then be whole;
            Gemma and Qwen3 choose it apart from the width).
        dropout: on the attention weights, in training mode.
        bias: biases on the query, key and value projections.
        out_bias: a bias on the output projection (default ``bias``; Qwen2 has query, key and
            value biases and none on the output).
        rope: rotate queries and keys by their positions (:class:`RotaryEmbedding`).
        rope_theta: its base.
        rope_scaling: its scaling (``{"rope_type": "linear" | "dynamic" | "yarn" | "llama3" |
            "longrope", ...}``, :mod:`~attnlab.attention.rope_scaling`), which needs ``max_len``.
        partial_rotary: the share of each head that is rotated (Phi-4-mini: 0.75); the rest
            carries no position.
        max_len: the longest context the model was made for (the scaling's reference).
        alibi: add ALiBi's per-head distance penalty to the logits.
        sliding_window: each query sees the ``sliding_window`` latest keys, itself included
            (both sides when not causal). With a cache, only those are stored. A window over a
            whole input (without a mask or weights; a cache only if empty) runs as a band
            (:func:`~attnlab.attention.blocksparse.window_attention`), not through an ``(L, L)`` mask.
        qk_norm: RMSNorm on each head's queries and keys before the product (Qwen3, Gemma 3).
        scale: the logit scale (default ``D ** -0.5``; Gemma's ``query_pre_attn_scalar ** -0.5``).
        softcap: logits squashed to ``softcap * tanh(logits / softcap)`` (Gemma 2).
        sinks: a learned logit per query head, a key with no value that takes part of each
            query's weight (gpt-oss's attention sinks; the ``"sinks"`` kind has it on).
        output_gate: each head's output times ``sigmoid`` of a gate that the query projection
            also gives (its rows per head: the query's ``D``, then the gate's; Qwen3.5, Qwen3-Next).
        kernel: ``"standard"``: :func:`~attnlab.attention.functional.scaled_dot_product_attention`
            with dense masks; ``"flex"``: :func:`~attnlab.attention.flex.flex_attention_forward`
            from the window, ALiBi, soft-cap, sinks and padding (no ``(L, L)`` mask), where it runs
            (a one-time warning and the standard path where it does not: CPU training, dropout);
            ``"auto"``: flex on CUDA when the pattern needs more than torch's fused kernel (a
            window, ALiBi, soft-capping, sinks with padding), else standard. Only a full forward
            takes flex: without a cache, ``attn_mask``, weights or a capture.

    ``forward(x, *, key_padding_mask, attn_mask, is_causal, need_weights,
    average_attn_weights, positions, cache)``: ``x`` ``(B, L, E)``; ``positions`` ``(L,)``
    or ``(B, L)``: the rotary positions of the new tokens (default: the next ones after
    the cache's, or ``0..L-1``); ``key_padding_mask`` ``(B, Lk_total)`` over the cached
    and new keys. Returns ``(out (B, L, E), weights (B, Lq, Lk) averaged over heads or
    (B, H, Lq, Lk), or None)``. The cache (:meth:`new_cache`, a
    :class:`~attnlab.attention.cache.DecodingCache`) stores the ``Hkv`` key/value heads
    only, and only the window's keys when there is one; :meth:`decode_step` is the lean
    path of one token per row (the decoder contract of :mod:`~attnlab.attention.registry`).

    The projections are ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``, as in Llama.
    """

    _attn_capture: Callable[[Tensor], None] | None = None
    #: Whether the step from q, k, v to the heads' outputs is this class's softmax (:meth:`_attend`):
    #: the forms that stand in for it (FlexAttention, the banded window) run only then. A kind that
    #: changes the step (differential, nsa) defines its own ``_attend``, which sets it False.
    standard_step: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "_attend" in cls.__dict__:
            cls.standard_step = False

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 num_kv_heads: int | None = None, head_dim: int | None = None, out_bias: bool | None = None,
                 rope: bool = False, rope_theta: float = 10000.0, rope_scaling: dict | None = None,
                 partial_rotary: float = 1.0, max_len: int | None = None, alibi: bool = False,
                 sliding_window: int | None = None, qk_norm: bool = False, scale: float | None = None,
                 softcap: float | None = None, sinks: bool = False, output_gate: bool = False,
                 kernel: str = "auto") -> None:
        super().__init__()
        if kernel not in ("auto", "flex", "standard"):
            raise InputError(f"kernel must be one of 'auto', 'flex', 'standard'; got {kernel!r}"
                             + did_you_mean(kernel, ("auto", "flex", "standard"), "choices"))
        self.kernel = kernel
        if head_dim is None:
            check_heads(embed_dim, num_heads, dropout)
            head_dim = embed_dim // num_heads
        else:
            check_heads(embed_dim, 1, dropout)
            if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
                raise InputError(f"num_heads must be a positive integer; got {num_heads!r}")
            if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
                raise InputError(f"head_dim must be a positive integer; got {head_dim!r}")
        kv = num_heads if num_kv_heads is None else num_kv_heads
        if not isinstance(kv, int) or kv < 1 or num_heads % kv:
            raise InputError(f"num_kv_heads must be a positive divisor of num_heads={num_heads}; got {num_kv_heads!r}")
        if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 1):
            raise InputError(f"sliding_window must be a positive number of positions; got {sliding_window!r}")
        for name, value in (("scale", scale), ("softcap", softcap)):
            if value is not None and not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise InputError(f"{name} must be a positive number; got {value!r}")
        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, kv, head_dim
        self.dropout, self.sliding_window = dropout, sliding_window
        self.scale = None if scale is None else float(scale)
        self.softcap = None if softcap is None else float(softcap)
        self.output_gate = bool(output_gate)
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim * (2 if output_gate else 1), bias=bias)
        self.k_proj = nn.Linear(embed_dim, kv * head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, kv * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=bias if out_bias is None else out_bias)
        init_torch_style(self.q_proj, self.k_proj, self.v_proj, self.o_proj)  # torch's, as exact attention's always
        self.register_upgrade()  # checkpoints with the packed in_proj/out_proj of earlier versions
        init_inner_positions(self, head_dim, num_heads, rope=rope, rope_theta=rope_theta, alibi=alibi,
                             rope_scaling=rope_scaling, partial_rotary=partial_rotary, max_len=max_len)
        self.q_norm = RMSNorm(head_dim) if qk_norm else None
        self.k_norm = RMSNorm(head_dim) if qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(num_heads)) if sinks else None

    # ------------------------------------------------------------------ the cache (the decoder contract)
    def new_cache(self, batch: int | None = None, capacity: int | None = None, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, cache_window: int | None = None,
                  sink_tokens: int = 0, static: bool = False) -> DecodingCache:
        """A cache of this layer's keys and values for at most ``capacity`` positions (its
        buffers are made, in the keys' dtype and device, by the first step that fills them).

        ``cache_window`` (default: the layer's sliding window) and ``sink_tokens`` make it a
        streaming cache, a policy of generation whatever the layer was trained with (StreamingLLM,
        Xiao et al., 2023): each token attends to the first ``sink_tokens`` positions and the last
        ``cache_window``,
        and memory stays flat however long it runs. With sink tokens, rotary positions are
        those of the cache's slots (the sinks just before the window), as StreamingLLM places them.
        ``static``: the cache of a cross-attention, filled once by the other sequence's keys and
        values. ``capacity`` None: a cache without bound (the buffers keep doubling)."""
        if static:
            return DecodingCache(capacity, static=True)
        if sink_tokens and self.alibi_slopes is not None:
            raise InputError("sink_tokens place the first positions beside the window with rotary positions; ALiBi "
                             "layers are not supported")
        window = self.sliding_window if cache_window is None else cache_window
        return DecodingCache(capacity, window=window, sinks=sink_tokens)

    def cache_bytes(self, batch: int, positions: int, dtype: torch.dtype, *, cache_window: int | None = None,
                    sink_tokens: int = 0) -> int:
        """The bytes :meth:`new_cache`'s cache holds after ``positions`` positions (a sliding
        window's cache holds its window and the room it slides in, however long it runs);
        ``cache_window`` and ``sink_tokens``: under that streaming policy, as :meth:`new_cache`."""
        window = self.sliding_window if cache_window is None else cache_window
        if window is not None:
            positions = min(positions, window - 1 + max(1, DecodingCache.slide_room) + sink_tokens)
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * batch * self.num_kv_heads * self.head_dim * positions * itemsize

    # ------------------------------------------------------------------ forward
    def _heads(self, x: Tensor, heads: int) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, heads, self.head_dim).transpose(1, 2)  # (B, heads, L, D)

    def forward(self, x: Tensor, context: Tensor | None = None, value: Tensor | None = None, *,
                key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None, is_causal: bool = False,
                need_weights: bool = False, average_attn_weights: bool = True, positions: Tensor | None = None,
                cache: DecodingCache | None = None) -> tuple[Tensor, Tensor | None]:
        """Self-attention over ``x``, or, with ``context`` ``(B, Lk, kdim)`` (and ``value``
        ``(B, Lk, vdim)``, default ``context``), cross-attention from ``x``'s queries to another
        sequence's keys and values: ``torch.nn.MultiheadAttention``'s ``(query, key, value)``
        called by position. A static cache (:meth:`new_cache` with ``static=True``) keeps the
        context's projected keys and values after the first call, which then passes ``context``
        None."""
        if context is x and (value is None or value is x):
            context = value = None  # torch's m(x, x, x): self-attention, with the positions it may have
        if context is not None or value is not None or (cache is not None and cache.static):
            return self._cross(x, context, value, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                               is_causal=is_causal, need_weights=need_weights,
                               average_attn_weights=average_attn_weights, cache=cache)
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise InputError(f"x must have shape (B, L, {self.embed_dim}); got {shape_str(x)}")
        batch, n, _ = x.shape
        attn_mask = self._heads_mask(attn_mask, batch)
        past = cache.seq_len if cache is not None else 0
        streaming = cache is not None and cache.sinks > 0  # rotary positions are the cache's slots
        if streaming and n > 1 and past + n > cache.sinks + cache.window:  # type: ignore[union-attr, operator]
            return self._token_by_token(x, key_padding_mask, is_causal, cache), None  # type: ignore[arg-type]
        q, k, v, gate = self._project(x)
        if self.rotary is not None and not streaming:
            q, k = self.rotary(q, k, torch.arange(past, past + n, device=x.device) if positions is None else positions)
        start = 0
        if cache is not None:
            k, v, start = cache.append(k, v)
        lk = k.shape[2]
        window = self.sliding_window if cache is None or cache.window is None else cache.window
        if (key_padding_mask is not None and cache is not None and window is not None
                and key_padding_mask.shape[-1] > lk):
            key_padding_mask = key_padding_mask[:, -lk:]  # the keys a sliding window still holds
        if key_padding_mask is not None and key_padding_mask.shape[-1] != lk:
            raise InputError(f"key_padding_mask must have shape (B, Lk) = ({batch}, {lk}); got "
                             f"{shape_str(key_padding_mask)}")
        fast = self._fast_path(q, cache, past, lk, window, streaming, attn_mask, key_padding_mask, is_causal,
                               need_weights)
        if fast is not None:  # the same attention without an (Lq, Lk) mask
            return self._output(fast(q, k, v, window, key_padding_mask, is_causal), gate, batch, n), None
        # The definition: which keys each query sees as one dense mask (the window's band, ALiBi's bias, the
        # streaming sinks, the caller's masks), then softmax attention through the kernel chosen for it.
        if streaming:
            q, k, mask = self._streaming_mask(q, k, key_padding_mask, attn_mask, cache, start, window)
            key_padding_mask, is_causal = None, False  # the sinks and the window are the whole mask
        else:
            mask = attn_mask
            if self.alibi_slopes is not None or window is not None:  # the slots of the queries and the keys
                q_slots = torch.arange(past, past + n, device=x.device)
                k_slots = torch.arange(start, start + lk, device=x.device)
            if self.alibi_slopes is not None:
                mask = combine_masks(mask, alibi_bias(self.alibi_slopes, q_slots, k_slots).to(q.dtype))
            if window is not None:
                mask = combine_masks(mask, band_mask(q_slots, k_slots, causal=is_causal, window=window))
                is_causal = False  # the band holds the causal part too
        return self._finish(q, k, v, gate, batch, n, mask=mask, key_padding_mask=key_padding_mask,
                            is_causal=is_causal, need_weights=need_weights, average_attn_weights=average_attn_weights)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The query, key and value heads of ``x`` ``(B, L, E)``, ``(B, heads, L, D)``, QK-normed,
        and the output gate's ``(B, L, H * D)`` (or None)."""
        batch, n, _ = x.shape
        q, k, v = fused_linear(self, "qkv", (self.q_proj, self.k_proj, self.v_proj), x)
        gate = None
        if self.output_gate:  # per head: the query's D rows, then the gate's
            q, gate = q.view(batch, n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            q, gate = q.reshape(batch, n, -1), gate.reshape(batch, n, -1)
        q, k, v = self._heads(q, self.num_heads), self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # type: ignore[misc]
        return q, k, v, gate

    def _fast_path(self, q: Tensor, cache: DecodingCache | None, past: int, lk: int, window: int | None,
                   streaming: bool, attn_mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool,
                   need_weights: bool) -> Callable[..., Tensor] | None:
        """The one place that sends a forward past the dense mask: to FlexAttention (the pattern as
        functions of positions; :meth:`_flex_wanted` says where it runs) or to the banded window (a
        window over the whole input, or a prompt in parts after a cache: ``n x (window + chunk)``
        scores, not ``n x n``; results page "Why the fast paths", window-band). Both give what the
        dense mask gives, and neither forms weights or takes another kernel's step (``standard_step``)."""
        if attn_mask is not None or need_weights or self._attn_capture is not None or not self.standard_step:
            return None
        if cache is None and self._flex_wanted(q, key_padding_mask, window):
            return self._flex
        n = q.shape[2]
        whole = past == 0 and lk == n  # the queries' own keys
        if (window is not None and window < lk and (whole or (cache is not None and is_causal and n > 1))
                and not streaming and self.alibi_slopes is None and self.softcap is None and self.sinks is None
                and (key_padding_mask is None or key_padding_mask.dtype == torch.bool)):
            return self._band
        return None

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, window: int | None, key_padding_mask: Tensor | None,
              is_causal: bool) -> Tensor:
        return flex_attention_forward(q, k, v, scale=self.scale, causal=is_causal, window=window,
                                      alibi_slopes=self.alibi_slopes, softcap=self.softcap, sinks=self.sinks,
                                      key_padding_mask=key_padding_mask)

    def _band(self, q: Tensor, k: Tensor, v: Tensor, window: int, key_padding_mask: Tensor | None,
              is_causal: bool) -> Tensor:
        batch, n, lk = q.shape[0], q.shape[2], k.shape[2]
        k, v = self._per_query_head(k, v)
        first = torch.full((batch, 1), lk - n, dtype=torch.long, device=q.device)  # the first query's key
        return window_attention(q, k, v, window, causal=is_causal, key_padding_mask=key_padding_mask, first=first,
                                scale=self.scale, dropout_p=self.dropout if self.training else 0.0)

    def _token_by_token(self, x: Tensor, key_padding_mask: Tensor | None, is_causal: bool,
                        cache: DecodingCache) -> Tensor:
        """A prompt longer than the streaming cache's sinks and window: each of its tokens sees the
        sinks at other slots, so they go one by one, as they would have been generated."""
        n = x.shape[1]
        steps = [self(x[:, i : i + 1], key_padding_mask=None if key_padding_mask is None else
                      key_padding_mask[:, : key_padding_mask.shape[1] - n + i + 1], is_causal=is_causal,
                      cache=cache)[0] for i in range(n)]
        return torch.cat(steps, dim=1)

    def _streaming_mask(self, q: Tensor, k: Tensor, key_padding_mask: Tensor | None, attn_mask: Tensor | None,
                        cache: DecodingCache, start: int, window: int | None) -> tuple[Tensor, Tensor, Tensor]:
        """Under a streaming cache (sink tokens): queries and keys rotated by their slots in the
        cache, and the mask of the window plus the sinks, which every later query sees."""
        if key_padding_mask is not None and bool(key_padding_mask.any()):
            raise InputError("sink_tokens take a row's first positions as its sinks: padded rows are not "
                             "supported (generate each prompt on its own)")
        n, lk = q.shape[2], k.shape[2]
        q_slots = torch.arange(lk - n, lk, device=q.device)
        k_slots = torch.arange(lk, device=q.device)
        if self.rotary is not None:
            q = self.rotary(q, q, q_slots)[0]
            k = self.rotary(k, k, k_slots)[0]
        band = band_mask(q_slots, k_slots, causal=True, window=window)
        # the first positions: behind the window once it has moved past them, else in their own places
        sinks = cache.sinks_in_last if start > 0 else min(cache.sinks, lk)
        band[:, :sinks] = q_slots[:, None] < k_slots[None, :sinks]  # the sinks: seen by every later query
        return q, k, combine_masks(attn_mask, band)  # type: ignore[return-value]  # band is a tensor

    def _heads_mask(self, attn_mask: Tensor | None, batch: int) -> Tensor | None:
        """torch's 3-D mask ``(B*H, Lq, Lk)`` as ``(B, H, Lq, Lk)``; other masks as given."""
        if attn_mask is None or attn_mask.dim() != 3:
            return attn_mask
        if attn_mask.shape[0] != batch * self.num_heads:
            raise InputError(f"a 3-D attn_mask must have shape (B*H, Lq, Lk) with B*H = "
                             f"{batch * self.num_heads}; got {shape_str(attn_mask)}")
        return attn_mask.view(batch, self.num_heads, *attn_mask.shape[1:])

    def _cross(self, x: Tensor, context: Tensor | None, value: Tensor | None, *, key_padding_mask: Tensor | None,
               attn_mask: Tensor | None, is_causal: bool, need_weights: bool, average_attn_weights: bool,
               cache: DecodingCache | None) -> tuple[Tensor, Tensor | None]:
        """Cross-attention (:meth:`forward` with a ``context``): no positions, no window."""
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise InputError(f"x must have shape (B, Lq, {self.embed_dim}); got {shape_str(x)}")
        if self.rotary is not None or self.alibi_slopes is not None or self.sliding_window is not None:
            raise InputError("rope, alibi and sliding_window give the positions of one sequence's queries and keys: they "
                             "apply to self-attention, not to attention over another sequence (cross-attention)")
        batch, n, _ = x.shape
        filled = cache is not None and cache.static and cache.filled
        if cache is not None and not cache.static:
            raise InputError("cross-attention keeps the other sequence's keys in a static cache: "
                             "new_cache(static=True)")
        if filled:
            if cache.batch_size != batch:  # type: ignore[union-attr]
                raise InputError(f"the cache holds batch size {cache.batch_size} but x has shape {shape_str(x)}; "  # type: ignore[union-attr]
                                 "use a fresh cache, or reorder it, for a new batch")
        else:
            if context is None:
                raise InputError("context is required unless a filled static cache is given")
            value = context if value is None else value
            for name, t, dim in (("context", context, self.k_proj.in_features), ("value", value, self.v_proj.in_features)):
                if t.dim() != 3 or t.shape[-1] != dim:
                    raise InputError(f"{name} must have shape (B, Lk, {dim}); got {shape_str(t)}")
                if t.shape[0] != batch:
                    raise InputError(f"{name} must have the batch size {batch} of x; got shape {shape_str(t)}")
            if value.shape[1] != context.shape[1]:
                raise InputError(f"value must have context's length {context.shape[1]}; got {shape_str(value)} for "
                                 f"context {shape_str(context)}")
        q = fused_linear(self, "q", (self.q_proj,), x)[0]
        gate = None
        if self.output_gate:
            q, gate = q.view(batch, n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
            q, gate = q.reshape(batch, n, -1), gate.reshape(batch, n, -1)
        q = self._heads(q, self.num_heads)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if filled:
            k, v, _ = cache.append(None, None)  # type: ignore[union-attr]
        else:
            if value is context and self.k_proj.in_features == self.v_proj.in_features:
                k, v = fused_linear(self, "kv", (self.k_proj, self.v_proj), context)
            else:
                k, v = self.k_proj(context), self.v_proj(value)
            k, v = self._heads(k, self.num_kv_heads), self._heads(v, self.num_kv_heads)
            if self.k_norm is not None:
                k = self.k_norm(k)
            if cache is not None:
                k, v, _ = cache.append(k, v)
        if key_padding_mask is not None and key_padding_mask.shape[-1] != k.shape[2]:
            raise InputError(f"key_padding_mask must have shape (B, Lk) = ({batch}, {k.shape[2]}); got "
                             f"{shape_str(key_padding_mask)}")
        return self._finish(q, k, v, gate, batch, n, mask=self._heads_mask(attn_mask, batch),
                            key_padding_mask=key_padding_mask, is_causal=is_causal, need_weights=need_weights,
                            average_attn_weights=average_attn_weights)

    def _finish(self, q: Tensor, k: Tensor, v: Tensor, gate: Tensor | None, batch: int, n: int, *,
                mask: Tensor | None, key_padding_mask: Tensor | None, is_causal: bool, need_weights: bool,
                average_attn_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Attention on the heads, recorded inside :func:`capture_attention`, and the output projection."""
        k, v = self._per_query_head(k, v)
        capture = self._attn_capture
        out, weights = self._attend(q, k, v, mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
                                    need_weights=need_weights or capture is not None)
        if capture is not None:
            capture(weights)
            if not need_weights:
                weights = None
        out = self._output(out, gate, batch, n)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    def _per_query_head(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """``k``, ``v`` ``(B, Hkv, L, D)`` with each key/value head repeated for the group of query
        heads it serves: ``(B, H, L, D)``."""
        if self.num_kv_heads == self.num_heads:
            return k, v
        group = self.num_heads // self.num_kv_heads
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def _output(self, out: Tensor, gate: Tensor | None, batch: int, n: int) -> Tensor:
        """The heads' outputs ``(B, H, L, D)`` gated (with an output gate) and projected: ``(B, L, E)``."""
        out = out.transpose(1, 2).reshape(batch, n, self.num_heads * self.head_dim)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return fused_linear(self, "o", (self.o_proj,), out)[0]

    def _flex_wanted(self, q: Tensor, key_padding_mask: Tensor | None, window: int | None) -> bool:
        """Whether this full forward (no cache, attn_mask or weights) takes FlexAttention (``kernel``)."""
        kernel = getattr(self, "kernel", "auto")  # a module pickled whole before the option existed
        if kernel == "standard" or self._attn_capture is not None:
            return False
        if not self.standard_step:
            return False
        if key_padding_mask is not None and key_padding_mask.dtype != torch.bool:
            return False  # an additive padding mask: the standard path adds it
        if kernel == "auto":
            # On the CPU each new shape compiles for seconds (4 s for (2, 4, 256, 16), 13 s for the process's
            # first, 2 threads), which no pattern repays at the lengths a CPU trains: auto stays standard there.
            if q.device.type != "cuda" or (self.training and self.dropout > 0):
                return False
            structured = window is not None or self.alibi_slopes is not None or self.softcap is not None or (
                self.sinks is not None and key_padding_mask is not None)
            return structured and flex_runs(q.device, torch.is_grad_enabled() and q.requires_grad)[0]
        runs, reason = flex_runs(q.device, torch.is_grad_enabled() and q.requires_grad)
        if runs and self.training and self.dropout > 0:
            runs, reason = False, "flex_attention has no dropout on the attention weights"
        if not runs:
            warn_fallback_once(reason)
        return runs

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, key_padding_mask: Tensor | None,
                is_causal: bool, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """The attention of :meth:`forward` on heads made ready, ``q``, ``k``, ``v`` ``(B, H, L, D)``
        (the key/value heads repeated per query head): ``(out (B, H', Lq, D'), weights (B, H', Lq, Lk)
        or None)`` with ``H' * D' = H * D``; a kind built on this module changes this step."""
        return scaled_dot_product_attention(
            q, k, v, attn_mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal, scale=self.scale,
            softcap=self.softcap, sinks=self.sinks, dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights)

    def _attend_step(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
        """The attention of :meth:`decode_step`: ``q`` ``(B, Hkv, group, D)`` (query head ``i`` is
        row ``i % group`` of key/value head ``i // group``), ``k``, ``v`` ``(B, Hkv, Lk, D)`` as
        cached, ``keep`` ``(B, 1, 1, Lk)`` (``True`` = may attend) or None; returns ``(B, H * D)``."""
        batch = q.shape[0]
        if self.softcap is None and self.sinks is None:
            # torch's fused kernel, not matmul, softmax, matmul, for a group's few queries (decode-attend)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=self.scale)  # (B, Hkv, group, D)
        else:
            d = q.shape[-1]
            logits = (q @ k.transpose(-2, -1)) * (d ** -0.5 if self.scale is None else self.scale)
            if self.softcap is not None:
                logits = torch.tanh(logits / self.softcap) * self.softcap
            if keep is not None:
                logits = logits.masked_fill(~keep, float("-inf"))
            if self.sinks is None:
                weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
            else:
                column = self.sinks.to(logits.dtype).view(1, *q.shape[1:3], 1).expand(*logits.shape[:-1], 1)
                weights = torch.softmax(torch.cat([logits, column], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
            out = weights.to(q.dtype) @ v
        return out.reshape(batch, -1)

    # ------------------------------------------------------------------ one token per row
    def decode_step(self, x: Tensor, cache: DecodingCache, *, positions: Tensor | None = None,
                    key_padding_mask: Tensor | None = None) -> Tensor:
        """A fused copy of :meth:`forward` for one token per row while generating, in eval mode:
        ``x`` ``(B, E)`` -> ``(B, E)``, what ``forward(x[:, None], cache=cache, is_causal=True)``
        gives; ``tests/attention/test_contract.py`` (a step against forward, every kind with a
        step) and ``tests/models/test_gpt.py`` (a model's step against its forward) keep them equal.

        ``positions`` ``(B, 1)`` for left-padded prompts (else the cache's next position);
        ``key_padding_mask`` ``(B, keys seen)``. Why a copy: at one token a row, forward's checks,
        masks and routes cost as much as the arithmetic (results page "Why the fast paths",
        decode-step-vs-forward). The query, key and value projections are joined into one
        product, fetched once per generation and kept in the cache. A single query sees every
        cached key (a sliding-window cache holds only those in its window), so no causal or band
        mask is built, and the query heads of a group are laid out as rows of their key/value
        head instead of copying the keys once per query head. ALiBi and the output gate go
        through :meth:`forward`.
        """
        plan = cache.scratch.get("plan")
        if plan is None:
            plan = cache.scratch["plan"] = self._decode_plan(x.dtype)
        through_forward, w_qkv, b_qkv, w_o, b_o, qk_weight, qk_eps, rotary_key = plan
        if through_forward or cache.sinks:
            return self(x[:, None], key_padding_mask=key_padding_mask, is_causal=True, positions=positions,
                        cache=cache)[0][:, 0]
        batch = x.shape[0]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = product(x, w_qkv, b_qkv)  # (B, E): torch.mm or addmm; 8-bit rows through their kernel
        # QK-norm of every query and key head as one norm and one product, bit for bit the two norms and their
        # concatenation, in fewer operators (results page "Why the fast paths", qk-norm-joined).
        if qk_weight is not None:
            qk = _RMS_NORM(qkv[:, : (h + hkv) * d].view(batch, h + hkv, d), (d,), None, qk_eps) * qk_weight
            v = qkv[:, (h + hkv) * d :]
        elif self.q_norm is not None:
            q, k, v = qkv.split((h * d, hkv * d, hkv * d), dim=-1)
            qk = torch.cat([self.q_norm(q.view(batch, -1, d)), self.k_norm(k.view(batch, -1, d))], dim=1)  # type: ignore[misc]
        else:
            qk, v = qkv[:, : (h + hkv) * d].view(batch, h + hkv, d), qkv[:, (h + hkv) * d :]
        # Queries and keys rotated together, with the step's angles shared by the layers and rotate_half(x) * sin
        # as x.roll(R / 2) * signed sin: one operator for chunk, neg and cat, the same bits (rotary-roll).
        if rotary_key is not None:
            cos, sin = self._step_angles(cache, rotary_key, positions, x)
            r = cos.shape[-1]
            if r == d:
                qk = qk * cos + qk.roll(r // 2, -1) * sin
            else:
                part = qk[..., :r]
                qk = torch.cat((part * cos + part.roll(r // 2, -1) * sin, qk[..., r:]), dim=-1)
        q = qk[:, :h].view(batch, hkv, h // hkv, d)  # query head i: key/value head i // group
        k, v = qk[:, h:].view(batch, hkv, 1, d), v.reshape(batch, hkv, 1, d)
        k, v, _ = cache.update(k, v)
        keep = None
        if key_padding_mask is not None:
            keep = ~key_padding_mask[:, -k.shape[2]:][:, None, None, :]  # True = may attend (torch's)
        out = self._attend_step(q, k, v, keep)
        return product(out, w_o, b_o)

    def _decode_plan(self, dtype: torch.dtype) -> tuple:
        """What :meth:`decode_step` fetches once per generation (kept in the cache's scratch):
        whether it uses ALiBi or an output gate (then the step goes through :meth:`forward`), the joined
        query/key/value weight and bias, the output projection's, the QK-norm weights of every
        head joined ``(H + Hkv, D)`` with their eps (``None`` unless both norms are RMSNorms of
        one eps and the input float32: then one ``F.rms_norm`` without a weight and one product
        are bit for bit the two norms and their concatenation, in two operators instead of
        three), and the key under which layers of equal rotary share the angles of a step
        (``None`` without rotary)."""
        qk_weight, qk_eps = None, None
        qn, kn = self.q_norm, self.k_norm
        if (qn is not None and type(qn) is RMSNorm and type(kn) is RMSNorm and qn.eps == kn.eps
                and dtype == torch.float32 and _RMS_NORM is not None):
            h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
            with torch.no_grad():
                qk_weight = torch.cat([qn.weight.expand(h, d), kn.weight.expand(hkv, d)])  # type: ignore[union-attr]
            qk_eps = qn.eps
        rotary_key = None
        rot = self.rotary
        if rot is not None:
            rotary_key = (type(rot), rot.head_dim, rot.rotary_dim, rot.theta, rot.attention_factor,
                          repr(rot.scaling), rot.max_len)
        return (self.alibi_slopes is not None or self.output_gate, *joined_weight(self, "qkv", (self.q_proj, self.k_proj, self.v_proj)),
                *joined_weight(self, "o", (self.o_proj,)), qk_weight, qk_eps, rotary_key)

    def _step_angles(self, cache: DecodingCache, rotary_key: tuple, positions: Tensor | None,
                     x: Tensor) -> tuple[Tensor, Tensor]:
        """``cos`` and the signed ``sin`` (``(-sin, sin)`` over the two halves, so that
        ``rotate_half(x) * sin`` is ``x.roll(R / 2) * signed``, bit for bit) of this step's
        position, ``(1 or B, 1, R)``: computed by the first layer of a step and shared by the
        others of the same rotary, through ``cache.scratch["shared"]`` (a dict that the
        decoder (:class:`~attnlab.models.gpt.GPT`) gives every layer's cache; a lone layer
        keeps its own)."""
        shared = cache.scratch.get("shared", cache.scratch)
        at = cache.seq_len if positions is None else -1  # or the step's positions: one tensor for all its layers
        hit = shared.get(rotary_key)
        if hit is not None and hit[0] == at and hit[1] is positions and hit[2] == x.dtype:
            return hit[3], hit[4]
        rotary = self.rotary
        if positions is None:
            cos, sin = rotary.cos_sin_from(at, 1, x.dtype, x.device)  # (1, 1, R)
        else:
            cos, sin = rotary.cos_sin(positions, x.dtype)  # (B, 1, 1, R)
            cos, sin = cos[:, 0], sin[:, 0]
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        shared[rotary_key] = (at, positions, x.dtype, cos, sin)
        return cos, sin

    def extra_repr(self) -> str:
        parts = [f"embed_dim={self.embed_dim}", f"num_heads={self.num_heads}", f"num_kv_heads={self.num_kv_heads}"]
        if self.head_dim * self.num_heads != self.embed_dim:
            parts.append(f"head_dim={self.head_dim}")
        parts += inner_positions_repr(self)
        for name in ("sliding_window", "scale", "softcap"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name):g}")
        if self.sinks is not None:
            parts.append("sinks=True")
        if self.output_gate:
            parts.append("output_gate=True")
        if getattr(self, "kernel", "auto") != "auto":
            parts.append(f"kernel={self.kernel}")
        return ", ".join(parts)


register_alias("gqa", "exact")  # recipes and runs of earlier versions name it so
