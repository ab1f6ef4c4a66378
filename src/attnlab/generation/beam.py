"""Beam search for a decoder-only model, with the model's cache: the search Hugging Face
transformers' ``generate(num_beams=...)`` makes (its 2025 vectorized form), so that the same
weights give the same tokens.

Every step scores the ``num_beams x V`` continuations of each prompt and keeps the best
``2 * num_beams``. Those that end (``eos_id``, or the length limit) among the first
``num_beams`` of them enter the prompt's pool of finished hypotheses, scored ``sum log p /
generated_length ** length_penalty``; the pool keeps the ``num_beams`` best. The best
``num_beams`` that did not end go on, their cache rows reordered (``cache.reorder``). A prompt
stops taking hypotheses once its pool is full and no running beam could beat the worst of it
at today's length (``early_stopping=False``), once its pool is full (``True``), or never before
the limit (``"never"``; with a positive ``length_penalty`` the bound is taken at the limit's
length). The search ends when no prompt can improve or every continuation has ended.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InputError
from ..memory import require_memory
from .processors import processors_for
from .sampling import check_decodable
from .sessions import DecoderSession, Step

__all__ = ["beam_search_decoder", "beam_search_session"]

_NEVER = -1.0e9  # the score of what may not be chosen (transformers' constant: ties break the same way)


def _check(num_beams: Any, length_penalty: Any, early_stopping: Any) -> None:
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise InputError(f"num_beams must be a positive integer; got {num_beams!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) \
            or not math.isfinite(length_penalty):
        raise InputError(f"length_penalty must be a finite number; got {length_penalty!r}")
    if early_stopping not in (True, False, "never"):
        raise InputError(f"early_stopping must be true, false or 'never'; got {early_stopping!r}")


@torch.no_grad()
def beam_search_decoder(model: Any, input_ids: Tensor, max_new_tokens: int, *, num_beams: int,
                        eos_id: int | None = None, pad_id: int | None = None, length_penalty: float = 1.0,
                        early_stopping: bool | str = False, use_cache: bool = True,
                        decodable: int | None = None, observer: Any = None) -> Tensor:
    """``(B, L + n)`` ids: each prompt of ``input_ids`` ``(B, L)`` (one length: no padding) and
    its best hypothesis, right-padded with ``pad_id`` (default ``eos_id``, else 0) to the
    longest of the batch. ``model`` is a decoder (``GPT``): logits, ``new_cache`` and caches
    that reorder their rows."""
    _check(num_beams, length_penalty, early_stopping)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be a positive integer; got {max_new_tokens!r}")
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise InputError(f"input_ids must be (B, L) with L >= 1; got {tuple(input_ids.shape)}")
    decodable = check_decodable(decodable, model.config.vocab_size)
    batch = input_ids.shape[0]
    k, vocab = num_beams, model.config.vocab_size
    if k > vocab:
        raise InputError(f"num_beams must be at most the vocabulary's {vocab:,} tokens; got {k:,}")
    pad = pad_id if pad_id is not None else eos_id if eos_id is not None else 0
    # A step holds a few (B*k, V) float32 tensors (the logits, their log-softmax, the scores).
    require_memory(4 * 4 * batch * k * vocab, f"num_beams={k:,} for a batch of {batch} over {vocab:,} tokens")
    session = DecoderSession(model, input_ids.repeat_interleave(k, dim=0), max_new_tokens, use_cache=use_cache)
    new, _ = beam_search_session(session, batch, max_new_tokens, num_beams=k, eos_id=eos_id, pad=pad,
                                 length_penalty=length_penalty, early_stopping=early_stopping,
                                 processors=processors_for(decodable=decodable), observer=observer)
    return torch.cat([input_ids, new], dim=1)


def beam_search_session(session: Any, batch: int, max_new_tokens: int, *, num_beams: int, eos_id: int | None,
                        pad: int, length_penalty: float = 1.0, early_stopping: bool | str = False,
                        processors: Sequence[Any] = (), observer: Any = None) -> tuple[Tensor, Tensor]:
    """The search over a generation's session (:mod:`attnlab.generation.search`) whose rows are
    ``batch`` prompts each repeated ``num_beams`` times: each prompt's best hypothesis ``(B, n)``
    (right-padded with ``pad`` to the longest) and its score ``(B,)``. ``processors`` act on
    each step's log-probabilities, as transformers' beam search applies them (they mask tokens)."""
    _check(num_beams, length_penalty, early_stopping)
    k = num_beams
    logits = session.first()
    device, vocab = logits.device, logits.shape[-1]
    keep = 2 * k  # continuations kept a step: enough that k go on whatever ends
    first_k = torch.arange(keep, device=device) < k
    empty = torch.empty(batch, k, 0, dtype=torch.long, device=device)
    generated = empty  # the running beams' tokens
    running = torch.zeros(batch, k, device=device)
    running[:, 1:] = _NEVER  # all beams start equal: expand the first only
    pool = empty  # finished hypotheses, as long as the longest so far
    pool_scores = torch.full((batch, k), _NEVER, device=device)
    pool_full = torch.zeros(batch, k, dtype=torch.bool, device=device)
    pool_len = torch.zeros(batch, k, dtype=torch.long, device=device)  # each hypothesis's generated tokens
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)
    offsets = (torch.arange(batch, device=device) * k)[:, None]

    for step in range(max_new_tokens):
        logits = logits.float()
        logp = F.log_softmax(logits, dim=-1)
        for processor in processors:
            logp = processor(session.ids, logp)
        scores = (logp.view(batch, k, vocab) + running[..., None]).view(batch, k * vocab)
        top_scores, top_index = scores.topk(keep, dim=1)
        beam, token = top_index // vocab, top_index % vocab
        candidates = torch.cat([generated.gather(1, beam[..., None].expand(-1, -1, step)), token[..., None]], dim=2)
        ended = torch.full_like(token, step + 1 == max_new_tokens, dtype=torch.bool)
        if eos_id is not None:
            ended |= token == eos_id

        # The best k that did not end go on.
        going = top_scores + ended.float() * _NEVER
        chosen = going.topk(k, dim=1).indices
        generated = candidates.gather(1, chosen[..., None].expand(-1, -1, step + 1))
        running = going.gather(1, chosen)
        from_beam = beam.gather(1, chosen)

        # Those that ended among the first k enter the pool, which keeps the k best.
        normed = top_scores / ((step + 1) ** length_penalty)
        full = pool_full.all(dim=-1, keepdim=True) & (early_stopping is True)
        normed += full.float() * _NEVER
        normed += (~improvable).float() * _NEVER
        just_ended = ended & first_k[None, :]
        normed += (~just_ended).float() * _NEVER
        merged = torch.cat([pool_scores, normed], dim=1)
        best = merged.topk(k, dim=1).indices
        pool = torch.cat([F.pad(pool, (0, 1), value=pad), candidates], dim=1).gather(1, best[..., None].expand(-1, -1, step + 1))
        pool_scores = merged.gather(1, best)
        pool_full = torch.cat([pool_full, just_ended], dim=1).gather(1, best)
        pool_len = torch.cat([pool_len, torch.full_like(just_ended, step + 1, dtype=torch.long)], dim=1).gather(1, best)

        rows = (offsets + from_beam).view(-1)
        session.reorder(rows)
        last = generated[..., -1].reshape(-1)
        if observer is not None:
            observer(Step(step, last, logits.index_select(0, rows), session.cache))
        length = (max_new_tokens if early_stopping == "never" and length_penalty > 0 else step + 1)
        bound = running[:, :1] / (length ** length_penalty)
        worst = torch.where(pool_full, pool_scores.min(dim=1, keepdim=True).values, _NEVER)
        improvable = improvable & (bound > worst).any(dim=-1, keepdim=True)
        if not bool(improvable.any()) or bool(ended.all()) or (early_stopping is True and bool(pool_full.all())):
            break
        logits = session.next(last)

    width = int(pool_len[:, 0].max())
    return pool[:, 0, :width], pool_scores[:, 0]  # the best of each pool, padded to the longest
