"""The contract between a model and its attention, written down once.

* :class:`Capabilities`: what an attention kind can do, declared when it registers
  (:func:`~attnlab.attention.registry.register_attention`), read by every model through
  :func:`~attnlab.attention.registry.attention_entry`; no model looks inside a kind to
  find out.
* :class:`Option` and :class:`Options`: the options a kind takes, typed, with defaults and
  ranges. Recipes are checked against them before anything is built, ``attnlab kinds KIND``
  lists them, and a kind built on another extends its parent's (``EXACT.extend(...)``)
  instead of repeating them.
* :class:`Cache`: what a decoding cache that a kind makes holds and does.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Protocol, runtime_checkable

from torch import Tensor

from ..errors import InputError
from ..suggest import did_you_mean, rename_former

__all__ = ["Capabilities", "Option", "Options", "Cache"]


@dataclass(frozen=True)
class Capabilities:
    """What an attention kind can do.

    ``causal``, ``padding``: it honours a causal mask and key padding (a kind that cannot refuses
    them in one line); ``None`` for a ``"grid"`` kind, which takes no masks.
    ``weights``: it forms the ``(B, H, Lq, Lk)`` weight matrix on request and hands it to
    :func:`~attnlab.attention.capture_attention`.
    ``cache``: it decodes with a cache of its own (``new_cache``, ``cache_bytes``; the cache is a
    :class:`Cache`).
    ``streaming``: its cache takes a generation's policy, ``cache_window`` and ``sink_tokens``
    (StreamingLLM), in ``new_cache`` and ``cache_bytes`` alike.
    ``decode_step``: it has the lean one-token step ``decode_step(x, cache, *, positions,
    key_padding_mask)`` and its cache a ``scratch`` dict.
    ``positions``: its ``forward`` takes each new token's ``positions`` (rotary positions of
    left-padded prompts and packed documents).
    ``causal_only``: it has no form for attending both ways (a recurrent state); only a decoder
    can use it.
    ``lora_roles``: the roles of its linear layers for LoRA (``"attention"``: the query, key,
    value and output projections; :mod:`attnlab.layers.lora`).
    """

    causal: bool | None
    padding: bool | None
    weights: bool
    cache: bool
    streaming: bool = False
    decode_step: bool = False
    positions: bool = False
    causal_only: bool = False
    lora_roles: tuple[str, ...] = ()


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _is_size(value: object) -> bool:
    pair = (value, value) if _is_int(value) else tuple(value) if isinstance(value, (tuple, list)) else ()
    return len(pair) == 2 and all(_is_int(s) and s > 0 for s in pair)


_TYPES = {int: ("an integer", _is_int), float: ("a finite number", _is_number), bool: ("true or false", lambda v: isinstance(v, bool)),
          str: ("a string", lambda v: isinstance(v, str)), dict: ("a mapping", lambda v: isinstance(v, Mapping)),
          tuple: ("a positive integer or a pair (H, W) of them", _is_size),
          object: ("any value", lambda v: True)}  # a plugin's kind that declares no options: its constructor's, untyped


@dataclass(frozen=True)
class Option:
    """One option of an attention kind.

    ``type``: ``int``, ``float`` (an integer is a number too), ``bool``, ``str``, ``dict`` or
    ``tuple`` (a feature map's size, ``(H, W)`` or one number). ``default``: its value when not
    given; ``None`` is then a value as well ("derived": the option's help says from what).
    ``required``: no default, the model gives it (a grid kind's ``size``). ``low``/``high``: the
    range, inclusive unless ``low_open``/``high_open``. ``choices``: the strings it may be.
    ``counts_positions``: it counts positions (a window, buckets, landmarks): a model refuses it
    above the positions it holds. ``from_model``: a model fills it from the layer's place when
    the recipe does not (``"layer_index"``: the layer's depth; ``"norm_eps"``: the model's).
    ``was``: the option's former name, which recipes and saved runs may still use (read as this
    one, with a one-line notice naming the new name).
    """

    name: str
    type: type
    default: Any = None
    help: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    required: bool = False
    counts_positions: bool = False
    from_model: str | None = None
    was: str | None = None

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise InputError(f"option {self.name!r}: type must be one of int, float, bool, str, dict, tuple, object; "
                             f"got {self.type!r}")

    def expected(self) -> str:
        """What the option takes, in words: ``"an integer >= 1, or None"``."""
        if self.choices:
            text = "one of " + ", ".join(map(repr, self.choices))
        else:
            text = _TYPES[self.type][0]
            bounds = []
            if self.low is not None:
                bounds.append(f"{'>' if self.low_open else '>='} {self.low:g}")
            if self.high is not None:
                bounds.append(f"{'<' if self.high_open else '<='} {self.high:g}")
            if bounds:
                text += " " + " and ".join(bounds)
        return text + (", or None" if self.default is None and not self.required else "")

    def accepts(self, value: object) -> bool:
        """Whether ``value`` is one the option takes."""
        if value is None:
            return self.default is None and not self.required
        if not _TYPES[self.type][1](value):
            return False
        if self.choices and value not in self.choices:
            return False
        if self.type in (int, float):
            v = float(value)  # type: ignore[arg-type]
            if self.low is not None and (v <= self.low if self.low_open else v < self.low):
                return False
            if self.high is not None and (v >= self.high if self.high_open else v > self.high):
                return False
        return True


class Options:
    """The options of a kind, in order; immutable. ``extend`` makes a kind's options from its
    parent's: new options added, same-named ones replaced, ``drop`` ones removed."""

    def __init__(self, *options: Option) -> None:
        by_name: dict[str, Option] = {}
        for option in options:
            if option.name in by_name:
                raise InputError(f"option {option.name!r} is declared twice")
            by_name[option.name] = option
        self._by_name = by_name

    def extend(self, *options: Option, drop: tuple[str, ...] = (), defaults: Mapping[str, Any] | None = None
               ) -> Options:
        for name in (*drop, *(defaults or {})):
            if name not in self._by_name:
                raise InputError(f"option {name!r} is not among the options extended" + did_you_mean(name, self.names()))
        kept = {n: o for n, o in self._by_name.items() if n not in drop}
        for name, value in (defaults or {}).items():
            kept[name] = replace(kept[name], default=value)
        for option in options:
            kept[option.name] = option
        return Options(*kept.values())

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def __iter__(self) -> Iterator[Option]:
        return iter(self._by_name.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Option:
        return self._by_name[name]

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"Options({', '.join(self._by_name)})"

    def upgrade(self, kind: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """``given`` with options under their former names (:attr:`Option.was`) renamed, each
        with a :class:`FutureWarning` naming the new name; a copy, in the same order."""
        former = {o.was: o.name for o in self._by_name.values() if o.was is not None and o.was not in self._by_name}
        return rename_former(given, former, lambda name: f"option {name!r} of attention {kind!r}")

    def problem(self, given: Mapping[str, Any]) -> tuple[str, Any, str | None] | None:
        """The first of ``given`` that the options refuse, as ``(name, value, expected)``
        (``expected`` ``None``: no such option), or ``None`` when all are fine."""
        for name, value in given.items():
            option = self._by_name.get(name)
            if option is None:
                return name, value, None
            if not option.accepts(value):
                return name, value, option.expected()
        return None

    def check(self, kind: str, given: Mapping[str, Any]) -> None:
        """Refuse, in one line naming it, an option of ``given`` that kind ``kind`` does not take
        or a value outside what it takes."""
        found = self.problem(given)
        if found is None:
            return
        name, value, expected = found
        if expected is None:
            raise InputError(f"unknown option {name!r} of attention {kind!r}" + did_you_mean(name, self.names(), "options"))
        raise InputError(f"{name} must be {expected} (an option of attention {kind!r}); got {value!r}")


@runtime_checkable
class Cache(Protocol):
    """A decoding cache, as a kind's ``new_cache`` makes it.

    ``seq_len``: the positions it has seen. ``nbytes()``: the bytes it holds now.
    ``reorder(index)``: keep the batch rows ``index`` ``(B',)`` names, in that order (beam search
    reorders and drops hypotheses this way). ``scratch``: a dict a kind with a ``decode_step``
    keeps per-generation values in (joined weights, a plan); the decoder puts one dict of its
    own under ``scratch["shared"]`` for what a step computes once for every layer. What is stored
    is the kind's business alone. Its size before it exists is the kind's
    ``cache_bytes(batch, positions, dtype)`` (with ``cache_window`` and ``sink_tokens`` for a kind that
    streams)."""

    seq_len: int
    scratch: dict

    def nbytes(self) -> int: ...

    def reorder(self, index: Tensor) -> None: ...
