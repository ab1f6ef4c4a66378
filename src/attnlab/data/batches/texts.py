"""Labelled texts tokenized once for sentence classification (:class:`SentimentDataset`),
padded per batch."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ...errors import InputError
from ..tokenizers.text import TextTokenizer

__all__ = ["SentimentDataset"]


class SentimentDataset:
    """Texts with integer labels, tokenized once, for sentence classification.

    Args:
        texts: ``N`` strings.
        labels: ``N`` integer class labels.
        tokenizer: a :class:`~attnlab.data.tokenizers.text.TextTokenizer`.
        max_length: tokens per text at most, special tokens included; longer texts are
            truncated (one warning for the whole data set).
        add_cls: wrap every text as ``[CLS] tokens [SEP]``.

    ``ds[i]`` is a dict, as in the tutorials: ``input_ids`` ``int64`` ``(L_i,)``,
    ``attention_mask`` ``int64`` ``(L_i,)`` (all ones: 1 = real token) and ``label``
    ``int64`` scalar, unpadded; :meth:`collate` pads a list of them
    (``DataLoader(ds, batch_size, collate_fn=ds.collate)``).

    :meth:`get_batch` is the fast path (what :class:`~attnlab.engine.Trainer` uses): it
    returns ``(inputs, labels)`` where ``inputs`` is ``{"input_ids", "attention_mask"}``,
    both ``int64`` ``(B, L)`` padded on the right to the longest text of the batch, and
    ``labels`` is ``int64`` ``(B,)``; a model is called as ``model(**inputs)``.

    Attributes: ``texts``, ``targets`` (``int64`` ``(N,)``), ``lengths`` (``int64``
    ``(N,)``, tokens per text) and ``input_ids`` (``int64`` ``(N, max(lengths))``, padded).
    """

    def __init__(
        self,
        texts: Sequence[str],
        labels: Sequence[int] | Tensor,
        tokenizer: TextTokenizer,
        max_length: int = 128,
        *,
        add_cls: bool = True,
    ) -> None:
        targets = torch.as_tensor(labels)
        if targets.dim() != 1 or targets.dtype.is_floating_point or targets.dtype == torch.bool:
            raise InputError(f"labels must be N integers; got {targets.dtype} of shape {tuple(targets.shape)}")
        if len(texts) == 0:
            raise InputError("texts must hold at least one text; got none")
        if len(texts) != len(targets):
            raise InputError(
                f"texts and labels must have the same length; got {len(texts)} texts and {len(targets)} labels"
            )
        self.texts = list(texts)
        self.targets = targets.long()
        self.tokenizer = tokenizer
        self.max_length = max_length
        ids, cut = tokenizer._tokenize(self.texts, max_length, True, add_cls, False, False)
        if cut:
            warnings.warn(
                f"{len(cut):,} of {len(ids):,} texts were longer than max_length={max_length} tokens and were "
                f"truncated (the longest had {max(cut)}); raise max_length (text.max_length in a recipe) "
                f"to {max(cut)} or more to keep them whole",
                stacklevel=2,
            )
        batch = tokenizer.pad(ids)
        self.input_ids = batch["input_ids"]
        self.lengths = batch["attention_mask"].sum(1)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        n = int(self.lengths[index])
        return {
            "input_ids": self.input_ids[index, :n].clone(),
            "attention_mask": torch.ones(n, dtype=torch.long),
            "label": self.targets[index].clone(),
        }

    def get_batch(self, indices: Sequence[int] | Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """``({"input_ids": (B, L), "attention_mask": (B, L)}, labels (B,))``, ``L`` = longest in the batch."""
        index = torch.as_tensor(indices, dtype=torch.long)
        if index.dim() != 1 or len(index) == 0:
            raise InputError(f"indices must be a non-empty 1-D sequence of ints; got shape {tuple(index.shape)}")
        lengths = self.lengths[index]
        width = max(int(lengths.max()), 1)
        ids = self.input_ids[index, :width]
        mask = (torch.arange(width) < lengths[:, None]).long()
        return {"input_ids": ids, "attention_mask": mask}, self.targets[index]

    def collate(self, items: Sequence[dict[str, Any]]) -> tuple[dict[str, Tensor], Tensor]:
        """Items of this data set -> the same ``(inputs, labels)`` as :meth:`get_batch`."""
        inputs = self.tokenizer.pad([item["input_ids"].tolist() for item in items])
        return inputs, torch.stack([torch.as_tensor(item["label"]) for item in items]).long()

    def __repr__(self) -> str:
        return (
            f"SentimentDataset(n={len(self)}, max_length={self.max_length}, "
            f"longest={int(self.lengths.max()) if len(self) else 0}, tokenizer={self.tokenizer!r})"
        )
