"""Greedy and beam-search decoding for encoder-decoder models.

A model is usable here when it has ``encode(src) -> (memory, memory_pad)``,
``decode(tgt, memory, memory_pad, cache=..., last_only=...) -> logits``, ``new_cache()`` and a
``config`` with ``pad_id``, ``bos_id`` and ``eos_id``.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["greedy_search", "beam_search"]


class EncoderDecoder(Protocol):
    config: Any

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]: ...
    def decode(
        self, tgt: Tensor, memory: Tensor, memory_pad: Tensor | None, *, cache: Any = None, last_only: bool = False
    ) -> Tensor: ...
    def new_cache(self) -> Any: ...


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
    cache = model.new_cache() if use_cache else None
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
    cache = model.new_cache() if use_cache else None

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
