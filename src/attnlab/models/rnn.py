"""The recurrent encoder-decoder with attention that the Transformer replaced: a
bidirectional GRU encoder and a GRU decoder that attends to the encoder's states at every
step, with additive attention (Bahdanau, Cho and Bengio, 2015, "Neural Machine Translation
by Jointly Learning to Align and Translate") or multiplicative attention (Luong, Pham and
Manning, 2015, their "general" score).

At decoder step ``t``, with state ``s_{t-1}`` and encoder states ``h_1 .. h_n``:

* additive:        ``e_tj = v^T tanh(W s_{t-1} + U h_j)``
* multiplicative:  ``e_tj = s_{t-1}^T W h_j``

``a_t = softmax_j(e_t)`` over the real (unpadded) source positions, the context
``c_t = sum_j a_tj h_j``, the new state ``s_t = GRU([y_{t-1}; c_t], s_{t-1})`` and the
logits ``W_o [s_t; c_t; y_{t-1}]``. The first state is ``tanh(W_0 mean_j h_j)``.

What the tutorials say of it, and what :mod:`attnlab.tasks.translation` measures (the
README's translation table): the decoder is a loop over target positions even in
training (teacher forcing), where the Transformer's decoder computes every position at
once; the encoder is a loop over source positions in each direction. The same
translation task trains, decodes (greedy and beam search, :mod:`.generation`), scores
and draws it: its alignments are the decoder attention's weights, one row per step.

Shapes: ``src`` ``(B, Ls)``, ``tgt`` ``(B, Lt)`` token ids -> logits ``(B, Lt, V)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor, nn

from ..dropout import Dropout
from ..errors import InputError
from ..generation.search import translate
from .registry import build_config, register_model
from .token_ids import check_token_ids

__all__ = ["RNNSeq2SeqConfig", "RNNSeq2Seq", "AlignmentAttention", "RNNCache"]

SCORES = ("additive", "multiplicative")


@dataclass
class RNNSeq2SeqConfig:
    """Configuration of :class:`RNNSeq2Seq`; defaults are ``gru_attention_small``."""

    src_vocab_size: int = 10000
    tgt_vocab_size: int = 10000
    embed_dim: int = 256
    hidden_dim: int = 256  # the decoder's state, and each direction of the encoder's
    score: str = "additive"  # additive (Bahdanau) or multiplicative (Luong's "general")
    drop_rate: float = 0.3
    max_len: int = 1024  # the longest generation by default
    share_embeddings: bool = False  # one table for source and target (needs one vocabulary)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "embed_dim", "hidden_dim", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(f"{name} must be a positive integer; got {value!r}")
        if self.score not in SCORES:
            raise InputError(f"score must be one of {', '.join(map(repr, SCORES))}; got {self.score!r}")
        if not 0.0 <= self.drop_rate < 1.0:
            raise InputError(f"drop_rate must be in [0, 1); got {self.drop_rate}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise InputError(f"share_embeddings needs src_vocab_size == tgt_vocab_size; got {self.src_vocab_size} "
                             f"and {self.tgt_vocab_size}")
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            raise InputError(f"pad_id, bos_id and eos_id must differ; got {self.pad_id}, {self.bos_id}, {self.eos_id}")


class AlignmentAttention(nn.Module):
    """One decoder step's attention over the encoder states: ``(state (B, H), keys, memory,
    padding) -> (context (B, 2H), weights (B, Ls))``. ``keys`` are :meth:`keys` of the
    memory, computed once per sentence. Records its weights ``(B, 1, 1, Ls)`` (one head,
    one query) under :func:`~attnlab.attention.capture_attention`."""

    forms_weights = True  # capture_attention records it
    _attn_capture: Callable[[Tensor], None] | None = None

    def __init__(self, hidden_dim: int, memory_dim: int, score: str) -> None:
        super().__init__()
        self.score = score
        if score == "additive":
            self.query = nn.Linear(hidden_dim, hidden_dim, bias=False)  # W
            self.key = nn.Linear(memory_dim, hidden_dim)  # U
            self.v = nn.Linear(hidden_dim, 1, bias=False)
        else:
            self.key = nn.Linear(memory_dim, hidden_dim, bias=False)  # W of s^T W h

    def keys(self, memory: Tensor) -> Tensor:
        """``U h_j`` (additive) or ``W h_j`` (multiplicative): ``(B, Ls, H)``."""
        return self.key(memory)

    def forward(self, state: Tensor, keys: Tensor, memory: Tensor, pad: Tensor | None) -> tuple[Tensor, Tensor]:
        if self.score == "additive":
            scores = self.v(torch.tanh(keys + self.query(state).unsqueeze(1))).squeeze(-1)  # (B, Ls)
        else:
            scores = torch.bmm(keys, state.unsqueeze(-1)).squeeze(-1)
        if pad is not None:
            scores = scores.masked_fill(pad, float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(memory.dtype)
        if self._attn_capture is not None:
            self._attn_capture(weights[:, None, None, :])
        return torch.bmm(weights.unsqueeze(1), memory).squeeze(1), weights


@dataclass
class RNNCache:
    """Decoding state kept between steps: the decoder's state ``(B, H)``, the attention
    keys of the memory, and the number of positions decoded."""

    state: Tensor | None = None
    keys: Tensor | None = None
    seq_len: int = 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: reorder beams, drop finished sentences)."""
        if self.state is not None:
            self.state = self.state.index_select(0, index)
            self.keys = self.keys.index_select(0, index)  # type: ignore[union-attr]


class RNNSeq2Seq(nn.Module):
    """Bidirectional GRU encoder, GRU decoder with additive or multiplicative attention
    (see the module docstring). ``encode``, ``decode`` and ``new_cache`` are those that
    :mod:`.generation` decodes with, as for :class:`~attnlab.models.Seq2SeqTransformer`."""

    alignment_modules: ClassVar[str] = "attention"  # what the translation task draws as alignments

    def __init__(self, config: RNNSeq2SeqConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = build_config(RNNSeq2SeqConfig, asdict(config or RNNSeq2SeqConfig()), overrides)
        self.config = cfg
        e, h = cfg.embed_dim, cfg.hidden_dim
        self.src_embed = nn.Embedding(cfg.src_vocab_size, e, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab_size, e,
                                                                                 padding_idx=cfg.pad_id)
        self.encoder = nn.GRU(e, h, batch_first=True, bidirectional=True)
        self.init_state = nn.Linear(2 * h, h)
        self.attention = AlignmentAttention(h, 2 * h, cfg.score)
        self.decoder = nn.GRUCell(e + 2 * h, h)
        self.pre_output = nn.Linear(h + 2 * h + e, h)
        self.generator = nn.Linear(h, cfg.tgt_vocab_size)
        self.drop = Dropout(cfg.drop_rate)

    def _check_ids(self, name: str, ids: Tensor) -> None:
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise InputError(f"{name} must be integer token ids of shape (B, L); got {ids.dtype} {tuple(ids.shape)}")
        size = "src_vocab_size" if name == "src" else "tgt_vocab_size"
        check_token_ids(ids, getattr(self.config, size), name, size)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """``src`` ``(B, Ls)`` -> memory ``(B, Ls, 2H)`` (both directions' states) and its
        padding mask ``(B, Ls)``. Padding is packed away: it changes no real state."""
        self._check_ids("src", src)
        pad = src == self.config.pad_id
        lengths = (~pad).sum(1).clamp_min(1).cpu()
        x = self.drop(self.src_embed(src))
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.encoder(packed)
        memory, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        return memory, pad

    def new_cache(self, batch: int | None = None, capacity: int | None = None) -> RNNCache:
        """The decoder's state between steps (the protocol of :mod:`attnlab.generation.search`;
        a recurrent state has no positions to size)."""
        return RNNCache()

    def decode(self, tgt: Tensor, memory: Tensor, memory_pad: Tensor | None, *, cache: RNNCache | None = None,
               last_only: bool = False) -> Tensor:
        """Logits ``(B, Lt, V)`` for decoder input ``tgt`` ``(B, Lt)`` (``(B, 1, V)`` with
        ``last_only``); with a cache, ``tgt`` holds only the new positions and the cache
        keeps the state after them."""
        self._check_ids("tgt", tgt)
        if memory.shape[0] != tgt.shape[0]:
            raise InputError(f"memory must have tgt's batch size {tgt.shape[0]}; got shape {tuple(memory.shape)}")
        if cache is not None and cache.state is not None:
            state, keys = cache.state, cache.keys
        else:
            real = (~memory_pad).unsqueeze(-1).to(memory.dtype) if memory_pad is not None else None
            mean = memory.mean(1) if real is None else (memory * real).sum(1) / real.sum(1).clamp_min(1.0)
            state, keys = torch.tanh(self.init_state(mean)), self.attention.keys(memory)
        emb = self.drop(self.tgt_embed(tgt))
        outputs = []
        for t in range(tgt.shape[1]):
            context, _ = self.attention(state, keys, memory, memory_pad)
            state = self.decoder(torch.cat([emb[:, t], context], dim=-1), state)
            outputs.append(torch.cat([state, context, emb[:, t]], dim=-1))
        if cache is not None:
            cache.state, cache.keys, cache.seq_len = state, keys, cache.seq_len + tgt.shape[1]
        out = torch.stack(outputs[-1:] if last_only else outputs, dim=1)
        return self.generator(self.drop(torch.tanh(self.pre_output(out))))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        memory, pad = self.encode(src)
        return self.decode(tgt, memory, pad)

    @torch.no_grad()
    def generate(self, src: Tensor, *, max_new_tokens: int | None = None, num_beams: int = 1,
                 **options: Any) -> Tensor:
        """Translate ``src`` ``(B, Ls)``: token ids ``(B, T)`` without BOS, as
        :meth:`Seq2SeqTransformer.generate <attnlab.models.Seq2SeqTransformer.generate>`."""
        self._check_ids("src", src)
        n = min(self.config.max_len, src.shape[1] + 50) if max_new_tokens is None else max_new_tokens
        if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
            raise InputError(f"num_beams must be a positive integer; got {num_beams!r}")
        return translate(self, src, n, num_beams=num_beams, **options)[0]


@register_model("rnn")
def gru_attention_small(**overrides) -> RNNSeq2Seq:
    """Bidirectional GRU encoder, GRU decoder with additive (Bahdanau) attention; width 256, Multi30k-sized."""
    return RNNSeq2Seq(RNNSeq2SeqConfig(), **overrides)


@register_model("rnn")
def gru_attention_tiny(**overrides) -> RNNSeq2Seq:
    """The GRU encoder-decoder at width 64 with a 1k vocabulary: tests and demos."""
    return RNNSeq2Seq(RNNSeq2SeqConfig(src_vocab_size=1000, tgt_vocab_size=1000, embed_dim=64, hidden_dim=64,
                                       max_len=512), **overrides)
