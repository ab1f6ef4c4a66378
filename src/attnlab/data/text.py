"""Text files and tokenized text data sets.

* :func:`read_lines`: a user's text file, one input per line, decoded strictly: a byte
  that is not valid in the file's encoding raises ``ValueError`` naming the file and
  the 1-based line, instead of turning into a silent replacement character.
* :class:`SentimentDataset`: texts and integer labels, tokenized once, padded per batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError
from .tokenize import TextTokenizer

__all__ = ["read_lines", "decode_lines", "SentimentDataset"]


def decode_lines(data: bytes, source: str | Path, encoding: str = "utf-8") -> list[str]:
    """``data`` decoded with ``encoding`` and split into lines (``\\n`` or ``\\r\\n``).

    The line ending is removed and nothing else; a final newline does not make an extra
    empty line. A UTF-8 byte-order mark at the start is dropped. ``source`` (a file name)
    is only used in the error raised for bytes that are not valid ``encoding``.
    """
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        utf8 = encoding.lower().replace("-", "").replace("_", "") == "utf8"
        hint = " (re-save it as UTF-8, e.g. iconv -f cp1252 -t utf-8)" if utf8 else ""
        raise InputError(
            f"{source}: line {line} is not valid {encoding}: byte 0x{data[exc.start]:02x} at column {column}; "
            f"the file must be {encoding}-encoded text{hint}"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [s[:-1] if s.endswith("\r") else s for s in lines]


def read_lines(path: str | Path, encoding: str = "utf-8") -> list[str]:
    """The lines of a text file (e.g. sentences to classify), without line endings.

    Every line is kept, empty ones included, so that ``result[i]`` is line ``i + 1``.
    Raises ``FileNotFoundError`` when ``path`` does not exist and ``ValueError`` naming
    the file and the 1-based line when a line is not valid ``encoding`` (a file saved as
    Latin-1 or Windows-1252 read as UTF-8, say).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"{path} {what}; a text file was expected")
    return decode_lines(path.read_bytes(), path, encoding)


class SentimentDataset:
    """Texts with integer labels, tokenized once, for sentence classification.

    Args:
        texts: ``N`` strings.
        labels: ``N`` integer class labels.
        tokenizer: a :class:`~attnlab.data.tokenize.TextTokenizer`.
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
