"""Tokenizers: :mod:`.text` (WordPiece or byte-level BPE for text tasks), :mod:`.lm` (the language
models' tokenizers), :mod:`.chat` (chat templates)."""
