"""Building blocks assembled into models."""

from ..moved import former_names
from .channel_attention import CBAM, SqueezeExcite, build_channel_attention
from .drop_path import DropPath
from .init import mimetic_init_
from .lora import LoRALinear, apply_lora, mark_only_lora_trainable, merge_lora
from .mlp import Mlp
from .norms import LayerNorm, TokenBatchNorm, build_norm, freeze_batch_norm
from .pos_encoding import LearnedPositionalEncoding, SinusoidalPositionalEncoding, build_pos_encoding
from .transformer_layers import (
    EncoderBlock,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "CBAM",
    "SqueezeExcite",
    "build_channel_attention",
    "DropPath",
    "mimetic_init_",
    "LoRALinear",
    "apply_lora",
    "merge_lora",
    "mark_only_lora_trainable",
    "Mlp",
    "LayerNorm",
    "TokenBatchNorm",
    "build_norm",
    "freeze_batch_norm",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEncoding",
    "build_pos_encoding",
    "EncoderBlock",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
]


__getattr__ = former_names(__name__)  # DecoderCache, now attnlab.attention.cache.ModelCache
