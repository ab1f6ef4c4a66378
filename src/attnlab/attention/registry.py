"""Attention kinds by name, so that any model can swap its attention from a recipe.

Two families share the registry:

* ``"tokens"`` kinds attend over a sequence. Built as ``cls(embed_dim, num_heads, *,
  dropout, bias, **options)``; called as ``module(x, *, key_padding_mask=None,
  attn_mask=None, is_causal=False, need_weights=False, average_attn_weights=True)`` with
  ``x`` ``(B, L, embed_dim)``, returning ``(out (B, L, embed_dim), weights or None)``.
  Masks follow :mod:`attnlab.attention.functional`.
* ``"grid"`` kinds attend over a feature map. Built as ``cls(embed_dim, num_heads, *,
  size=(H, W), **options)``; called as ``module(x, need_weights=False)`` with ``x``
  ``(B, embed_dim, H, W)``, returning ``(out (B, embed_dim, H, W), weights or None)``:
  ``relpos2d``'s weights are ``(B, heads, H*W, H*W)``, the others' are of their own shapes
  (each kind's docstring says which).

Every kind returns the same pair whatever ``need_weights`` is; the weights are ``None``
unless asked for. :func:`~attnlab.attention.capture_attention` is the route to the weights
of the attention inside a model.

A model that works on feature maps can still use a ``"tokens"`` kind by flattening the
map (see :func:`attend_grid`).

A decoder block and its attention
---------------------------------
A decoder (:class:`~attnlab.models.gpt.GPT`) never names a kind. It calls its layers'
attention as above with ``is_causal=True``, and, when generating, asks each for a cache.
A kind registered with ``keeps_cache=True`` promises:

* ``new_cache(batch, capacity, *, dtype, device)``: an object holding what later tokens
  need of the earlier ones (keys and values, a window of them, a latent, a recurrent
  state), for at most ``capacity`` positions, with ``seq_len`` (the positions it has seen)
  and ``nbytes()`` (what it holds now). What is inside is the kind's business alone.
* ``forward(x, ..., positions=None, cache=None)``: with a cache, ``x`` ``(B, L, E)`` are the
  next ``L`` tokens; the kind adds them to the cache and attends over everything it holds
  (``key_padding_mask`` then covers every position seen, ``(B, seq_len + L)``).
  ``positions`` ``(L,)`` or ``(B, L)``, given by the decoder, are the new tokens' positions
  (left-padded prompts start later); without them they follow the cache's ``seq_len``. A
  kind without positions of its own ignores them.
* ``cache_bytes(batch, positions, dtype)``: the bytes its cache takes after ``positions``
  positions, before anything is allocated (the decoder refuses a generation that cannot fit).
* optionally ``decode_step(x, cache, *, positions=None, key_padding_mask=None)``: one token
  per row in eval mode, ``x`` ``(B, E)`` -> ``(B, E)``, equal to ``forward(x[:, None],
  cache=cache, is_causal=True)``, without its checks and masks (the decoder uses it for the
  steps after the prompt when every layer has it). Per-generation values (weights joined
  once, a table) may be kept in the cache. A cache with a ``scratch`` dict gets from the
  decoder ``scratch["shared"]``, one dict for all its layers: values a step computes once for
  every layer alike (the rotary angles of its position), under a key that says what they
  depend on.

A kind without ``keeps_cache`` is decoded by running the whole sequence again at each step.

A kind with a loss of its own (``dsa``'s indexer, which its selection cannot train) keeps it
in a training forward and hands it over through ``take_aux_loss()``: the loss, already
weighted, or ``None``, forgotten once taken. The engine's trainer adds what every such
module hands over to the task's loss; the forward's output never depends on it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor, nn

from ..errors import InputError
from ..suggest import did_you_mean

__all__ = ["register_attention", "register_alias", "build_attention", "list_attention", "attention_family",
           "attention_forms_weights", "attention_keeps_cache", "attention_honours", "attention_summary", "attention_causal_only", "attention_accepts", "attention_options_named",
           "attention_takes", "kinds_taking", "attention_position_options", "attend_grid"]


@dataclass(frozen=True)
class AttentionEntry:
    name: str
    family: str  # "tokens" or "grid"
    cls: Callable[..., nn.Module]
    forms_weights: bool  # computes the (B, H, Lq, Lk) weights, which capture_attention can record
    keeps_cache: bool  # makes and advances a decoding cache (the contract in the module docstring)
    causal_only: bool = False  # attends to earlier positions only: refuses is_causal=False (decoders only)
    summary: str = ""  # what the kind is, in one line (the README's and the guide's table of kinds)


_KINDS: dict[str, AttentionEntry] = {}
_ALIASES: dict[str, str] = {}  # an older name -> the kind's name (recipes and runs that say it still work)


def register_attention(name: str, family: str = "tokens", *, forms_weights: bool = False,
                       keeps_cache: bool = False, causal_only: bool = False,
                       summary: str = "") -> Callable[[type], type]:
    """Class decorator: make ``cls`` buildable as ``build_attention(name, ...)``.

    ``forms_weights``: the kind computes the full ``(B, heads, Lq, Lk)`` weight matrix
    (on request), and its ``forward`` hands it to ``self._attn_capture`` when that is set,
    so :func:`~attnlab.attention.capture_attention` records it. The efficient kinds never
    form it; the decorator records the flag on the class, where capture looks for it.

    ``keeps_cache``: the kind decodes with a cache of its own, as the module docstring's
    contract says (checked here: it has ``new_cache`` and ``cache_bytes``).

    ``causal_only``: the kind has no form for attending both ways (a recurrent state, blocks
    seen once complete); it refuses ``is_causal=False`` in one line, and only a decoder can use it.

    ``summary``: what the kind is, in one line, for the tables of kinds (:mod:`attnlab.catalog`)."""
    if family not in ("tokens", "grid"):
        raise InputError(f"family must be 'tokens' or 'grid'; got {family!r}")

    def deco(cls: type) -> type:
        if name in _KINDS:
            raise InputError(f"attention kind {name!r} is already registered")
        if keeps_cache and not all(callable(getattr(cls, m, None)) for m in ("new_cache", "cache_bytes")):
            raise InputError(f"attention kind {name!r} keeps a cache, so it needs new_cache and cache_bytes")
        cls.forms_weights = forms_weights  # the capability, read by capture_attention
        cls.keeps_cache = keeps_cache
        cls.causal_only = causal_only
        _KINDS[name] = AttentionEntry(name, family, cls, forms_weights, keeps_cache, causal_only, summary)
        return cls

    return deco


def register_alias(alias: str, name: str) -> None:
    """Let ``alias`` name the kind ``name`` (not listed by :func:`list_attention`)."""
    if alias in _KINDS or alias in _ALIASES:
        raise InputError(f"attention kind {alias!r} is already registered")
    _entry(name)
    _ALIASES[alias] = name


def _entry(name: str) -> AttentionEntry:
    name = _ALIASES.get(name, name) if isinstance(name, str) else name
    if name not in _KINDS:
        raise InputError(f"unknown attention {name!r}" + did_you_mean(name, _KINDS))
    return _KINDS[name]


def attention_family(name: str) -> str:
    """The family of the kind ``name``: ``"tokens"`` (takes ``(B, L, E)``) or ``"grid"``
    (takes ``(B, C, H, W)``); an unknown name is an error with the known ones."""
    return _entry(name).family


def _options(name: str) -> list[str] | None:
    """The options kind ``name`` takes: the keyword parameters after the first two, which take
    the width and the heads (passed by position: a kind registered by a plugin may still call
    them dim, heads); ``None`` when it takes any (``**options``)."""
    params = inspect.signature(_entry(name).cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return [n for n, p in list(params.items())[2:]
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]


def attention_takes(name: str, option: str) -> bool:
    """Whether kind ``name`` takes the build option ``option`` (``"rope"``, ``"alibi"``, ...)."""
    known = _options(name)
    return known is None or option in known


def attention_options_named(name: str) -> tuple[str, ...]:
    """The build options kind ``name`` names (none for a kind that takes ``**options``)."""
    return tuple(_options(name) or ())


def attention_accepts(name: str, argument: str) -> bool:
    """Whether kind ``name``'s ``forward`` takes the keyword ``argument`` (``"positions"``, ``"cache"``)."""
    params = inspect.signature(_entry(name).cls.forward).parameters
    return argument in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def kinds_taking(option: str, family: str = "tokens") -> list[str]:
    """The kinds of ``family`` that take ``option``, sorted (for error messages)."""
    return [n for n in list_attention(family) if option in (_options(n) or ())]


def build_attention(name: str, embed_dim: int, num_heads: int, **options: Any) -> nn.Module:
    """Build attention kind ``name`` for width ``embed_dim`` and ``num_heads`` heads; an
    option the kind does not take is an error naming it (with the close matches)."""
    cls = _entry(name).cls
    known = _options(name)
    if known is not None:
        for key in options:
            if key not in known:
                raise InputError(f"unknown option {key!r} of attention {name!r}" + did_you_mean(key, known, "options"))
    return cls(embed_dim, num_heads, **options)


def attention_position_options(name: str) -> tuple[str, ...]:
    """The options of kind ``name`` that count positions (a window, buckets, landmarks): a
    model refuses them above the positions it holds (its ``max_len``), where they mean nothing."""
    return tuple(getattr(_entry(name).cls, "position_options", ()))


def attention_forms_weights(name: str) -> bool:
    """Whether kind ``name`` forms the weight matrix that capture_attention records."""
    return _entry(name).forms_weights


def attention_summary(name: str) -> str:
    """What kind ``name`` is, in one line (empty for a kind registered without one)."""
    return _entry(name).summary


def attention_honours(name: str) -> dict[str, bool | None]:
    """What kind ``name`` honours of the masks: ``{"causal": ..., "padding": ...}``, each
    ``True`` or ``False`` for a ``"tokens"`` kind (one that cannot honour a mask refuses it
    in one line) and ``None`` for a ``"grid"`` kind, which takes no masks."""
    cls = _entry(name).cls
    return {what: getattr(cls, f"supports_{what}", None) for what in ("causal", "padding")}


def attention_causal_only(name: str) -> bool:
    """Whether kind ``name`` attends causally only (see :func:`register_attention`)."""
    return _entry(name).causal_only


def attention_keeps_cache(name: str) -> bool:
    """Whether kind ``name`` decodes with a cache of its own (``new_cache``; see the contract)."""
    return _entry(name).keeps_cache


def list_attention(family: str | None = None) -> list[str]:
    """The registered attention kinds, sorted; only those of ``family`` (``"tokens"`` or
    ``"grid"``) when given."""
    return sorted(n for n, e in _KINDS.items() if family is None or e.family == family)


def attend_grid(module: nn.Module, x: Tensor) -> Tensor:
    """Run a ``"tokens"`` attention module over a feature map ``(B, C, H, W)``."""
    b, c, h, w = x.shape
    tokens = x.flatten(2).transpose(1, 2)  # (B, H*W, C)
    out, _ = module(tokens)
    return out.transpose(1, 2).reshape(b, c, h, w)
