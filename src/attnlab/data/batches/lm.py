"""Documents packed into one token stream and cut into windows, for training a
decoder-only language model.

The documents of a split are tokenized (no special tokens) and concatenated, with the
tokenizer's end-of-document token between two documents when it has one (``eos_id``;
none after the last, so one document gives exactly its own tokens). The end-of-document
token belongs to the document it ends. With ``T`` tokens in the stream and context ``L``,
window ``i`` is the tokens ``i*L .. i*L + L`` (``L + 1`` of them): its first ``L`` are the
inputs and its last ``L`` the labels, the inputs shifted by one. Windows overlap by one
token, so every token but the first is a label exactly once; the last window may be short,
and is padded to ``L`` (input id 0, ``doc_ids`` -1, label -100).

``doc_ids`` give, at each input position, the index of its document in the split (0, 1,
...), so that a model can build a document mask (``doc_ids[q] == doc_ids[k]``, with its
causal mask): no token attends across a document boundary. A label that crosses a
boundary, the first token of the next document, is -100 (``IGNORE_INDEX``): with the
document mask nothing before it can predict it. So with an end-of-document token each
document learns to end (its last token's label is the end-of-document token), and the
first token of a document after the first is never a label.

Bits per character: the loss is a mean over :attr:`LMDataset.num_targets` labels, so
``loss * num_targets / num_chars / ln 2`` bits per character of the split's
:attr:`LMDataset.num_chars` characters (:meth:`LMDataset.bits_per_char`).

Nothing here is random: the trainer's sampler shuffles the window indices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ...engine.trainer import IGNORE_INDEX
from ...errors import InputError
from ..tokenizers.lm import LMTokenizer

__all__ = ["LMDataset", "PAD_DOC_ID"]

PAD_DOC_ID = -1  # doc_ids of the padding of a short last window


class LMDataset:
    """The documents of one split as windows of ``context + 1`` tokens (see the module docstring).

    Args:
        documents: the split's texts (empty ones add nothing).
        tokenizer: an :class:`~attnlab.data.tokenizers.lm.LMTokenizer`.
        context: ``L``, the tokens a model reads at once.
        name: how an error names these documents, as a run says it: the split and where it
            came from (``"the test part of data.path=story.txt"``, ``"--data notes.txt"``); its
            messages then name the context by its recipe key, ``text.context``. Default: the
            ``name`` of :class:`~attnlab.data.kinds.text_corpus.NamedDocuments`, which the corpus
            sources give.

    :meth:`get_batch` gives ``({"input_ids": (B, L), "doc_ids": (B, L)}, labels (B, L))``,
    all ``int64``; a model is called as ``model(input_ids=..., doc_ids=...)``.

    Attributes: ``tokens`` and ``doc_of`` (``int64`` ``(T,)``: the stream and each token's
    document), ``num_tokens`` (``T``), ``num_chars`` (characters of the documents),
    ``num_documents`` (the non-empty ones), ``num_targets`` (labels that are not -100).
    """

    def __init__(self, documents: Sequence[str], tokenizer: LMTokenizer, context: int, *,
                 name: str | None = None) -> None:
        if isinstance(context, bool) or not isinstance(context, int) or context < 1:
            raise InputError(f"context must be a positive integer (tokens per window); got {context!r}")
        name = name if name is not None else getattr(documents, "name", None)
        documents = list(documents)
        bad = next((i for i, d in enumerate(documents) if not isinstance(d, str)), None)
        if bad is not None:
            raise TypeError(f"documents[{bad}] must be a str; got {type(documents[bad]).__name__}")
        kept = [i for i, d in enumerate(documents) if d]
        ids = tokenizer.encode_batch([documents[i] for i in kept])
        eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
        pieces, owners = [], []
        for n, (i, row) in enumerate(zip(kept, ids)):
            row = row + eos if n < len(kept) - 1 else row
            pieces.append(np.asarray(row, dtype=np.int64))
            owners.append(np.full(len(row), i, dtype=np.int64))
        self.tokens = torch.from_numpy(np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64))
        self.doc_of = torch.from_numpy(np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64))
        if len(self.tokens) < 2:
            chars = sum(map(len, documents))
            found = f"{len(self.tokens)} token{'s' * (len(self.tokens) != 1)} ({chars} character{'s' * (chars != 1)})"
            if name is None:
                raise InputError(f"documents must give at least 2 tokens (one input and its label; windows of "
                                 f"context={context} tokens, a short last one padded); they give {found}")
            raise InputError(f"{name} gives {found}; a language model needs at least 2 tokens (one input and its "
                             f"label; it reads windows of text.context={context} tokens, a short last one padded): "
                             f"give it more text")
        self.tokenizer, self.context = tokenizer, context
        # what a sample is, as a refusal of too few of them says it (the trainer's batch check)
        self.sample_note = f"windows of text.context={context} tokens" if name is not None else \
            f"windows of context={context} tokens"
        self.num_tokens = len(self.tokens)
        self.num_chars = sum(len(documents[i]) for i in kept)
        self.num_documents = len(kept)
        self.num_targets = int((self.doc_of[1:] == self.doc_of[:-1]).sum())

    def __len__(self) -> int:
        """The number of windows: ``ceil((T - 1) / L)``."""
        return -(-(self.num_tokens - 1) // self.context)

    def get_batch(self, indices: Sequence[int] | Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """Windows ``indices`` -> ``({"input_ids": (B, L), "doc_ids": (B, L)}, labels (B, L))``."""
        index = torch.as_tensor(indices, dtype=torch.long)
        if index.dim() != 1 or len(index) == 0:
            raise InputError(f"indices must be a non-empty 1-D sequence of ints; got shape {tuple(index.shape)}")
        if int(index.min()) < 0 or int(index.max()) >= len(self):
            raise InputError(f"indices must lie in [0, {len(self)}) (the number of windows); got "
                             f"{[i for i in index.tolist() if not 0 <= i < len(self)][:5]}")
        positions = index[:, None] * self.context + torch.arange(self.context + 1)
        real = positions < self.num_tokens
        positions = positions.clamp(max=self.num_tokens - 1)
        tokens = self.tokens[positions].masked_fill(~real, 0)
        docs = self.doc_of[positions].masked_fill(~real, PAD_DOC_ID)
        same = real[:, 1:] & (docs[:, 1:] == docs[:, :-1])
        labels = tokens[:, 1:].masked_fill(~same, IGNORE_INDEX)
        return {"input_ids": tokens[:, :-1], "doc_ids": docs[:, :-1]}, labels

    def __getitem__(self, index: int) -> tuple[dict[str, Tensor], Tensor]:
        """Window ``index`` as :meth:`get_batch` gives it, without the batch dimension: ``(L,)``."""
        inputs, labels = self.get_batch([index])
        return {k: v[0] for k, v in inputs.items()}, labels[0]

    def bits_per_char(self, loss: float) -> float:
        """Bits per character of a mean cross-entropy ``loss`` (nats per label) over this split."""
        return loss * self.num_targets / self.num_chars / math.log(2)

    def __repr__(self) -> str:
        return (f"LMDataset(windows={len(self)}, context={self.context}, tokens={self.num_tokens:,}, "
                f"chars={self.num_chars:,}, documents={self.num_documents}, tokenizer={self.tokenizer!r})")
