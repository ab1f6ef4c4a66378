"""Decoder-only language models: GPT-2's shape and Llama's, in one configuration.

A stack of pre-norm blocks, ``x + attn(norm(x))`` then ``x + mlp(norm(x))``, over token
embeddings, with a final norm and a head onto the vocabulary (tied to the embeddings or
not). Positions are learned or sinusoidal embeddings added to the input, rotary
(``pos_embed="rope"``) or ALiBi inside the attention, or none. The sinusoidal table is
added times a learned scale that starts at ``embed_dim ** -0.5`` (x-transformers' "scaled
sinusoidal" form): added as it is, its rows (a norm of 8 at width 128) swamped token
embeddings initialised with a norm of 0.23, and a character model of Tiny Shakespeare
reached a validation loss of 3.32 nats after 300 steps, against 2.44 with the scale and 2.40
with learned positions (``attnlab bench lm --parts extrapolation``, AVX2 EPYC).

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
sample through :mod:`attnlab.models.generation`, with the cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.grouped import KeepsJoinedWeights, RMSNorm, fused_linear, joined_weight
from ..attention.registry import (attention_capabilities, attention_family, attention_keeps_cache, attention_options,
                                  attention_takes, build_attention, kinds_taking, list_attention)
from ..dropout import Dropout
from ..errors import InputError, shape_str
from ..layers.init import normal_init_
from ..layers.norms import build_norm
from ..layers.pos_encoding import inner_position_options, sinusoid_table
from ..memory import available_memory, gib
from . import generation
from .registry import build_config, check_attention_options, check_attention_values, register_model
from .token_ids import check_token_ids

__all__ = ["GPTConfig", "GPT", "SwiGLU", "GeluMlp", "LayerCaches", "document_positions"]

POS_EMBEDS = ("learned", "sinusoidal", "rope", "alibi", "none")
MLPS = ("gelu", "gelu_tanh", "swiglu", "geglu")
LAYER_TYPES = ("full", "sliding", "linear")


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    max_len: int = 1024  # the longest context (learned positions have this many rows)
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    num_kv_heads: int | None = None  # grouped-query attention (None: num_heads; 1: multi-query)
    head_dim: int | None = None  # the size of one head (None: embed_dim / num_heads; Gemma's and Qwen3's differ)
    mlp_ratio: float = 4.0
    mlp_hidden_dim: int | None = None  # the MLP width itself (Llama's intermediate_size); overrides mlp_ratio
    mlp: str = "gelu"  # "gelu", "gelu_tanh" (GPT-2's), "swiglu" (Llama's), "geglu" (Gemma's: tanh-GELU gate)
    norm: str = "layernorm"  # or "rmsnorm"
    norm_eps: float = 1e-5
    pos_embed: str = "learned"  # learned, sinusoidal, rope, alibi, none
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "linear"|"dynamic"|"yarn"|"llama3"|"longrope", ...} (full layers)
    partial_rotary: float = 1.0  # the share of each head that rotary positions rotate (Phi-4-mini: 0.75)
    window: int | None = None  # sliding-window attention: each token sees the last `window` tokens
    layer_types: list | None = None  # per layer "sliding" (sees `window`), "full" or "linear" (linear_attention)
    linear_attention: str = "gated_delta"  # the kind of the "linear" layers of layer_types (Qwen3.5's 3 in 4)
    linear_attention_options: dict = field(default_factory=dict)  # its options
    window_pattern: int | None = None  # instead of layer_types: every window_pattern-th layer full, others sliding
    rope_local_theta: float | None = None  # the plain rotary base of the sliding layers (Gemma 3: 10,000)
    nope_layers: list | None = None  # indices of layers without positions (SmolLM3: every fourth)
    qk_norm: bool = False
    query_pre_attn_scalar: float | None = None  # logits scaled by its -1/2 power instead of head_dim's (Gemma)
    attn_softcap: float | None = None  # attention logits squashed to cap * tanh(logits / cap) (Gemma 2: 50)
    logit_softcap: float | None = None  # the output logits alike (Gemma 2: 30)
    post_norms: bool = False  # norms after the attention and the MLP too, before the residual sum (Gemma 2, 3)
    embed_scale: float | None = None  # token embeddings times this (Gemma: sqrt(embed_dim))
    bias: bool = True  # biases of the attention projections and the MLP (each set apart below)
    attention_bias: bool | None = None  # biases of the query, key and value projections (None: bias)
    attention_out_bias: bool | None = None  # of the attention's output projection (None: attention_bias)
    mlp_bias: bool | None = None  # of the MLP's layers (None: bias)
    attention_output_gate: bool = False  # each head's output gated by a sigmoid the query projection gives (Qwen3.5)
    norm_bias: bool = True  # the layernorms' biases (nanoGPT's bias=False leaves them out as well)
    tie_embeddings: bool = True
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    attention: str = "exact"  # any "tokens" kind; "exact" (older name "gqa") keeps a cache
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
        self._check_layers()
        if self.pos_embed == "rope" and not attention_capabilities(self.attention).positions:
            raise InputError(f"attention={self.attention!r} with pos_embed='rope' cannot take each row's positions "
                             f"(generation and packed documents need them); kinds that do: "
                             f"{', '.join(k for k in kinds_taking('rope') if attention_capabilities(k).positions)}")
        inner_position_options(self.pos_embed, self.rope_theta, self.attention)  # a kind that cannot take them
        for key, field_name in self._kind_options().items():
            if not attention_takes(self.attention, key):
                raise InputError(f"{field_name} is not an option of attention {self.attention!r}; kinds that take "
                                 f"it: {', '.join(kinds_taking(key))}")
        check_attention_options(self.attention_options, {
            "dropout": "attn_drop_rate", "bias": "attention_bias", "out_bias": "attention_out_bias",
            "num_kv_heads": "num_kv_heads", "head_dim": "head_dim", "window": "window", "rope": "pos_embed",
            "alibi": "pos_embed", "rope_theta": "rope_theta", "rope_scaling": "rope_scaling",
            "partial_rotary": "partial_rotary", "max_len": "max_len", "qk_norm": "qk_norm",
            "scale": "query_pre_attn_scalar", "softcap": "attn_softcap", "output_gate": "attention_output_gate"})
        if self.layer_types is not None and "linear" in self.layer_types:
            if attention_family(self.linear_attention) != "tokens":
                raise InputError(f"linear_attention must be a 'tokens' kind; {self.linear_attention!r} is a grid kind")
            if not isinstance(self.linear_attention_options, dict):
                raise InputError(f"linear_attention_options must be a mapping; got {self.linear_attention_options!r}")
            check_attention_options(self.linear_attention_options, {"dropout": "attn_drop_rate",
                                                                    "bias": "attention_bias"})
        check_attention_values(GPTConfig, self.attention, self.attention_options,
                               self.max_len if isinstance(self.max_len, int) else None)

    def _check_layers(self) -> None:
        """The per-layer lists and the numbers the families' knobs take."""
        depth = self.depth if isinstance(self.depth, int) and not isinstance(self.depth, bool) else None
        if self.layer_types is not None:
            if not isinstance(self.layer_types, (list, tuple)) or any(t not in LAYER_TYPES for t in self.layer_types):
                raise InputError(f"layer_types must be a list of {' or '.join(map(repr, LAYER_TYPES))}, one per "
                                 f"layer; got {self.layer_types!r}")
            if depth is not None and len(self.layer_types) != depth:
                raise InputError(f"layer_types must name one type per layer, {depth}; got {len(self.layer_types)}")
            if self.window_pattern is not None:
                raise InputError("layer_types and window_pattern both say which layers slide; give one")
        if self.window_pattern is not None and (not isinstance(self.window_pattern, int)
                                                or isinstance(self.window_pattern, bool) or self.window_pattern < 1):
            raise InputError(f"window_pattern must be a positive integer (every window_pattern-th layer is full); "
                             f"got {self.window_pattern!r}")
        if self._has_sliding() and self.window is None:
            raise InputError("layer_types has sliding layers, which need window (the positions each token sees)")
        if self.nope_layers is not None:
            if not isinstance(self.nope_layers, (list, tuple)) or any(
                    not isinstance(i, int) or isinstance(i, bool) or depth is not None and not 0 <= i < depth
                    for i in self.nope_layers):
                raise InputError(f"nope_layers must be a list of layer indices in [0, {depth}); "
                                 f"got {self.nope_layers!r}")
            if self.pos_embed != "rope":
                raise InputError(f"nope_layers leave rotary positions out of some layers; pos_embed is "
                                 f"{self.pos_embed!r}, not 'rope'")
        if self.rope_local_theta is not None and (self.pos_embed != "rope" or not self._has_sliding()):
            raise InputError("rope_local_theta is the rotary base of sliding layers: it needs pos_embed='rope' and "
                             "sliding layers")
        if (self.rope_scaling is not None or self.partial_rotary != 1.0) and self.pos_embed != "rope":
            raise InputError(f"rope_scaling and partial_rotary scale rotary positions; pos_embed is "
                             f"{self.pos_embed!r}, not 'rope'")
        for name in ("query_pre_attn_scalar", "attn_softcap", "logit_softcap", "embed_scale", "rope_local_theta"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < float("inf")):
                raise InputError(f"{name} must be a positive number; got {value!r}")
        if self.head_dim is None and isinstance(self.embed_dim, int) and isinstance(self.num_heads, int) \
                and self.num_heads > 0 and self.embed_dim % self.num_heads:
            raise InputError(f"embed_dim must be divisible by num_heads unless head_dim is given; got "
                             f"embed_dim={self.embed_dim}, num_heads={self.num_heads}")

    def _has_sliding(self) -> bool:
        """Whether some layer slides (without listing the layers: the depth is not checked yet)."""
        if self.layer_types is not None:
            return "sliding" in self.layer_types
        if self.window_pattern is not None:
            return self.window_pattern > 1
        return self.window is not None

    def layer_kinds(self) -> list[str]:
        """Each layer's type, ``"sliding"`` or ``"full"``: ``layer_types``, else every
        ``window_pattern``-th layer full (Gemma 3's 5 sliding to 1 full is 6), else all sliding
        when there is a ``window``, else all full."""
        depth = self.depth if isinstance(self.depth, int) else 0
        if self.layer_types is not None:
            return list(self.layer_types)
        if self.window_pattern is not None:
            return ["full" if (i + 1) % self.window_pattern == 0 else "sliding" for i in range(depth)]
        return ["sliding" if self.window is not None else "full"] * depth

    def _kind_options(self) -> dict[str, str]:
        """The attention options this config sets (beyond the defaults), by the field that sets them."""
        asked = {"num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim, "window": self.window,
                 "qk_norm": self.qk_norm or None, "rope_scaling": self.rope_scaling,
                 "partial_rotary": None if self.partial_rotary == 1.0 else self.partial_rotary,
                 "scale": self.query_pre_attn_scalar, "softcap": self.attn_softcap,
                 "out_bias": self.attention_out_bias, "output_gate": self.attention_output_gate or None}
        names = {"scale": "query_pre_attn_scalar", "softcap": "attn_softcap", "out_bias": "attention_out_bias",
                 "output_gate": "attention_output_gate"}
        return {k: names.get(k, k) for k, v in asked.items() if v is not None}

    def attention_of(self, layer: int) -> str:
        """The attention kind of layer ``layer``: ``linear_attention`` in the "linear" layers, else ``attention``."""
        return self.linear_attention if self.layer_kinds()[layer] == "linear" else self.attention

    def heads_of(self, layer: int) -> int:
        """The heads of layer ``layer``'s attention: ``linear_attention_options["num_heads"]`` in the
        "linear" layers when given (Qwen3.5's linear layers have heads of their own), else ``num_heads``."""
        if self.layer_kinds()[layer] == "linear":
            return self.linear_attention_options.get("num_heads", self.num_heads)
        return self.num_heads

    def attention_options_of(self, layer: int) -> dict[str, Any]:
        """The options the attention of layer ``layer`` is built with (besides width and heads)."""
        if self.layer_kinds()[layer] == "linear":  # its own options; no positions (a recurrent state has its order)
            options = {k: v for k, v in self.linear_attention_options.items() if k != "num_heads"}
            return self._placed(self.linear_attention, layer, options)
        options: dict[str, Any] = dict(self.attention_options)
        sliding = self.layer_kinds()[layer] == "sliding"
        rope = self.pos_embed == "rope" and layer not in (self.nope_layers or ())
        if self.pos_embed == "alibi":
            options["alibi"] = True
        elif rope:
            local = sliding and self.rope_local_theta is not None  # Gemma 3: plain rotary on the sliding layers
            options.update(rope=True, rope_theta=self.rope_local_theta if local else self.rope_theta)
            if self.rope_scaling is not None and not local:
                options.update(rope_scaling=self.rope_scaling, max_len=self.max_len)
            if self.partial_rotary != 1.0:
                options["partial_rotary"] = self.partial_rotary
        kind = self._kind_options()
        if "window" in kind and sliding:
            options["window"] = self.window
        for key in ("num_kv_heads", "head_dim", "qk_norm", "out_bias", "output_gate"):
            if key in kind:
                options[key] = {"out_bias": self.attention_out_bias,
                                "output_gate": self.attention_output_gate}.get(key, getattr(self, key, None))
        if self.query_pre_attn_scalar is not None:
            options["scale"] = float(self.query_pre_attn_scalar) ** -0.5
        if self.attn_softcap is not None:
            options["softcap"] = self.attn_softcap
        return self._placed(self.attention, layer, options)

    def _placed(self, kind: str, layer: int, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` with what kind ``kind`` declares it takes from its place in the decoder
        (``from_model``: the layer's depth, the model's norm eps), where the recipe set none."""
        place = {"layer_index": layer, "norm_eps": self.norm_eps}
        for option in attention_options(kind):
            if option.from_model in place:
                options.setdefault(option.name, place[option.from_model])
        return options

    @property
    def head_size(self) -> int:
        """The size of one head: ``head_dim``, or ``embed_dim / num_heads``."""
        return self.head_dim if self.head_dim is not None else self.embed_dim // self.num_heads

    @property
    def hidden_dim(self) -> int:
        return self.mlp_hidden_dim if self.mlp_hidden_dim is not None else round(self.embed_dim * self.mlp_ratio)


class GeluMlp(KeepsJoinedWeights, nn.Module):
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

    def step_function(self) -> Callable[[Tensor], Tensor]:
        """:meth:`forward` of a decoding step's ``(B, E)`` in eval mode, its weights joined and bound."""
        fc, proj, approximate = _matmul(*joined_weight(self, "fc", (self.c_fc,))), \
            _matmul(*joined_weight(self, "proj", (self.c_proj,))), self.approximate
        return lambda x: proj(F.gelu(fc(x), approximate=approximate))


class SwiGLU(KeepsJoinedWeights, nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` (Shazeer, 2020): SwiGLU with ``act="silu"``
    (Llama's MLP), GeGLU with ``act="gelu_tanh"`` (Gemma's)."""

    lora_role = "mlp"  # LoRA (attnlab.layers.lora): gate_proj, up_proj and down_proj

    def __init__(self, dim: int, hidden: int, *, bias: bool, drop_rate: float, act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.drop = Dropout(drop_rate)
        if act not in ("silu", "gelu_tanh"):
            raise InputError(f"act must be 'silu' or 'gelu_tanh'; got {act!r}")
        self.act = act

    def _gate(self, x: Tensor) -> Tensor:
        return F.silu(x) if self.act == "silu" else F.gelu(x, approximate="tanh")

    def forward(self, x: Tensor) -> Tensor:
        gate, up = fused_linear(self, "gate_up", (self.gate_proj, self.up_proj), x)
        return fused_linear(self, "down", (self.down_proj,), self.drop(self._gate(gate) * up))[0]

    def step_function(self) -> Callable[[Tensor], Tensor]:
        """:meth:`forward` of a decoding step's ``(B, E)`` in eval mode, its weights joined and bound."""
        gate_up = _matmul(*joined_weight(self, "gate_up", (self.gate_proj, self.up_proj)))
        down, act = _matmul(*joined_weight(self, "down", (self.down_proj,))), self._gate

        def mlp(x: Tensor) -> Tensor:
            gate, up = gate_up(x).chunk(2, dim=-1)
            return down(act(gate) * up)
        return mlp

    def extra_repr(self) -> str:
        return "" if self.act == "silu" else f"act={self.act}"


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
        step of a 4-layer width-256 model spends half its time outside the arithmetic (524
        of 1,022 µs at batch 1, the same model at width 16: AMD EPYC AVX-512, 2 threads),
        much of it in looking up modules and weights; bound, they are looked up once."""
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


def _matmul(weight: Tensor, bias: Tensor | None) -> Callable[[Tensor], Tensor]:
    """``x @ weight + bias`` of a step's ``(B, in)`` with a joined ``weight`` ``(in, out)``."""
    if bias is None:
        return lambda x: torch.mm(x, weight)
    return lambda x: torch.addmm(bias, x, weight)


def _step_norm(norm: nn.Module | None, dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
    """``norm`` for a decoding step's ``(B, E)``. An RMSNorm of float32 is written out in
    operators that give F.rms_norm's bits (its CPU kernel is these operators, plus two casts of
    the scalars it is given as numbers): 8.9 µs against 10.5 (width 256, batch 1; 10.1 against
    11.1 at batch 8; AMD EPYC AVX-512, torch 2.13, 2 threads), nine a step of 4 layers."""
    if norm is None:
        return lambda x: x
    if type(norm) is RMSNorm and dtype == torch.float32:
        weight = norm.weight
        size = torch.tensor(float(weight.shape[0]), device=weight.device)
        eps = torch.tensor(norm.eps, device=weight.device)
        return lambda x: x * x.pow(2).sum(-1, keepdim=True).div_(size).add_(eps).rsqrt_() * weight
    return norm


class LayerCaches(list):
    """A decoder's cache: one per layer, each made by that layer's attention
    (``attn.new_cache``), and ``scratch``, what the decoder keeps for one generation (its
    MLPs' joined weights). ``seq_len``: the positions seen."""

    def __init__(self, caches: Any) -> None:
        super().__init__(caches)
        self.scratch: dict[str, Any] = {}

    @property
    def seq_len(self) -> int:
        return self[0].seq_len if self else 0

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in self)


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

    # ------------------------------------------------------------------ the cache
    @property
    def keeps_cache(self) -> bool:
        """Whether every layer's attention decodes with a cache of its own."""
        return all(attention_keeps_cache(k) for k in {self.config.attention_of(i) for i in range(self.config.depth)})

    def new_cache(self, batch: int, capacity: int, *, window: int | None = None, sink_tokens: int = 0) -> LayerCaches:
        """Each layer's cache, made by its attention, for ``batch`` rows and at most ``capacity``
        positions. ``window`` and ``sink_tokens``: a streaming cache in the layers whose attention
        keeps keys (``exact`` and the kinds built on it; a recurrent state is flat already): each
        token sees the first ``sink_tokens`` positions and the last ``window`` (StreamingLLM)."""
        if not self.keeps_cache:
            raise InputError(f"attention {self.config.attention!r} decodes without a cache; kinds that keep one: "
                             f"{', '.join(k for k in list_attention('tokens') if attention_keeps_cache(k))}")
        weight = self.tok_embed.weight
        policy = self._streaming_policy(window, sink_tokens)
        return LayerCaches(block.attn.new_cache(batch, capacity, dtype=weight.dtype, device=weight.device,
                                                **(policy if streams else {}))
                           for block, streams in zip(self.blocks, self._streaming_layers()))

    def _streaming_layers(self) -> list[bool]:
        """Per layer, whether its attention's cache takes a streaming policy (its kind declares it)."""
        return [attention_capabilities(self.config.attention_of(i)).streaming for i in range(self.config.depth)]

    def _streaming_policy(self, window: int | None, sink_tokens: int) -> dict[str, int]:
        """``{"window": ..., "sink_tokens": ...}`` for a streaming generation, ``{}`` otherwise;
        refused in one line where no layer keeps keys to stream."""
        if window is None and not sink_tokens:
            return {}
        if window is None or isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise InputError(f"window must be a positive number of positions when streaming; got {window!r}")
        if not any(self._streaming_layers()):
            raise InputError(f"attention {self.config.attention!r} keeps no keys to stream: window and "
                             f"sink_tokens are for the exact kind and the kinds built on it")
        return {"window": window, "sink_tokens": sink_tokens}

    def check_generation_size(self, batch: int, prompt: int, max_new_tokens: int, *, use_cache: bool = True,
                              window: int | None = None, sink_tokens: int = 0) -> None:
        """Refuse, before the first step, a generation the model cannot hold: more positions
        than learned or sinusoidal positions have, or a cache that could not fit in this
        machine's memory (its buffers grow as it goes, so a long ``max_new_tokens`` that ends
        early costs nothing), with the limit it implies. ``window`` and ``sink_tokens``: a
        streaming generation's policy, under which the layers that stream hold that window only."""
        cfg, total = self.config, prompt + max_new_tokens
        if cfg.pos_embed in ("learned", "sinusoidal") and total > cfg.max_len:
            raise InputError(f"prompt and max_new_tokens make {total} positions; the model holds max_len={cfg.max_len}")
        if not (use_cache and self.keeps_cache):
            return
        dtype = self.tok_embed.weight.dtype
        room = available_memory()
        policy = self._streaming_policy(window, sink_tokens)
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
                positions: Tensor | None = None, cache: LayerCaches | None = None) -> Tensor:
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
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask=attn_mask, key_padding_mask=padding_mask, positions=rope_positions,
                      cache=cache[i] if cache else None)
        return self._logits(x)

    @property
    def has_decode_step(self) -> bool:
        """Whether every layer's attention has the lean one-token step (the contract's ``decode_step``)."""
        return self.keeps_cache and all(attention_capabilities(self.config.attention_of(i)).decode_step
                                        for i in range(self.config.depth))

    def decode_step(self, ids: Tensor, cache: LayerCaches, *, positions: Tensor | None = None,
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
            scratch["final"] = _step_norm(self.norm, dtype), _matmul(*joined_weight(self, "head", (self.head,)))
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
        follows, chosen as :func:`attnlab.models.generation.generate` says (greedy by default;
        ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``, ``seed``,
        ``eos_id``, ``padding_mask`` for left-padded prompts, ``compile``, ``use_cache``, ``decodable``: the
        number of ids the tokenizer decodes, past which the embedding's rows are never chosen)."""
        return generation.generate(self, input_ids, max_new_tokens, **options)

    def stream(self, input_ids: Tensor, max_new_tokens: int, **options: Any) -> Iterator[Tensor]:
        """The next token of every row, ``(B,)``, one step after the other, as :meth:`generate`
        chooses them (:func:`attnlab.models.generation.stream`)."""
        return generation.stream(self, input_ids, max_new_tokens, **options)


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
