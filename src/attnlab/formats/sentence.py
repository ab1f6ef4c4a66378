"""Sentence embeddings from a sentence-transformers folder (all-MiniLM-L6-v2 and the like): the
encoder of its Hugging Face files (:func:`~attnlab.formats.from_hf`), its tokenizer, and the
modules its ``modules.json`` lists after the encoder: the pooling that
``1_Pooling/config.json`` names (the first token, the mean or the maximum over the tokens,
the mean scaled by the square root of the length; several are concatenated in that order)
and, when listed, a normalisation to unit length. Texts longer than ``max_seq_length``
(``sentence_bert_config.json``) are cut there, as sentence-transformers cuts them.

    encoder = SentenceEncoder.load(folder)
    vectors = encoder.encode(["A man is eating food.", "Someone eats."])  # (2, 384)
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from ..errors import InputError
from ..io import read_json_mapping
from ..models.encoder import TextEncoder
from .hf.load import from_hf

__all__ = ["SentenceEncoder", "POOLING_MODES"]

# config.json of the pooling module -> the pooling, in sentence-transformers' order of concatenation
POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len"}
_KNOWN_MODULES = {"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
                  "sentence_transformers.models.Normalize"}


class SentenceEncoder:
    """An encoder, its tokenizer, the pooling ``modes`` and whether vectors are made unit length."""

    def __init__(self, encoder: TextEncoder, tokenizer, modes: Sequence[str], normalize: bool,  # type: ignore[no-untyped-def]
                 max_length: int) -> None:
        self.encoder, self.tokenizer = encoder, tokenizer
        self.modes, self.normalize, self.max_length = tuple(modes), normalize, max_length

    @classmethod
    def load(cls, folder: str | Path) -> "SentenceEncoder":
        folder = Path(folder).expanduser()
        modules_file = folder / "modules.json"
        if not modules_file.is_file():
            raise InputError(f"folder must be a sentence-transformers folder with modules.json; {folder} has none")
        modules = _read_list(modules_file)
        kinds = [m.get("type") for m in modules]
        unknown = [k for k in kinds if k not in _KNOWN_MODULES]
        if unknown:
            raise InputError(f"{modules_file}: module {unknown[0]!r} is not one attnlab computes; it reads "
                             f"{', '.join(sorted(_KNOWN_MODULES))}")
        pooling = next((m for m in modules if m.get("type", "").endswith(".Pooling")), None)
        if pooling is None:
            raise InputError(f"{modules_file} lists no Pooling module: nothing makes one vector of the tokens")
        pool_file = folder / str(pooling.get("path", "")) / "config.json"
        pool = read_json_mapping(pool_file)
        modes = [mode for key, mode in POOLING_MODES.items() if pool.get(key)]
        others = [k for k, v in pool.items() if k.startswith("pooling_mode_") and v and k not in POOLING_MODES]
        if others or not modes:
            what = f"pooling {others[0]} is not supported" if others else "no pooling is switched on"
            raise InputError(f"{pool_file}: {what}; attnlab pools by {', '.join(POOLING_MODES)}")
        bert_config = folder / "sentence_bert_config.json"
        max_length = int(read_json_mapping(bert_config).get("max_seq_length", 512)) if bert_config.is_file() else 512
        model = from_hf(folder)
        if not isinstance(model, TextEncoder):
            raise InputError(f"{folder}: its model is not a text encoder")
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tokenizer.enable_truncation(min(max_length, model.config.longest))
        tokenizer.no_padding()
        return cls(model, tokenizer, modes, any(k.endswith(".Normalize") for k in kinds), max_length)

    @torch.no_grad()
    def encode(self, texts: Sequence[str], batch_size: int = 32) -> Tensor:
        """``(len(texts), width x modes)`` float32 vectors."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise InputError("texts must be a list of strings")
        out = []
        device = next(self.encoder.parameters()).device
        for start in range(0, len(texts), batch_size):
            batch = self.tokenizer.encode_batch(list(texts[start:start + batch_size]))
            longest = max(len(e.ids) for e in batch)
            pad = self.encoder.config.pad_token_id
            ids = torch.tensor([e.ids + [pad] * (longest - len(e.ids)) for e in batch], device=device)
            mask = torch.tensor([[1] * len(e.ids) + [0] * (longest - len(e.ids)) for e in batch], device=device)
            types = torch.tensor([e.type_ids + [0] * (longest - len(e.ids)) for e in batch], device=device)
            features = self.encoder.forward_features(
                ids, mask, types if self.encoder.type_embed is not None else None)
            out.append(self.pool(features, mask))
        return torch.cat(out) if out else torch.empty(0, self.encoder.config.embed_dim * len(self.modes))

    def pool(self, features: Tensor, mask: Tensor) -> Tensor:
        """The pooled ``(B, E x modes)`` of token features ``(B, L, E)`` where ``mask`` is 1."""
        m = mask.unsqueeze(-1).to(features.dtype)
        count = m.sum(1).clamp(min=1e-9)
        parts = []
        for mode in self.modes:
            if mode == "cls":
                parts.append(features[:, 0])
            elif mode == "max":
                parts.append(features.masked_fill(m == 0, -1e9).amax(1))
            elif mode == "mean":
                parts.append((features * m).sum(1) / count)
            else:  # mean_sqrt_len
                parts.append((features * m).sum(1) / count.sqrt())
        vectors = torch.cat(parts, dim=-1)
        return torch.nn.functional.normalize(vectors, p=2, dim=-1) if self.normalize else vectors


def _read_list(file: Path) -> list:
    """A JSON file holding a list (modules.json), read with attnlab's size and depth limits."""
    from ..jsonfile import parse_json

    data = parse_json(file.read_bytes(), str(file))
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise InputError(f"{file} must hold a list of modules; got {type(data).__name__}")
    return data
