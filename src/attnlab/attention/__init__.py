"""The attention mechanism: scaled dot-product attention, multi-head attention, caches."""

from .cache import KVCache
from .functional import causal_mask, merge_masks, scaled_dot_product_attention
from .multihead import CrossAttention, MultiHeadAttention, SelfAttention
from .variants import relpos2d  # noqa: F401  (registers "relpos2d")
from .variants.relpos2d import RelPosSelfAttention2d
from .registry import attend_grid, attention_family, build_attention, list_attention, register_attention

__all__ = [
    "scaled_dot_product_attention",
    "merge_masks",
    "causal_mask",
    "MultiHeadAttention",
    "SelfAttention",
    "CrossAttention",
    "KVCache",
    "build_attention",
    "register_attention",
    "list_attention",
    "attention_family",
    "attend_grid",
    "RelPosSelfAttention2d",
]
