"""The attention mechanism: scaled dot-product attention, multi-head attention, caches,
and capturing the weights of a model's attention (:func:`capture_attention`)."""

from .alibi import alibi_bias, alibi_slopes
from .cache import DecodingCache, KVCache, ModelCache
from .functional import causal_mask, merge_masks, scaled_dot_product_attention
from .exact import GroupedQueryAttention
from .rmsnorm import RMSNorm
from .sinks import SinkAttention
from .differential import DifferentialAttention
from .latent import LatentAttention
from .dsa import IndexedSparseAttention
from .gated_delta import GatedDeltaNet
from .nsa import NativeSparseAttention
from .multihead import CrossAttention, MultiHeadAttention, SelfAttention
from .rotary import RotaryEmbedding, apply_rotary, rotate_half
from .variants import axial, linear, linformer, local, lsa, nystrom, performer, relpos2d, sparse, standalone2d, topk, lsh  # noqa: F401  (register)
from .variants.axial import AxialAttention2d, AxialWeights
from .variants.base import TokenAttention
from .variants.linear import LinearAttention
from .variants.linformer import LinformerAttention
from .variants.local import LocalAttention
from .variants.lsa import LocalitySelfAttention
from .variants.nystrom import NystromAttention
from .variants.performer import PerformerAttention
from .variants.relpos2d import RelPosSelfAttention2d
from .variants.sparse import SparseAttention
from .variants.standalone2d import StandAloneSelfAttention2d
from .variants.topk import TopKAttention
from .variants.lsh import LSHAttention
from .contract import Cache, Capabilities, Option, Options
from .registry import (AttentionEntry, attend_grid, attention_capabilities, attention_causal_only, attention_entry,
                       attention_family,
                       attention_forms_weights, attention_honours, attention_keeps_cache, attention_options,
                       build_attention, list_attention, register_attention)
from .capture import capture_attention

__all__ = [
    "scaled_dot_product_attention",
    "merge_masks",
    "causal_mask",
    "MultiHeadAttention",
    "SelfAttention",
    "CrossAttention",
    "KVCache",
    "DecodingCache",
    "ModelCache",
    "GroupedQueryAttention",
    "DifferentialAttention",
    "SinkAttention",
    "LatentAttention",
    "IndexedSparseAttention",
    "GatedDeltaNet",
    "NativeSparseAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "apply_rotary",
    "rotate_half",
    "alibi_slopes",
    "alibi_bias",
    "capture_attention",
    "build_attention",
    "register_attention",
    "attention_entry",
    "AttentionEntry",
    "attention_capabilities",
    "attention_options",
    "Capabilities",
    "Option",
    "Options",
    "Cache",
    "list_attention",
    "attention_family",
    "attention_forms_weights",
    "attention_keeps_cache",
    "attention_honours",
    "attention_causal_only",
    "attend_grid",
    "RelPosSelfAttention2d",
    "TokenAttention",
    "LocalAttention", "LocalitySelfAttention",
    "SparseAttention",
    "LinearAttention",
    "PerformerAttention",
    "LinformerAttention",
    "NystromAttention",
    "AxialAttention2d",
    "AxialWeights",
    "StandAloneSelfAttention2d",
    "TopKAttention",
    "LSHAttention",
]
