"""A generation's sessions, the model's side of it: :class:`DecoderSession` for a
decoder-only model and :class:`Seq2SeqSession` for an encoder-decoder, and the :class:`Step`
an observer sees after each choice. ``first()`` reads the prompt (a decoder's prompt; an
encoder-decoder's source, then its start token) and gives the logits of the first choice;
``next(tokens)`` feeds the chosen tokens and gives the next logits; ``reorder(index)`` keeps
the rows a beam search chose; ``ids`` are the rows as the model reads them.

The searches over a session, greedy and sampling (:mod:`attnlab.generation.search`) and beam
(:mod:`attnlab.generation.beam`), both import it, so neither imports the other's loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from ..errors import InputError

__all__ = ["Step", "Observer", "DecoderSession", "Seq2SeqSession"]


@dataclass(frozen=True)
class Step:
    """What an observer sees after each choice: ``index`` (0 for the first new token),
    ``tokens`` ``(B,)`` chosen, ``logits`` ``(B, V)`` float32 they were chosen from (before the
    processors), the ``cache`` (``None`` without one), and, at index 0 of a decoder's
    generation, ``prompt_logits`` ``(B, L, V)``: the logits after every prompt position."""

    index: int
    tokens: Tensor
    logits: Tensor
    cache: Any
    prompt_logits: Tensor | None = None


Observer = Callable[[Step], None]


class DecoderSession:
    """A decoder-only model's side of a generation: the prompt ``input_ids`` ``(B, L)``
    (left-padded where ``padding_mask`` says) read once, then one token a row per step, with
    the model's cache (streaming under ``cache_window`` and ``sink_tokens``) or, without one,
    the whole sequence again at every step. ``lean=False``: every step through the model's
    ``forward`` instead of its lean ``decode_step`` (which records no attention weights)."""

    def __init__(self, model: Any, input_ids: Tensor, max_new_tokens: int, *, padding_mask: Tensor | None = None,
                 use_cache: bool = True, cache_window: int | None = None, sink_tokens: int = 0,
                 compile: bool = False, lean: bool = True) -> None:
        streaming = {"cache_window": cache_window, "sink_tokens": sink_tokens} \
            if cache_window is not None or sink_tokens else {}
        if streaming and (not use_cache or not model.keeps_cache):
            raise InputError("cache_window and sink_tokens are a policy of the cache: they need use_cache and a model "
                             "whose attention keeps one")
        batch, prompt = input_ids.shape
        model.check_generation_size(batch, prompt, max_new_tokens, use_cache=use_cache, **streaming)
        model.eval()
        self.model, self.ids, self.pad = model, input_ids, padding_mask
        self.positions = None if padding_mask is None else (~padding_mask).long().cumsum(1).sub(1).clamp(min=0)
        self.cache = model.new_cache(batch, prompt + max_new_tokens, **streaming) \
            if use_cache and model.keeps_cache else None
        self.step_fn = model.decode_step if lean and self.cache is not None and model.has_decode_step else None
        if compile and self.step_fn is not None:
            if "_compiled_step" not in model.__dict__:
                model.__dict__["_compiled_step"] = torch.compile(model.decode_step, dynamic=True)
            self.step_fn = model.__dict__["_compiled_step"]
        self.prompt_logits: Tensor | None = None

    def first(self) -> Tensor:
        out = self.model(self.ids, padding_mask=self.pad, positions=self.positions, cache=self.cache)
        self.prompt_logits = out
        return out[:, -1]

    def next(self, tokens: Tensor) -> Tensor:
        self.ids = torch.cat([self.ids, tokens[:, None]], dim=1)
        step_pos = None
        if self.pad is not None:
            self.pad = torch.cat([self.pad, torch.zeros_like(self.pad[:, :1])], dim=1)
            step_pos = self.positions[:, -1:] + 1  # type: ignore[index]
            self.positions = torch.cat([self.positions, step_pos], dim=1)  # type: ignore[list-item]
        if self.cache is None:  # no cache: the whole sequence again
            return self.model(self.ids, padding_mask=self.pad, positions=self.positions)[:, -1]
        if self.step_fn is not None:
            return self.step_fn(tokens[:, None], self.cache, positions=step_pos, padding_mask=self.pad)
        return self.model(tokens[:, None], padding_mask=self.pad, positions=step_pos, cache=self.cache)[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.ids = self.ids.index_select(0, index)
        if self.pad is not None:
            self.pad, self.positions = self.pad.index_select(0, index), self.positions.index_select(0, index)  # type: ignore[union-attr]
        if self.cache is not None:
            self.cache.reorder(index)


class Seq2SeqSession:
    """An encoder-decoder's side of a generation: the source ``src`` ``(B, Ls)`` encoded once
    (each row ``repeat`` times, for beams), then the target from its start token, one token a
    row per step, with the decoder's caches (or the whole target again without them)."""

    def __init__(self, model: Any, src: Tensor, max_new_tokens: int, *, use_cache: bool = True,
                 repeat: int = 1) -> None:
        model.eval()
        memory, memory_pad = model.encode(src)
        memory_pad = memory_pad if bool(memory_pad.any()) else None  # unpadded sources skip the masking
        if repeat > 1:
            memory = memory.repeat_interleave(repeat, dim=0)
            memory_pad = None if memory_pad is None else memory_pad.repeat_interleave(repeat, dim=0)
        self.model, self.memory, self.memory_pad = model, memory, memory_pad
        self.ids = src.new_full((src.shape[0] * repeat, 1), model.config.bos_id)
        self.cache = model.new_cache(self.ids.shape[0], max_new_tokens + 1) if use_cache else None
        self.prompt_logits = None

    def _logits(self, tgt: Tensor) -> Tensor:
        return self.model.decode(tgt, self.memory, self.memory_pad, cache=self.cache, last_only=True)[:, -1]

    def first(self) -> Tensor:
        return self._logits(self.ids)

    def next(self, tokens: Tensor) -> Tensor:
        self.ids = torch.cat([self.ids, tokens[:, None]], dim=1)
        return self._logits(tokens[:, None] if self.cache is not None else self.ids)

    def reorder(self, index: Tensor) -> None:
        self.ids = self.ids.index_select(0, index)
        self.memory = self.memory.index_select(0, index)
        if self.memory_pad is not None:
            self.memory_pad = self.memory_pad.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index)
