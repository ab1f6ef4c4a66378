"""The configuration of a decoder-only language model (:class:`~attnlab.models.gpt.GPT`), and
its per-layer plan: which attention kind each layer has, with which options (a sliding window,
the rotary base, no positions), as the families of today set them (see the GPT module docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..suggest import did_you_mean

from ..attention.registry import canonical_attention, kinds_taking, upgrade_attention_options, attention_entry
from ..errors import InputError
from ..layers.pos_encoding import inner_position_options
from .registry import refuse_options_the_model_sets, check_attention_values

__all__ = ["GPTConfig", "LayerPlan", "POS_EMBEDS", "MLPS", "LAYER_TYPES", "LAYER_KEYS"]

POS_EMBEDS = ("learned", "sinusoidal", "rope", "alibi", "none")
MLPS = ("gelu", "gelu_tanh", "swiglu", "geglu")
LAYER_TYPES = ("full", "sliding", "linear")
# What an entry of GPTConfig.layers may say of its layer.
LAYER_KEYS = ("attention", "options", "sliding", "positions", "num_heads")


@dataclass(frozen=True)
class LayerPlan:
    """One layer of a decoder as it is built: its attention kind, the options it is built with
    (besides width, heads, dropout and bias), its heads, whether it sees a sliding window of
    ``sliding_window`` positions, and whether it takes rotary positions."""

    attention: str
    options: dict
    heads: int
    sliding: bool
    positions: bool

    def __post_init__(self) -> None:
        # the kind's own name, whatever name the config used for it: what reads a plan compares one name
        object.__setattr__(self, "attention", canonical_attention(self.attention))

    @property
    def type(self) -> str:
        """``"sliding"`` or ``"full"`` (a layer of a kind without a window is ``"full"``)."""
        return "sliding" if self.sliding else "full"


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
    sliding_window: int | None = None  # sliding-window attention: each token sees the last `sliding_window` tokens
    layer_types: list | None = None  # per layer "sliding" (sees `sliding_window`), "full" or "linear"
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
    # One entry per layer, or a pattern repeated to depth: a kind's name, or {"attention": kind, "options": {...},
    # "sliding": bool, "positions": bool, "num_heads": int}. Instead of layer_types, window_pattern and nope_layers.
    layers: list | None = None
    grad_checkpointing: bool = False

    renamed: ClassVar[dict[str, str]] = {"n_layer": "depth", "n_head": "num_heads", "n_embd": "embed_dim",
                                          "dropout": "drop_rate", "block_size": "max_len"}
    # former names that still work, with a notice naming the new one (models.registry.build_config)
    deprecated: ClassVar[dict[str, str]] = {"window": "sliding_window"}

    def __post_init__(self) -> None:
        if isinstance(self.attention_options, dict) and isinstance(self.attention, str):
            self.attention_options = upgrade_attention_options(self.attention, self.attention_options)
        if self.pos_embed not in POS_EMBEDS:
            raise InputError(f"pos_embed must be one of {', '.join(POS_EMBEDS)}; got {self.pos_embed!r}")
        if self.mlp not in MLPS:
            raise InputError(f"mlp must be one of {', '.join(MLPS)}; got {self.mlp!r}")
        if attention_entry(self.attention).family != "tokens":
            raise InputError(f"attention must be a 'tokens' kind; {self.attention!r} is a grid kind")
        self._check_layers()
        if self.pos_embed == "rope" and not attention_entry(self.attention).capabilities.positions:
            taking = [k for k in kinds_taking("rope") if attention_entry(k).capabilities.positions]
            raise InputError(f"attention={self.attention!r} with pos_embed='rope' cannot take each row's positions "
                             f"(generation and packed documents need them); kinds that do: {', '.join(taking)}")
        inner_position_options(self.pos_embed, self.rope_theta, self.attention)  # a kind that cannot take them
        for key, field_name in self._kind_options().items():
            if not attention_entry(self.attention).takes(key):
                raise InputError(f"{field_name} is not an option of attention {self.attention!r}; kinds that take "
                                 f"it: {', '.join(kinds_taking(key))}")
        refuse_options_the_model_sets(self.attention_options, {
            "dropout": "attn_drop_rate", "bias": "attention_bias", "out_bias": "attention_out_bias",
            "num_kv_heads": "num_kv_heads", "head_dim": "head_dim", "sliding_window": "sliding_window", "rope": "pos_embed",
            "alibi": "pos_embed", "rope_theta": "rope_theta", "rope_scaling": "rope_scaling",
            "partial_rotary": "partial_rotary", "max_len": "max_len", "qk_norm": "qk_norm",
            "scale": "query_pre_attn_scalar", "softcap": "attn_softcap", "output_gate": "attention_output_gate"})
        self._check_layer_entries()
        if self.layer_types is not None and "linear" in self.layer_types:
            if attention_entry(self.linear_attention).family != "tokens":
                raise InputError(f"linear_attention must be a 'tokens' kind; {self.linear_attention!r} is a grid kind")
            if not isinstance(self.linear_attention_options, dict):
                raise InputError(f"linear_attention_options must be a mapping; got {self.linear_attention_options!r}")
            refuse_options_the_model_sets(self.linear_attention_options, {"dropout": "attn_drop_rate",
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
        if self.layers is None and self._has_sliding() and self.sliding_window is None:
            raise InputError("layer_types has sliding layers, which need sliding_window (the positions each token "
                             "sees)")
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

    def _entries(self) -> list[dict[str, Any]]:
        """``layers`` as one mapping per layer (names become ``{"attention": name}``; a pattern
        shorter than ``depth`` is repeated), checked for its form."""
        if not isinstance(self.layers, (list, tuple)) or not self.layers:
            raise InputError(f"layers must be a list of one entry per layer (a kind's name, or a mapping of "
                             f"{', '.join(LAYER_KEYS)}), or a pattern of them repeated to depth; got {self.layers!r}")
        depth = self.depth if isinstance(self.depth, int) and not isinstance(self.depth, bool) else len(self.layers)
        if depth % len(self.layers):
            raise InputError(f"layers must list depth={depth} entries, or a pattern whose length divides it; got "
                             f"{len(self.layers)} entries")
        entries = []
        for i, entry in enumerate(self.layers):
            if isinstance(entry, str):
                entry = {"attention": entry}
            if not isinstance(entry, dict):
                raise InputError(f"layers[{i}] must be a kind's name or a mapping of {', '.join(LAYER_KEYS)}; "
                                 f"got {entry!r}")
            for key in entry:
                if key not in LAYER_KEYS:
                    raise InputError(f"layers[{i}]: unknown key {key!r}" + did_you_mean(str(key), LAYER_KEYS, "keys"))
            for key in ("sliding", "positions"):
                if key in entry and not isinstance(entry[key], bool):
                    raise InputError(f"layers[{i}].{key} must be true or false; got {entry[key]!r}")
            if "options" in entry and not isinstance(entry["options"], dict):
                raise InputError(f"layers[{i}].options must be a mapping of option names to values; got "
                                 f"{entry['options']!r}")
            heads = entry.get("num_heads")
            if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
                raise InputError(f"layers[{i}].num_heads must be a positive integer; got {heads!r}")
            entries.append(entry)
        return [entries[i % len(entries)] for i in range(depth)]

    def _check_layer_entries(self) -> None:
        """``layers``: each entry's kind, options, window and positions, before anything is built."""
        if self.layers is None:
            return
        for other in ("layer_types", "window_pattern", "nope_layers"):
            if getattr(self, other) is not None:
                raise InputError(f"layers and {other} both say what each layer is; give layers alone")
        max_len = self.max_len if isinstance(self.max_len, int) else None
        for i, entry in enumerate(self._entries()[: len(self.layers)]):
            kind = entry.get("attention", self.attention)
            if attention_entry(kind).family != "tokens":  # unknown names fail here, with suggestions
                raise InputError(f"layers[{i}].attention must be a 'tokens' kind; {kind!r} is a grid kind")
            options = entry.get("options", {})
            refuse_options_the_model_sets(options, {"dropout": "attn_drop_rate", "bias": "attention_bias",
                                              "rope": "pos_embed", "alibi": "pos_embed"})
            check_attention_values(GPTConfig, kind, options, max_len, key=f"layers[{i}].options")
            if entry.get("sliding") and (self.sliding_window is None
                                        or not attention_entry(kind).takes("sliding_window")):
                raise InputError(f"layers[{i}].sliding needs sliding_window set and a kind with a sliding window; "
                                 f"got sliding_window={self.sliding_window!r} and attention {kind!r}")
            if entry.get("positions") is False and self.pos_embed != "rope":
                raise InputError(f"layers[{i}].positions=false leaves rotary positions out of a layer; pos_embed is "
                                 f"{self.pos_embed!r}, not 'rope'")
            rope = self.pos_embed == "rope" and entry.get("positions", True) and attention_entry(kind).takes("rope")
            if rope and not attention_entry(kind).capabilities.positions:
                raise InputError(f"layers[{i}]: attention {kind!r} with pos_embed='rope' cannot take each row's "
                                 f"positions")

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        self.__dict__.pop("_plan", None)  # a field set anew: the plan is made again when next asked

    def layer_plan(self) -> list[LayerPlan]:
        """Each layer as it is built (:class:`LayerPlan`): from ``layers`` when given, else from
        ``attention`` with ``layer_types`` (its ``"linear"`` layers ``linear_attention``),
        ``window_pattern`` and ``nope_layers``, the knobs the families' configs have. Made once
        and kept until a field is set (a field's dict or list changed in place is not seen: set
        the field); a copy of the list, whose entries are frozen."""
        plan = self.__dict__.get("_plan")
        if plan is None:
            plan = self.__dict__["_plan"] = self._make_plan()
        return list(plan)

    def _make_plan(self) -> list[LayerPlan]:
        if self.layers is not None:
            plan = []
            for i, entry in enumerate(self._entries()):
                kind = entry.get("attention", self.attention)
                sliding = entry.get("sliding", self.sliding_window is not None
                                    and attention_entry(kind).takes("sliding_window"))
                rope = self.pos_embed == "rope" and entry.get("positions", True) and attention_entry(kind).takes("rope")
                base = dict(self.attention_options) if kind == self.attention else {}
                options = {**base, **self._model_options(kind, i, sliding=sliding, rope=rope), **entry.get("options", {})}
                plan.append(LayerPlan(kind, self._placed(kind, i, options), entry.get("num_heads", self.num_heads),
                                      bool(sliding), bool(rope)))
            return plan
        plan = []
        for i, layer_type in enumerate(self.layer_kinds()):
            if layer_type == "linear":  # its own options; no positions (a recurrent state has its order)
                options = {k: v for k, v in self.linear_attention_options.items() if k != "num_heads"}
                plan.append(LayerPlan(self.linear_attention, self._placed(self.linear_attention, i, options),
                                      self.linear_attention_options.get("num_heads", self.num_heads), False, False))
                continue
            sliding = layer_type == "sliding"
            rope = self.pos_embed == "rope" and i not in (self.nope_layers or ())
            options = {**self.attention_options, **self._model_options(self.attention, i, sliding=sliding, rope=rope)}
            plan.append(LayerPlan(self.attention, self._placed(self.attention, i, options), self.num_heads, sliding,
                                  rope))
        return plan

    def _model_options(self, kind: str, layer: int, *, sliding: bool, rope: bool) -> dict[str, Any]:
        """The options the model's own fields give a layer of kind ``kind`` (positions, a window,
        heads' sizes, QK-norm, logit scale and soft-capping): those ``kind`` takes, for the kinds
        of ``layers`` other than ``attention`` (whose options were checked against it)."""
        options: dict[str, Any] = {}
        sliding_rope = sliding and self.rope_local_theta is not None  # Gemma 3: plain rotary on the sliding layers
        if self.pos_embed == "alibi":
            options["alibi"] = True
        elif rope:
            options.update(rope=True, rope_theta=self.rope_local_theta if sliding_rope else self.rope_theta)
            if self.rope_scaling is not None and not sliding_rope:
                options.update(rope_scaling=self.rope_scaling, max_len=self.max_len)
            if self.partial_rotary != 1.0:
                options["partial_rotary"] = self.partial_rotary
        kind_options = self._kind_options()
        if "sliding_window" in kind_options and sliding:
            options["sliding_window"] = self.sliding_window
        for key in ("num_kv_heads", "head_dim", "qk_norm", "out_bias", "output_gate"):
            if key in kind_options:
                options[key] = {"out_bias": self.attention_out_bias,
                                "output_gate": self.attention_output_gate}.get(key, getattr(self, key, None))
        if self.query_pre_attn_scalar is not None:
            options["scale"] = float(self.query_pre_attn_scalar) ** -0.5
        if self.attn_softcap is not None:
            options["softcap"] = self.attn_softcap
        if kind != self.attention:
            options = {k: v for k, v in options.items() if attention_entry(kind).takes(k)}
        return options

    def _has_sliding(self) -> bool:
        """Whether some layer slides (without listing the layers: the depth is not checked yet)."""
        if self.layers is not None:
            return isinstance(self.layers, (list, tuple)) and any(
                isinstance(e, dict) and e.get("sliding", self.sliding_window is not None) or isinstance(e, str)
                and self.sliding_window is not None for e in self.layers)
        if self.layer_types is not None:
            return "sliding" in self.layer_types
        if self.window_pattern is not None:
            return self.window_pattern > 1
        return self.sliding_window is not None

    def layer_kinds(self) -> list[str]:
        """Each layer's type, ``"sliding"``, ``"full"`` or ``"linear"``: ``layer_types``, else every
        ``window_pattern``-th layer full (Gemma 3's 5 sliding to 1 full is 6), else all sliding
        when there is a ``sliding_window``, else all full; with ``layers``, each entry's sliding or full."""
        depth = self.depth if isinstance(self.depth, int) else 0
        if self.layers is not None:
            return [layer.type for layer in self.layer_plan()]
        if self.layer_types is not None:
            return list(self.layer_types)
        if self.window_pattern is not None:
            return ["full" if (i + 1) % self.window_pattern == 0 else "sliding" for i in range(depth)]
        return ["sliding" if self.sliding_window is not None else "full"] * depth

    def _kind_options(self) -> dict[str, str]:
        """The attention options this config sets (beyond the defaults), by the field that sets them."""
        asked = {"num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim, "sliding_window": self.sliding_window,
                 "qk_norm": self.qk_norm or None, "rope_scaling": self.rope_scaling,
                 "partial_rotary": None if self.partial_rotary == 1.0 else self.partial_rotary,
                 "scale": self.query_pre_attn_scalar, "softcap": self.attn_softcap,
                 "out_bias": self.attention_out_bias, "output_gate": self.attention_output_gate or None}
        names = {"scale": "query_pre_attn_scalar", "softcap": "attn_softcap", "out_bias": "attention_out_bias",
                 "output_gate": "attention_output_gate"}
        return {k: names.get(k, k) for k, v in asked.items() if v is not None}

    def attention_of(self, layer: int) -> str:
        """The attention kind of layer ``layer`` (:meth:`layer_plan`)."""
        return self.layer_plan()[layer].attention

    def heads_of(self, layer: int) -> int:
        """The heads of layer ``layer``'s attention (:meth:`layer_plan`)."""
        return self.layer_plan()[layer].heads

    def attention_options_of(self, layer: int) -> dict[str, Any]:
        """The options the attention of layer ``layer`` is built with, besides width and heads (:meth:`layer_plan`)."""
        return dict(self.layer_plan()[layer].options)

    def attention_kinds(self) -> list[str]:
        """Each layer's attention kind, in order."""
        return [layer.attention for layer in self.layer_plan()]

    def _placed(self, kind: str, layer: int, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` with what kind ``kind`` declares it takes from its place in the decoder
        (``from_model``: the layer's depth, the model's norm eps), where the recipe set none."""
        place = {"layer_index": layer, "norm_eps": self.norm_eps}
        for option in attention_entry(kind).options:
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
