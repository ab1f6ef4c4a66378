"""Models, one file per family, all registered with :func:`create_model`. Reading and writing
them in other formats (Hugging Face, GGUF, ...) is :mod:`attnlab.formats`'s; generating from
them, :mod:`attnlab.generation`'s."""

from ..moved import former_names

# Importing a family registers its models; resnet before the hybrid ViT, which builds on it.
from . import attention_cnn, botnet, cct, encoder, fast_cnn, gpt, resnet, rnn, sentiment, transformer, vit, vit_hybrid  # noqa: F401
from .botnet import BoTNet, BoTNetConfig
from .encoder import TextEncoder, TextEncoderConfig
from .gpt import GPT, GPTConfig
from .registry import count_parameters, create_model, list_models, model_entry, register_model
from .resnet import ResNet, ResNetConfig
from .rnn import RNNSeq2Seq, RNNSeq2SeqConfig
from .transformer import Seq2SeqTransformer, Transformer, TransformerConfig
from .vit import VisionTransformer, ViTConfig

__all__ = [
    "create_model",
    "RNNSeq2Seq",
    "RNNSeq2SeqConfig",
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


__getattr__ = former_names(__name__)  # from_hf, now attnlab.formats.from_hf
