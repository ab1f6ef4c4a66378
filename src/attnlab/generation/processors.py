"""What shapes each step's choice of token, as a list: logits processors and stopping rules.

A *logits processor* takes the tokens so far and a step's logits and returns new logits::

    processor(ids (B, L), logits (B, V)) -> (B, V)

:func:`processors_for` builds the list a generation's options ask for, in transformers' order
(the ids past the tokenizer's vocabulary masked, the repetition penalty, then temperature,
top-k, top-p and min-p), and :func:`choose` applies a list and picks each row's token: the
arg-max, or a draw when the list has a :class:`Temperature` (a generation that samples). A
caller's own processor is any callable of that form, placed in the list where it should act.

A *stopping rule* says which rows have ended after a step: :class:`StopStrings` ends a row
whose new text holds one of some strings (it needs the tokenizer's ``decode``).

``ids`` are the rows as the model reads them: a decoder's prompt and what it has generated,
an encoder-decoder's target so far (its start token first). Padding in a left-padded prompt
is given by ``pad`` ``(B, L)`` (``True`` = padding), which the repetition penalty leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch
from torch import Tensor

__all__ = ["LogitsProcessor", "Decodable", "Forbid", "RepetitionPenalty", "Temperature", "TopK", "TopP", "MinP",
           "StopStrings", "processors_for", "choose", "samples", "cut_at_stop", "held_back"]


class LogitsProcessor(Protocol):
    def __call__(self, ids: Tensor, logits: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class Decodable:
    """``-inf`` at every id ``>= n``: rows of an embedding padded past its tokenizer's vocabulary
    (Qwen pads 151,669 tokens to 151,936 rows), so no choice ever picks one."""

    n: int

    def __call__(self, ids: Tensor, logits: Tensor) -> Tensor:
        if self.n >= logits.shape[-1]:
            return logits
        logits = logits.clone()
        logits[..., self.n:] = float("-inf")
        return logits


@dataclass(frozen=True)
class Forbid:
    """``-inf`` at the ids ``tokens`` (an encoder-decoder never emits padding or a second start)."""

    tokens: tuple[int, ...]

    def __call__(self, ids: Tensor, logits: Tensor) -> Tensor:
        logits = logits.clone()
        logits[..., list(self.tokens)] = float("-inf")
        return logits


@dataclass
class RepetitionPenalty:
    """CTRL's repetition penalty (Keskar et al., 2019): the logit of every token already in the
    row is divided by ``penalty`` when positive and multiplied by it when negative, so a
    penalty above 1 makes repeats less likely. ``pad``: the prompt's padding, not tokens of
    the row (set by the generation for left-padded prompts)."""

    penalty: float
    pad: Tensor | None = None

    def __call__(self, ids: Tensor, logits: Tensor) -> Tensor:
        real = torch.ones_like(ids, dtype=torch.int8)
        if self.pad is not None:
            real[:, : self.pad.shape[1]] = (~self.pad).to(torch.int8)
        # amax, not a plain scatter: a padded slot and a real token may share an id
        seen = torch.zeros(logits.shape, dtype=torch.int8, device=logits.device)
        seen = seen.scatter_reduce(1, ids, real, "amax").bool()
        return penalize_repeats(logits, seen, self.penalty)


def penalize_repeats(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """``logits`` with the tokens of ``seen`` ``(B, V)`` bool penalized as
    :class:`RepetitionPenalty` says."""
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


@dataclass(frozen=True)
class Temperature:
    """``logits / t`` (``t > 0``); its presence makes :func:`choose` draw instead of taking the
    arg-max."""

    t: float

    def __call__(self, ids: Tensor, logits: Tensor) -> Tensor:
        return logits / self.t


@dataclass(frozen=True)
class TopK:
    """Only the ``k`` most probable tokens."""

    k: int

    def __call__(self, ids: Tensor, logits: Tensor) -> Tensor:
        kth = logits.topk(min(self.k, logits.shape[-1]), dim=-1).values[:, -1:]
        return logits.masked_fill(logits < kth, float("-inf"))


@dataclass(frozen=True)
class TopP:
    """The smallest set of most probable tokens whose probability reaches ``p`` (the nucleus)."""

    p: float

    def __call__(self, ids: Tensor, logits: Tensor) -> Tensor:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= self.p  # the tokens past the nucleus
        return logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))


@dataclass(frozen=True)
class MinP:
    """The tokens at least ``p`` times as probable as the likeliest (Nguyen et al., 2024)."""

    p: float

    def __call__(self, ids: Tensor, logits: Tensor) -> Tensor:
        probs = logits.softmax(-1)
        return logits.masked_fill(probs < self.p * probs.max(-1, keepdim=True).values, float("-inf"))


def processors_for(*, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                   min_p: float | None = None, repetition_penalty: float = 1.0, decodable: int | None = None,
                   forbid: Sequence[int] = ()) -> list[LogitsProcessor]:
    """The list a generation's options ask for (checked before: :mod:`attnlab.generation.sampling`),
    in transformers' order. ``temperature`` 0: greedy, and the sampling filters drop out."""
    out: list[LogitsProcessor] = []
    if decodable is not None:
        out.append(Decodable(decodable))
    if forbid:
        out.append(Forbid(tuple(forbid)))
    if repetition_penalty != 1:
        out.append(RepetitionPenalty(repetition_penalty))
    if temperature:
        out.append(Temperature(temperature))
        if top_k:
            out.append(TopK(top_k))
        if top_p is not None and top_p < 1:
            out.append(TopP(top_p))
        if min_p:
            out.append(MinP(min_p))
    return out


def samples(processors: Sequence[LogitsProcessor]) -> bool:
    """Whether a generation with ``processors`` draws its tokens (it has a :class:`Temperature`)."""
    return any(isinstance(p, Temperature) for p in processors)


def choose(ids: Tensor, logits: Tensor, processors: Sequence[LogitsProcessor],
           generator: torch.Generator | None = None) -> Tensor:
    """Each row's next token ``(B,)``: ``logits`` ``(B, V)`` (float32) through ``processors``,
    then a draw from their softmax when the list samples, else the arg-max."""
    for processor in processors:
        logits = processor(ids, logits)
    if not samples(processors):
        return logits.argmax(-1)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


@dataclass
class StopStrings:
    """A stopping rule: a row ends once the text of its new tokens holds one of ``texts``.
    ``decode``: the tokenizer's, from a row's new ids to text. Called after each step with the
    new tokens so far ``(B, n)``; returns ``(B,)`` bool."""

    texts: Sequence[str]
    decode: Callable[[list[int]], str]

    def __call__(self, new: Tensor) -> Tensor:
        return torch.tensor([any(t in self.decode(row) for t in self.texts) for row in new.tolist()],
                            device=new.device)


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``(text up to its first stop string, whether one was found)``."""
    ends = [i for i in (text.find(t) for t in stops) if i >= 0]
    return (text[: min(ends)], True) if ends else (text, False)


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could begin a stop string (and so wait for
    the next token before they are shown)."""
    return max((k for t in stops for k in range(min(len(t) - 1, len(text)), 0, -1) if text.endswith(t[:k])),
               default=0)
