"""Stochastic depth (Huang et al., 2016): drop a residual branch per sample."""

from __future__ import annotations

from torch import Tensor, nn

from ..errors import InputError

__all__ = ["DropPath", "drop_path_rates"]


class DropPath(nn.Module):
    """Zero the whole branch for a random ``p`` of the samples in training and scale the
    rest by ``1 / (1 - p)``; the identity in eval mode. Any shape ``(B, ...)``."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise InputError(f"drop path probability must be in [0, 1); got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        # Scale the (B, 1, ...) mask, not x: one full-size multiply instead of two.
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep).div_(keep)
        return x * mask

    def extra_repr(self) -> str:
        return f"p={self.p:.3f}"


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """Linearly increasing rates over depth, 0 for the first block, ``rate`` for the last."""
    # Plain Python: works under torch.device("meta") too.
    return [rate * i / (depth - 1) for i in range(depth)] if depth > 1 else [rate] * depth
