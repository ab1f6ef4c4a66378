"""Sentence pairs for sequence-to-sequence training: tokenized once, padded per batch.

Each pair becomes three id sequences (``tokens`` without specials)::

    src      source tokens, [EOS]           encoder input
    tgt      [BOS], target tokens           decoder input (teacher forcing)
    labels   target tokens, [EOS]           what the decoder must predict at each position

Batches are ``({"src": (B, Ls), "tgt": (B, Lt)}, labels (B, Lt))``, right-padded to the
longest of the batch: inputs with the tokenizer's ``[PAD]`` (which the model masks), labels
with ``-100``, which the loss and the token accuracy skip. A model is called as
``model(src=..., tgt=...)`` (:class:`~attnlab.models.transformer.Seq2SeqTransformer`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from ...engine.trainer import IGNORE_INDEX  # label of padding: -100, torch's cross_entropy default
from ...errors import InputError
from ..tokenizers.text import TextTokenizer

__all__ = ["TranslationDataset"]


def _padded(rows: Sequence[Sequence[int]], value: int) -> Tensor:
    out = torch.full((len(rows), max(1, max(map(len, rows)))), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


class TranslationDataset:
    """``(source, target)`` text pairs for :class:`~attnlab.engine.Trainer`.

    Args:
        pairs: ``(source, target)`` strings.
        src_tokenizer: must have ``[EOS]``; may be the target one (joint vocabulary).
        tgt_tokenizer: must have ``[BOS]`` and ``[EOS]``.
        max_source_length: source tokens, specials included; longer texts are cut (one
            warning says how many).
        max_target_length: the same for the target side.

    Attributes: ``pairs``, ``src_ids``, ``tgt_ids`` (lists of token-id lists, specials
    excluded) and ``lengths`` (``int64`` ``(N,)``, the longer side of each pair, for
    ``train.group_by_length``).
    """

    def __init__(self, pairs: Sequence[tuple[str, str]], src_tokenizer: TextTokenizer, tgt_tokenizer: TextTokenizer,
                 max_source_length: int = 128, max_target_length: int = 128) -> None:
        if len(pairs) == 0:
            raise InputError("pairs must hold at least one (source, target) pair; got none")
        for name, tok, needs in (("src_tokenizer", src_tokenizer, ("eos",)),
                                 ("tgt_tokenizer", tgt_tokenizer, ("bos", "eos"))):
            missing = [r for r in needs if getattr(tok, f"{r}_id") is None]
            if missing:
                raise InputError(f"{name} must have {', '.join(f'[{r.upper()}]' for r in missing)} tokens; "
                                 f"its vocabulary has none")
        for name, n in (("max_source_length", max_source_length), ("max_target_length", max_target_length)):
            if not isinstance(n, int) or n < 2:
                raise InputError(f"{name} must be an integer >= 2 (one token and [EOS]); got {n!r}")
        self.pairs = [(str(s), str(t)) for s, t in pairs]
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.max_source_length, self.max_target_length = max_source_length, max_target_length
        self.src_ids = self._ids(src_tokenizer, [s for s, _ in self.pairs], max_source_length, "source")
        self.tgt_ids = self._ids(tgt_tokenizer, [t for _, t in self.pairs], max_target_length, "target")
        self.lengths = torch.tensor([max(len(s), len(t)) + 1 for s, t in zip(self.src_ids, self.tgt_ids)])

    @staticmethod
    def _ids(tokenizer: TextTokenizer, texts: list[str], max_length: int, side: str) -> list[list[int]]:
        limit = max_length - 1  # room for the [EOS] (or [BOS]) that get_batch adds
        ids = tokenizer.tokenize(texts, add_cls=False)  # no specials: get_batch adds them
        cut = [len(row) for row in ids if len(row) > limit]
        if cut:
            warnings.warn(
                f"{len(cut):,} of {len(ids):,} {side} texts are longer than {limit} tokens and were truncated; "
                f"raise max_{side}_length (text.max_length in a recipe) to {max(cut) + 1} or more to keep them whole",
                stacklevel=3,
            )
        return [row[:limit] for row in ids]

    def __len__(self) -> int:
        return len(self.pairs)

    def get_batch(self, indices: Sequence[int] | Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """``({"src": (B, Ls), "tgt": (B, Lt)}, labels (B, Lt))``; see the module docstring."""
        index = torch.as_tensor(indices, dtype=torch.long).tolist()
        if len(index) == 0:
            raise InputError("indices must name at least one pair; got none")
        s_tok, t_tok = self.src_tokenizer, self.tgt_tokenizer
        src = _padded([self.src_ids[i] + [s_tok.eos_id] for i in index], s_tok.pad_id)
        tgt = _padded([[t_tok.bos_id] + self.tgt_ids[i] for i in index], t_tok.pad_id)
        labels = _padded([self.tgt_ids[i] + [t_tok.eos_id] for i in index], IGNORE_INDEX)
        return {"src": src, "tgt": tgt}, labels

    def __repr__(self) -> str:
        return (f"TranslationDataset(n={len(self)}, longest={int(self.lengths.max())}, "
                f"joint_vocabulary={self.src_tokenizer is self.tgt_tokenizer})")
