"""Decoder-only language models: GPT-2's shape and Llama's, in one configuration.

A stack of pre-norm blocks, ``x + attn(norm(x))`` then ``x + mlp(norm(x))``, over token
embeddings, with a final norm and a head onto the vocabulary (tied to the embeddings or
not). Positions are learned or sinusoidal embeddings added to the input, rotary
(``pos_embed="rope"``) or ALiBi inside the attention, or none. The sinusoidal table is
added times a learned scale that starts at ``embed_dim ** -0.5`` (x-transformers' "scaled
sinusoidal" form): added as it is, its rows (a norm of 8 at width 128) swamped token
embeddings initialised with a norm of 0.23, and a character model of Tiny Shakespeare
reached a validation loss of 3.32 nats after 300 steps, against 2.44 with the scale and 2.40
with learned positions (``attnlab bench lm --parts extrapolation``, AVX2 EPYC). The attention is the
``"gqa"`` kind (grouped-query heads, sliding window, QK-norm, a key/value cache) or any
tokens kind that can be causal (``local``, ``sparse``, ``topk``, ``lsh``, ``linear``,
``performer``), which decodes without a cache; rotary positions reach those that take them
(all but the kernel kinds, ``linear`` and ``performer``), and ``window`` reaches ``local``.

``forward(input_ids (B, L), *, padding_mask, doc_ids, positions, cache)`` gives logits
``(B, L, vocab_size)``. ``doc_ids`` ``(B, L)`` packs several documents in a row: no token
attends across a document boundary and positions restart at each document, so a packed
row computes what its documents would alone. ``generate`` decodes greedily or samples
(temperature, top-k, top-p, a seed) with the cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.cache import DecodingCache
from ..attention.grouped import fused_linear, joined_weight, product
from ..attention.registry import attention_family, attention_takes, build_attention
from ..dropout import Dropout
from ..errors import InputError, shape_str
from ..layers.init import normal_init_
from ..layers.norms import build_norm
from ..layers.pos_encoding import inner_position_options, sinusoid_table
from ..memory import available_memory, gib
from .registry import build_config, check_attention_options, check_attention_positions, register_model
from .sampling import check_generation, choose_next, penalize_repeats
from .token_ids import check_token_ids

__all__ = ["GPTConfig", "GPT", "SwiGLU", "GeluMlp", "document_positions"]

POS_EMBEDS = ("learned", "sinusoidal", "rope", "alibi", "none")
MLPS = ("gelu", "gelu_tanh", "swiglu")


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    max_len: int = 1024  # the longest context (learned positions have this many rows)
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    num_kv_heads: int | None = None  # grouped-query attention (None: num_heads; 1: multi-query)
    mlp_ratio: float = 4.0
    mlp_hidden_dim: int | None = None  # the MLP width itself (Llama's intermediate_size); overrides mlp_ratio
    mlp: str = "gelu"  # "gelu", "gelu_tanh" (GPT-2's), "swiglu" (Llama's)
    norm: str = "layernorm"  # or "rmsnorm"
    norm_eps: float = 1e-5
    pos_embed: str = "learned"  # learned, sinusoidal, rope, alibi, none
    rope_theta: float = 10000.0
    window: int | None = None  # sliding-window attention: each token sees the last `window` tokens
    qk_norm: bool = False
    bias: bool = True  # biases of the attention projections, the MLP and the norms' (layernorm)
    tie_embeddings: bool = True
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    attention: str = "gqa"
    attention_options: dict = field(default_factory=dict)
    grad_checkpointing: bool = False

    renamed: ClassVar[dict[str, str]] = {"n_layer": "depth", "n_head": "num_heads", "n_embd": "embed_dim",
                                          "dropout": "drop_rate", "block_size": "max_len"}

    def __post_init__(self) -> None:
        if self.pos_embed not in POS_EMBEDS:
            raise InputError(f"pos_embed must be one of {', '.join(POS_EMBEDS)}; got {self.pos_embed!r}")
        if self.mlp not in MLPS:
            raise InputError(f"mlp must be one of {', '.join(MLPS)}; got {self.mlp!r}")
        if attention_family(self.attention) != "tokens":
            raise InputError(f"attention must be a 'tokens' kind; {self.attention!r} is a grid kind")
        window = self.window is not None and not attention_takes(self.attention, "window")
        if self.attention != "gqa":
            if self.num_kv_heads is not None or window or self.qk_norm:
                raise InputError(f"num_kv_heads, window and qk_norm are options of the 'gqa' attention (window also "
                                 f"of 'local'); attention={self.attention!r} has none of them")
            if self.attention == "exact" and self.pos_embed in ("rope", "alibi"):
                raise InputError(f"exact attention with pos_embed={self.pos_embed!r} is the 'gqa' kind here (it keeps "
                                 f"a cache and takes each row's positions): use attention='gqa'")
            inner_position_options(self.pos_embed, self.rope_theta, self.attention)  # a kind that cannot take them
        check_attention_options(self.attention_options, {"dropout": "attn_drop_rate", "bias": "bias",
                                                         "num_kv_heads": "num_kv_heads", "window": "window",
                                                         "rope": "pos_embed", "alibi": "pos_embed",
                                                         "rope_theta": "rope_theta"})
        if isinstance(self.max_len, int):
            check_attention_positions(GPTConfig, self.attention, self.attention_options, self.max_len)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def hidden_dim(self) -> int:
        return self.mlp_hidden_dim if self.mlp_hidden_dim is not None else round(self.embed_dim * self.mlp_ratio)


class GeluMlp(nn.Module):
    """``c_proj(gelu(c_fc(x)))``, GPT-2's MLP (``gelu_tanh``: its tanh approximation)."""

    lora_role = "mlp"  # LoRA (attnlab.layers.lora): c_fc and c_proj are feed-forward layers

    def __init__(self, dim: int, hidden: int, *, tanh: bool, bias: bool, drop_rate: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, dim, bias=bias)
        self.approximate = "tanh" if tanh else "none"
        self.drop = Dropout(drop_rate)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(fused_linear(self, "fc", (self.c_fc,), x)[0], approximate=self.approximate)
        return fused_linear(self, "proj", (self.c_proj,), self.drop(h))[0]

    def decode_weights(self) -> tuple[Tensor | None, ...]:
        return (*joined_weight(self, "fc", (self.c_fc,)), *joined_weight(self, "proj", (self.c_proj,)))

    def decode(self, x: Tensor, w: tuple[Tensor | None, ...]) -> Tensor:
        """:meth:`forward` in eval mode with :meth:`decode_weights`, fetched once per generation."""
        return product(F.gelu(product(x, w[0], w[1]), approximate=self.approximate), w[2], w[3])  # type: ignore[arg-type]


class SwiGLU(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Shazeer, 2020), Llama's MLP."""

    lora_role = "mlp"  # LoRA (attnlab.layers.lora): gate_proj, up_proj and down_proj

    def __init__(self, dim: int, hidden: int, *, bias: bool, drop_rate: float) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.drop = Dropout(drop_rate)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = fused_linear(self, "gate_up", (self.gate_proj, self.up_proj), x)
        return fused_linear(self, "down", (self.down_proj,), self.drop(F.silu(gate) * up))[0]

    def decode_weights(self) -> tuple[Tensor | None, ...]:
        return (*joined_weight(self, "gate_up", (self.gate_proj, self.up_proj)),
                *joined_weight(self, "down", (self.down_proj,)))

    def decode(self, x: Tensor, w: tuple[Tensor | None, ...]) -> Tensor:
        """:meth:`forward` in eval mode with :meth:`decode_weights`, fetched once per generation."""
        gate, up = product(x, w[0], w[1]).chunk(2, dim=-1)  # type: ignore[arg-type]
        return product(F.silu(gate) * up, w[2], w[3])  # type: ignore[arg-type]


class DecoderBlock(nn.Module):
    """``x + drop(attn(norm1(x)))``, then ``x + drop(mlp(norm2(x)))``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        options: dict[str, Any] = dict(cfg.attention_options)
        if cfg.attention == "gqa":
            options.update(num_kv_heads=cfg.num_kv_heads, rope=cfg.pos_embed == "rope", rope_theta=cfg.rope_theta,
                           alibi=cfg.pos_embed == "alibi", window=cfg.window, qk_norm=cfg.qk_norm)
        else:
            options.update(inner_position_options(cfg.pos_embed, cfg.rope_theta, cfg.attention))
            if cfg.window is not None:  # one name for the sliding window: the local kind's means the same
                options["window"] = cfg.window
        self.norm1 = build_norm(cfg.norm, cfg.embed_dim, cfg.norm_eps)
        self.attn = build_attention(cfg.attention, cfg.embed_dim, cfg.num_heads, dropout=cfg.attn_drop_rate,
                                    bias=cfg.bias, **options)
        self.norm2 = build_norm(cfg.norm, cfg.embed_dim, cfg.norm_eps)
        if cfg.mlp == "swiglu":
            self.mlp: nn.Module = SwiGLU(cfg.embed_dim, cfg.hidden_dim, bias=cfg.bias, drop_rate=cfg.drop_rate)
        else:
            self.mlp = GeluMlp(cfg.embed_dim, cfg.hidden_dim, tanh=cfg.mlp == "gelu_tanh", bias=cfg.bias,
                               drop_rate=cfg.drop_rate)
        self.drop = Dropout(cfg.drop_rate)

    def forward(self, x: Tensor, *, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
                positions: Tensor | None, cache: DecodingCache | None) -> Tensor:
        kw: dict[str, Any] = {"positions": positions, "cache": cache} if isinstance(cache, DecodingCache) or \
            positions is not None else {}
        h, _ = self.attn(self.norm1(x), key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=True, **kw)
        x = x + self.drop(h)
        return x + self.drop(self.mlp(self.norm2(x)))


def document_positions(doc_ids: Tensor) -> Tensor:
    """``(B, L)`` positions that restart at 0 where ``doc_ids`` ``(B, L)`` changes."""
    index = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


class GPT(nn.Module):
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
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.depth))
        self.norm = build_norm(cfg.norm, cfg.embed_dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.embed_dim, cfg.vocab_size, bias=False)
        self.apply(normal_init_)  # GPT-2's initialisation
        if cfg.tie_embeddings:
            self.head.weight = self.tok_embed.weight

    def new_cache(self, capacity: int) -> list[DecodingCache]:
        """One :class:`DecodingCache` per block, for at most ``capacity`` positions."""
        if self.config.attention != "gqa":
            raise InputError(f"attention {self.config.attention!r} decodes without a cache; only 'gqa' keeps one")
        return [DecodingCache(capacity, window=self.config.window) for _ in self.blocks]

    def forward(self, input_ids: Tensor, *, padding_mask: Tensor | None = None, doc_ids: Tensor | None = None,
                positions: Tensor | None = None, cache: list[DecodingCache] | None = None) -> Tensor:
        cfg = self.config
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
            raise InputError(f"input_ids must be (B, L) integer token ids; got {shape_str(input_ids)} "
                             f"{input_ids.dtype}")
        check_token_ids(input_ids, cfg.vocab_size)
        b, n = input_ids.shape
        past = cache[0].seq_len if cache else 0
        if positions is None:
            positions = document_positions(doc_ids) if doc_ids is not None else \
                torch.arange(past, past + n, device=input_ids.device)
        if int(positions.max()) >= cfg.max_len and cfg.pos_embed in ("learned", "sinusoidal"):
            raise InputError(f"positions reach {int(positions.max())}; the model's {cfg.pos_embed} positions hold "
                             f"max_len={cfg.max_len}")
        x = self.tok_embed(input_ids)
        if self.pos_embed is not None:
            x = x + self.pos_embed(positions)
        elif cfg.pos_embed == "sinusoidal":
            x = x + (self.sinusoid_scale * self.sinusoid[positions]).to(x.dtype)
        x = self.drop(x)
        attn_mask = None
        if doc_ids is not None:  # packing: a token sees its own document only
            if cache is not None:
                raise InputError("doc_ids pack documents for training and scoring; generation takes no doc_ids")
            # A row of one document (and, at the end of a split, padding with a negative id, which the causal
            # mask already hides from it) needs no mask: the fused causal kernel is 12-25% faster per step.
            if not bool(((doc_ids == doc_ids[:, :1]) | (doc_ids < 0)).all()):
                attn_mask = (doc_ids[:, :, None] != doc_ids[:, None, :])[:, None]  # (B, 1, L, L), True = blocked
        rope_positions = positions if cfg.pos_embed == "rope" else None
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask=attn_mask, key_padding_mask=padding_mask, positions=rope_positions,
                      cache=cache[i] if cache else None)
        return fused_linear(self, "head", (self.head,), self.norm(x))[0]

    def _decode_weights(self) -> list[tuple[Any, Any]]:
        """Every block's joined weights for :meth:`_decode_step`, fetched once per generation."""
        return [(block.attn.decode_weights(), block.mlp.decode_weights()) for block in self.blocks]

    def _decode_step(self, ids: Tensor, padding_mask: Tensor | None, positions: Tensor | None,
                     cache: list[DecodingCache], weights: list[tuple[Any, Any]]) -> Tensor:
        """Logits ``(B, vocab)`` of one new token per row, ``ids`` ``(B, 1)``: :meth:`forward`
        with the cache, in eval mode without ALiBi, on a ``(B, E)`` hidden state through
        :meth:`GroupedQueryAttention.decode_step`. ``positions`` ``(B, 1)`` for left-padded
        prompts, else the cache's next position; ``weights``: :meth:`_decode_weights`."""
        cfg, past = self.config, cache[0].seq_len
        x = self.tok_embed(ids[:, 0])
        if cfg.pos_embed in ("learned", "sinusoidal"):
            pos = positions[:, 0] if positions is not None else torch.full_like(ids[:, 0], past)
            x = x + (self.pos_embed(pos) if self.pos_embed is not None else
                     (self.sinusoid_scale * self.sinusoid[pos]).to(x.dtype))
        rope = None
        rotary = self.blocks[0].attn.rotary
        if rotary is not None:  # the angles of this position, (1 or B, 1, D), once for every layer
            if positions is None:
                rope = rotary.cos_sin_from(past, 1, x.dtype, x.device)
            else:
                cos, sin = rotary.cos_sin(positions, x.dtype)  # (B, 1, 1, D)
                rope = cos[:, 0], sin[:, 0]
        for block, layer_cache, (attn_w, mlp_w) in zip(self.blocks, cache, weights):
            x = x + block.attn.decode_step(block.norm1(x), layer_cache, attn_w, rope, padding_mask)
            x = x + block.mlp.decode(block.norm2(x), mlp_w)
        return product(self.norm(x), *joined_weight(self, "head", (self.head,)))

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, *, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, eos_id: int | None = None,
                 padding_mask: Tensor | None = None, compile: bool = False, use_cache: bool = True,
                 repetition_penalty: float = 1.0) -> Tensor:
        """``(B, L + n)`` ids, ``n <= max_new_tokens``: the prompts ``input_ids`` ``(B, L)`` and what
        follows (fewer than ``max_new_tokens`` when every row has ended with ``eos_id``).

        ``temperature`` 0 decodes greedily; above 0 it samples from the softmax of
        ``logits / temperature``, within the ``top_k`` most probable tokens (0: all) and the
        smallest set whose probability reaches ``top_p``, drawn with ``seed`` (reproducible);
        ``repetition_penalty`` above 1 makes the tokens a row already holds less likely
        (:func:`~attnlab.models.sampling.penalize_repeats`). The options are checked as
        :func:`~attnlab.models.sampling.check_generation` says. Prompts of
        different lengths are left-padded, with ``padding_mask`` ``(B, L)`` ``True`` at the
        padding. A row that emits ``eos_id`` is continued with ``eos_id``. ``compile``: run the
        decoding step through ``torch.compile`` (compiled once per model, for any batch and
        length; it needs a C++ compiler on the CPU): the first call spends half a minute
        compiling, and then a step of a small model is about 1.5x faster (210 against 323
        tokens per second at batch 1 for a 4-layer width-256 model, AVX2 EPYC,
        ``benchmarks/lm_generate.py``), which pays for long or repeated generations.
        ``use_cache=False`` runs the whole sequence through the model at every step instead of
        keeping the keys and values (the same tokens, slower: for measurements; the kinds other
        than ``gqa`` always decode so). :meth:`stream` yields the same tokens one step at a time."""
        steps = list(self.stream(input_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                 seed=seed, eos_id=eos_id, padding_mask=padding_mask, compile=compile,
                                 use_cache=use_cache, repetition_penalty=repetition_penalty))
        return torch.cat([input_ids, *(t[:, None] for t in steps)], dim=1)

    @torch.no_grad()
    def stream(self, input_ids: Tensor, max_new_tokens: int, *, temperature: float = 0.0, top_k: int | None = None,
               top_p: float | None = None, seed: int | None = None, eos_id: int | None = None,
               padding_mask: Tensor | None = None, compile: bool = False, use_cache: bool = True,
               repetition_penalty: float = 1.0) -> Iterator[Tensor]:
        """The next token of every row, ``(B,)``, one step after the other, as :meth:`generate`
        chooses them; it stops early once every row has emitted ``eos_id``."""
        cfg = self.config
        check_generation(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         repetition_penalty=repetition_penalty, seed=seed)
        total = input_ids.shape[1] + max_new_tokens
        if cfg.pos_embed in ("learned", "sinusoidal") and total > cfg.max_len:
            raise InputError(f"prompt and max_new_tokens make {total} positions; the model holds max_len={cfg.max_len}")
        cache_kept = cfg.attention == "gqa" and use_cache
        if cache_kept:
            self._check_cache_memory(input_ids.shape[0], input_ids.shape[1], max_new_tokens)
        self.eval()
        gen = None if seed is None else torch.Generator(device=input_ids.device).manual_seed(seed)
        pad = padding_mask
        positions = None if pad is None else (~pad).long().cumsum(1).sub(1).clamp(min=0)
        cache = self.new_cache(total) if cache_kept else None
        seen = None  # (B, V): the tokens each row holds, for the repetition penalty
        if repetition_penalty != 1:
            real = input_ids if pad is None else input_ids.masked_fill(pad, 0)
            seen = torch.zeros(input_ids.shape[0], cfg.vocab_size, dtype=torch.bool, device=input_ids.device)
            seen.scatter_(1, real, True)
            if pad is not None:  # padding's placeholder id 0 is not a token of the row, unless the row has it
                seen[:, 0] = (input_ids.masked_fill(pad, -1) == 0).any(1)
        # The steps after the prompt: _decode_step, with the weights joined once.
        lean = self._decode_weights() if cache is not None and cfg.pos_embed != "alibi" else None
        decode_step = self._decode_step
        if compile and lean is not None:
            if "_compiled_step" not in self.__dict__:
                self.__dict__["_compiled_step"] = torch.compile(self._decode_step, dynamic=True)
            decode_step = self.__dict__["_compiled_step"]
        ids, done = input_ids, torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        step_ids, step_pos = input_ids, positions
        for step in range(max_new_tokens):
            if cache is None:  # an attention kind without a cache: the whole sequence again
                logits = self(ids, padding_mask=pad, positions=positions)[:, -1]
            elif lean is not None and step > 0:
                logits = decode_step(step_ids, pad, step_pos, cache, lean)
            else:
                logits = self(step_ids, padding_mask=pad, positions=step_pos, cache=cache)[:, -1]
            logits = logits.float()
            if seen is not None:
                logits = penalize_repeats(logits, seen, repetition_penalty)
            nxt = choose_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)
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

    def _check_cache_memory(self, batch: int, prompt: int, max_new_tokens: int) -> None:
        """Refuse a generation whose key/value cache could not fit in this machine's memory
        (its buffers grow as it goes, so a long ``max_new_tokens`` that ends early costs
        nothing): said before the first step, with the limit it implies."""
        cfg = self.config
        kv_heads = cfg.num_kv_heads or cfg.num_heads
        per_position = 2 * batch * kv_heads * cfg.head_dim * cfg.depth * self.tok_embed.weight.element_size()
        room = available_memory()
        positions = prompt + max_new_tokens
        if cfg.window is not None:  # a sliding-window cache holds its window, however long the generation
            positions = min(positions, cfg.window - 1 + max(prompt, DecodingCache.slide_room))
        if room is not None and positions * per_position > room:
            limit = max(room // per_position - prompt, 0)
            raise InputError(f"max_new_tokens must be at most {limit:,} for a batch of {batch} prompt(s) of {prompt} "
                             f"tokens: the key/value cache takes {per_position:,} bytes a position and this machine "
                             f"has {gib(room)} available; got {max_new_tokens:,}")

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
