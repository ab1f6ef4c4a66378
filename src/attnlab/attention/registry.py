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
What a kind can do is declared when it registers, once, as :class:`~attnlab.attention.contract.Capabilities`
(read them as ``attention_entry(name).capabilities``), and the options it takes as
:class:`~attnlab.attention.contract.Options` (``attention_entry(name).options``): nothing outside this
module looks into a kind's signature or methods to find out. A kind registered with
``keeps_cache=True`` promises:

* ``new_cache(batch, capacity, *, dtype, device)``: a :class:`~attnlab.attention.contract.Cache`
  holding what later tokens need of the earlier ones (keys and values, a window of them, a
  latent, a recurrent state), for at most ``capacity`` positions. What is inside is the kind's
  business alone. A kind that ``streams`` takes ``cache_window`` and ``sink_tokens`` there too: a
  policy of the generation (StreamingLLM), apart from any sliding window the layer has.
* ``forward(x, ..., positions=None, cache=None)``: with a cache, ``x`` ``(B, L, E)`` are the
  next ``L`` tokens; the kind adds them to the cache and attends over everything it holds
  (``key_padding_mask`` then covers every position seen, ``(B, seq_len + L)``).
  ``positions`` ``(L,)`` or ``(B, L)``, given by the decoder to a kind that declares
  ``takes_positions``, are the new tokens' positions (left-padded prompts start later);
  without them they follow the cache's ``seq_len``.
* ``cache_bytes(batch, positions, dtype)``: the bytes its cache takes after ``positions``
  positions, before anything is allocated (the decoder refuses a generation that cannot fit);
  with ``cache_window`` and ``sink_tokens`` for a kind that streams, the bytes under that policy.
* with ``decode_step=True``, ``decode_step(x, cache, *, positions=None, key_padding_mask=None)``:
  one token per row in eval mode, ``x`` ``(B, E)`` -> ``(B, E)``, equal to ``forward(x[:, None],
  cache=cache, is_causal=True)``, without its checks and masks (the decoder uses it for the
  steps after the prompt when every layer has it). Per-generation values (weights joined
  once, a table) may be kept in ``cache.scratch``; the decoder puts there under ``"shared"``
  one dict for all its layers: values a step computes once for every layer alike (the rotary
  angles of its position), under a key that says what they depend on.

A kind without ``keeps_cache`` is decoded by running the whole sequence again at each step.

A kind with a loss of its own (``dsa``'s indexer, which its selection cannot train) keeps it
in a training forward and hands it over through ``take_aux_loss()``: the loss, already
weighted, or ``None``, forgotten once taken. The engine's trainer adds what every such
module hands over to the task's loss; the forward's output never depends on it.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor, nn

from ..errors import InputError
from ..suggest import FORMER_NAMES_GO_IN, did_you_mean
from .contract import Capabilities, Option, Options

__all__ = ["register_attention", "register_alias", "attention_entry", "AttentionEntry", "canonical_attention",
           "build_attention", "list_attention", "attention_family",
           "attention_capabilities", "attention_options", "attention_forms_weights", "attention_keeps_cache",
           "attention_honours", "attention_summary", "attention_causal_only", "attention_options_named",
           "attention_takes", "kinds_taking", "attention_position_options", "attend_grid",
           "Capabilities", "Option", "Options"]


@dataclass(frozen=True)
class AttentionEntry:
    """A registered kind, all the registry knows of it (:func:`attention_entry`): its ``name``, its
    ``family`` (``"tokens"``: takes ``(B, L, E)``; ``"grid"``: ``(B, C, H, W)``), its class, what it
    can do (``capabilities``: weights, cache, decode step, streaming, positions, masks), the
    ``options`` it takes (typed, with defaults and ranges) and a one-line ``summary``."""

    name: str
    family: str  # "tokens" or "grid"
    cls: Callable[..., nn.Module]
    capabilities: Capabilities
    options: Options
    open_options: bool = False  # a plugin's kind whose constructor takes **options: names past `options` pass too
    summary: str = ""  # what the kind is, in one line (the README's and the guide's table of kinds)

    def takes(self, option: str) -> bool:
        """Whether the kind takes the build option ``option`` (``"rope"``, ``"alibi"``, ...)."""
        return self.open_options or option in self.options

    def position_options(self) -> tuple[str, ...]:
        """The options that count positions (a window, buckets, landmarks): a model refuses them
        above the positions it holds (its ``max_len``), where they mean nothing."""
        return tuple(o.name for o in self.options if o.counts_positions)

    def honours(self) -> dict[str, bool | None]:
        """What the kind honours of the masks: ``{"causal": ..., "padding": ...}``, each ``True``
        or ``False`` for a ``"tokens"`` kind (one that cannot honour a mask refuses it in one line)
        and ``None`` for a ``"grid"`` kind, which takes no masks."""
        return {"causal": self.capabilities.causal, "padding": self.capabilities.padding}

    def check(self, options: dict[str, Any]) -> None:
        """Refuse, in one line, an option the kind does not take or a value it does not take."""
        if self.open_options:  # a plugin's **options: only what it names is checked
            self.options.check(self.name, {k: v for k, v in options.items() if k in self.options})
        else:
            self.options.check(self.name, options)

    def build(self, embed_dim: int, num_heads: int, **options: Any) -> nn.Module:
        """The kind for width ``embed_dim`` and ``num_heads`` heads, its options upgraded from
        former names (a notice each) and checked first."""
        options = self.options.upgrade(self.name, options)
        self.check(options)
        return self.cls(embed_dim, num_heads, **options)


_KINDS: dict[str, AttentionEntry] = {}
_ALIASES: dict[str, str] = {}  # an older name -> the kind's name (recipes and runs that say it still work)


def _takes(function: Callable[..., Any], *names: str) -> bool:
    params = inspect.signature(function).parameters
    return all(n in params for n in names) or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _constructor_options(cls: type) -> tuple[list[inspect.Parameter], bool]:
    """The keyword parameters of ``cls`` after the first two (the width and the heads, passed by
    position: a plugin's kind may call them dim, heads), and whether it takes ``**options``."""
    params = list(inspect.signature(cls).parameters.values())
    named = [p for p in params[2:] if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _schema(name: str, cls: type, declared: Options | None) -> tuple[Options, bool]:
    """The kind's options: ``declared``, checked against its constructor (every named keyword
    declared with the same default, and, without ``**options``, nothing declared that it does not
    take), so the schema and the code cannot drift apart; or, for a plugin's kind that declares
    none, its constructor's keywords, untyped."""
    named, open_ = _constructor_options(cls)
    if declared is None:
        return Options(*(Option(p.name, object, None if p.default is inspect.Parameter.empty else p.default,
                                required=p.default is inspect.Parameter.empty) for p in named)), open_
    for p in named:
        if p.name not in declared:
            raise InputError(f"attention kind {name!r}: its constructor takes {p.name!r}, which its options do not declare")
        option = declared[p.name]
        default = None if p.default is inspect.Parameter.empty else p.default
        if option.required != (p.default is inspect.Parameter.empty) or (not option.required and option.default != default):
            raise InputError(f"attention kind {name!r}: option {p.name!r} defaults to {option.default!r} in its "
                             f"options and to {default!r} in its constructor")
    if not open_:
        missing = [o.name for o in declared if o.name not in {p.name for p in named}]
        if missing:
            raise InputError(f"attention kind {name!r} declares options its constructor does not take: "
                             f"{', '.join(missing)}")
    return declared, False


def register_attention(name: str, family: str = "tokens", *, options: Options | None = None,
                       forms_weights: bool = False, keeps_cache: bool = False, streams: bool = False,
                       decode_step: bool = False, takes_positions: bool | None = None, causal: bool | None = None,
                       padding: bool | None = None, causal_only: bool = False,
                       lora_roles: tuple[str, ...] | None = None, summary: str = "") -> Callable[[type], type]:
    """Class decorator: make ``cls`` buildable as ``build_attention(name, ...)``, with what it
    can do declared here once (:class:`~attnlab.attention.contract.Capabilities`; checked
    against the class where the class can show it).

    ``options``: the options it takes (:class:`~attnlab.attention.contract.Options`). A kind
    that declares none (a plugin's) takes its constructor's keyword parameters, unchecked
    beyond their names.

    ``forms_weights``: the kind computes the full ``(B, heads, Lq, Lk)`` weight matrix (on
    request), and its ``forward`` hands it to ``self._attn_capture`` when that is set, so
    :func:`~attnlab.attention.capture_attention` records it (the flag is set on the class, where
    capture looks for it). ``keeps_cache``: it decodes with a cache of its own, as the module
    docstring's contract says (it needs ``new_cache`` and ``cache_bytes``). ``streams``: its
    cache takes a streaming policy (``cache_window``, ``sink_tokens``). ``decode_step``: it has the
    lean one-token step. ``takes_positions``: its ``forward`` takes ``positions`` (default:
    whether its signature says so). ``causal``, ``padding``: it honours a causal mask and key
    padding (default: its class's ``supports_causal`` and ``supports_padding``, which
    :class:`~attnlab.attention.variants.base.TokenAttention` sets). ``causal_only``: it has no
    form for attending both ways; it refuses ``is_causal=False`` in one line, and only a decoder
    can use it. ``lora_roles``: the LoRA roles of its linear layers (default: its class's
    ``lora_role``). ``summary``: what it is, in one line (:mod:`attnlab.catalog`)."""
    if family not in ("tokens", "grid"):
        raise InputError(f"family must be 'tokens' or 'grid'; got {family!r}")

    def deco(cls: type) -> type:
        if name in _KINDS:
            raise InputError(f"attention kind {name!r} is already registered")
        if keeps_cache and not all(callable(getattr(cls, m, None)) for m in ("new_cache", "cache_bytes")):
            raise InputError(f"attention kind {name!r} keeps a cache, so it needs new_cache and cache_bytes")
        if streams and not (keeps_cache and _takes(cls.new_cache, "cache_window", "sink_tokens")
                            and _takes(cls.cache_bytes, "cache_window", "sink_tokens")):
            raise InputError(f"attention kind {name!r} streams, so it keeps a cache whose new_cache and cache_bytes "
                             f"take cache_window and sink_tokens")
        if decode_step and not (keeps_cache and callable(getattr(cls, "decode_step", None))):
            raise InputError(f"attention kind {name!r} declares decode_step, so it keeps a cache and has the method")
        positions = _takes(cls.forward, "positions") if takes_positions is None else takes_positions
        if positions and not _takes(cls.forward, "positions"):
            raise InputError(f"attention kind {name!r} takes positions, so its forward has a positions argument")
        grid = family == "grid"
        roles = lora_roles if lora_roles is not None else \
            ((cls.lora_role,) if isinstance(getattr(cls, "lora_role", None), str) else ())
        caps = Capabilities(
            causal=None if grid else getattr(cls, "supports_causal", None) if causal is None else causal,
            padding=None if grid else getattr(cls, "supports_padding", None) if padding is None else padding,
            weights=forms_weights, cache=keeps_cache, streaming=streams, decode_step=decode_step,
            positions=positions, causal_only=causal_only, lora_roles=tuple(roles))
        schema, open_ = _schema(name, cls, options)
        # Set on the class, where the module's own code and capture_attention / LoRA read them.
        cls.capabilities, cls.option_schema = caps, schema
        cls.forms_weights, cls.keeps_cache, cls.causal_only = forms_weights, keeps_cache, causal_only
        if caps.causal is not None:
            cls.supports_causal, cls.supports_padding = caps.causal, caps.padding
        if caps.lora_roles:
            cls.lora_role = caps.lora_roles[0]  # what attnlab.layers.lora reads of any module
        _KINDS[name] = AttentionEntry(name, family, cls, caps, schema, open_, summary)
        return cls

    return deco


def register_alias(alias: str, name: str) -> None:
    """Let ``alias``, a former name, name the kind ``name`` (not listed by :func:`list_attention`)
    until attnlab :data:`~attnlab.suggest.FORMER_NAMES_GO_IN`; what is built from a name
    (:func:`canonical_attention`) says the kind's own name."""
    if alias in _KINDS or alias in _ALIASES:
        raise InputError(f"attention kind {alias!r} is already registered")
    attention_entry(name)
    _ALIASES[alias] = name


def attention_entry(name: str) -> AttentionEntry:
    """The registered kind ``name`` names (a former name too: ``"gqa"`` is ``"exact"``'s entry);
    an unknown name is refused with the close ones."""
    name = _ALIASES.get(name, name) if isinstance(name, str) else name
    if name not in _KINDS:
        raise InputError(f"unknown attention {name!r}" + did_you_mean(name, _KINDS))
    return _KINDS[name]





def canonical_attention(name: str) -> str:
    """The registered name of the kind ``name`` names (``"gqa"`` -> ``"exact"``)."""
    return attention_entry(name).name


def kinds_taking(option: str, family: str = "tokens") -> list[str]:
    """The kinds of ``family`` that take ``option``, sorted (for error messages)."""
    return [n for n in list_attention(family) if option in _KINDS[n].options]


def upgrade_attention_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` of kind ``name`` with former option names renamed (a notice each)."""
    return attention_entry(name).options.upgrade(name, options)


def check_attention_options(name: str, options: dict[str, Any]) -> None:
    """Refuse, in one line, an option kind ``name`` does not take or a value it does not take."""
    attention_entry(name).check(options)


def build_attention(name: str, embed_dim: int, num_heads: int, **options: Any) -> nn.Module:
    """Build attention kind ``name`` for width ``embed_dim`` and ``num_heads`` heads; an
    option the kind does not take, or a value outside what it takes, is an error naming it
    (with the close matches)."""
    return attention_entry(name).build(embed_dim, num_heads, **options)


def list_attention(family: str | None = None) -> list[str]:
    """The registered attention kinds, sorted; only those of ``family`` (``"tokens"`` or
    ``"grid"``) when given."""
    return sorted(n for n, e in _KINDS.items() if family is None or e.family == family)


def _former_accessor(former: str, instead: str, get: Callable[..., Any]) -> Callable[..., Any]:
    """One of the accessors the registry had before :func:`attention_entry`, with a notice."""

    def accessor(name: str, *args: Any) -> Any:
        warnings.warn(f"attnlab.attention.{former}(name) is now attention_entry(name).{instead}; the old name works "
                      f"until attnlab {FORMER_NAMES_GO_IN}", FutureWarning, stacklevel=2)
        return get(attention_entry(name), *args)

    accessor.__name__ = accessor.__qualname__ = former
    accessor.__doc__ = f"Former accessor: ``attention_entry(name).{instead}``."
    return accessor


# The accessors of the registry before attention_entry, each one property of the entry.
attention_family = _former_accessor("attention_family", "family", lambda e: e.family)
attention_capabilities = _former_accessor("attention_capabilities", "capabilities", lambda e: e.capabilities)
attention_options = _former_accessor("attention_options", "options", lambda e: e.options)
attention_takes = _former_accessor("attention_takes", "takes(option)", lambda e, option: e.takes(option))
attention_options_named = _former_accessor("attention_options_named", "options.names()", lambda e: e.options.names())
attention_position_options = _former_accessor("attention_position_options", "position_options()",
                                              lambda e: e.position_options())
attention_forms_weights = _former_accessor("attention_forms_weights", "capabilities.weights",
                                           lambda e: e.capabilities.weights)
attention_summary = _former_accessor("attention_summary", "summary", lambda e: e.summary)
attention_honours = _former_accessor("attention_honours", "honours()", lambda e: e.honours())
attention_causal_only = _former_accessor("attention_causal_only", "capabilities.causal_only",
                                         lambda e: e.capabilities.causal_only)
attention_keeps_cache = _former_accessor("attention_keeps_cache", "capabilities.cache", lambda e: e.capabilities.cache)


def attend_grid(module: nn.Module, x: Tensor) -> Tensor:
    """Run a ``"tokens"`` attention module over a feature map ``(B, C, H, W)``."""
    b, c, h, w = x.shape
    tokens = x.flatten(2).transpose(1, 2)  # (B, H*W, C)
    out, _ = module(tokens)
    return out.transpose(1, 2).reshape(b, c, h, w)
