"""Change the attention of a pretrained decoder before fine-tuning it (``model.convert_attention``):
its configuration rewritten so that the chosen layers attend differently, and, where the new
attention has other weights, those weights made from the pretrained ones.

``to: sliding``: each chosen layer sees the last ``window`` positions only (Mistral's and
Gemma's sliding-window attention), its projections unchanged; the decoding cache of such a layer
holds ``window`` positions instead of the whole text. A layer that slides already keeps its own
window; a layer of another kind (a linear layer of a hybrid) is refused by its index.

``to: latent``: each chosen layer becomes latent attention (:mod:`attnlab.attention.latent`,
DeepSeek-V2's), whose cache holds one latent of ``kv_rank`` numbers a position and a small
rotary key per key/value group instead of every key/value head, as MHA2MLA (Ji et al., 2025)
and TransMLA (Meng et al., 2025) convert a pretrained model:

1. *partial RoPE*: of each head's ``D / 2`` rotary pairs, the ``rope_dim / 2`` of highest
   frequency keep their rotation (MHA2MLA's "high-frequency" choice); the others carry no
   position any more (default: half the head). This is the one change the factorisation cannot
   undo: the model right
   after it differs from the pretrained one even at full rank. The kept pairs become the
   latent kind's rotary part, whose base ``theta ** (rope_dim / D)`` gives them the same
   frequencies as before.
2. *joint factorisation*: the position-free part of the keys and the values of every
   key/value head, ``[W_k_nope; W_v]`` (``Hkv * (2D - rope_dim)`` rows), is factored into
   ``W_UKV W_DKV`` of rank ``kv_rank``: ``W_DKV`` makes the cached latent from
   ``x``, ``W_UKV`` each query head's key and value from it (the rows of its group, repeated).
   At full rank (``kv_rank`` at least ``min(E, Hkv * (2D - rope_dim))``) the keys and values are
   the same as after step 1. Below it, the factors are those nearest in what the layer computes
   on ``calibrate`` windows of the training text (the keys' and values' principal directions,
   as TransMLA takes them), or, with ``calibrate: 0``, nearest in the weights' own measure
   (MHA2MLA's joint SVD). Weighing the activations matters: below full rank, SmolLM2's loss right
   after the change is several nats lower with it (the results page "Language models",
   ``benchmarks/convert_attention.py``). The latent has no norm (``latent_norm=False``), so
   that the product is the key.

The queries and the output projection keep their weights (the queries' rows in the latent
kind's order: each head's position-free part, then its rotary part). Layers with QK-norm,
biases of the query, key or value, scaled or partial rotary positions, a window, soft-capping
or an output gate are refused by name: their attention is not a plain product to factor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

import torch
from torch import Tensor

from ..errors import InputError
from .gpt_config import GPTConfig, LayerPlan

__all__ = ["ConvertAttention", "convert_options", "convert_weights", "cache_bytes_per_token"]

_TAKES_WINDOW = ("exact",)  # the softmax kinds whose layers slide through sliding_window


DEFAULT_WINDOW = 256


@dataclass
class ConvertAttention:
    """``model.convert_attention``: the layers ``layers`` (indices; ``None``: every layer)
    changed ``to`` sliding-window attention over ``window`` positions, or to latent attention
    with a latent of ``kv_rank`` numbers and rotary parts of ``rope_dim``."""

    to: Literal["sliding", "latent"] = "sliding"
    # sliding: the positions each converted layer's queries see (null: 256)
    window: int | None = field(default=None, metadata={"min": 1})
    # latent: the latent's size (null: what halves the cache, Hkv * (D - rope_dim), or the full rank if less)
    kv_rank: int | None = field(default=None, metadata={"min": 1})
    # latent: the rotary part of each head that keeps its positions, its highest frequencies (null: half)
    rope_dim: int | None = field(default=None, metadata={"min": 0})
    # latent: windows of the training text whose activations the factorisation weighs (0: the weights alone)
    calibrate: int = field(default=8, metadata={"min": 0, "max": 1024})
    layers: list | None = None  # the layers converted, by index (null: every layer)


def convert_options(options: dict[str, Any], spec: ConvertAttention) -> dict[str, Any]:
    """``options`` (a decoder's GPTConfig fields, as a pretrained folder gives them) with the
    layers of ``spec`` converted; refused by name where the model cannot take it."""
    cfg = GPTConfig(**options)
    plan = cfg.layer_plan()
    chosen = _chosen_layers(plan, spec)
    if spec.to == "sliding":
        for key in ("kv_rank", "rope_dim", "calibrate"):
            if getattr(spec, key) != getattr(ConvertAttention, key):
                raise InputError(f"model.convert_attention.{key} is an option of to: latent; to: sliding takes window")
        return _to_sliding(options, cfg, plan, chosen, DEFAULT_WINDOW if spec.window is None else spec.window)
    if spec.window is not None:
        raise InputError("model.convert_attention.window is an option of to: sliding; to: latent takes kv_rank and "
                         "rope_dim")
    return _to_latent(options, cfg, plan, chosen, spec)


def _chosen_layers(plan: list[LayerPlan], spec: ConvertAttention) -> list[int]:
    depth = len(plan)
    chosen = list(range(depth)) if spec.layers is None else spec.layers
    if not isinstance(chosen, list) or not chosen:
        raise InputError(f"model.convert_attention.layers must be a non-empty list of layer indices or null (every "
                         f"layer); got {spec.layers!r}")
    for k, i in enumerate(chosen):
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < depth:
            raise InputError(f"model.convert_attention.layers[{k}] must be a layer index in [0, {depth}) (the "
                             f"model has {depth} layers); got {i!r}")
        if plan[i].attention not in _TAKES_WINDOW:
            raise InputError(f"model.convert_attention.layers[{k}]: layer {i} computes {plan[i].attention!r}; "
                             f"model.convert_attention replaces softmax attention ({', '.join(_TAKES_WINDOW)})")
    return chosen


def _entry(cfg: GPTConfig, p: LayerPlan, **changes: Any) -> dict[str, Any]:
    """A ``layers`` entry that builds the layer of ``p`` as it is, with ``changes``."""
    entry: dict[str, Any] = {"sliding": p.sliding, "positions": p.positions}
    if p.attention != cfg.attention:
        entry["attention"] = p.attention
    if p.heads != cfg.num_heads:
        entry["num_heads"] = p.heads
    return {**entry, **changes}


def _rewritten(options: dict[str, Any], layers: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    converted = {**options, "layers": layers, "layer_types": None, "window_pattern": None, "nope_layers": None,
                 **fields}
    GPTConfig(**converted)  # checked as a whole
    return converted


def _to_sliding(options: dict[str, Any], cfg: GPTConfig, plan: list[LayerPlan], chosen: list[int],
                window: int) -> dict[str, Any]:
    if cfg.sliding_window is not None and cfg.sliding_window != window and any(p.sliding for p in plan):
        raise InputError(f"model.convert_attention.window must be the model's own sliding_window "
                         f"{cfg.sliding_window} (its sliding layers see that many positions); got {window}")
    if window >= cfg.max_len:
        raise InputError(f"model.convert_attention.window must be below the model's {cfg.max_len} positions (a "
                         f"window as long as the text changes nothing); got {window}")
    layers = [_entry(cfg, p, sliding=p.sliding or i in chosen) for i, p in enumerate(plan)]
    return _rewritten(options, layers, sliding_window=window)


# What a layer must not have for its keys to be a plain product to factor: (option, what it is).
_NOT_FACTORED = (("qk_norm", "QK-norm"), ("rope_scaling", "a scaled rotary"), ("partial_rotary", "partial rotary"),
                 ("alibi", "ALiBi"), ("softcap", "soft-capped logits"), ("output_gate", "an output gate"),
                 ("sinks", "attention sinks"))


def _latent_shape(cfg: GPTConfig, p: LayerPlan, spec: ConvertAttention, index: int) -> tuple[int, int, int, int]:
    """``(Hkv, D, rope_dim, kv_rank)`` of converted layer ``index``, checked."""
    for key, what in _NOT_FACTORED:
        value = p.options.get(key)
        if value is not None and value is not False and not (key == "partial_rotary" and value == 1.0):
            raise InputError(f"model.convert_attention.to: latent: layer {index} has {what} ({key}="
                             f"{p.options[key]!r}), which a low-rank factorisation of its keys cannot keep")
    if p.sliding:
        raise InputError(f"model.convert_attention.to: latent: layer {index} slides over a window of "
                         f"{cfg.sliding_window}, which latent attention has none of")
    if cfg.attention_bias or (cfg.attention_bias is None and cfg.bias):
        raise InputError("model.convert_attention.to: latent: the model's query, key and value projections have "
                         "biases (attention_bias), which latent attention's projections do not take")
    if cfg.attention_out_bias:
        raise InputError("model.convert_attention.to: latent: the model's attention output has a bias "
                         "(attention_out_bias), which latent attention's does not take")
    heads = p.heads
    kv = p.options.get("num_kv_heads") or heads
    d = p.options.get("head_dim") or cfg.embed_dim // heads
    rope = 0 if not p.positions else max(2, d // 4 * 2) if spec.rope_dim is None else spec.rope_dim
    if p.positions and (rope < 2 or rope % 2 or rope > d - 2):
        raise InputError(f"model.convert_attention.rope_dim must be an even number from 2 to {d - 2} (each head "
                         f"has {d} features, and some must be left to the latent); got {rope}")
    full = min(cfg.embed_dim, kv * (2 * d - rope))
    rank = min(kv * (d - rope), full) if spec.kv_rank is None else spec.kv_rank
    if not 1 <= rank <= full:
        raise InputError(f"model.convert_attention.kv_rank must be from 1 to {full} (the rank of the keys and values "
                         f"it factors: {full} is exact); got {rank}")
    return kv, d, rope, rank


def _to_latent(options: dict[str, Any], cfg: GPTConfig, plan: list[LayerPlan], chosen: list[int],
               spec: ConvertAttention) -> dict[str, Any]:
    layers = []
    for i, p in enumerate(plan):
        if i not in chosen:
            layers.append(_entry(cfg, p))
            continue
        kv, d, rope, rank = _latent_shape(cfg, p, spec, i)
        latent: dict[str, Any] = {"kv_rank": rank, "head_dim": d - rope, "v_head_dim": d, "latent_norm": False,
                                  "scale": p.options.get("scale") or d ** -0.5}
        if rope:  # the kept pairs' frequencies, theta^(-2j/D), as a rotary part of rope features has them
            latent.update(rope_dim=rope, rope_heads=kv, rope_theta=p.options["rope_theta"] ** (rope / d))
        layers.append(_entry(cfg, p, attention="latent", sliding=False, options=latent))
    return _rewritten(options, layers)


def _rotary_features(d: int, rope: int) -> tuple[list[int], list[int]]:
    """``(position-free, rotary)`` feature indices of a head of ``d`` whose highest-frequency
    ``rope / 2`` pairs keep their rotation (pairs ``(j, j + d/2)``, the halves layout)."""
    half, pairs = d // 2, rope // 2
    kept = [*range(pairs), *range(half, half + pairs)]
    return [j for j in range(d) if j not in kept], kept


def convert_weights(weights: dict[str, Tensor], options: dict[str, Any], spec: ConvertAttention,
                    inputs: Iterable[Tensor] = (), prefix: str = "blocks") -> dict[str, Tensor]:
    """The pretrained ``weights`` (attnlab's names) of the decoder of ``options`` (its fields
    before the conversion) made into the weights of the model ``convert_options`` makes of it:
    for ``to: latent``, each chosen layer's query, key and value projections factored as the
    module docstring says (in float64, returned in float32); other weights as they are.

    ``inputs`` (token ids ``(B, L)``, the training text's): the factorisation weighs what the
    layers read (:func:`_input_moments`) instead of treating every input direction alike
    (``spec.calibrate: 0``: the weights alone, whatever ``inputs``)."""
    if spec.to != "latent":
        return weights
    cfg = GPTConfig(**options)
    plan = cfg.layer_plan()
    chosen = _chosen_layers(plan, spec)
    moments = _input_moments(cfg, weights, chosen, inputs, prefix) if spec.calibrate else {}
    out = dict(weights)
    for i in chosen:
        p = plan[i]
        kv, d, rope, rank = _latent_shape(cfg, p, spec, i)
        at = f"{prefix}.{i}.attn."
        wq, wk, wv = (out.pop(f"{at}{n}_proj.weight").double() for n in "qkv")
        nope, kept = _rotary_features(d, rope)
        heads, embed = p.heads, wq.shape[1]
        q = wq.view(heads, d, embed)[:, nope + kept]  # per head: the position-free features, then the rotary
        k = wk.view(kv, d, embed)
        down, up = _factor(k[:, nope].reshape(-1, embed), wv, rank, moments.get(i))
        k_up, v_up = up[: kv * (d - rope)].view(kv, d - rope, rank), up[kv * (d - rope):].view(kv, d, rank)
        group = torch.arange(heads) // (heads // kv)  # the key/value head of each query head
        out[f"{at}q_proj.weight"] = q.reshape(-1, embed).float()
        out[f"{at}kv_a_proj_with_mqa.weight"] = torch.cat([down, k[:, kept].reshape(-1, embed)]).float()
        out[f"{at}kv_b_proj.weight"] = torch.cat([k_up[group], v_up[group]], dim=1).reshape(-1, rank).float()
    return out


def _factor(wk: Tensor, wv: Tensor, rank: int, moment: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(down (rank, E), up (Mk + Mv, rank))`` with ``up @ down`` close to ``[wk; wv]``.

    Without ``moment``: the truncated SVD of ``[wk; wv]``, its singular values split evenly
    between the two factors. With ``moment`` ``C = E[x x^T]`` of the layer's inputs: the
    rank-``rank`` product nearest in what the layer computes, ``E |([wk; wv] - up down) x|^2``,
    which is ``U U^T [wk; wv]`` for ``U`` the top eigenvectors of ``[wk; wv] C [wk; wv]^T`` (PCA
    of the keys and values, as TransMLA does), after the keys are scaled to the values' mean
    size so that neither outweighs the other in that measure (and scaled back in ``up``)."""
    if moment is None:
        u, s, vh = torch.linalg.svd(torch.cat([wk, wv]), full_matrices=False)
        root = s[:rank].sqrt()
        return root[:, None] * vh[:rank], u[:, :rank] * root
    size_k = torch.einsum("ie,ef,if->", wk, moment, wk).sqrt()
    size_v = torch.einsum("ie,ef,if->", wv, moment, wv).sqrt()
    balance = float(size_v / size_k) if size_k > 0 and size_v > 0 else 1.0
    joint = torch.cat([wk * balance, wv])
    _, vectors = torch.linalg.eigh(joint @ moment @ joint.T)  # ascending
    u = vectors[:, -rank:].flip(-1)
    up = u.clone()
    up[: wk.shape[0]] /= balance
    return u.T @ joint, up


def _input_moments(cfg: GPTConfig, weights: dict[str, Tensor], chosen: list[int], inputs: Iterable[Tensor],
                   prefix: str) -> dict[int, Tensor]:
    """``{layer: E[x x^T]}`` (float64 ``(E, E)``) of what each chosen layer's attention reads
    while the unchanged model runs over ``inputs``; empty when there are none."""
    from .gpt import GPT

    batches = list(inputs)
    if not batches:
        return {}
    model = GPT(cfg).eval()
    model.load_state_dict(weights)
    sums: dict[int, Tensor] = {}
    counts = dict.fromkeys(chosen, 0)

    def hook(i: int) -> Any:
        def add(_module: Any, args: tuple, _kwargs: dict) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()
            sums[i] = sums.get(i, 0) + x.T @ x
            counts[i] += x.shape[0]
        return add

    blocks = getattr(model, prefix)
    handles = [blocks[i].attn.register_forward_pre_hook(hook(i), with_kwargs=True) for i in chosen]
    try:
        with torch.no_grad():
            for ids in batches:
                model(ids)
    finally:
        for h in handles:
            h.remove()
    return {i: sums[i] / counts[i] for i in chosen}

def cache_bytes_per_token(cfg: GPTConfig, length: int, bytes_per_value: int = 2) -> float:
    """The decoding cache's bytes per token of a text of ``length`` tokens: each softmax
    layer keeps keys and values of its key/value heads for every position it sees (a sliding
    layer its window at most), a latent layer its latent and rotary keys, ``bytes_per_value``
    each (2: bfloat16)."""
    total = 0
    for p in cfg.layer_plan():
        if p.attention == "latent":
            o = p.options
            total += (o["kv_rank"] + o.get("rope_heads", 1) * o.get("rope_dim", 0)) * length * bytes_per_value
            continue
        if p.attention not in _TAKES_WINDOW:
            raise InputError(f"cache_bytes_per_token counts softmax and latent layers' caches; the model has a "
                             f"{p.attention!r} layer")
        heads, size = p.options.get("num_kv_heads") or p.heads, p.options.get("head_dim") or cfg.embed_dim // p.heads
        seen = min(length, cfg.sliding_window) if p.sliding and cfg.sliding_window else length
        total += 2 * heads * size * seen * bytes_per_value
    return total / length
