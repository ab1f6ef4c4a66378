"""Change the attention of a pretrained decoder before fine-tuning it (``model.convert_attention``):
its configuration rewritten so that the chosen layers attend differently, its weights loaded as
they are.

``to: sliding``: each chosen layer sees the last ``window`` positions only (Mistral's and
Gemma's sliding-window attention), its projections unchanged; the decoding cache of such a layer
holds ``window`` positions instead of the whole text. A layer that slides already keeps its own
window; a layer of another kind (a linear layer of a hybrid) is refused by its index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import InputError
from .gpt_config import GPTConfig

__all__ = ["ConvertAttention", "convert_options", "cache_bytes_per_token"]

_TAKES_WINDOW = ("exact", "gqa")  # the softmax kinds whose layers slide through sliding_window


@dataclass
class ConvertAttention:
    """``model.convert_attention``: the layers ``layers`` (indices; ``None``: every layer)
    changed ``to`` sliding-window attention over ``window`` positions."""

    to: Literal["sliding"] = "sliding"
    window: int = field(default=256, metadata={"min": 1})  # positions each converted layer's queries see
    layers: list | None = None  # the layers converted, by index (null: every layer)


def convert_options(options: dict[str, Any], spec: ConvertAttention) -> dict[str, Any]:
    """``options`` (a decoder's GPTConfig fields, as a pretrained folder gives them) with the
    layers of ``spec`` converted; refused by name where the model cannot take it."""
    cfg = GPTConfig(**options)
    plan = cfg.layer_plan()
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
            raise InputError(f"model.convert_attention.layers[{k}]: layer {i} computes {plan[i].attention!r}, which "
                             f"takes no window; sliding-window attention replaces softmax attention "
                             f"({', '.join(_TAKES_WINDOW)})")
    if cfg.sliding_window is not None and cfg.sliding_window != spec.window and any(p.sliding for p in plan):
        raise InputError(f"model.convert_attention.window must be the model's own sliding_window "
                         f"{cfg.sliding_window} (its sliding layers see that many positions); got {spec.window}")
    if spec.window >= cfg.max_len:
        raise InputError(f"model.convert_attention.window must be below the model's {cfg.max_len} positions (a "
                         f"window as long as the text changes nothing); got {spec.window}")
    layers = []
    for i, p in enumerate(plan):
        entry: dict[str, Any] = {"sliding": p.sliding or i in chosen, "positions": p.positions}
        if p.attention != cfg.attention:
            entry["attention"] = p.attention
        if p.heads != cfg.num_heads:
            entry["num_heads"] = p.heads
        layers.append(entry)
    converted = {**options, "layers": layers, "sliding_window": spec.window, "layer_types": None,
                 "window_pattern": None, "nope_layers": None}
    GPTConfig(**converted)  # checked as a whole
    return converted


def cache_bytes_per_token(cfg: GPTConfig, length: int, bytes_per_value: int = 2) -> float:
    """The decoding cache's bytes per token of a text of ``length`` tokens: each softmax
    layer keeps keys and values of its key/value heads for every position it sees (a sliding
    layer its window at most), ``bytes_per_value`` each (2: bfloat16)."""
    heads, size = cfg.num_kv_heads or cfg.num_heads, cfg.head_size
    total = 0
    for p in cfg.layer_plan():
        if p.attention not in _TAKES_WINDOW:
            raise InputError(f"cache_bytes_per_token counts softmax layers' caches; the model has a {p.attention!r} layer")
        seen = min(length, cfg.sliding_window) if p.sliding and cfg.sliding_window else length
        total += 2 * heads * size * seen * bytes_per_value
    return total / length
