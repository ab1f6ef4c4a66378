"""The synthetic source ``reverse``: random strings of token ids and their reversals,
drawn from a seed (no download); the data of the reversal demo.

Strings are token ids ``FIRST..vocab_size-1`` (0, 1 and 2 are padding, begin and end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import torch
from torch import Tensor

from ...engine.trainer import IGNORE_INDEX
from ...errors import InputError
from ..source import Source, SourceConfig, Splits, register_source

__all__ = ["PAD", "BOS", "EOS", "FIRST", "ReverseConfig", "ReverseDataset", "Reversal"]

PAD, BOS, EOS, FIRST = 0, 1, 2, 3


@dataclass
class ReverseConfig(SourceConfig):
    kind: ClassVar[str] = "reversal"
    changeable: ClassVar[tuple[str, ...]] = ()

    name: str = "reverse"
    vocab_size: int = field(default=20, metadata={"min": FIRST + 1})  # ids 0-2 are padding, begin and end
    min_length: int = field(default=2, metadata={"min": 1})
    max_length: int = field(default=12, metadata={"min": 1})
    train_size: int = field(default=50_000, metadata={"min": 1})
    test_size: int = field(default=256, metadata={"min": 1})
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 2})  # of the strings (the test set: seed + 1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_length > self.max_length:
            raise InputError(f"data.min_length must not exceed data.max_length; got {self.min_length} > "
                             f"{self.max_length}")


class ReverseDataset:
    """``size`` random strings and their reversals, drawn once from ``seed``. Batches are
    ``({"src": (B, Ls), "tgt": (B, Lt)}, labels (B, Lt))`` as in
    :class:`~attnlab.data.batches.translation.TranslationDataset`: the decoder input starts with
    ``BOS``, the labels end with ``EOS``, padding is ``PAD`` in inputs and ``-100`` in labels."""

    def __init__(self, size: int, vocab_size: int, min_length: int, max_length: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(min_length, max_length + 1, (size,), generator=gen)
        tokens = torch.randint(FIRST, vocab_size, (size, max_length), generator=gen)
        self.tokens = tokens.masked_fill(torch.arange(max_length) >= self.lengths[:, None], PAD)

    def __len__(self) -> int:
        return len(self.lengths)

    def strings(self, indices: Sequence[int]) -> list[list[int]]:
        return [self.tokens[i, : int(self.lengths[i])].tolist() for i in indices]

    def get_batch(self, indices: Sequence[int]) -> tuple[dict[str, Tensor], Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        n = int(self.lengths[index].max())
        src = self.tokens[index, :n]
        rev = torch.full((len(index), n + 1), PAD, dtype=torch.long)
        for row, i in enumerate(index.tolist()):
            k = int(self.lengths[i])
            rev[row, :k] = self.tokens[i, :k].flip(0)
            rev[row, k] = EOS
        tgt = torch.cat([torch.full((len(index), 1), BOS, dtype=torch.long), rev[:, :-1]], dim=1)
        return {"src": src, "tgt": tgt}, rev.masked_fill(rev == PAD, IGNORE_INDEX)


@register_source
class Reversal(Source):
    name = "reverse"
    kind = "reversal"
    config_class = ReverseConfig
    summary = "random token strings and their reversals (synthetic, no download)"

    def load(self, config: ReverseConfig) -> Splits[ReverseDataset]:
        return Splits(ReverseDataset(config.train_size, config.vocab_size, config.min_length, config.max_length,
                                     config.seed), None, self.load_test(config))

    def load_test(self, config: ReverseConfig) -> ReverseDataset:
        return ReverseDataset(config.test_size, config.vocab_size, config.min_length, config.max_length,
                              config.seed + 1)
