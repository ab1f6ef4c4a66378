"""How a model family's attention is drawn: an adapter registered beside the model.

A task that shows what a model looks at asks :func:`attention_maps_adapter` for the
adapter of the model's class (or of a base class), calls it on a batch, and turns what
it returns into pictures. The adapter knows its family's layout; the task knows none::

    @register_attention_maps(MyModel)
    def _my_maps(model, x):
        with capture_attention(model, cpu=True) as maps:
            logits = model(x)
        return logits, PixelMaps([(name, calls[0], (8, 8)) for name, calls in maps.items()])

Two layouts cover the image models: :class:`TokenGridMaps` (a ViT: tokens over a grid of
patches, after some prefix tokens) and :class:`PixelMaps` (2-D attention over feature-map
pixels, block by block, as in BoTNet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar, Union

from torch import Tensor, nn

from ..errors import InputError

__all__ = ["TokenGridMaps", "PixelMaps", "register_attention_maps", "attention_maps_adapter"]


@dataclass
class TokenGridMaps:
    """Per block ``weights (B, heads, N, N)`` over ``prefix`` tokens (class, registers) and a
    ``grid`` ``(h, w)`` of patches; ``pooling``: ``"token"`` (the head reads the class
    token) or ``"avg"`` (the mean of the patches)."""

    layers: list[Tensor]
    grid: tuple[int, int]
    prefix: int
    pooling: str


@dataclass
class PixelMaps:
    """Per block ``(name, weights (B, heads, h*w, h*w), (h, w))``: pixel-to-pixel attention
    on a feature map, pixels in row-major order."""

    blocks: list[tuple[str, Tensor, tuple[int, int]]]


Maps = Union[TokenGridMaps, PixelMaps]
Adapter = Callable[[nn.Module, Tensor], "tuple[Tensor, Maps]"]
_ADAPTERS: dict[type, Adapter] = {}
F = TypeVar("F", bound=Adapter)


def register_attention_maps(cls: type) -> Callable[[F], F]:
    """Register ``fn(model, x) -> (logits, maps)`` as the adapter of ``cls`` and its subclasses."""
    def deco(fn: F) -> F:
        if cls in _ADAPTERS:
            raise InputError(f"{cls.__name__} already has an attention-maps adapter")
        _ADAPTERS[cls] = fn
        return fn

    return deco


def attention_maps_adapter(model: nn.Module) -> Adapter | None:
    """The adapter registered for ``model``'s class or its nearest base class; ``None``
    when its family registered none."""
    return next((_ADAPTERS[c] for c in type(model).__mro__ if c in _ADAPTERS), None)


def families_with_maps() -> list[str]:
    """The class names that registered an adapter, for messages."""
    return sorted(c.__name__ for c in _ADAPTERS)
