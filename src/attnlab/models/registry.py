"""Model registry: ``@register_model``, ``create_model(name, **overrides)``, ``list_models``."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, fields
from typing import Any, Callable, TypeVar

from torch import nn

from ..errors import InputError
from ..suggest import did_you_mean

__all__ = ["register_model", "create_model", "list_models", "model_entry", "build_config", "count_parameters"]


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
    """``cls(**defaults, **overrides)`` with an error naming any unknown override."""
    valid = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    for key in overrides:
        if key not in valid:
            raise _unknown(f"{cls.__name__} field", key, valid)
    return cls(**{**defaults, **overrides})


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (tied weights count once)."""
    return sum(p.numel() for p in model.parameters())
