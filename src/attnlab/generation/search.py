"""Generation, one API for every model that gives logits and keeps a cache: greedy search,
sampling and beam search, for decoder-only models and encoder-decoders alike.

A generation is a loop over a *session*, the model's side of it (:mod:`attnlab.generation.sessions`:
:class:`DecoderSession`, :class:`Seq2SeqSession`): ``first()`` reads the prompt (a decoder's prompt; an
encoder-decoder's source, then its start token) and gives the logits of the first choice;
``next(tokens)`` feeds the chosen tokens and gives the next logits; ``reorder(index)`` keeps
the rows a beam search chose; ``ids`` are the rows as the model reads them. The choice of
each token is a list of logits processors (:mod:`attnlab.generation.processors`: temperature,
top-k, top-p, min-p, the repetition penalty, the caller's own), and an ``observer`` sees every
step (:class:`Step`: the tokens, the logits, the cache), which the explorer and the decoding
benchmarks use instead of loops of their own.

A decoder-only model (:class:`~attnlab.models.gpt.GPT`) gives ``model(ids, padding_mask=,
positions=, cache=) -> (B, L, V)``, ``keeps_cache``, ``new_cache(batch, capacity,
cache_window=, sink_tokens=)``, ``check_generation_size(...)``, ``config.vocab_size``, and,
for the steps after the prompt, ``has_decode_step`` and ``decode_step(ids (B, 1), cache,
positions=, padding_mask=) -> (B, V)``. An encoder-decoder gives ``encode(src) -> (memory,
memory_pad)``, ``decode(tgt, memory, memory_pad, cache=, last_only=) -> logits``,
``new_cache(batch, capacity)`` and a ``config`` with ``pad_id``, ``bos_id`` and ``eos_id``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
from torch import Tensor

from ..errors import InputError
from .beam import beam_search_decoder, beam_search_session
from .processors import LogitsProcessor, StopStrings, choose, processors_for
from .sampling import check_decodable, check_generation
from .sessions import DecoderSession, Observer, Seq2SeqSession, Step

__all__ = ["generate", "stream", "translate", "greedy_search", "beam_search", "Step", "DecoderSession",
           "Seq2SeqSession", "search"]


# What beam search takes besides the prompt (the rest are sampling's or a stream's).
_BEAM_OPTIONS = ("eos_id", "pad_id", "use_cache", "decodable", "length_penalty", "early_stopping", "observer")


def search(session: Any, max_new_tokens: int, processors: Sequence[LogitsProcessor], *, eos_id: int | None = None,
           fill: int | None = None, generator: torch.Generator | None = None, observer: Observer | None = None,
           stops: Sequence[Callable[[Tensor], Tensor]] = (), scores: Tensor | None = None) -> Iterator[Tensor]:
    """Greedy search or sampling over ``session``: the next token of every row, ``(B,)``, one
    step after the other, chosen through ``processors`` (:func:`~attnlab.generation.processors.choose`).
    A row ends at ``eos_id`` or when a rule of ``stops`` says so (called with the new tokens so
    far); it is continued with ``fill`` (default ``eos_id``); the loop stops once every row has
    ended. ``scores`` ``(B,)``: summed with each row's log-probability of its tokens (until it
    ends) before the processors (greedy search's score, whose processors only mask tokens)."""
    if max_new_tokens == 0:
        return
    logits = session.first()
    # the logits after every prompt position, for the first step's observer alone: (B, L, V) is not held longer
    prompt_logits, session.prompt_logits = session.prompt_logits, None
    batch = logits.shape[0]
    done = torch.zeros(batch, dtype=torch.bool, device=logits.device)
    fill = eos_id if fill is None else fill
    new: list[Tensor] = []
    for index in range(max_new_tokens):
        logits = logits.float()
        nxt = choose(session.ids, logits, processors, generator)
        if scores is not None:  # a chosen token is never one the processors masked: its raw log-probability
            scores += torch.log_softmax(logits, dim=-1).gather(1, nxt[:, None])[:, 0].masked_fill(done, 0.0)
        if fill is not None:
            nxt = torch.where(done, torch.full_like(nxt, fill), nxt)
        if eos_id is not None:
            done |= nxt == eos_id
        if observer is not None:
            observer(Step(index, nxt, logits, session.cache, prompt_logits if index == 0 else None))
        prompt_logits = None
        yield nxt
        new.append(nxt)
        for rule in stops:
            done |= rule(torch.stack(new, dim=1))
        if (eos_id is not None or stops) and bool(done.all()):
            return
        if index + 1 < max_new_tokens:
            logits = session.next(nxt)


@torch.no_grad()
def generate(model: Any, input_ids: Tensor, max_new_tokens: int, *, num_beams: int = 1, **options: Any) -> Tensor:
    """``(B, L + n)`` ids, ``n <= max_new_tokens``: the prompts ``input_ids`` ``(B, L)`` and what
    follows (fewer than ``max_new_tokens`` when every row has ended with ``eos_id``), as
    :func:`stream` chooses them; with ``num_beams`` above 1, the best hypothesis of a beam search
    (:func:`~attnlab.generation.beam.beam_search_decoder`: ``eos_id``, ``pad_id``, ``length_penalty``,
    ``early_stopping``, ``use_cache``, ``decodable``), as transformers' ``generate(num_beams=...)``
    finds it."""
    if num_beams != 1 or "length_penalty" in options or "early_stopping" in options:
        quiet = {"temperature": 0, "repetition_penalty": 1, "compile": False, "sink_tokens": 0}  # stream's defaults
        other = sorted(k for k, v in options.items() if k not in _BEAM_OPTIONS and v is not None
                       and not (k in quiet and not isinstance(v, Tensor) and v == quiet[k]))
        if other:
            raise InputError(f"beam search takes no {', '.join(other)} (they are sampling's or a stream's); "
                             f"options it takes: {', '.join(_BEAM_OPTIONS)}")
        return beam_search_decoder(model, input_ids, max_new_tokens, num_beams=num_beams,
                                   **{k: v for k, v in options.items() if k in _BEAM_OPTIONS})
    steps = list(stream(model, input_ids, max_new_tokens, **options))
    return torch.cat([input_ids, *(t[:, None] for t in steps)], dim=1)


@torch.no_grad()
def stream(model: Any, input_ids: Tensor, max_new_tokens: int, *, temperature: float = 0.0,
           top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
           repetition_penalty: float = 1.0, seed: int | None = None, eos_id: int | None = None,
           padding_mask: Tensor | None = None, compile: bool = False, use_cache: bool = True,
           cache_window: int | None = None, sink_tokens: int = 0, decodable: int | None = None,
           processors: Sequence[LogitsProcessor] = (), stop: StopStrings | None = None,
           observer: Observer | None = None) -> Iterator[Tensor]:
    """The next token of every row, ``(B,)``, one step after the other; it stops early once
    every row has emitted ``eos_id`` (a row that has is continued with ``eos_id``).

    ``temperature`` 0 decodes greedily; above 0 it samples from the softmax of
    ``logits / temperature``, within the ``top_k`` most probable tokens (0: all), the
    smallest set whose probability reaches ``top_p`` and the tokens at least ``min_p`` times
    as probable as the likeliest, drawn with ``seed`` (reproducible); ``repetition_penalty``
    above 1 makes the tokens a row already holds less likely. These options become the list
    of :mod:`~attnlab.generation.processors`; ``processors``: the caller's own, applied after
    them. ``stop``: a :class:`~attnlab.generation.processors.StopStrings` rule that ends a row
    (and with ``eos_id`` continues it). ``observer``: called with each :class:`Step`. The
    options are checked as :func:`~attnlab.generation.sampling.check_generation` says, and the
    model's room (``check_generation_size``) before the first step. Prompts of different
    lengths are left-padded, with ``padding_mask`` ``(B, L)`` ``True`` at the padding.

    The prompt goes through the model with a cache from ``model.new_cache``; each later
    token through ``model.decode_step`` (every layer's lean step). ``compile``: run that step
    through ``torch.compile`` (compiled once per model, for any batch and length; it needs a
    C++ compiler on the CPU): the first call spends half a minute compiling, and then a step
    of a small model is faster (results page "Decoding and caches", ``benchmarks/lm_generate.py``),
    which pays for long or repeated generations. ``use_cache=False``, or a model whose attention keeps no cache,
    runs the whole sequence through the model at every step (the same tokens, slower).
    ``cache_window`` and ``sink_tokens`` stream: the cache holds the first ``sink_tokens``
    positions and the last ``cache_window`` (StreamingLLM), so memory stays flat past the
    model's context (``model.new_cache``'s policy; not with padded prompts). ``decodable``: the
    number of ids the caller's tokenizer decodes (``None``: every row of ``config.vocab_size``);
    the rows past it (an embedding padded past its tokenizer's vocabulary) are never chosen,
    greedy or sampled (:class:`~attnlab.generation.processors.Decodable`).
    """
    check_generation(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                     min_p=min_p, repetition_penalty=repetition_penalty, seed=seed)
    decodable = check_decodable(decodable, model.config.vocab_size)
    session = DecoderSession(model, input_ids, max_new_tokens, padding_mask=padding_mask, use_cache=use_cache,
                             cache_window=cache_window, sink_tokens=sink_tokens, compile=compile)
    chosen = processors_for(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition_penalty, decodable=decodable)
    for processor in chosen:
        if hasattr(processor, "pad"):
            processor.pad = padding_mask  # the prompt's padding is not a token of the row
    gen = None if seed is None else torch.Generator(device=input_ids.device).manual_seed(seed)
    yield from search(session, max_new_tokens, [*chosen, *processors], eos_id=eos_id, generator=gen,
                      observer=observer, stops=[stop] if stop is not None else [])


class EncoderDecoder(Protocol):
    config: Any

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]: ...
    def decode(
        self, tgt: Tensor, memory: Tensor, memory_pad: Tensor | None, *, cache: Any = None, last_only: bool = False
    ) -> Tensor: ...
    def new_cache(self, batch: int, capacity: int) -> Any: ...


@torch.no_grad()
def translate(model: EncoderDecoder, src: Tensor, max_new_tokens: int, *, num_beams: int = 1,
              length_penalty: float = 1.0, early_stopping: bool | str = True, temperature: float = 0.0,
              top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
              repetition_penalty: float = 1.0, seed: int | None = None, use_cache: bool = True,
              processors: Sequence[LogitsProcessor] = (), observer: Observer | None = None) -> tuple[Tensor, Tensor]:
    """An encoder-decoder's generation: tokens ``(B, T)`` (no start token; after a row's EOS,
    ``pad_id``) and each row's score ``(B,)``. Greedy by default; ``temperature`` above 0
    samples (``top_k``, ``top_p``, ``min_p``, drawn with ``seed``: the same tokens for the
    same seed); ``num_beams`` above 1 is the beam search decoders have
    (:func:`~attnlab.generation.beam.beam_search_session`, its score ``sum log p / length **
    length_penalty``); the score of greedy search and sampling is the summed log-probability.
    Padding and a second start token are never chosen."""
    cfg = model.config
    check_generation(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                     min_p=min_p, repetition_penalty=repetition_penalty, seed=seed)
    forbid = (cfg.pad_id, cfg.bos_id)
    if num_beams > 1:
        if temperature or repetition_penalty != 1 or processors:
            raise InputError("beam search takes no temperature, repetition_penalty or processors (they are "
                             "sampling's)")
        session = Seq2SeqSession(model, src, max_new_tokens, use_cache=use_cache, repeat=num_beams)
        new, scores = beam_search_session(session, src.shape[0], max_new_tokens, num_beams=num_beams,
                                          eos_id=cfg.eos_id, pad=cfg.pad_id, length_penalty=length_penalty,
                                          early_stopping=early_stopping, processors=processors_for(forbid=forbid),
                                          observer=observer)
        return new, scores
    session = Seq2SeqSession(model, src, max_new_tokens, use_cache=use_cache)
    chosen = [*processors_for(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repetition_penalty=repetition_penalty, forbid=forbid), *processors]
    gen = None if seed is None else torch.Generator(device=src.device).manual_seed(seed)
    scores = torch.zeros(src.shape[0], device=src.device)
    steps = list(search(session, max_new_tokens, chosen, eos_id=cfg.eos_id, fill=cfg.pad_id, generator=gen,
                        observer=observer, scores=scores))
    return torch.stack(steps, dim=1), scores


def greedy_search(model: EncoderDecoder, src: Tensor, max_new_tokens: int, *,
                  use_cache: bool = True) -> tuple[Tensor, Tensor]:
    """The most probable token at each step (:func:`translate`): tokens ``(B, T)`` (no BOS;
    EOS then ``pad_id`` after a sentence ends) and their summed log-probabilities ``(B,)``.
    ``use_cache=False`` re-decodes the whole prefix at every step (the slow reference the cache
    is measured against)."""
    return translate(model, src, max_new_tokens, use_cache=use_cache)


def beam_search(model: EncoderDecoder, src: Tensor, num_beams: int, max_new_tokens: int, *,
                length_penalty: float = 1.0, use_cache: bool = True) -> tuple[Tensor, Tensor]:
    """Beam search (:func:`translate` with ``num_beams``; a sentence is done once it has
    ``num_beams`` finished hypotheses): the best hypothesis per sentence ``(B, T)`` (no BOS,
    right-padded with ``pad_id``) and its normalized score ``(B,)``. One beam is greedy search."""
    return translate(model, src, max_new_tokens, num_beams=num_beams, length_penalty=length_penalty,
                     use_cache=use_cache)
