"""Model registry: ``@register_model``, ``create_model(name, **overrides)``, ``list_models``."""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, TypeVar

import torch
from torch import nn

from ..attention.registry import upgrade_attention_options, attention_entry
from ..errors import InputError
from ..suggest import did_you_mean, former_function, rename_former

__all__ = ["register_model", "create_model", "list_models", "model_entry", "build_config", "count_parameters",
           "config_class", "upgrade_options", "OptionError", "FIELD_RANGES", "check_ranges",
           "refuse_options_the_model_sets", "check_attention_values"]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    family: str
    fn: Callable[..., nn.Module]
    description: str


_REGISTRY: dict[str, ModelEntry] = {}
F = TypeVar("F", bound=Callable[..., nn.Module])


def register_model(family: str) -> Callable[[F], F]:
    """Register a builder ``fn(**overrides) -> nn.Module`` under its function name.

    The first line of its docstring is the model's one-line description.
    """

    def deco(fn: F) -> F:
        name = fn.__name__
        if name in _REGISTRY:
            raise InputError(f"model {name!r} is already registered")
        doc = (fn.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = ModelEntry(name, family, fn, doc[0] if doc else "")
        return fn

    return deco


def _unknown(kind: str, name: str, known: list[str]) -> InputError:
    return InputError(f"unknown {kind} {name!r}" + did_you_mean(name, known))


def model_entry(name: str) -> ModelEntry:
    if name not in _REGISTRY:
        raise _unknown("model", name, list(_REGISTRY))
    return _REGISTRY[name]


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a registered model; keyword overrides replace fields of its configuration."""
    return model_entry(name).fn(**overrides)


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style ``pattern``, sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


C = TypeVar("C")

_PROBABILITY = ((">=", 0.0), ("<", 1.0))
# The ranges of the configuration fields, by name: one vocabulary across the model families,
# so a field means the same, and is checked alike, in every config that has it.
FIELD_RANGES: dict[str, tuple[tuple[str, float], ...]] = {
    **dict.fromkeys(("drop_rate", "attn_drop_rate", "drop_path_rate", "pos_drop_rate"), _PROBABILITY),
    **dict.fromkeys(("mlp_ratio", "norm_eps", "logit_scale"), ((">", 0.0),)),
    **dict.fromkeys(("embed_dim", "num_heads", "patch_size", "in_chans", "vocab_size", "src_vocab_size",
                     "tgt_vocab_size", "max_len", "stem_width"), ((">=", 1),)),
}  # (depth and num_classes differ between families: each model checks them itself)
_HOLDS = {">=": lambda v, b: v >= b, ">": lambda v, b: v > b, "<": lambda v, b: v < b}


class OptionError(InputError):
    """A model option outside its range: ``key``, ``value`` and ``rule`` (``">= 0.0 and < 1.0"``)."""

    def __init__(self, cls: type, key: str, value: Any, rule: str) -> None:
        super().__init__(f"{cls.__name__}.{key} must be {rule}; got {value!r}")
        self.key, self.value, self.rule = key, value, rule


def check_ranges(cls: type, values: dict[str, Any]) -> None:
    """:class:`OptionError` for the first number of ``values`` outside its
    :data:`FIELD_RANGES` range (fields without one, and values that are not numbers, pass:
    the model's own checks see them)."""
    for key, value in values.items():
        ranges = FIELD_RANGES.get(key)
        if ranges is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not all(_HOLDS[op](value, bound) for op, bound in ranges):
            raise OptionError(cls, key, value, " and ".join(f"{op} {bound}" for op, bound in ranges))


def refuse_options_the_model_sets(options: dict[str, Any], owned: dict[str, str]) -> None:
    """Refuse ``attention_options`` that set an option the model sets itself: ``owned`` maps
    each such option (``"dropout"``) to the model field that sets it (``"attn_drop_rate"``).
    (Passed on, both would reach the attention kind: Python's "multiple values" TypeError.)"""
    for key, field_name in owned.items():
        if key in options:
            raise InputError(f"attention_options must not set {key!r}: the model sets it from {field_name}, "
                             f"so set that")


# Its former name, which the attention registry's check_attention_options (another job) shares.
check_attention_options = former_function(refuse_options_the_model_sets,
                                          "attnlab.models.registry.check_attention_options")


def check_attention_values(cls: type, attention: str, options: dict[str, Any], max_len: int | None = None, *,
                           key: str = "attention_options") -> None:
    """Check a config's ``attention_options`` against the options kind ``attention`` declares,
    before anything is built: a name it does not take is refused with the close ones, a value
    outside what it takes is an :class:`OptionError` (key ``attention_options.NAME``), and so is
    an option that counts positions (a window, buckets, landmarks) set above ``max_len``, the
    longest sequence the model holds: a window wider than every sequence means nothing, and some
    such options size buffers (LSH's rotations)."""
    if not isinstance(options, dict):
        raise InputError(f"{cls.__name__}.{key} must be a mapping of option names to values; got {options!r}")
    upgraded = upgrade_attention_options(attention, options)  # former option names, with a notice each
    if list(upgraded) != list(options):
        options.clear()
        options.update(upgraded)
    schema = attention_entry(attention).options
    for name, value in options.items():
        if name not in schema:
            if not attention_entry(attention).takes(name):  # a plugin's kind with **options takes any name
                raise InputError(f"{cls.__name__}.{key}: unknown option {name!r} of attention "
                                 f"{attention!r}" + did_you_mean(name, schema.names(), "options"))
            continue
        if not schema[name].accepts(value):
            raise OptionError(cls, f"{key}.{name}", value, schema[name].expected())
    if max_len is None:
        return
    for name in attention_entry(attention).position_options():
        value = options.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > max_len:
            raise OptionError(cls, f"{key}.{name}", value,
                              f"<= {max_len}, the model's max_len (it counts positions, and no sequence the model "
                              f"reads is longer)")


def build_config(cls: type[C], defaults: dict[str, Any], overrides: dict[str, Any]) -> C:
    """``cls(**defaults, **overrides)`` with an error naming any unknown override (and
    the new name of one that attnlab renamed to timm's vocabulary), or a value outside
    its range (:data:`FIELD_RANGES`: a dropout rate of 2, an ``mlp_ratio`` of 0)."""
    valid = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    renamed = getattr(cls, "renamed", {})
    overrides = upgrade_fields(cls, overrides, notice=True)
    for key in overrides:
        if key in renamed and key not in valid:
            raise InputError(f"{cls.__name__} field {key!r} is now called {renamed[key]!r} (attnlab's models use "
                             f"timm's names)")
        if key not in valid:
            raise _unknown(f"{cls.__name__} field", key, valid)
    check_ranges(cls, {**defaults, **overrides})
    return cls(**{**defaults, **overrides})


@functools.lru_cache(maxsize=None)
def config_class(name: str) -> type | None:
    """The configuration dataclass of registered model ``name`` (``None`` if it has none),
    read off a copy built on the meta device."""
    with torch.device("meta"):
        config = getattr(create_model(name), "config", None)
    return type(config) if is_dataclass(config) else None


def upgrade_fields(cls: type, options: dict[str, Any], *, notice: bool) -> dict[str, Any]:
    """``options`` with the config class's former field names (its ``deprecated`` map) renamed,
    each with a one-line :class:`FutureWarning` naming the new name when ``notice``."""
    return rename_former(options, getattr(cls, "deprecated", {}), lambda key: f"{cls.__name__} field {key!r}",
                         notice=notice)


def upgrade_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``model.options`` of a run trained by an older attnlab, in today's names (the
    config class's ``upgrade``, else its ``renamed`` map); unchanged when nothing was renamed."""
    cls = config_class(name) if name in _REGISTRY else None
    if cls is None:
        return dict(options)
    options = upgrade_fields(cls, options, notice=False)  # a saved run: read as it is, without a notice
    if not any(k in getattr(cls, "renamed", {}) for k in options):
        return dict(options)
    if hasattr(cls, "upgrade"):
        return cls.upgrade(options)
    return {cls.renamed.get(k, k): v for k, v in options.items()}


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights count once)."""
    return sum(p.numel() for p in model.parameters())
