"""Decoder-only language models: GPT-2's shape and Llama's, in one configuration.

A stack of pre-norm blocks, ``x + attn(norm(x))`` then ``x + mlp(norm(x))``, over token
embeddings, with a final norm and a head onto the vocabulary (tied to the embeddings or
not). Positions are learned or sinusoidal embeddings added to the input, rotary
(``pos_embed="rope"``) or ALiBi inside the attention, or none. The sinusoidal table is
added times a learned scale that starts at ``embed_dim ** -0.5`` (x-transformers' "scaled
sinusoidal" form): added as it is, its rows (a norm of 8 at width 128) swamped token
embeddings initialised with a norm of 0.23, and a character model of Tiny Shakespeare
learned far more slowly than with the scale or learned positions (results page "Language
models", ``attnlab bench lm --parts extrapolation``).

The block never names an attention kind. It builds ``config.attention`` (by default
``"gqa"``: grouped-query heads, sliding window, QK-norm, a key/value cache) with the
options the config sets and the kind takes (an option set for a kind that does not take it
is refused by name), and, when generating, asks each layer's attention for its cache
(the contract in :mod:`attnlab.attention.registry`); a kind without one (``local``,
``sparse``, ``topk``, ``lsh``, ``linear``, ``performer``) is decoded by running the whole
sequence again. Per-layer choices are lists in the config: ``layer_types`` (``"sliding"``
or ``"full"``, or ``window_pattern``), ``rope_local_theta`` for the sliding layers and
``nope_layers`` without positions. The knobs of today's families (Qwen, Gemma, Phi, Llama
3, SmolLM3) are fields: ``head_dim``, ``attention_bias``/``attention_out_bias``/``mlp_bias``,
``rope_scaling``, ``partial_rotary``, ``attn_softcap``/``logit_softcap``,
``query_pre_attn_scalar``, ``post_norms``, ``embed_scale`` and ``mlp="geglu"``.

``forward(input_ids (B, L), *, padding_mask, doc_ids, positions, cache)`` gives logits
``(B, L, vocab_size)``. ``doc_ids`` ``(B, L)`` packs several documents in a row: no token
attends across a document boundary and positions restart at each document, so a packed
row computes what its documents would alone. ``generate`` and ``stream`` decode greedily or
sample through :mod:`attnlab.generation.search`, with the cache.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.cache import ModelCache
from ..attention.joined import KeepsJoinedWeights, bound_product, fused_linear, joined_weight
from ..attention.registry import build_attention, list_attention, attention_entry
from ..attention.rmsnorm import RMSNorm
from ..dropout import Dropout
from ..errors import InputError, shape_str
from ..layers.checkpointing import checkpointed
from ..layers.init import normal_init_
from ..layers.mlp import GeluMlp, SwiGLU
from ..layers.norms import build_norm
from ..layers.pos_encoding import sinusoid_table
from ..memory import available_memory, gib
from ..moved import former_names
from ..generation import search
from .gpt_config import LAYER_TYPES, MLPS, POS_EMBEDS, GPTConfig  # noqa: F401  (GPTConfig's home is gpt_config)
from .registry import build_config, register_model
from .token_ids import check_token_ids

__all__ = ["GPTConfig", "GPT", "SwiGLU", "GeluMlp", "document_positions"]



class DecoderBlock(nn.Module):
    """``x + drop(attn(norm1(x)))``, then ``x + drop(mlp(norm2(x)))``; with ``post_norms``,
    ``x + drop(post_attn_norm(attn(norm1(x))))`` and ``x + drop(post_mlp_norm(mlp(norm2(x))))``
    (Gemma 2 and 3). The attention is layer ``index``'s, as :meth:`GPTConfig.attention_options_of` says."""

    def __init__(self, cfg: GPTConfig, index: int) -> None:
        super().__init__()
        self.norm1 = build_norm(cfg.norm, cfg.embed_dim, cfg.norm_eps, bias=cfg.norm_bias)
        bias = cfg.bias if cfg.attention_bias is None else cfg.attention_bias
        self.attn = build_attention(cfg.attention_of(index), cfg.embed_dim, cfg.heads_of(index), dropout=cfg.attn_drop_rate,
                                    bias=bias, **cfg.attention_options_of(index))
        self.post_attn_norm = build_norm(cfg.norm, cfg.embed_dim, cfg.norm_eps, bias=cfg.norm_bias) if cfg.post_norms else None
        self.norm2 = build_norm(cfg.norm, cfg.embed_dim, cfg.norm_eps, bias=cfg.norm_bias)
        mlp_bias = cfg.bias if cfg.mlp_bias is None else cfg.mlp_bias
        if cfg.mlp in ("swiglu", "geglu"):
            self.mlp: nn.Module = SwiGLU(cfg.embed_dim, cfg.hidden_dim, bias=mlp_bias, drop_rate=cfg.drop_rate,
                                         act="silu" if cfg.mlp == "swiglu" else "gelu_tanh")
        else:
            self.mlp = GeluMlp(cfg.embed_dim, cfg.hidden_dim, tanh=cfg.mlp == "gelu_tanh", bias=mlp_bias,
                               drop_rate=cfg.drop_rate)
        self.post_mlp_norm = build_norm(cfg.norm, cfg.embed_dim, cfg.norm_eps, bias=cfg.norm_bias) if cfg.post_norms else None
        self.drop = Dropout(cfg.drop_rate)

    def forward(self, x: Tensor, *, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
                positions: Tensor | None, cache: Any) -> Tensor:
        kw: dict[str, Any] = {}
        if positions is not None:
            kw["positions"] = positions
        if cache is not None:
            kw["cache"] = cache
        h, _ = self.attn(self.norm1(x), key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=True, **kw)
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
        x = x + self.drop(h)
        h = self.mlp(self.norm2(x))
        if self.post_mlp_norm is not None:
            h = self.post_mlp_norm(h)
        return x + self.drop(h)

    def step_function(self, dtype: torch.dtype) -> Callable[..., Tensor]:
        """:meth:`forward` of one token per row ``(B, E)`` in eval mode, as a function
        ``step(x, cache, positions, key_padding_mask)`` made once per generation: the
        attention's ``decode_step``, the MLP's joined weights and the norms bound to it. A
        small model's step spends about half its time outside the arithmetic, much of it in
        looking up modules and weights; bound, they are looked up once."""
        attend, mlp = self.attn.decode_step, self.mlp.step_function()
        norm1, norm2 = _step_norm(self.norm1, dtype), _step_norm(self.norm2, dtype)
        if self.post_attn_norm is None and self.post_mlp_norm is None:
            def step(x: Tensor, cache: Any, positions: Tensor | None, key_padding_mask: Tensor | None) -> Tensor:
                x = x + attend(norm1(x), cache, positions=positions, key_padding_mask=key_padding_mask)
                return x + mlp(norm2(x))
            return step
        post_attn, post_mlp = _step_norm(self.post_attn_norm, dtype), _step_norm(self.post_mlp_norm, dtype)

        def step_post_norms(x: Tensor, cache: Any, positions: Tensor | None,
                            key_padding_mask: Tensor | None) -> Tensor:
            x = x + post_attn(attend(norm1(x), cache, positions=positions, key_padding_mask=key_padding_mask))
            return x + post_mlp(mlp(norm2(x)))
        return step_post_norms


def _step_norm(norm: nn.Module | None, dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
    """``norm`` for a decoding step's ``(B, E)``. An RMSNorm of float32 is written out in
    operators that give F.rms_norm's bits (its CPU kernel is these operators, plus two casts of
    the scalars it is given as numbers; results page "Why the fast paths", step-norm)."""
    if norm is None:
        return lambda x: x
    if type(norm) is RMSNorm and dtype == torch.float32:
        weight = norm.weight
        size = torch.tensor(float(weight.shape[0]), device=weight.device)
        eps = torch.tensor(norm.eps, device=weight.device)
        return lambda x: x * x.pow(2).sum(-1, keepdim=True).div_(size).add_(eps).rsqrt_() * weight
    return norm


def document_positions(doc_ids: Tensor) -> Tensor:
    """``(B, L)`` positions that restart at 0 where ``doc_ids`` ``(B, L)`` changes."""
    index = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


class GPT(KeepsJoinedWeights, nn.Module):
    """A decoder-only language model (see the module docstring)."""

    def __init__(self, config: GPTConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = build_config(GPTConfig, asdict(config or GPTConfig()), overrides)
        self.config = cfg
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        if cfg.pos_embed == "learned":
            self.pos_embed: nn.Module | None = nn.Embedding(cfg.max_len, cfg.embed_dim)
        else:
            self.pos_embed = None
        if cfg.pos_embed == "sinusoidal":
            self.register_buffer("sinusoid", sinusoid_table(cfg.max_len, cfg.embed_dim), persistent=False)
            self.sinusoid_scale = nn.Parameter(torch.tensor(cfg.embed_dim ** -0.5))
        self.drop = Dropout(cfg.drop_rate)
        self.blocks = nn.ModuleList(DecoderBlock(cfg, i) for i in range(cfg.depth))
        self.norm = build_norm(cfg.norm, cfg.embed_dim, cfg.norm_eps, bias=cfg.norm_bias)
        self.head = nn.Linear(cfg.embed_dim, cfg.vocab_size, bias=False)
        self.apply(normal_init_)  # GPT-2's initialisation
        if cfg.tie_embeddings:
            self.head.weight = self.tok_embed.weight

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in backward instead of storing them (training
        with gradients only; ``config.grad_checkpointing`` says the same)."""
        self.config.grad_checkpointing = bool(enable)

    def shard_blocks(self) -> list[nn.Module]:
        """Its decoder blocks: the units sharded training gathers one at a time
        (:mod:`attnlab.engine.sharding`); the embeddings, final norm and head are the rest."""
        return list(self.blocks)

    # ------------------------------------------------------------------ the cache
    @property
    def keeps_cache(self) -> bool:
        """Whether every layer's attention decodes with a cache of its own."""
        kinds = {self.config.attention_of(i) for i in range(self.config.depth)}
        return all(attention_entry(k).capabilities.cache for k in kinds)

    def new_cache(self, batch: int, capacity: int, *, cache_window: int | None = None,
                  sink_tokens: int = 0) -> ModelCache:
        """Each layer's cache, made by its attention, for ``batch`` rows and at most ``capacity``
        positions. ``cache_window`` and ``sink_tokens``: a streaming cache in the layers whose attention
        keeps keys (``exact`` and the kinds built on it; a recurrent state is flat already): each
        token sees the first ``sink_tokens`` positions and the last ``cache_window`` (StreamingLLM)."""
        if not self.keeps_cache:
            keeping = [k for k in list_attention("tokens") if attention_entry(k).capabilities.cache]
            raise InputError(f"attention {self.config.attention!r} decodes without a cache; kinds that keep one: "
                             f"{', '.join(keeping)}")
        weight = self.tok_embed.weight
        policy = self._streaming_policy(cache_window, sink_tokens)
        return ModelCache(block.attn.new_cache(batch, capacity, dtype=weight.dtype, device=weight.device,
                                                **(policy if streams else {}))
                           for block, streams in zip(self.blocks, self._streaming_layers()))

    def _streaming_layers(self) -> list[bool]:
        """Per layer, whether its attention's cache takes a streaming policy (its kind declares it)."""
        return [attention_entry(self.config.attention_of(i)).capabilities.streaming for i in range(self.config.depth)]

    def _streaming_policy(self, cache_window: int | None, sink_tokens: int) -> dict[str, int]:
        """``{"cache_window": ..., "sink_tokens": ...}`` for a streaming generation, ``{}``
        otherwise; refused in one line where no layer keeps keys to stream."""
        if cache_window is None and not sink_tokens:
            return {}
        if cache_window is None or isinstance(cache_window, bool) or not isinstance(cache_window, int) \
                or cache_window < 1:
            raise InputError(f"cache_window must be a positive number of positions when streaming; got "
                             f"{cache_window!r}")
        if not any(self._streaming_layers()):
            raise InputError(f"attention {self.config.attention!r} keeps no keys to stream: cache_window and "
                             f"sink_tokens are for the exact kind and the kinds built on it")
        return {"cache_window": cache_window, "sink_tokens": sink_tokens}

    def check_generation_size(self, batch: int, prompt: int, max_new_tokens: int, *, use_cache: bool = True,
                              cache_window: int | None = None, sink_tokens: int = 0) -> None:
        """Refuse, before the first step, a generation the model cannot hold: more positions
        than learned or sinusoidal positions have, or a cache that could not fit in this
        machine's memory (its buffers grow as it goes, so a long ``max_new_tokens`` that ends
        early costs nothing), with the limit it implies. ``cache_window`` and ``sink_tokens``: a
        streaming generation's policy, under which the layers that stream hold that window only."""
        cfg, total = self.config, prompt + max_new_tokens
        if cfg.pos_embed in ("learned", "sinusoidal") and total > cfg.max_len:
            raise InputError(f"prompt and max_new_tokens make {total} positions; the model holds max_len={cfg.max_len}")
        if not (use_cache and self.keeps_cache):
            return
        dtype = self.tok_embed.weight.dtype
        room = available_memory()
        policy = self._streaming_policy(cache_window, sink_tokens)
        cost = lambda n: sum(block.attn.cache_bytes(batch, n, dtype, **(policy if streams else {}))  # noqa: E731
                             for block, streams in zip(self.blocks, self._streaming_layers()))
        if room is None or cost(total) <= room:
            return
        per_position = max(cost(prompt + 1) - cost(prompt), 1)
        limit = max(room // per_position - prompt, 0)
        raise InputError(f"max_new_tokens must be at most {limit:,} for a batch of {batch} prompt(s) of {prompt} "
                         f"tokens: the key/value cache takes {per_position:,} bytes a position and this machine "
                         f"has {gib(room)} available; got {max_new_tokens:,}")

    # ------------------------------------------------------------------ forward
    def _embed(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        cfg = self.config
        x = self.tok_embed(input_ids)
        if cfg.embed_scale is not None:  # in the embeddings' dtype, as Gemma rounds it
            x = x * torch.tensor(cfg.embed_scale, dtype=x.dtype)
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions)
        elif cfg.pos_embed == "sinusoidal":
            x = x + (self.sinusoid_scale * self.sinusoid[positions]).to(x.dtype)
        return x

    def _logits(self, x: Tensor) -> Tensor:
        logits = fused_linear(self, "head", (self.head,), self.norm(x))[0]
        cap = self.config.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def forward(self, input_ids: Tensor, *, padding_mask: Tensor | None = None, doc_ids: Tensor | None = None,
                positions: Tensor | None = None, cache: ModelCache | None = None) -> Tensor:
        cfg = self.config
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
            raise InputError(f"input_ids must be (B, L) integer token ids; got {shape_str(input_ids)} "
                             f"{input_ids.dtype}")
        check_token_ids(input_ids, cfg.vocab_size)
        b, n = input_ids.shape
        past = cache.seq_len if cache else 0
        last = None  # the largest position, when known without reading the tensor (no host sync)
        if positions is None:
            if doc_ids is not None:
                positions = document_positions(doc_ids)
            else:
                positions, last = torch.arange(past, past + n, device=input_ids.device), past + n - 1
        if cfg.pos_embed in ("learned", "sinusoidal"):
            last = int(positions.max()) if last is None else last
            if last >= cfg.max_len:
                raise InputError(f"positions reach {last}; the model's {cfg.pos_embed} positions hold "
                                 f"max_len={cfg.max_len}")
        x = self.drop(self._embed(input_ids, positions))
        attn_mask = None
        if doc_ids is not None:  # packing: a token sees its own document only
            if cache is not None:
                raise InputError("doc_ids pack documents for training and scoring; generation takes no doc_ids")
            # A row of one document (and, at the end of a split, padding with a negative id, which the causal
            # mask already hides from it) needs no mask: the fused causal kernel is 12-25% faster per step.
            if not bool(((doc_ids == doc_ids[:, :1]) | (doc_ids < 0)).all()):
                attn_mask = (doc_ids[:, :, None] != doc_ids[:, None, :])[:, None]  # (B, 1, L, L), True = blocked
        rope_positions = positions if cfg.pos_embed == "rope" else None
        recompute = cfg.grad_checkpointing and self.training and torch.is_grad_enabled() and not cache
        for i, block in enumerate(self.blocks):
            if recompute:  # the block's activations recomputed in backward instead of kept
                x = checkpointed(block, x, attn_mask=attn_mask, key_padding_mask=padding_mask, positions=rope_positions,
                                 cache=None)
                continue
            x = block(x, attn_mask=attn_mask, key_padding_mask=padding_mask, positions=rope_positions,
                      cache=cache[i] if cache else None)
        return self._logits(x)

    @property
    def has_decode_step(self) -> bool:
        """Whether every layer's attention has the lean one-token step (the contract's ``decode_step``)."""
        return self.keeps_cache and all(attention_entry(self.config.attention_of(i)).capabilities.decode_step
                                        for i in range(self.config.depth))

    def decode_step(self, ids: Tensor, cache: ModelCache, *, positions: Tensor | None = None,
                    padding_mask: Tensor | None = None) -> Tensor:
        """Logits ``(B, vocab)`` of one new token per row, ``ids`` ``(B, 1)``: :meth:`forward`
        with the cache, in eval mode, on a ``(B, E)`` hidden state through each layer's
        attention's ``decode_step``. ``positions`` ``(B, 1)`` for left-padded prompts, else the
        cache's next position; ``padding_mask`` ``(B, positions seen + 1)``. The MLPs' joined
        weights are fetched once per generation and kept in ``cache.scratch``."""
        cfg = self.config
        scratch = cache.scratch
        steps = scratch.get("steps")
        if steps is None:
            dtype = self.tok_embed.weight.dtype
            steps = scratch["steps"] = [block.step_function(dtype) for block in self.blocks]
            scratch["final"] = _step_norm(self.norm, dtype), bound_product(*joined_weight(self, "head", (self.head,)))
            shared = scratch["shared"] = {}  # what the layers share within a step (the rotary angles)
            for layer_cache in cache:  # a kind with a decode step keeps a scratch dict in its cache (the contract)
                layer_cache.scratch["shared"] = shared
            if cfg.embed_scale is not None:
                scratch["embed_scale"] = torch.tensor(cfg.embed_scale, dtype=dtype)
        embed = self.tok_embed
        x = F.embedding(ids.reshape(-1), embed.weight) if type(embed) is nn.Embedding and embed.max_norm is None \
            else embed(ids[:, 0])
        if cfg.embed_scale is not None:
            x = x * scratch["embed_scale"]
        if cfg.pos_embed in ("learned", "sinusoidal"):
            pos = positions[:, 0] if positions is not None else torch.full_like(ids[:, 0], cache.seq_len)
            x = x + (self.pos_embed(pos) if self.pos_embed is not None else
                     (self.sinusoid_scale * self.sinusoid[pos]).to(x.dtype))
        rope_positions = positions if cfg.pos_embed == "rope" else None
        for step, layer_cache in zip(steps, cache):
            x = step(x, layer_cache, rope_positions, padding_mask)
        final_norm, head = scratch["final"]
        logits = head(final_norm(x))
        cap = cfg.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, **options: Any) -> Tensor:
        """``(B, L + n)`` ids, ``n <= max_new_tokens``: the prompts ``input_ids`` ``(B, L)`` and what
        follows, chosen as :func:`attnlab.generation.search.generate` says (greedy by default;
        ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``, ``seed``,
        ``eos_id``, ``padding_mask`` for left-padded prompts, ``compile``, ``use_cache``, ``decodable``: the
        number of ids the tokenizer decodes, past which the embedding's rows are never chosen)."""
        return search.generate(self, input_ids, max_new_tokens, **options)

    def stream(self, input_ids: Tensor, max_new_tokens: int, **options: Any) -> Iterator[Tensor]:
        """The next token of every row, ``(B,)``, one step after the other, as :meth:`generate`
        chooses them (:func:`attnlab.generation.search.stream`)."""
        return search.stream(self, input_ids, max_new_tokens, **options)


def _gpt(defaults: dict[str, Any], overrides: dict[str, Any]) -> GPT:
    return GPT(build_config(GPTConfig, defaults, overrides))


@register_model("lm")
def gpt_tiny(**overrides: Any) -> GPT:
    """A tiny decoder-only model for tests and character models: 4 layers of width 128."""
    return _gpt(dict(vocab_size=256, max_len=256, embed_dim=128, depth=4, num_heads=4), overrides)


@register_model("lm")
def gpt_small(**overrides: Any) -> GPT:
    """GPT-2 small's shape: 12 layers of width 768, 12 heads, context 1,024, GELU (tanh)."""
    return _gpt(dict(mlp="gelu_tanh"), overrides)


@register_model("lm")
def llama_tiny(**overrides: Any) -> GPT:
    """A tiny Llama-style model: RMSNorm, SwiGLU, rotary positions, 8 query and 2 key/value
    heads, no biases, untied head; 4 layers of width 256."""
    return _gpt(dict(vocab_size=256, max_len=2048, embed_dim=256, depth=4, num_heads=8, num_kv_heads=2,
                     mlp="swiglu", mlp_hidden_dim=688, norm="rmsnorm", norm_eps=1e-6, pos_embed="rope",
                     bias=False, tie_embeddings=False), overrides)


__getattr__ = former_names(__name__)  # LayerCaches, now attnlab.attention.cache.ModelCache
