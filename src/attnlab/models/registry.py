"""Model registry: ``@register_model``, ``create_model(name, **overrides)``, ``list_models``."""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, TypeVar

import torch
from torch import nn

from ..errors import InputError
from ..suggest import did_you_mean

__all__ = ["register_model", "create_model", "list_models", "model_entry", "build_config", "count_parameters",
           "config_class", "upgrade_options"]


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


def build_config(cls: type[C], defaults: dict[str, Any], overrides: dict[str, Any]) -> C:
    """``cls(**defaults, **overrides)`` with an error naming any unknown override (and
    the new name of one that attnlab renamed to timm's vocabulary)."""
    valid = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    renamed = getattr(cls, "renamed", {})
    for key in overrides:
        if key in renamed and key not in valid:
            raise InputError(f"{cls.__name__} field {key!r} is now called {renamed[key]!r} (attnlab's models use "
                             f"timm's names)")
        if key not in valid:
            raise _unknown(f"{cls.__name__} field", key, valid)
    return cls(**{**defaults, **overrides})


@functools.lru_cache(maxsize=None)
def config_class(name: str) -> type | None:
    """The configuration dataclass of registered model ``name`` (``None`` if it has none),
    read off a copy built on the meta device."""
    with torch.device("meta"):
        config = getattr(create_model(name), "config", None)
    return type(config) if is_dataclass(config) else None


def upgrade_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``model.options`` of a run trained by an older attnlab, in today's names (the
    config class's ``upgrade``, else its ``renamed`` map); unchanged when nothing was renamed."""
    cls = config_class(name) if name in _REGISTRY else None
    if cls is None or not any(k in getattr(cls, "renamed", {}) for k in options):
        return dict(options)
    if hasattr(cls, "upgrade"):
        return cls.upgrade(options)
    return {cls.renamed.get(k, k): v for k, v in options.items()}


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights count once)."""
    return sum(p.numel() for p in model.parameters())
