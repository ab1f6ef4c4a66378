"""Channel attention for convolutional feature maps: Squeeze-and-Excitation and CBAM.

Both take and return ``(B, C, H, W)``; they only rescale ``x``, so either can sit on a
residual branch (as in SE-ResNet) without changing any shape.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["SqueezeExcite", "CBAM", "ChannelGate", "SpatialGate", "build_channel_attention", "CHANNEL_ATTENTION"]


def _hidden(channels: int, reduction: int) -> int:
    if not isinstance(channels, int) or channels <= 0:
        raise InputError(f"channels must be a positive integer; got {channels!r}")
    if not isinstance(reduction, int) or reduction <= 0:
        raise InputError(f"reduction must be a positive integer; got {reduction!r}")
    # At least one hidden unit, so that narrow layers (channels < reduction) still work.
    return max(channels // reduction, 1)


class SqueezeExcite(nn.Module):
    """Squeeze-and-Excitation (Hu et al., 2018): ``x * sigmoid(fc2(relu(fc1(avgpool(x)))))``.

    The two fully connected layers are 1x1 convolutions (with bias) on the pooled
    ``(B, C, 1, 1)`` descriptor, so no reshape is needed; the hidden width is
    ``max(C // reduction, 1)``.

    Shapes: ``x`` ``(B, C, H, W)`` -> ``(B, C, H, W)``; :meth:`gate` gives the
    ``(B, C, 1, 1)`` factors in ``(0, 1)``.
    """

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        hidden = _hidden(channels, reduction)
        self.fc1 = nn.Conv2d(channels, hidden, 1)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(hidden, channels, 1)

    def gate(self, x: Tensor) -> Tensor:
        """Per-channel factors ``(B, C, 1, 1)`` in ``(0, 1)``."""
        s = x.mean((2, 3), keepdim=True)  # squeeze: one global descriptor per channel
        return torch.sigmoid(self.fc2(self.relu(self.fc1(s))))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gate(x)


class ChannelGate(nn.Module):
    """CBAM's channel attention: ``sigmoid(mlp(avgpool(x)) + mlp(maxpool(x)))``, one shared MLP.

    Max pooling keeps the most distinctive response of each channel, which average
    pooling washes out (Woo et al., 2018, §3.1). Shapes: ``(B, C, H, W)`` -> gate
    ``(B, C, 1, 1)``.
    """

    def __init__(self, channels: int, reduction: int = 16) -> None:
        super().__init__()
        hidden = _hidden(channels, reduction)
        self.mlp = nn.Sequential(nn.Conv2d(channels, hidden, 1), nn.ReLU(inplace=True), nn.Conv2d(hidden, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.mlp(x.mean((2, 3), keepdim=True)) + self.mlp(x.amax((2, 3), keepdim=True)))


class SpatialGate(nn.Module):
    """CBAM's spatial attention: ``sigmoid(conv_kxk([mean_c(x); max_c(x)]))``.

    Shapes: ``(B, C, H, W)`` -> gate ``(B, 1, H, W)``. ``kernel_size`` must be odd so that
    the map keeps its size.
    """

    def __init__(self, kernel_size: int = 7) -> None:
        super().__init__()
        if not isinstance(kernel_size, int) or kernel_size <= 0 or kernel_size % 2 == 0:
            raise InputError(f"spatial_kernel must be a positive odd integer; got {kernel_size!r}")
        self.conv = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2)

    def forward(self, x: Tensor) -> Tensor:
        pooled = torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], dim=1)  # (B, 2, H, W)
        return torch.sigmoid(self.conv(pooled))


class CBAM(nn.Module):
    """Convolutional Block Attention Module (Woo et al., 2018): channel, then spatial gate.

    ``x' = x * Mc(x)``; ``out = x' * Ms(x')``. The order matters: the paper found
    channel-first slightly better than spatial-first or both in parallel (§4.1).

    Shapes: ``x`` ``(B, C, H, W)`` -> ``(B, C, H, W)``.
    """

    def __init__(self, channels: int, reduction: int = 16, spatial_kernel: int = 7) -> None:
        super().__init__()
        self.channel = ChannelGate(channels, reduction)
        self.spatial = SpatialGate(spatial_kernel)

    def forward(self, x: Tensor) -> Tensor:
        x = x * self.channel(x)
        return x * self.spatial(x)


CHANNEL_ATTENTION = ("none", "se", "cbam")


def build_channel_attention(name: str | None, channels: int, **options) -> nn.Module:
    """Channel attention by name: ``None``/``"none"`` (an :class:`~torch.nn.Identity`,
    which adds no parameters or state-dict keys), ``"se"`` or ``"cbam"``. ``options`` go
    to the constructor (``reduction``; ``spatial_kernel`` for CBAM)."""
    if name is None or name == "none":
        if options:
            raise InputError(f"channel attention options need channel_attention 'se' or 'cbam'; got {options}")
        return nn.Identity()
    if name == "se":
        return SqueezeExcite(channels, **options)
    if name == "cbam":
        return CBAM(channels, **options)
    choices = ", ".join(map(repr, CHANNEL_ATTENTION))
    raise InputError(f"channel_attention must be None or one of {choices}; got {name!r}")
