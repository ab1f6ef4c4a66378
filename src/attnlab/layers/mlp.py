"""The position-wise feed-forward blocks: :class:`Mlp` (the Transformer's and ViT's), :class:`GeluMlp`
(GPT-2's) and :class:`SwiGLU` (Llama's; GeGLU, Gemma's), the last two with a decoding step of their own."""

from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.joined import KeepsJoinedWeights, bound_product, fused_linear, joined_weight
from ..dropout import Dropout
from ..errors import InputError

__all__ = ["Mlp", "GeluMlp", "SwiGLU", "get_activation", "ACTIVATIONS"]

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


class GeluMlp(KeepsJoinedWeights, nn.Module):
    """``c_proj(gelu(c_fc(x)))``, GPT-2's MLP (``gelu_tanh``: its tanh approximation)."""

    lora_role = "mlp"  # LoRA (attnlab.layers.lora): c_fc and c_proj are feed-forward layers

    def __init__(self, dim: int, hidden: int, *, tanh: bool, bias: bool, drop_rate: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, dim, bias=bias)
        self.approximate = "tanh" if tanh else "none"
        self.drop = Dropout(drop_rate)

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(fused_linear(self, "fc", (self.c_fc,), x)[0], approximate=self.approximate)
        return fused_linear(self, "proj", (self.c_proj,), self.drop(h))[0]

    def step_function(self) -> Callable[[Tensor], Tensor]:
        """:meth:`forward` of a decoding step's ``(B, E)`` in eval mode, its weights joined and bound."""
        fc, proj, approximate = bound_product(*joined_weight(self, "fc", (self.c_fc,))), \
            bound_product(*joined_weight(self, "proj", (self.c_proj,))), self.approximate
        return lambda x: proj(F.gelu(fc(x), approximate=approximate))


class SwiGLU(KeepsJoinedWeights, nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` (Shazeer, 2020): SwiGLU with ``act="silu"``
    (Llama's MLP), GeGLU with ``act="gelu_tanh"`` (Gemma's)."""

    lora_role = "mlp"  # LoRA (attnlab.layers.lora): gate_proj, up_proj and down_proj

    def __init__(self, dim: int, hidden: int, *, bias: bool, drop_rate: float, act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.drop = Dropout(drop_rate)
        if act not in ("silu", "gelu_tanh"):
            raise InputError(f"act must be 'silu' or 'gelu_tanh'; got {act!r}")
        self.act = act

    def _gate(self, x: Tensor) -> Tensor:
        return F.silu(x) if self.act == "silu" else F.gelu(x, approximate="tanh")

    def forward(self, x: Tensor) -> Tensor:
        gate, up = fused_linear(self, "gate_up", (self.gate_proj, self.up_proj), x)
        return fused_linear(self, "down", (self.down_proj,), self.drop(self._gate(gate) * up))[0]

    def step_function(self) -> Callable[[Tensor], Tensor]:
        """:meth:`forward` of a decoding step's ``(B, E)`` in eval mode, its weights joined and bound."""
        gate_up = bound_product(*joined_weight(self, "gate_up", (self.gate_proj, self.up_proj)))
        down, act = bound_product(*joined_weight(self, "down", (self.down_proj,))), self._gate

        def mlp(x: Tensor) -> Tensor:
            gate, up = gate_up(x).chunk(2, dim=-1)
            return down(act(gate) * up)
        return mlp

    def extra_repr(self) -> str:
        return "" if self.act == "silu" else f"act={self.act}"
