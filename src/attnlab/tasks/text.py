"""What the text tasks share: the ``text`` section of their recipes (tokenization) and
the tokenizer it gives."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

from ..data.tokenizers.text import MAX_VOCAB, TextTokenizer
from ..errors import InputError
from ..formats.hf.load import is_hf_folder

__all__ = ["TextConfig", "build_tokenizer"]


@dataclass
class TextConfig:
    """Tokenization of a text task."""

    tokenizer: Literal["wordpiece", "bpe"] = "wordpiece"
    vocab_size: int = field(default=8000, metadata={"min": 263, "max": MAX_VOCAB})  # a tokenizer file's cap too
    lowercase: bool = True
    min_frequency: int = field(default=1, metadata={"min": 0})
    max_length: int = field(default=64, metadata={"min": 3})  # tokens per text, special tokens included
    tokenizer_file: str | None = None  # a tokenizer.json to use instead of training one


def build_tokenizer(text: TextConfig, texts: Sequence[str], checkpoint: str | None = None) -> TextTokenizer:
    """``text.tokenizer_file``; else the ``tokenizer.json`` of ``checkpoint`` when it is a
    pretrained model's folder (its words are the ones the model knows); else a tokenizer of
    ``text``'s kind trained on ``texts``."""
    if text.tokenizer_file:
        return TextTokenizer.load(text.tokenizer_file)
    if checkpoint is not None and is_hf_folder(checkpoint):
        folder = Path(checkpoint).expanduser()
        if not (folder / "tokenizer.json").is_file():
            raise InputError(f"model.checkpoint={folder} holds no tokenizer.json: a pretrained model reads the words "
                             f"of its own tokenizer; save the folder with its tokenizer (tokenizer.save_pretrained), "
                             f"or name one in text.tokenizer_file")
        return TextTokenizer.load(folder)
    return TextTokenizer.train(texts, text.tokenizer, text.vocab_size, lowercase=text.lowercase,
                               min_frequency=text.min_frequency)
