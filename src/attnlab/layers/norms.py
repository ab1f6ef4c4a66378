"""Normalization layers for token sequences ``(B, L, E)``, chosen by name.

Every norm here takes an optional ``padding_mask`` ``(B, L)`` (``True`` = padding) so
that blocks can call any of them the same way.
"""

from __future__ import annotations

import types
from typing import Callable

from torch import Tensor, nn

from ..attention.rmsnorm import RMSNorm
from ..errors import InputError, shape_str

__all__ = ["LayerNorm", "TokenBatchNorm", "build_norm", "freeze_batch_norm", "NORMS"]


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` over the last dimension; ``padding_mask`` is accepted and
    ignored (each token is normalized on its own, so padding cannot leak in)."""

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:  # type: ignore[override]
        return super().forward(x)


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm for token sequences: each of the ``E`` features is normalized over the
    batch *and* the positions, ``(B, L, E) -> (B, L, E)``.

    ``nn.BatchNorm1d(E)`` applied to a ``(B, L, E)`` tensor treats ``L`` as the channel
    axis, which normalizes the wrong dimension (and breaks when ``L != E``); this layer
    flattens the tokens instead. In training, padded tokens (``padding_mask`` ``True``)
    are left out of the statistics and of the running averages, and their outputs are
    zero. In eval mode the running statistics are used, so a token's output does not
    depend on the rest of the batch. Parameters and buffers have ``BatchNorm1d``'s names.
    """

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:  # type: ignore[override]
        if x.dim() != 3 or x.shape[-1] != self.num_features:
            raise InputError(f"x must have shape (B, L, {self.num_features}); got {shape_str(x)}")
        if padding_mask is not None and tuple(padding_mask.shape) != tuple(x.shape[:2]):
            raise InputError(
                f"padding_mask must have shape (B, L) = ({x.shape[0]}, {x.shape[1]}); got {shape_str(padding_mask)}"
            )
        batch_stats = self.training or not self.track_running_stats
        if padding_mask is None or not batch_stats:
            return super().forward(x.reshape(-1, self.num_features)).view_as(x)
        keep = ~padding_mask
        out = x.new_zeros(x.shape)
        out[keep] = super().forward(x[keep])
        return out


NORMS: dict[str, Callable[..., nn.Module]] = {
    "layernorm": LayerNorm,
    "batchnorm": TokenBatchNorm,
    "rmsnorm": RMSNorm,
}
_ALIASES = {"layer": "layernorm", "ln": "layernorm", "batch": "batchnorm", "bn": "batchnorm"}


def build_norm(name: str, dim: int, eps: float = 1e-5, *, bias: bool = True) -> nn.Module:
    """A norm by name: ``"layernorm"`` (``"ln"``), ``"batchnorm"`` (``"bn"``) or ``"rmsnorm"``;
    ``bias=False``: a layernorm without its bias (the others have none, or keep BatchNorm's)."""
    key = _ALIASES.get(name.lower(), name.lower()) if isinstance(name, str) else name
    if key not in NORMS:
        raise InputError(f"norm must be one of {sorted(NORMS)}; got {name!r}")
    if key == "layernorm" and not bias:
        return NORMS[key](dim, eps=eps, bias=False)
    return NORMS[key](dim, eps=eps)


def _stay_in_eval(self: nn.Module, mode: bool = True) -> nn.Module:
    return nn.Module.train(self, False)


def freeze_batch_norm(module: nn.Module) -> list[str]:
    """Keep every BatchNorm layer of ``module`` (``nn.BatchNorm1d/2d/3d``, :class:`TokenBatchNorm`)
    in eval mode, whatever ``train()`` later asks: it normalizes with its running statistics,
    and they no longer follow the data. For a frozen backbone, whose weights do not learn
    either: in training mode its statistics would drift to the new data while its weights
    stay fitted to the old, and a batch's statistics would stand in for them. The layers,
    their ``state_dict`` keys and their checkpoints are unchanged (unlike a swap for a frozen
    class). Returns the names of the layers frozen so."""
    frozen = []
    for name, layer in module.named_modules():
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            layer.train = types.MethodType(_stay_in_eval, layer)  # type: ignore[method-assign]
            layer.eval()
            frozen.append(name)
    return frozen
