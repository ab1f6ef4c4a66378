"""Attention with learned sinks (gpt-oss, 2025), the ``"sinks"`` kind: the exact module
(:class:`~attnlab.attention.exact.GroupedQueryAttention`) with its ``sinks`` option on."""

from __future__ import annotations

from .exact import EXACT_OPTIONS, GroupedQueryAttention
from .registry import check_attention_options, register_attention

__all__ = ["SinkAttention"]


@register_attention("sinks", options=EXACT_OPTIONS.extend(drop=("sinks", "output_gate")), forms_weights=True,
                    keeps_cache=True, streams=True, decode_step=True, takes_positions=True, causal=True, padding=True,
                    lora_roles=("attention",),
                    summary="exact attention with a learned sink logit per head (gpt-oss)")
class SinkAttention(GroupedQueryAttention):
    """Exact attention with a learned sink logit per query head (gpt-oss): every query also
    sees a key without a value, so it may give part of its weight to nothing instead of to
    the first tokens (where softmax attention otherwise dumps it). The options are the exact
    kind's; the sink logits are the parameter ``sinks`` ``(H,)`` (zero at the start). Without
    weights wanted it runs on torch's fused kernel, the sink as one key more: its memory grows
    linearly with the length, as exact attention's does."""

    def __init__(self, embed_dim: int, num_heads: int, **options: object) -> None:
        check_attention_options("sinks", options)
        super().__init__(embed_dim, num_heads, sinks=True, **options)
