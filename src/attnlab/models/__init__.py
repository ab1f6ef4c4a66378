"""Models, one file per family, all registered with :func:`create_model`."""

# Importing a family registers its models; resnet before the hybrid ViT, which builds on it.
from . import attention_cnn, botnet, cct, encoder, fast_cnn, gpt, resnet, rnn, sentiment, transformer, vit, vit_hybrid  # noqa: F401
from .botnet import BoTNet, BoTNetConfig
from .encoder import TextEncoder, TextEncoderConfig
from .gpt import GPT, GPTConfig
from .hf import from_hf
from .registry import count_parameters, create_model, list_models, model_entry, register_model
from .resnet import ResNet, ResNetConfig
from .rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from .transformer import Seq2SeqTransformer, Transformer, TransformerConfig
from .vit import VisionTransformer, ViTConfig

__all__ = [
    "create_model",
    "RNNSeq2Seq",
    "RNNSeq2SeqConfig",
    "from_hf",
    "GPT",
    "GPTConfig",
    "list_models",
    "model_entry",
    "register_model",
    "count_parameters",
    "Seq2SeqTransformer",
    "Transformer",
    "TransformerConfig",
    "VisionTransformer",
    "ViTConfig",
    "ResNet",
    "ResNetConfig",
    "BoTNet",
    "BoTNetConfig",
    "TextEncoder",
    "TextEncoderConfig",
]
