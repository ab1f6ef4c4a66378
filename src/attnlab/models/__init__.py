"""Models, one file per family, all registered with :func:`create_model`. Reading and writing
them in other formats (Hugging Face, GGUF, ...) is :mod:`attnlab.formats`'s; generating from
them, :mod:`attnlab.generation`'s."""

import importlib
import warnings
from typing import Any

from ..suggest import FORMER_NAMES_GO_IN

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


def __getattr__(name: str) -> Any:
    if name == "from_hf":  # its home before attnlab.formats
        warnings.warn(f"attnlab.models.from_hf is now attnlab.formats.from_hf (or attnlab.from_hf); the old name "
                      f"works until attnlab {FORMER_NAMES_GO_IN}", FutureWarning, stacklevel=2)
        return importlib.import_module("attnlab.formats").from_hf
    raise AttributeError(f"module 'attnlab.models' has no attribute {name!r}")
