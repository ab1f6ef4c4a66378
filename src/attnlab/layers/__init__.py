"""Building blocks assembled into models."""

from .mlp import Mlp
from .norms import LayerNorm, TokenBatchNorm, build_norm
from .pos_encoding import LearnedPositionalEncoding, SinusoidalPositionalEncoding, build_pos_encoding
from .transformer_layers import (
    DecoderCache,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "Mlp",
    "LayerNorm",
    "TokenBatchNorm",
    "build_norm",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEncoding",
    "build_pos_encoding",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "DecoderCache",
]
