"""Models, one file per family, all registered with :func:`create_model`."""

from . import transformer  # noqa: F401  (registers the transformer sizes)
from .registry import count_parameters, create_model, list_models, model_entry, register_model
from .transformer import Seq2SeqTransformer, Transformer, TransformerConfig

__all__ = [
    "create_model",
    "list_models",
    "model_entry",
    "register_model",
    "count_parameters",
    "Seq2SeqTransformer",
    "Transformer",
    "TransformerConfig",
]
