"""Rotary frequencies stretched for contexts longer than the pretraining one ("rope scaling").

Each type turns the plain frequencies ``theta^(-2i/d)`` of a rotary dimension ``d`` into
others, and may scale ``cos`` and ``sin`` by an attention factor (a sharper or flatter
softmax). The formulas and their defaults are those of Hugging Face transformers
(``modeling_rope_utils``), so that checkpoints trained with them load as they are:

- ``default``: the plain frequencies (Su et al., 2021, RoFormer).
- ``linear``: every frequency divided by ``factor``, i.e. positions interpolated (Chen et
  al., 2023, "Position Interpolation"; kaiokendev's SuperHOT).
- ``dynamic``: NTK-aware scaling of the base, grown with the sequence once it passes
  ``max_len`` (/u/bloc97 and /u/emozilla, 2023; Qwen 1). Depends on the sequence length.
- ``yarn``: low frequencies interpolated, high ones kept, a linear ramp between the
  ``beta_fast``/``beta_slow`` rotation counts, and the ``0.1 ln(factor) + 1`` attention
  factor (Peng et al., 2023, "YaRN"; Qwen 2.5, DeepSeek-V3 with ``mscale``).
- ``llama3``: wavelengths longer than ``original_max_position_embeddings / low_freq_factor``
  divided by ``factor``, shorter than ``... / high_freq_factor`` kept, smoothed between (Llama 3.1).
- ``longrope``: one searched factor per frequency, ``short_factor`` within the pretraining
  length and ``long_factor`` past it, and the attention factor
  ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))`` (Ding et al., 2024,
  "LongRoPE"; Phi-3). Depends on the sequence length.

A scaling is a dict ``{"rope_type": ..., <its settings>}``, as transformers writes it in
``config.json`` (``rope_scaling``, or ``rope_parameters`` since transformers 5).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..errors import InputError

__all__ = ["ROPE_TYPES", "check_rope_scaling", "rope_frequencies", "depends_on_length"]

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")

# type -> (required settings, optional settings). original_max_position_embeddings is optional
# where transformers fills it in from max_position_embeddings (our max_len) when it is missing.
_SETTINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "yarn": (("factor",), ("original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                           "attention_factor", "truncate")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor"), ("original_max_position_embeddings",)),
    "longrope": (("short_factor", "long_factor"), ("original_max_position_embeddings", "attention_factor", "factor")),
}
# transformers writes these in every rope dict; the caller gives them as RotaryEmbedding's theta and fraction
_CARRIED = ("rope_theta", "partial_rotary_factor")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _number(name: str, key: str, v: Any, *, minimum: float = 0.0, strict: bool = True) -> float:
    if not _is_number(v) or (v <= minimum if strict else v < minimum):
        raise InputError(f"{name}.{key} must be a number {'>' if strict else '>='} {minimum:g}; got {v!r}")
    return v


def check_rope_scaling(scaling: dict | None, *, rotary_dim: int, name: str = "rope_scaling") -> dict | None:
    """``scaling`` checked for a rotary dimension ``rotary_dim``, as a new dict keyed by
    ``rope_type`` (transformers' older ``type`` is taken as well); ``None`` for plain rotary
    positions (``None`` or ``{"rope_type": "default"}``).

    Settings set to ``None`` count as absent, as in transformers. ``rope_theta`` and
    ``partial_rotary_factor``, which transformers writes into every dict, are accepted and
    left out: the caller gives them apart. Any other setting the type does not read is
    refused by name. ``original_max_position_embeddings`` may be left out of ``yarn``,
    ``llama3`` and ``longrope``: it is then ``max_len``, as transformers fills it in from
    ``max_position_embeddings``; ``longrope``'s ``factor`` defaults to ``max_len`` over it.
    Raises :class:`InputError` naming ``f"{name}.<setting>"``.
    """
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise InputError(f"{name} must be a dict with a rope_type, or None; got {type(scaling).__name__}")
    given = {k: v for k, v in scaling.items() if v is not None and k not in _CARRIED}
    if "type" in given:
        old = given.pop("type")
        if given.setdefault("rope_type", old) != old:
            raise InputError(f"{name}.type {old!r} disagrees with {name}.rope_type {given['rope_type']!r}; give one")
    kind = given.pop("rope_type", "default")
    if kind not in ROPE_TYPES:
        raise InputError(f"{name}.rope_type must be one of {', '.join(ROPE_TYPES)}; got {kind!r}")
    required, optional = _SETTINGS[kind]
    for key in given:
        if key not in required and key not in optional:
            known = ", ".join(required + optional) or "none besides rope_theta"
            raise InputError(f"{name}.{key} is not a setting of rope_type {kind!r} (its settings: {known}); got {key}")
    for key in required:
        if key not in given:
            raise InputError(f"{name}.{key} is required for rope_type {kind!r}; got no {key}")
    if kind == "default":
        return None
    out: dict[str, Any] = {"rope_type": kind}
    for key, v in given.items():
        if key == "original_max_position_embeddings":
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"{name}.{key} must be a positive integer; got {v!r}")
        elif key == "truncate":
            if not isinstance(v, bool):
                raise InputError(f"{name}.{key} must be true or false; got {v!r}")
        elif key in ("short_factor", "long_factor"):
            if not isinstance(v, (list, tuple)) or not all(_is_number(f) and f > 0 for f in v):
                raise InputError(f"{name}.{key} must be a list of numbers > 0; got {v!r}")
            if len(v) != rotary_dim // 2:
                raise InputError(f"{name}.{key} must have rotary_dim / 2 = {rotary_dim // 2} numbers, one per "
                                 f"frequency; got {len(v)}")
            v = [float(f) for f in v]
        elif key in ("mscale", "mscale_all_dim"):
            _number(name, key, v, strict=False)
        else:  # factor, low/high_freq_factor, beta_fast/slow, attention_factor
            _number(name, key, v)
        out[key] = v
    if kind == "dynamic" and rotary_dim <= 2:
        raise InputError(f"{name}.rope_type 'dynamic' needs a rotary dimension of 4 or more (its base grows by a "
                         f"power d / (d - 2)); got rotary_dim {rotary_dim}")
    if kind == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise InputError(f"{name}.high_freq_factor must be > low_freq_factor ({out['low_freq_factor']}); "
                         f"got {out['high_freq_factor']}")
    if kind == "yarn" and out.get("beta_fast", 32) < out.get("beta_slow", 1):
        raise InputError(f"{name}.beta_fast must be >= beta_slow ({out.get('beta_slow', 1)}); "
                         f"got {out.get('beta_fast', 32)}")
    return out


def depends_on_length(scaling: dict | None) -> bool:
    """Whether the frequencies change with the sequence length (``dynamic``, ``longrope``)."""
    return scaling is not None and scaling.get("rope_type", scaling.get("type")) in ("dynamic", "longrope")


def _plain(rotary_dim: int, base: float | Tensor) -> Tensor:
    return 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)


def _yarn(d: int, theta: float, s: dict, original: int) -> tuple[Tensor, float]:
    factor = s["factor"]

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    attention = s.get("attention_factor")
    if attention is None:  # DeepSeek-V3 gives mscale == mscale_all_dim: a factor of 1
        both = s.get("mscale") and s.get("mscale_all_dim")
        attention = float(mscale(s["mscale"]) / mscale(s["mscale_all_dim"])) if both else mscale(1)

    def dim_of(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` turns in `original`
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(s.get("beta_fast", 32)), dim_of(s.get("beta_slow", 1))
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (the frequency as it is), 0: interpolate (divided by factor)
    wavelengths = theta ** (torch.arange(0, d, 2).float() / d)
    inv_freq = 1.0 / (factor * wavelengths) * (1 - keep) + 1.0 / wavelengths * keep
    return inv_freq, attention


def _llama3(d: int, theta: float, s: dict, original: int) -> Tensor:
    inv_freq = _plain(d, theta)
    factor, low_f, high_f = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    low_wavelen, high_wavelen = original / low_f, original / high_f
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_f) / (high_f - low_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _frequencies(rotary_dim: int, theta: float, s: dict | None, max_len: int, seq_len: int | None,
                 ) -> tuple[Tensor, float]:
    """:func:`rope_frequencies` on a scaling already checked."""
    kind = "default" if s is None else s["rope_type"]
    if kind == "default":
        return _plain(rotary_dim, theta), 1.0
    assert s is not None
    original = s.get("original_max_position_embeddings", max_len)
    if kind == "linear":
        return _plain(rotary_dim, theta) / s["factor"], 1.0
    if kind == "dynamic":  # the base grows only once the sequence passes max_len
        factor, power = s["factor"], rotary_dim / (rotary_dim - 2)
        if seq_len is None or seq_len <= max_len:
            return _plain(rotary_dim, theta * ((factor * max_len / max_len) - (factor - 1)) ** power), 1.0
        # transformers' rotary module computes this base in float32 from a tensor seq_len: so do we, bit for bit
        grown = factor * torch.tensor(seq_len) / max_len - (factor - 1)
        return _plain(rotary_dim, theta * grown**power), 1.0
    if kind == "yarn":
        return _yarn(rotary_dim, theta, s, original)
    if kind == "llama3":
        return _llama3(rotary_dim, theta, s, original), 1.0
    # longrope (Phi-3 stores max_len / original as the factor when it gives none)
    factor = s.get("factor", max_len / original)
    attention = s.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = torch.tensor(s["long_factor"] if seq_len and seq_len > original else s["short_factor"], dtype=torch.float32)
    return 1.0 / (ext * theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)), attention


def rope_frequencies(rotary_dim: int, theta: float, scaling: dict | None, *, max_len: int,
                     seq_len: int | None = None) -> tuple[Tensor, float]:
    """The float32 inverse frequencies ``(rotary_dim // 2,)`` and the attention factor (by
    which ``cos`` and ``sin`` are multiplied) of the rotary dimension ``rotary_dim``.

    ``max_len``: the longest context of the model (transformers' ``max_position_embeddings``;
    the default ``original_max_position_embeddings``). ``seq_len``: one more than the
    longest position in use (``None``: as when the model is built). Only two types read it:
    ``dynamic`` grows its base when ``seq_len > max_len`` (and is plain up to it), and
    ``longrope`` takes ``long_factor`` when ``seq_len > original_max_position_embeddings``
    (``short_factor`` up to it, and for ``None``).
    """
    if not isinstance(rotary_dim, int) or rotary_dim < 2 or rotary_dim % 2:
        raise InputError(f"rotary_dim must be a positive even integer; got {rotary_dim!r}")
    if not _is_number(theta) or theta <= 0:
        raise InputError(f"theta (rope_theta) must be positive; got {theta!r}")
    if not isinstance(max_len, int) or max_len < 1:
        raise InputError(f"max_len must be a positive integer; got {max_len!r}")
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len < 1):
        raise InputError(f"seq_len must be a positive integer or None; got {seq_len!r}")
    return _frequencies(rotary_dim, float(theta), check_rope_scaling(scaling, rotary_dim=rotary_dim), max_len, seq_len)
