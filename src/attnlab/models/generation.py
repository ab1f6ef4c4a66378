"""Generation, one module for every decoder: the decoder-only loop (:func:`generate`,
:func:`stream`) and greedy and beam search for encoder-decoders.

A decoder-only model (:class:`~attnlab.models.gpt.GPT`) gives logits and a cache:
``model(ids, padding_mask=, positions=, cache=) -> (B, L, V)``, ``keeps_cache``,
``new_cache(batch, capacity)``, ``check_generation_size(batch, prompt, max_new_tokens,
use_cache=, cache_window=, sink_tokens=)``, ``config.vocab_size``, and, for the steps after the prompt, ``has_decode_step``
and ``decode_step(ids (B, 1), cache, positions=, padding_mask=) -> (B, V)``. The choice of
each token (:mod:`attnlab.models.sampling`) is the same for every model.

An encoder-decoder is usable here when it has ``encode(src) -> (memory, memory_pad)``,
``decode(tgt, memory, memory_pad, cache=..., last_only=...) -> logits``, ``new_cache(batch,
capacity)`` (the same protocol: the decoder's caches, made by its layers) and a
``config`` with ``pad_id``, ``bos_id`` and ``eos_id``.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Protocol

import torch
from torch import Tensor

from ..errors import InputError
from .sampling import check_decodable, check_generation, choose_next

__all__ = ["generate", "stream", "greedy_search", "beam_search"]


# What beam search takes besides the prompt (the rest are sampling's or a stream's).
_BEAM_OPTIONS = ("eos_id", "pad_id", "use_cache", "decodable", "length_penalty", "early_stopping")


@torch.no_grad()
def generate(model: Any, input_ids: Tensor, max_new_tokens: int, *, num_beams: int = 1, **options: Any) -> Tensor:
    """``(B, L + n)`` ids, ``n <= max_new_tokens``: the prompts ``input_ids`` ``(B, L)`` and what
    follows (fewer than ``max_new_tokens`` when every row has ended with ``eos_id``), as
    :func:`stream` chooses them; with ``num_beams`` above 1, the best hypothesis of a beam search
    (:func:`~attnlab.models.beam.beam_search_decoder`: ``eos_id``, ``pad_id``, ``length_penalty``,
    ``early_stopping``, ``use_cache``, ``decodable``), as transformers' ``generate(num_beams=...)``
    finds it."""
    if num_beams != 1 or "length_penalty" in options or "early_stopping" in options:
        from .beam import beam_search_decoder

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
           cache_window: int | None = None, sink_tokens: int = 0, decodable: int | None = None) -> Iterator[Tensor]:
    """The next token of every row, ``(B,)``, one step after the other; it stops early once
    every row has emitted ``eos_id`` (a row that has is continued with ``eos_id``).

    ``temperature`` 0 decodes greedily; above 0 it samples from the softmax of
    ``logits / temperature``, within the ``top_k`` most probable tokens (0: all), the
    smallest set whose probability reaches ``top_p`` and the tokens at least ``min_p`` times
    as probable as the likeliest, drawn with ``seed`` (reproducible); ``repetition_penalty``
    above 1 makes the tokens a row already holds less likely
    (:func:`~attnlab.models.sampling.penalize_repeats`). The options are checked as
    :func:`~attnlab.models.sampling.check_generation` says, and the model's room
    (``check_generation_size``) before the first step. Prompts of different lengths are
    left-padded, with ``padding_mask`` ``(B, L)`` ``True`` at the padding.

    The prompt goes through the model with a cache from ``model.new_cache``; each later
    token through ``model.decode_step`` (every layer's lean step). ``compile``: run that step
    through ``torch.compile`` (compiled once per model, for any batch and length; it needs a
    C++ compiler on the CPU): the first call spends half a minute compiling, and then a step
    of a small model is about 1.5x faster (210 against 323 tokens per second at batch 1 for a
    4-layer width-256 model, AVX2 EPYC, ``benchmarks/lm_generate.py``), which pays for long
    or repeated generations. ``use_cache=False``, or a model whose attention keeps no cache,
    runs the whole sequence through the model at every step (the same tokens, slower).
    ``cache_window`` and ``sink_tokens`` stream: the cache holds the first ``sink_tokens``
    positions and the last ``cache_window`` (StreamingLLM), so memory stays flat past the model's context
    (``model.new_cache``'s policy; not with padded prompts). ``decodable``: the number of ids
    the caller's tokenizer decodes (``None``: every row of ``config.vocab_size``); the rows
    past it (an embedding padded past its tokenizer's vocabulary) are never chosen, greedy or
    sampled (:func:`~attnlab.models.sampling.only_decodable`).
    """
    check_generation(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                     min_p=min_p, repetition_penalty=repetition_penalty, seed=seed)
    decodable = check_decodable(decodable, model.config.vocab_size)
    batch, prompt = input_ids.shape
    streaming = {"cache_window": cache_window, "sink_tokens": sink_tokens} \
        if cache_window is not None or sink_tokens else {}
    if streaming and (not use_cache or not model.keeps_cache):
        raise InputError("cache_window and sink_tokens are a policy of the cache: they need use_cache and a model whose "
                         "attention keeps one")
    model.check_generation_size(batch, prompt, max_new_tokens, use_cache=use_cache, **streaming)
    model.eval()
    device = input_ids.device
    gen = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    pad = padding_mask
    positions = None if pad is None else (~pad).long().cumsum(1).sub(1).clamp(min=0)
    cache = model.new_cache(batch, prompt + max_new_tokens, **streaming) if use_cache and model.keeps_cache else None
    seen = None  # (B, V): the tokens each row holds, for the repetition penalty
    if repetition_penalty != 1:
        real = input_ids if pad is None else input_ids.masked_fill(pad, 0)
        seen = torch.zeros(batch, model.config.vocab_size, dtype=torch.bool, device=device)
        seen.scatter_(1, real, True)
        if pad is not None:  # padding's placeholder id 0 is not a token of the row, unless the row has it
            seen[:, 0] = (input_ids.masked_fill(pad, -1) == 0).any(1)
    step_fn = model.decode_step if cache is not None and model.has_decode_step else None
    if compile and step_fn is not None:
        if "_compiled_step" not in model.__dict__:
            model.__dict__["_compiled_step"] = torch.compile(model.decode_step, dynamic=True)
        step_fn = model.__dict__["_compiled_step"]
    ids, done = input_ids, torch.zeros(batch, dtype=torch.bool, device=device)
    step_ids, step_pos = input_ids, positions
    for step in range(max_new_tokens):
        if cache is None:  # no cache: the whole sequence again
            logits = model(ids, padding_mask=pad, positions=positions)[:, -1]
        elif step_fn is not None and step > 0:
            logits = step_fn(step_ids, cache, positions=step_pos, padding_mask=pad)
        else:
            logits = model(step_ids, padding_mask=pad, positions=step_pos, cache=cache)[:, -1]
        nxt = choose_next(logits.float(), temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          generator=gen, decodable=decodable, seen=seen, repetition_penalty=repetition_penalty)
        if seen is not None:
            seen.scatter_(1, nxt[:, None], True)
        if eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            done |= nxt == eos_id
        yield nxt
        if eos_id is not None and bool(done.all()):
            return
        ids = torch.cat([ids, nxt[:, None]], dim=1) if cache is None else ids
        step_ids = nxt[:, None]
        if pad is not None:
            pad = torch.cat([pad, torch.zeros_like(pad[:, :1])], dim=1)
            last = positions[:, -1:] + 1  # type: ignore[index]
            positions = torch.cat([positions, last], dim=1)  # type: ignore[list-item]
            step_pos = last


class EncoderDecoder(Protocol):
    config: Any

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]: ...
    def decode(
        self, tgt: Tensor, memory: Tensor, memory_pad: Tensor | None, *, cache: Any = None, last_only: bool = False
    ) -> Tensor: ...
    def new_cache(self, batch: int, capacity: int) -> Any: ...


def _encode(model: EncoderDecoder, src: Tensor) -> tuple[Tensor, Tensor | None]:
    memory, memory_pad = model.encode(src)
    # Unpadded sources need no mask: every step's cross-attention then skips masking.
    return memory, memory_pad if bool(memory_pad.any()) else None


def _next_log_probs(logits: Tensor, cfg: Any) -> Tensor:
    """log-softmax in float32, never choosing padding or a second BOS."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp[:, cfg.pad_id] = -math.inf
    logp[:, cfg.bos_id] = -math.inf
    return logp


@torch.no_grad()
def greedy_search(
    model: EncoderDecoder, src: Tensor, max_new_tokens: int, *, use_cache: bool = True
) -> tuple[Tensor, Tensor]:
    """Pick the most probable token at each step.

    Returns tokens ``(B, T)`` (no BOS; EOS then ``pad_id`` after a sentence ends) and
    their summed log-probabilities ``(B,)``. ``use_cache=False`` re-decodes the whole
    prefix at every step (the slow reference the cache is measured against).
    """
    cfg = model.config
    memory, memory_pad = _encode(model, src)
    batch = src.shape[0]
    tokens = src.new_full((batch, 1), cfg.bos_id)
    scores = memory.new_zeros(batch, dtype=torch.float32)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    cache = model.new_cache(batch, max_new_tokens + 1) if use_cache else None
    for _ in range(max_new_tokens):
        inp = tokens[:, -1:] if use_cache else tokens
        logp = _next_log_probs(model.decode(inp, memory, memory_pad, cache=cache, last_only=True)[:, -1], cfg)
        best, nxt = logp.max(dim=-1)
        scores += best.masked_fill(finished, 0.0)
        nxt = nxt.masked_fill(finished, cfg.pad_id)
        tokens = torch.cat([tokens, nxt.unsqueeze(1)], dim=1)
        finished |= nxt == cfg.eos_id
        if bool(finished.all()):
            break
    return tokens[:, 1:], scores


@torch.no_grad()
def beam_search(
    model: EncoderDecoder, src: Tensor, num_beams: int, max_new_tokens: int, *, length_penalty: float = 1.0,
    use_cache: bool = True,
) -> tuple[Tensor, Tensor]:
    """Batched beam search with a key/value cache (``use_cache=False``: re-decode every
    hypothesis's whole prefix at each step, the slow reference the cache is measured against).

    Each step scores ``num_beams x V`` continuations per sentence and keeps the best
    ``2 * num_beams``: those ending in EOS among the top ``num_beams`` become finished
    hypotheses, scored ``sum log p / length ** length_penalty``; the best
    ``num_beams`` others stay active. A sentence is done once it has ``num_beams``
    finished hypotheses, and leaves the batch (its cache rows are dropped). At the
    length limit unfinished sentences are completed by their active beams. With one
    beam this is exactly greedy search.

    Returns the best hypothesis per sentence ``(B, T)`` (no BOS, right-padded with
    ``pad_id``) and its normalized score ``(B,)``.
    """
    cfg = model.config
    k = num_beams
    batch = src.shape[0]
    device = src.device
    memory, memory_pad = _encode(model, src)
    rows = torch.arange(batch, device=device).repeat_interleave(k)
    memory = memory.index_select(0, rows)
    memory_pad = None if memory_pad is None else memory_pad.index_select(0, rows)
    cache = model.new_cache(batch * k, max_new_tokens + 1) if use_cache else None

    tokens = src.new_full((batch * k, 1), cfg.bos_id)  # active hypotheses, BOS first
    scores = torch.full((batch, k), -math.inf, device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    alive = list(range(batch))  # original sentence index of each active group
    finished: list[list[tuple[float, Tensor]]] = [[] for _ in range(batch)]
    rank = torch.arange(2 * k, device=device)

    def penalty(length: int) -> float:
        return length**length_penalty

    for step in range(max_new_tokens):
        n = len(alive)  # sentences still searching; rows are n * k
        inp = tokens[:, -1:] if use_cache else tokens
        step_logits = model.decode(inp, memory, memory_pad, cache=cache, last_only=True)[:, -1]
        logp = _next_log_probs(step_logits, cfg)
        vocab = logp.shape[-1]
        cand = (scores.unsqueeze(-1) + logp.view(n, k, vocab)).view(n, k * vocab)
        top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=1)
        top_beam, top_tok = top_idx // vocab, top_idx % vocab
        is_eos = top_tok == cfg.eos_id

        # Finish hypotheses whose EOS ranks among the top k.
        ends = (is_eos[:, :k] & torch.isfinite(top_scores[:, :k])).nonzero().tolist()
        for i, j in ends:
            sent = alive[i]
            if len(finished[sent]) < k:
                hyp = torch.cat([tokens[i * k + int(top_beam[i, j]), 1:], top_tok[i, j : j + 1]])
                finished[sent].append((float(top_scores[i, j]) / penalty(step + 1), hyp))

        # Keep the k best continuations that did not end.
        order = (is_eos.long() * top_idx.shape[1] + rank[: top_idx.shape[1]]).topk(k, largest=False).indices
        act_scores = top_scores.gather(1, order)
        act_beam = top_beam.gather(1, order)
        act_tok = top_tok.gather(1, order)

        keep = [i for i, s in enumerate(alive) if len(finished[s]) < k]
        if not keep:
            break
        keep_t = torch.tensor(keep, device=device)
        src_rows = (keep_t.unsqueeze(1) * k + act_beam.index_select(0, keep_t)).view(-1)
        tokens = torch.cat([tokens.index_select(0, src_rows), act_tok.index_select(0, keep_t).view(-1, 1)], dim=1)
        scores = act_scores.index_select(0, keep_t)
        if cache is not None:
            cache.reorder(src_rows)
        memory = memory.index_select(0, src_rows)
        memory_pad = None if memory_pad is None else memory_pad.index_select(0, src_rows)
        alive = [alive[i] for i in keep]
    else:
        # Length limit reached: complete the sentences still open with their active beams.
        length = tokens.shape[1] - 1
        for i, sent in enumerate(alive):
            for j in range(k):
                if len(finished[sent]) < k and math.isfinite(float(scores[i, j])):
                    finished[sent].append((float(scores[i, j]) / penalty(length), tokens[i * k + j, 1:]))

    best = [max(hyps, key=lambda h: h[0]) for hyps in finished]
    width = max(h[1].numel() for h in best)
    out = src.new_full((batch, width), cfg.pad_id)
    for i, (_, hyp) in enumerate(best):
        out[i, : hyp.numel()] = hyp
    return out, torch.tensor([s for s, _ in best], device=device)
