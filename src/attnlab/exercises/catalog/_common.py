"""What the tutorials' exercise modules share: random tensors from a case's own generator."""

from __future__ import annotations

import torch
from torch import Tensor

from ..checking import Case, Exercise, Mistake

__all__ = ["Case", "Exercise", "Mistake", "randn", "rand", "randint", "halves", "rows", "t"]


def randn(g: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=g)


def rand(g: torch.Generator, *shape: int) -> Tensor:
    return torch.rand(*shape, generator=g)


def randint(g: torch.Generator, low: int, high: int, *shape: int) -> Tensor:
    return torch.randint(low, high, shape, generator=g)


def halves(*tensors: Tensor) -> tuple[Tensor, ...]:
    """The tensors in float16 (the floating ones)."""
    return tuple(x.half() if isinstance(x, Tensor) and x.is_floating_point() else x for x in tensors)


def rows(g: torch.Generator, *shape: int, causal: bool = False, sharp: float = 2.0) -> Tensor:
    """Attention weights ``(..., L, L)``: each row a softmax of random logits (``causal``:
    nothing above the diagonal)."""
    logits = torch.randn(*shape, generator=g) * sharp
    if causal:
        n = shape[-1]
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return logits.softmax(-1)


def t(en: str, zh: str) -> tuple[str, str]:
    """A text in both languages."""
    return (en, zh)
