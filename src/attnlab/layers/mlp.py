"""The position-wise feed-forward block."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from ..dropout import Dropout
from ..errors import InputError

__all__ = ["Mlp", "get_activation", "ACTIVATIONS"]

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "silu": F.silu,
}


def get_activation(name: str) -> Callable[[Tensor], Tensor]:
    if name not in ACTIVATIONS:
        raise InputError(f"activation must be one of {sorted(ACTIVATIONS)}; got {name!r}")
    return ACTIVATIONS[name]


class Mlp(nn.Module):
    """``fc2(dropout(act(fc1(x))))``: ``(..., dim) -> (..., out_dim or dim)``."""

    lora_role = "mlp"  # LoRA (attnlab.layers.lora): fc1 and fc2 are feed-forward layers

    def __init__(
        self, dim: int, hidden_dim: int, *, out_dim: int | None = None, activation: str = "relu",
        dropout: float = 0.0, bias: bool = True,
    ) -> None:
        super().__init__()
        self.act_name = activation
        self.act = get_activation(activation)
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.drop = Dropout(dropout)
        self.fc2 = nn.Linear(hidden_dim, out_dim or dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.drop(self.act(self.fc1(x))))

    def extra_repr(self) -> str:
        return f"activation={self.act_name}"
