"""RMSNorm, the norm of today's decoders (Llama, Qwen, Gemma), and of QK-norm inside attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["RMSNorm"]

_RMS_NORM = getattr(F, "rms_norm", None)  # torch >= 2.4


class RMSNorm(nn.Module):
    """``x / rms(x) · weight`` (Zhang and Sennrich, 2019), computed in float32 and cast back
    (as Llama does, so half-precision inputs keep their accuracy). ``(..., dim)``."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        if x.dtype == torch.float32 and _RMS_NORM is not None:  # one kernel, not five (rms-norm-kernel)
            return _RMS_NORM(x, (x.shape[-1],), self.weight, self.eps)
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
