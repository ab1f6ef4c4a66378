"""The Hugging Face families attnlab reads, one entry each in :data:`HF_FAMILIES`: how a
``config.json`` becomes an attnlab configuration (every key of it accounted for:
:mod:`attnlab.formats.hf.keys`), the model class, and the table of weight names.

Each family is one configuration map and one readable list of key renames (GPT-2 stores
its projections as ``Conv1D``, the transpose of a linear layer, and packs query, key and
value in ``c_attn``; Phi-3 packs them in ``qkv_proj``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

from torch import Tensor, nn

from ...errors import InputError
from ...weight_rules import Rule, apply_map, expand
from ...models.encoder import TextEncoder, TextEncoderConfig
from ...models.gpt import GPT, GPTConfig
from ...models.vit import VisionTransformer, ViTConfig

__all__ = ["HF_FAMILIES", "HFFamily", "ENCODER_ARCHITECTURES", "stored_layers"]


def _gpt2_weights(cfg: GPTConfig) -> list[Rule]:
    L, B = "h.{i}.", "blocks.{i}."
    return [("wte", "tok_embed", ""), ("wpe", "pos_embed", ""), ("ln_f", "norm", ""), ("lm_head", "head", ""),
            (L + "ln_1", B + "norm1", ""), (L + "ln_2", B + "norm2", ""),
            (L + "attn.c_attn", (B + "attn.q_proj", B + "attn.k_proj", B + "attn.v_proj"), "T split"),
            (L + "attn.c_proj", B + "attn.o_proj", "T"),
            (L + "mlp.c_fc", B + "mlp.c_fc", "T"), (L + "mlp.c_proj", B + "mlp.c_proj", "T")]


def _decoder_weights(cfg: GPTConfig, *, gemma: bool = False, packed: bool = False) -> list[Rule]:
    """Llama's names, which Mistral, Qwen2/3, SmolLM3, Gemma 2/3, Phi-3 and DiffLlama share;
    ``gemma``: four norms a block, each stored minus one; ``packed``: Phi-3's joined projections;
    DiffLlama's four lambda vectors a layer."""
    L, B = "model.layers.{i}.", "blocks.{i}."
    norm = "+1" if gemma else ""
    rules: list[Rule] = [("model.embed_tokens", "tok_embed", ""), ("model.norm", "norm", norm),
                         ("lm_head", "head", ""), (L + "input_layernorm", B + "norm1", norm)]
    if gemma:
        rules += [(L + "post_attention_layernorm", B + "post_attn_norm", norm),
                  (L + "pre_feedforward_layernorm", B + "norm2", norm),
                  (L + "post_feedforward_layernorm", B + "post_mlp_norm", norm)]
    else:
        rules.append((L + "post_attention_layernorm", B + "norm2", ""))
    if packed:
        rules += [(L + "self_attn.qkv_proj", tuple(B + f"attn.{n}_proj" for n in "qkv"), "split"),
                  (L + "mlp.gate_up_proj", (B + "mlp.gate_proj", B + "mlp.up_proj"), "split")]
    else:
        rules += [(L + f"self_attn.{n}_proj", B + f"attn.{n}_proj", "") for n in "qkv"]
        rules += [(L + f"mlp.{n}_proj", B + f"mlp.{n}_proj", "") for n in ("gate", "up")]
    rules += [(L + "self_attn.o_proj", B + "attn.o_proj", ""), (L + "mlp.down_proj", B + "mlp.down_proj", ""),
              (L + "self_attn.q_norm", B + "attn.q_norm", norm), (L + "self_attn.k_norm", B + "attn.k_norm", norm)]
    rules += [(L + f"self_attn.lambda_{n}", B + f"attn.lambda_{n}", "") for n in ("q1", "k1", "q2", "k2")]
    return rules


# A layer's index in a checkpoint's names: gpt2's h.3., llama's layers.3., BERT's and ViT's layer.3.
_LAYER = re.compile(r"(?:^|\.)(?:h|layers?)\.(\d+)\.")


def stored_layers(sd: dict[str, Tensor]) -> set[str]:
    """The layer indices the checkpoint's names hold."""
    return {m.group(1) for k in sd if (m := _LAYER.search(k))}


# --------------------------------------------------------------------------- decoder configs
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
_ACTIVATIONS = {"silu": "swiglu", "gelu_pytorch_tanh": "geglu", "gelu_tanh": "geglu"}


def _per_layer(entries: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """One :attr:`GPTConfig.layers` entry per layer as its shortest pattern (Gemma 3's six
    entries for 5 sliding layers to 1 full one, repeated to the depth), or ``None`` when every
    layer is the same plain layer (the config's own fields say it all)."""
    if all(e == entries[0] for e in entries) and set(entries[0]) <= {"sliding"}:
        return None
    n = len(entries)
    period = next(p for p in range(1, n + 1) if n % p == 0 and entries == entries[:p] * (n // p))
    return entries[:period]


def _rope(c: dict[str, Any], rotary_dim: int, flat: Callable[[dict[str, Any]], dict] | None = None,
          ) -> tuple[float, dict | None, float | None, float]:
    """``(rope_theta, rope_scaling, the sliding layers' plain base or None, partial_rotary)`` of
    config.json's ``rope_parameters`` (transformers 5; per layer type for Gemma 3) or
    ``rope_theta``/``rope_scaling`` (older folders; ``flat`` turns a family's own flat keys into
    ``rope_parameters``)."""
    params = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise InputError(f"config.json: rope_parameters must be a mapping; got {params!r}")
    local = None
    key = "rope_parameters" if c.get("rope_parameters") else "rope_scaling"
    if flat is not None and not c.get("rope_parameters"):
        params = flat(c)
    if "full_attention" in params or "sliding_attention" in params:  # one set per layer type
        sliding = params.get("sliding_attention") or {}
        if sliding.get("rope_type", sliding.get("type", "default")) != "default":
            raise InputError(f"config.json: rope_parameters.sliding_attention.rope_type "
                             f"{sliding.get('rope_type')!r} is not supported (the sliding layers' rotary "
                             f"positions are plain ones)")
        local = float(sliding["rope_theta"]) if "rope_theta" in sliding else None
        params, key = params.get("full_attention") or {}, f"{key}.full_attention"
    theta = float(params.get("rope_theta") or c.get("rope_theta") or 10000.0)
    top = c.get("partial_rotary_factor")  # read either way: transformers 5 writes it in both places
    fraction = float(params.get("partial_rotary_factor") or top or 1.0)
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    if scaling.get("rope_type", scaling.get("type", "default")) in ("default", None):
        return theta, None, local, fraction
    if "original_max_position_embeddings" not in scaling and "original_max_position_embeddings" in c:
        scaling["original_max_position_embeddings"] = c["original_max_position_embeddings"]  # Phi-3 keeps it outside
    from ...attention.rope_scaling import check_rope_scaling

    scaling = check_rope_scaling(scaling, rotary_dim=int(rotary_dim * fraction), name=f"config.json: {key}")
    return theta, scaling, local, fraction


def _gemma3_flat_rope(c: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's rotary settings before transformers 5: a plain base for the sliding layers, the
    scaled one for the full layers."""
    return {"sliding_attention": {"rope_type": "default", "rope_theta": c.get("rope_local_base_freq", 10000.0)},
            "full_attention": {**(c.get("rope_scaling") or {}), "rope_theta": c.get("rope_theta", 1e6)}}


# Each layer's type when config.json has no ``layer_types`` (folders written before transformers
# 5), as each family's config derives it.
def _every_layer_slides(c: dict[str, Any], depth: int) -> list[str]:
    """Mistral, Phi-3, Llama: every layer slides when there is a window."""
    return ["sliding" if c.get("sliding_window") and c.get("use_sliding_window", True) else "full"] * depth


def _alternate(c: dict[str, Any], depth: int) -> list[str]:
    """Gemma 2: sliding and full layers in turn."""
    return ["sliding" if (i + 1) % 2 else "full" for i in range(depth)]


def _gemma3_pattern(c: dict[str, Any], depth: int) -> list[str]:
    """Gemma 3: ``sliding_window_pattern - 1`` sliding layers to one full one."""
    pattern = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6))
    return ["sliding" if (i + 1) % pattern else "full" for i in range(depth)]


def _qwen_from_max_window_layers(c: dict[str, Any], depth: int) -> list[str]:
    """Qwen2 and Qwen3: sliding from ``max_window_layers`` on when ``use_sliding_window``."""
    slides = c.get("sliding_window") and c.get("use_sliding_window")
    return ["sliding" if slides and i >= c.get("max_window_layers", 28) else "full" for i in range(depth)]


def _smollm3_nope_layers(c: dict[str, Any], depth: int) -> list[str]:
    """SmolLM3: sliding in its layers without positions when ``use_sliding_window``."""
    rope = c.get("no_rope_layers") or [int((i + 1) % c.get("no_rope_layer_interval", 4) != 0) for i in range(depth)]
    slides = c.get("sliding_window") and c.get("use_sliding_window")
    return ["sliding" if slides and not rope[i] else "full" for i in range(depth)]


_NEEDED = object()  # a key a config.json must have
Key = tuple[str, str, Any, "Callable[[Any], Any] | None"]  # config.json key, GPTConfig field, default, conversion

# config.json key -> GPTConfig field, with the value when the key is absent and a conversion: the
# keys every Llama-shaped decoder reads alike. What a family reads besides, or defaults or fixes
# otherwise, is its own DecoderTable in _DECODER_FAMILIES.
_DECODER_FIELDS: list[Key] = [
    ("vocab_size", "vocab_size", _NEEDED, None),
    ("max_position_embeddings", "max_len", 2048, None),
    ("intermediate_size", "mlp_hidden_dim", _NEEDED, None),
    ("rms_norm_eps", "norm_eps", 1e-6, None),
    ("attention_bias", "attention_bias", False, bool),
    ("mlp_bias", "mlp_bias", False, bool),
    ("tie_word_embeddings", "tie_embeddings", False, bool),
]


@dataclass(frozen=True)
class DecoderTable:
    """What one Llama-shaped family reads differently from :data:`_DECODER_FIELDS`.

    ``defaults``: config.json key -> its value when absent; ``keys``: more keys read;
    ``fixed``: GPTConfig fields the family always has; ``gemma``: Gemma's layout (four norms a
    block stored minus one, ``hidden_activation``, embeddings scaled by the square root of the
    width); ``packed``: Phi-3's joined projections; ``layer_types``: each layer's type in
    folders without ``layer_types``; ``flat_rope``: the family's rotary keys before
    ``rope_parameters``."""

    defaults: dict[str, Any] = field(default_factory=dict)
    keys: tuple[Key, ...] = ()
    fixed: dict[str, Any] = field(default_factory=dict)
    gemma: bool = False
    packed: bool = False
    layer_types: Callable[[dict[str, Any], int], list[str]] = _every_layer_slides
    flat_rope: Callable[[dict[str, Any]], dict] | None = None

    def fields(self, c: dict[str, Any]) -> dict[str, Any]:
        """The GPTConfig fields that config.json's keys give directly."""
        out: dict[str, Any] = {}
        for key, name, default, convert in [*_DECODER_FIELDS, *self.keys]:
            value = c[key] if default is _NEEDED else c.get(key, self.defaults.get(key, default))
            out[name] = value if convert is None or value is None else convert(value)
        return {**out, **self.fixed}


_GEMMA_KEYS: tuple[Key, ...] = (("attn_logit_softcapping", "attn_softcap", None, None),
                                ("final_logit_softcapping", "logit_softcap", None, None),
                                ("query_pre_attn_scalar", "query_pre_attn_scalar", None, float))
_DECODER_FAMILIES: dict[str, DecoderTable] = {
    "llama": DecoderTable(), "mistral": DecoderTable(), "ministral": DecoderTable(),
    "phi3": DecoderTable(packed=True),
    "qwen2": DecoderTable(defaults={"attention_bias": True}, fixed={"attention_out_bias": False},  # no output bias
                          layer_types=_qwen_from_max_window_layers),
    "qwen3": DecoderTable(fixed={"qk_norm": True}, layer_types=_qwen_from_max_window_layers),
    "smollm3": DecoderTable(defaults={"tie_word_embeddings": True}, layer_types=_smollm3_nope_layers),
    "gemma2": DecoderTable(defaults={"tie_word_embeddings": True}, keys=_GEMMA_KEYS, fixed={"post_norms": True},
                           gemma=True, layer_types=_alternate),
    "gemma3_text": DecoderTable(defaults={"tie_word_embeddings": True}, keys=_GEMMA_KEYS,
                                fixed={"post_norms": True, "qk_norm": True}, gemma=True,
                                layer_types=_gemma3_pattern, flat_rope=_gemma3_flat_rope),
    "diffllama": DecoderTable(fixed={"attention": "differential"}),
}


def _decoder_config(c: dict[str, Any], sd: dict[str, Tensor], table: DecoderTable) -> GPTConfig:
    """A GPTConfig of a Llama-shaped decoder's config.json (Llama, Mistral, Qwen2/3, SmolLM3,
    Gemma 2/3, Phi-3, DiffLlama), read by the family's ``table``. Keys of folders written
    before transformers 5 (no ``layer_types``; Gemma 3's ``sliding_window_pattern`` and
    ``rope_local_base_freq``) are read as transformers reads them."""
    act_key = "hidden_activation" if table.gemma and "hidden_activation" in c else "hidden_act"
    act = c.get(act_key, "gelu_pytorch_tanh" if table.gemma else "silu")
    if act not in _ACTIVATIONS:
        raise InputError(f"config.json: {act_key} {act!r} is not supported; gated MLPs take "
                         f"{', '.join(_ACTIVATIONS)}")
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim")
    if head_dim is None and hidden % heads:
        raise InputError(f"config.json: hidden_size {hidden} is not divisible by num_attention_heads {heads}, and "
                         f"head_dim is not given")
    depth = c["num_hidden_layers"]
    c.get("sliding_window")  # read: it matters to the sliding layers, and where none slides it changes nothing
    if "layer_types" in c and c["layer_types"] is not None:
        unknown = [t for t in c["layer_types"] if t not in _LAYER_TYPES]
        if unknown:
            raise InputError(f"config.json: layer_types {unknown[0]!r} is not supported; attnlab's layers are "
                             f"{' and '.join(_LAYER_TYPES)}")
        types = [_LAYER_TYPES[t] for t in c["layer_types"]]
    elif isinstance(depth, int) and 0 < depth <= len(stored_layers(sd)):  # else refused below, by the weights
        types = table.layer_types(c, depth)
    else:
        types = ["full"]
    window = c.get("sliding_window") if "sliding" in types else None
    if not window:  # Qwen2's sliding layers without a window (use_sliding_window false) attend to everything
        types = ["full"] * len(types)
    theta, scaling, local, fraction = _rope(c, head_dim or hidden // heads, table.flat_rope)
    nope = None
    if c.get("no_rope_layers") is not None:  # SmolLM3: 1 = rotary positions, 0 = none
        nope = [i for i, use in enumerate(c["no_rope_layers"]) if not use] or None
    return GPTConfig(
        **table.fields(c), embed_dim=hidden, depth=depth, num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=head_dim if head_dim not in (None, hidden // heads) or hidden % heads else None,
        mlp=_ACTIVATIONS[act], norm="rmsnorm", pos_embed="rope", rope_theta=theta, rope_scaling=scaling,
        partial_rotary=fraction, sliding_window=window if "sliding" in types else None,
        layers=_per_layer([{"sliding": t == "sliding", **({"positions": False} if i in (nope or ()) else {})}
                           for i, t in enumerate(types)]),
        rope_local_theta=local if local is not None and local != theta and "sliding" in types else None,
        embed_scale=float(hidden) ** 0.5 if table.gemma else None, bias=False)


def _deepseek_config(c: dict[str, Any], sd: dict[str, Tensor], family: str, *, indexed: bool) -> GPTConfig:
    """DeepSeek-V3's config.json with every layer dense (``first_k_dense_replace`` at least the
    number of layers): multi-head latent attention (``kv_lora_rank``, ``q_lora_rank``, heads
    of ``qk_nope_head_dim`` + ``qk_rope_head_dim`` and values of ``v_head_dim``), Llama's MLP.
    With yarn rotary positions and ``mscale_all_dim``, the logits are scaled by ``mscale**2``
    as DeepSeek's attention does. ``indexed``: DeepSeek-V3.2, whose indexer picks each query's keys."""
    depth = c["num_hidden_layers"]
    types, kind = c.get("layer_types"), "indexed_attention" if indexed else "full_attention"
    if types is not None and any(t != kind for t in types):  # every layer the same kind, as attnlab builds them
        raise InputError(f"config.json: layer_types {sorted(set(types) - {kind})} are not supported in a "
                         f"{family} folder (its layers are all {kind})")
    dense = c.get("first_k_dense_replace", 3)
    if dense is None or (isinstance(depth, int) and dense < depth):
        raise InputError(f"config.json: first_k_dense_replace {dense!r} is below num_hidden_layers {depth}: layers "
                         f"from {dense} on have a mixture-of-experts MLP, which attnlab does not implement")
    heads = c["num_attention_heads"]
    if c.get("num_key_value_heads") not in (None, heads):
        raise InputError(f"config.json: num_key_value_heads {c['num_key_value_heads']!r} differs from "
                         f"num_attention_heads {heads}: latent attention makes every head's key and value")
    act = c.get("hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise InputError(f"config.json: hidden_act {act!r} is not supported; gated MLPs take {', '.join(_ACTIVATIONS)}")
    nope, rope_dim = int(c.get("qk_nope_head_dim", 128)), int(c.get("qk_rope_head_dim", 64))
    theta, scaling, _, fraction = _rope(c, rope_dim)
    if fraction != 1.0:
        raise InputError(f"config.json: partial_rotary_factor {fraction} is not supported with latent attention")
    scalar = None  # the logits' scale as query_pre_attn_scalar ** -0.5: (nope + rope_dim) / mscale ** 4
    if scaling is not None and scaling.get("mscale_all_dim"):
        factor = float(scaling["factor"])
        mscale = 0.1 * float(scaling["mscale_all_dim"]) * math.log(factor) + 1.0 if factor > 1 else 1.0
        scalar = (nope + rope_dim) / mscale ** 4
    options = {"kv_rank": int(c.get("kv_lora_rank", 512)), "q_rank": c.get("q_lora_rank"), "rope_dim": rope_dim,
               "v_head_dim": int(c.get("v_head_dim") or nope), "rope_interleave": bool(c.get("rope_interleave", True))}
    kind = "latent"
    if indexed:  # DeepSeek's sparse attention: an indexer picks each query's keys
        if c.get("q_lora_rank") is None:
            raise InputError("config.json: q_lora_rank is null; DeepSeek-V3.2's indexer reads the compressed query")
        kind = "dsa"
        options.update(rope_interleave=True, index_topk=int(c.get("index_topk", 2048)),
                       index_heads=int(c.get("index_n_heads", 64)), index_head_dim=int(c.get("index_head_dim", 128)))
    return GPTConfig(
        vocab_size=c["vocab_size"], max_len=c.get("max_position_embeddings", 4096), embed_dim=c["hidden_size"],
        depth=depth, num_heads=heads, head_dim=nope, mlp_hidden_dim=c["intermediate_size"], mlp=_ACTIVATIONS[act],
        norm="rmsnorm", norm_eps=c.get("rms_norm_eps", 1e-6), pos_embed="rope", rope_theta=theta,
        rope_scaling=scaling, bias=False, attention_bias=bool(c.get("attention_bias", False)),
        mlp_bias=bool(c.get("mlp_bias", False)),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)), query_pre_attn_scalar=scalar, attention=kind,
        attention_options=options)


def _qwen35_config(c: dict[str, Any], sd: dict[str, Tensor]) -> GPTConfig:
    """Qwen3.5's text decoder: ``layer_types`` of gated delta layers (``linear_attention``, with
    heads and sizes of their own) and full attention with QK-norm, an output gate and partial
    rotary positions."""
    types = c.get("layer_types")
    known = {"linear_attention": "linear", "full_attention": "full"}
    if not isinstance(types, list) or any(t not in known for t in types):
        raise InputError(f"config.json: layer_types must list 'linear_attention' or 'full_attention' per layer; "
                         f"got {types!r}")
    act = c.get("hidden_act", "silu")
    if act != "silu":
        raise InputError(f"config.json: hidden_act {act!r} is not supported (Qwen3.5's MLP and convolution use silu)")
    heads, hidden = c["num_attention_heads"], c["hidden_size"]
    head_dim = c.get("head_dim") or hidden // heads
    theta, scaling, _, fraction = _rope(c, head_dim)
    linear_heads = c["linear_num_value_heads"]
    linear = {"num_key_heads": c["linear_num_key_heads"],
              "head_dim": c["linear_key_head_dim"], "v_head_dim": c["linear_value_head_dim"],
              "conv_size": c.get("linear_conv_kernel_dim", 4), "norm_eps": c.get("rms_norm_eps", 1e-6)}
    return GPTConfig(
        vocab_size=c["vocab_size"], max_len=c.get("max_position_embeddings", 4096), embed_dim=hidden,
        depth=c["num_hidden_layers"], num_heads=heads, num_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=head_dim if head_dim != hidden // heads or hidden % heads else None,
        mlp_hidden_dim=c["intermediate_size"], mlp="swiglu", norm="rmsnorm", norm_eps=c.get("rms_norm_eps", 1e-6),
        pos_embed="rope", rope_theta=theta, rope_scaling=scaling, partial_rotary=fraction, qk_norm=True,
        attention_output_gate=True, bias=False, attention_bias=bool(c.get("attention_bias", False)), mlp_bias=False,
        layers=_per_layer([{"attention": "gated_delta", "options": linear, "num_heads": linear_heads}
                           if t == "linear_attention" else {"attention": "exact"} for t in types]),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)))


def _qwen35_weights(cfg: GPTConfig) -> list[Rule]:
    """Qwen3.5's names: norms stored minus one (the gated delta layer's own norm is not), the full
    attention's Llama names, the linear layers' own."""
    L, B = "model.layers.{i}.", "blocks.{i}."
    rules: list[Rule] = [("model.embed_tokens", "tok_embed", ""), ("model.norm", "norm", "+1"), ("lm_head", "head", ""),
                         (L + "input_layernorm", B + "norm1", "+1"), (L + "post_attention_layernorm", B + "norm2", "+1"),
                         (L + "self_attn.q_norm", B + "attn.q_norm", "+1"), (L + "self_attn.k_norm", B + "attn.k_norm", "+1"),
                         (L + "linear_attn.norm.weight", B + "attn.norm_weight", "")]
    rules += [(L + f"mlp.{n}_proj", B + f"mlp.{n}_proj", "") for n in ("gate", "up", "down")]
    rules += [(L + f"self_attn.{n}_proj", B + f"attn.{n}_proj", "") for n in "qkvo"]
    rules += [(L + f"linear_attn.{n}", B + f"attn.{n}", "") for n in (
        "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "out_proj", "dt_bias", "A_log")]
    return rules


def _deepseek_weights(cfg: GPTConfig) -> list[Rule]:
    """DeepSeek's names: Llama's norms and MLP, the latent attention's own projections (and
    DeepSeek-V3.2's indexer)."""
    L, B = "model.layers.{i}.", "blocks.{i}."
    rules: list[Rule] = [("model.embed_tokens", "tok_embed", ""), ("model.norm", "norm", ""), ("lm_head", "head", ""),
                         (L + "input_layernorm", B + "norm1", ""), (L + "post_attention_layernorm", B + "norm2", "")]
    rules += [(L + f"mlp.{n}_proj", B + f"mlp.{n}_proj", "") for n in ("gate", "up", "down")]
    rules += [(L + f"self_attn.{n}", B + f"attn.{n}", "") for n in (
        "q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
        "o_proj")]
    rules += [(L + f"self_attn.indexer.{n}", B + f"attn.indexer.{n}", "") for n in (
        "wq_b", "wk", "k_norm", "weights_proj")]
    return rules


def _gpt2_config(c: dict[str, Any], sd: dict[str, Tensor]) -> GPTConfig:
    activation = c.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
        raise InputError(f"config.json: activation_function {activation!r} is not supported for GPT-2")
    for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if c.get(key):
            raise InputError(f"config.json: {key} {c[key]!r} is not supported (attnlab's GPT-2 scales by the head "
                             f"size alone)")
    if c.get("scale_attn_weights", True) is False:
        raise InputError("config.json: scale_attn_weights False is not supported (attention logits are scaled)")
    return GPTConfig(vocab_size=c["vocab_size"], max_len=c["n_positions"], embed_dim=c["n_embd"], depth=c["n_layer"],
                     num_heads=c["n_head"], mlp_hidden_dim=c.get("n_inner") or 4 * c["n_embd"],
                     mlp="gelu" if activation == "gelu" else "gelu_tanh", norm="layernorm",
                     norm_eps=c.get("layer_norm_epsilon", 1e-5), pos_embed="learned", bias=True,
                     tie_embeddings=c.get("tie_word_embeddings", True))


# --------------------------------------------------------------------------- encoders
ENCODER_ARCHITECTURES = {"bert": ("BertModel", "BertForSequenceClassification"),
                         "roberta": ("RobertaModel", "RobertaForSequenceClassification"),
                         "distilbert": ("DistilBertModel", "DistilBertForSequenceClassification")}


def _architecture(c: dict[str, Any], family: str) -> str:
    """The one architecture of ``config.json`` that from_hf reads for ``family``."""
    known = ENCODER_ARCHITECTURES[family]
    named = c.get("architectures") or [known[0]]
    unread = [a for a in named if a not in known]
    if unread:
        raise InputError(f"config.json: architecture {unread[0]!r} is not supported; from_hf reads "
                         f"{' and '.join(known)} of the {family} family (the encoder, and it with a sequence "
                         f"classification head)")
    return named[0]


def _classes(c: dict[str, Any], sd: dict[str, Tensor], family: str, head: str) -> tuple[bool, int]:
    """Whether the folder is the family's classifier, and its number of classes (0: none)."""
    classify = _architecture(c, family).endswith("ForSequenceClassification")
    return classify, int(sd[head].shape[0]) if classify and head in sd else 0


def _check_encoder_act(c: dict[str, Any]) -> None:
    act = c.get("hidden_act", c.get("activation", "gelu"))
    if act != "gelu":
        raise InputError(f"config.json: activation {act!r} is not supported (attnlab's encoder layers take gelu)")


def _bert_config(c: dict[str, Any], sd: dict[str, Tensor], family: str, *, head: str,
                 positions_from_ids: bool = False) -> TextEncoderConfig:
    """BERT's and RoBERTa's config.json (``head``: the classifier's weight; RoBERTa counts
    positions from the padding token's index, ``positions_from_ids``)."""
    _check_encoder_act(c)
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise InputError(f"config.json: position_embedding_type {c['position_embedding_type']!r} is not supported "
                         f"(absolute positions only)")
    sd = {k.removeprefix(family + "."): v for k, v in sd.items()}
    classify, num_classes = _classes(c, sd, family, head)
    pooled = classify or any(k.endswith("pooler.dense.weight") for k in sd)
    return TextEncoderConfig(vocab_size=c["vocab_size"], num_classes=num_classes, embed_dim=c["hidden_size"],
                             depth=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                             mlp_ratio=c["intermediate_size"] / c["hidden_size"],
                             max_len=c.get("max_position_embeddings", 512), type_vocab_size=c.get("type_vocab_size", 2),
                             pad_token_id=c.get("pad_token_id", 0) if c.get("pad_token_id") is not None else 0,
                             positions_from_ids=positions_from_ids, norm_eps=c.get("layer_norm_eps", 1e-12),
                             drop_rate=c.get("hidden_dropout_prob", 0.1),
                             attn_drop_rate=c.get("attention_probs_dropout_prob", 0.1),
                             pooler="tanh" if pooled else "none")


def _distilbert_config(c: dict[str, Any], sd: dict[str, Tensor], family: str) -> TextEncoderConfig:
    """DistilBERT's config.json: its own key names, no token types, a ReLU pre-classifier."""
    _check_encoder_act(c)
    sd = {k.removeprefix(family + "."): v for k, v in sd.items()}
    classify, num_classes = _classes(c, sd, family, "classifier.weight")
    return TextEncoderConfig(vocab_size=c["vocab_size"], num_classes=num_classes, embed_dim=c["dim"],
                             depth=c["n_layers"], num_heads=c["n_heads"], mlp_ratio=c["hidden_dim"] / c["dim"],
                             max_len=c.get("max_position_embeddings", 512), type_vocab_size=0,
                             pad_token_id=c.get("pad_token_id", 0), norm_eps=1e-12,  # DistilBERT's, fixed
                             drop_rate=c.get("dropout", 0.1), attn_drop_rate=c.get("attention_dropout", 0.1),
                             pooler="relu" if classify else "none")


_QKV = (("query", "q"), ("key", "k"), ("value", "v"))  # BERT's and ViT's names of the projections


def _bert_weights(cfg: TextEncoderConfig) -> list[Rule]:
    L, B = "encoder.layer.{i}.", "encoder.layers.{i}."
    return [*_encoder_embeddings(), ("pooler.dense", "pooler", ""), ("classifier", "head", ""),
            *((L + f"attention.self.{theirs}", B + f"self_attn.{n}_proj", "") for theirs, n in _QKV),
            (L + "attention.output.dense", B + "self_attn.o_proj", ""),
            (L + "attention.output.LayerNorm", B + "norm1", ""), (L + "intermediate.dense", B + "ff.fc1", ""),
            (L + "output.dense", B + "ff.fc2", ""), (L + "output.LayerNorm", B + "norm2", "")]


def _roberta_weights(cfg: TextEncoderConfig) -> list[Rule]:
    rules = [r for r in _bert_weights(cfg) if r[0] not in ("pooler.dense", "classifier")]
    if cfg.num_classes:  # the classification head's dense layer takes the pooler's place
        return [*rules, ("classifier.dense", "pooler", ""), ("classifier.out_proj", "head", "")]
    return [*rules, ("pooler.dense", "pooler", "")]


def _distilbert_weights(cfg: TextEncoderConfig) -> list[Rule]:
    L, B = "transformer.layer.{i}.", "encoder.layers.{i}."
    return [*_encoder_embeddings(), ("pre_classifier", "pooler", ""), ("classifier", "head", ""),
            *((L + f"attention.{n}_lin", B + f"self_attn.{n}_proj", "") for n in "qkv"),
            (L + "attention.out_lin", B + "self_attn.o_proj", ""), (L + "sa_layer_norm", B + "norm1", ""),
            (L + "ffn.lin1", B + "ff.fc1", ""), (L + "ffn.lin2", B + "ff.fc2", ""),
            (L + "output_layer_norm", B + "norm2", "")]


def _encoder_embeddings() -> list[Rule]:
    return [("embeddings.word_embeddings", "embed", ""), ("embeddings.position_embeddings", "pos_embed", ""),
            ("embeddings.token_type_embeddings", "type_embed", ""), ("embeddings.LayerNorm", "embed_norm", "")]


def _vit_config(c: dict[str, Any], sd: dict[str, Tensor]) -> ViTConfig:
    arch = (c.get("architectures") or ["ViTModel"])[0]
    if arch not in ("ViTModel", "ViTForImageClassification"):
        raise InputError(f"config.json: architecture {arch!r} is not supported; from_hf reads ViTModel and "
                         f"ViTForImageClassification of the vit family")
    if c.get("hidden_act", "gelu") != "gelu":
        raise InputError(f"config.json: hidden_act {c['hidden_act']!r} is not supported (attnlab's ViT takes gelu)")
    size = c.get("image_size", 224)
    return ViTConfig(img_size=tuple(size) if isinstance(size, (list, tuple)) else (size, size),
                     patch_size=c.get("patch_size", 16), in_chans=c.get("num_channels", 3),
                     num_classes=int(sd["classifier.weight"].shape[0]) if "classifier.weight" in sd else 0,
                     embed_dim=c["hidden_size"], depth=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                     mlp_ratio=c["intermediate_size"] / c["hidden_size"], qkv_bias=c.get("qkv_bias", True),
                     pre_logits="pooler.dense.weight" in sd or "vit.pooler.dense.weight" in sd,
                     norm_eps=c.get("layer_norm_eps", 1e-12), drop_rate=c.get("hidden_dropout_prob", 0.0),
                     attn_drop_rate=c.get("attention_probs_dropout_prob", 0.0))


def _vit_weights(cfg: ViTConfig) -> list[Rule]:
    L, B = "encoder.layer.{i}.", "blocks.{i}."
    return [("embeddings.cls_token", "cls_token", ""), ("embeddings.position_embeddings", "pos_embed", ""),
            ("embeddings.patch_embeddings.projection", "patch_embed.proj", ""), ("layernorm", "norm", ""),
            ("pooler.dense", "pre_logits.fc", ""), ("classifier", "head", ""),
            *((L + f"attention.attention.{theirs}", B + f"attn.{n}_proj", "") for theirs, n in _QKV),
            (L + "attention.output.dense", B + "attn.o_proj", ""), (L + "layernorm_before", B + "norm1", ""),
            (L + "layernorm_after", B + "norm2", ""), (L + "intermediate.dense", B + "mlp.fc1", ""),
            (L + "output.dense", B + "mlp.fc2", "")]


@dataclass(frozen=True)
class HFFamily:
    """How one ``model_type`` of Hugging Face becomes an attnlab model: its config (from
    config.json and the weights' shapes), the model class, the table of weight names (for
    that config), the prefix its checkpoints put before the names (taken off first), the
    checkpoint entries that are buffers rather than weights, and the registered model its
    folders build on (what fine-tuning records)."""

    config: Callable[[dict[str, Any], dict[str, Tensor]], Any]
    model: Callable[[Any], nn.Module]
    weights: Callable[[Any], list[Rule]]
    registered: str
    prefix: str = ""
    buffers: str = r"$^"  # a regular expression

    def convert(self, sd: dict[str, Tensor], cfg: Any, expected: dict[str, Tensor],
                ) -> tuple[dict[str, Tensor], dict[str, str], dict[str, Tensor]]:
        sd = {k.removeprefix(self.prefix) if self.prefix else k: v for k, v in sd.items()
              if not re.search(self.buffers, k)}
        return apply_map(sd, expand(self.weights(cfg), getattr(cfg, "depth", 0)), expected)


def _decoder(family: str) -> HFFamily:
    table = _DECODER_FAMILIES[family]
    return HFFamily(partial(_decoder_config, table=table), GPT,
                    partial(_decoder_weights, gemma=table.gemma, packed=table.packed),
                    "llama_tiny", buffers=r"rotary_emb\.inv_freq$")


def _encoder(family: str, config: Callable[..., TextEncoderConfig], weights: Callable[[Any], list[Rule]],
             registered: str, **options: Any) -> HFFamily:
    return HFFamily(partial(config, family=family, **options), TextEncoder, weights, registered,
                    prefix=family + ".", buffers=r"embeddings\.(position_ids|token_type_ids)$")


HF_FAMILIES: dict[str, HFFamily] = {
    "gpt2": HFFamily(_gpt2_config, GPT, _gpt2_weights, "gpt_small", prefix="transformer.",
                     buffers=r"\.attn\.(bias|masked_bias)$"),
    "llama": _decoder("llama"),
    "mistral": _decoder("mistral"),
    "ministral": _decoder("ministral"),
    "qwen2": _decoder("qwen2"),
    "qwen3": _decoder("qwen3"),
    "smollm3": _decoder("smollm3"),
    "gemma2": _decoder("gemma2"),
    "gemma3_text": _decoder("gemma3_text"),
    "phi3": _decoder("phi3"),
    "diffllama": _decoder("diffllama"),
    "qwen3_5_text": HFFamily(_qwen35_config, GPT, _qwen35_weights,
                             "llama_tiny", buffers=r"rotary_emb\.inv_freq$"),
    "deepseek_v3": HFFamily(partial(_deepseek_config, family="deepseek_v3", indexed=False), GPT, _deepseek_weights,
                            "llama_tiny", buffers=r"rotary_emb\.inv_freq$"),
    "deepseek_v32": HFFamily(partial(_deepseek_config, family="deepseek_v32", indexed=True), GPT, _deepseek_weights,
                             "llama_tiny", buffers=r"rotary_emb\.inv_freq$"),
    "bert": _encoder("bert", _bert_config, _bert_weights, "bert_base", head="classifier.weight"),
    "roberta": _encoder("roberta", _bert_config, _roberta_weights, "roberta_base",
                        head="classifier.out_proj.weight", positions_from_ids=True),
    "distilbert": _encoder("distilbert", _distilbert_config, _distilbert_weights, "distilbert_base"),
    "vit": HFFamily(_vit_config, VisionTransformer, _vit_weights, "vit_base_patch16_224", prefix="vit."),
}
