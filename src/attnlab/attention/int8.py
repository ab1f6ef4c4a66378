"""Weights kept in 8 bits for decoding: each output row of a linear layer stored as int8 with a
float scale (its largest magnitude over 127), the product computed by torch's weight-only int8
kernel with the activations in bfloat16 on the CPU (``torch._weight_int8pack_mm``).

A decoding step of a language model at batch 1 reads every weight once for one row of
arithmetic: its speed is the weights' bytes over the memory bandwidth. float32 SmolLM2-135M reads
538 MB a token; in 8 bits it reads 135 MB. The kernel with float32 activations has no fast path
(several times slower than float32's ``mm``; results page "Why the fast paths", int8-rows),
hence the bfloat16 activations. What it costs in quality is measured by
``benchmarks/real_decoding.py`` (the loss on Tiny Shakespeare's test part).

    model = quantize_int8(from_hf("SmolLM2-135M-Instruct.Q4_1.gguf"))  # every nn.Linear, for inference
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["Int8Linear", "Int8Weight", "quantize_int8", "int8_product"]


class Int8Weight(NamedTuple):
    """A weight ``(out, in)`` as int8 rows and their float32 scales ``(out,)``."""

    rows: Tensor
    scale: Tensor


def _quantize(weight: Tensor) -> Int8Weight:
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    rows = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(rows.contiguous(), scale.contiguous())


def int8_product(x: Tensor, weight: Int8Weight, bias: Tensor | None = None) -> Tensor:
    """``x @ (rows * scale).T + bias`` for ``x`` ``(..., in)``, in ``x``'s dtype."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.device.type == "cpu":
        out = torch._weight_int8pack_mm(flat.to(torch.bfloat16), weight.rows,
                                        weight.scale.to(torch.bfloat16)).to(x.dtype)
    else:  # elsewhere: the rows widened, then scaled
        out = (flat @ weight.rows.to(x.dtype).t()) * weight.scale.to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], out.shape[-1])


class Int8Linear(nn.Module):
    """A linear layer of inference whose weight is kept in 8 bits (:class:`Int8Weight`, buffers
    ``rows`` and ``scale``); the bias stays as it was. It does not train."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        q = _quantize(linear.weight)
        self.register_buffer("rows", q.rows)
        self.register_buffer("scale", q.scale)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @property
    def int8_weight(self) -> Int8Weight:
        return Int8Weight(self.rows, self.scale)

    def forward(self, x: Tensor) -> Tensor:
        return int8_product(x, self.int8_weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8"


def quantize_int8(model: nn.Module) -> nn.Module:
    """``model`` with every ``nn.Linear`` replaced by an :class:`Int8Linear` (in place; returned):
    for decoding, after loading. An output layer tied to the token embedding gets an 8-bit
    copy; the embedding itself stays as it was (it is looked up, not multiplied)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, Int8Linear(child))
    return model.eval()
