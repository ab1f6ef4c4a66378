"""The Hugging Face families ``attnlab.formats.from_hf`` reads, by ``config.json``'s ``model_type``,
with the checkpoints each is known by. Here, apart from the readers in ``formats/hf/load.py``, so that
the command line's help names them without importing torch; ``tests/test_catalog.py`` checks that
this table and ``HF_FAMILIES`` hold the same names."""

from __future__ import annotations

__all__ = ["DECODERS", "ENCODERS", "IMAGE_MODELS", "HF_FAMILY_CHECKPOINTS", "decoder_names", "encoder_names"]

# model_type -> (the family's short name, the checkpoints that carry it, as their makers name them)
DECODERS = {
    "gpt2": ("GPT-2", "GPT-2"),
    "llama": ("Llama", "Llama 2, Llama 3.x, SmolLM2"),
    "mistral": ("Mistral", "Mistral"),
    "ministral": ("Ministral", "Ministral 8B"),
    "qwen2": ("Qwen2.5", "Qwen2, Qwen2.5"),
    "qwen3": ("Qwen3", "Qwen3 (dense)"),
    "smollm3": ("SmolLM3", "SmolLM3"),
    "gemma2": ("Gemma 2", "Gemma 2"),
    "gemma3_text": ("Gemma 3", "Gemma 3, text-only folders"),
    "phi3": ("Phi-3", "Phi-3, Phi-3.5, Phi-4-mini"),
    "diffllama": ("DiffLlama", "DiffLlama"),
    "qwen3_5_text": ("Qwen3.5", "Qwen3.5 text decoders (dense)"),
    "deepseek_v3": ("DeepSeek-V3", "DeepSeek-V3 whose every layer is dense"),
    "deepseek_v32": ("DeepSeek-V3.2", "DeepSeek-V3.2 with dense layers"),
}
ENCODERS = {"bert": ("BERT", "BERT"), "roberta": ("RoBERTa", "RoBERTa"), "distilbert": ("DistilBERT", "DistilBERT")}
IMAGE_MODELS = {"vit": ("ViT", "ViT")}
HF_FAMILY_CHECKPOINTS = {**DECODERS, **ENCODERS, **IMAGE_MODELS}


def decoder_names() -> str:
    """The decoder families in one phrase, ``"GPT-2, Llama, Mistral, ..."``, for help texts and docstrings."""
    return ", ".join(short for short, _ in DECODERS.values())


def encoder_names() -> str:
    """The text encoder families in one phrase: ``"BERT, RoBERTa, DistilBERT"``."""
    return ", ".join(short for short, _ in ENCODERS.values())
