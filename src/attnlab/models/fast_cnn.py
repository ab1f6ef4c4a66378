"""A CNN built for speed on small images, with multi-head self-attention over its
feature map: the attention CNN that trains to high CIFAR-10 accuracy on a CPU.

The layout follows the fast CIFAR-10 training literature (Page's ResNet-9, Keller
Jordan's airbench): a tiny 2x2 stem, then conv groups that pool *right after* their
first conv, so the expensive 3x3 convolutions mostly run at 15x15 and 7x7 instead of
32x32. Shapes for 32x32 inputs and the default widths ``(32, 128, 128)``::

    stem   2x2 conv, 3 -> 24          (B, 24, 31, 31)
    group1 conv, pool, conv           (B, 32, 15, 15)
    group2 conv, pool, conv           (B, 128, 7, 7)
    attn   pre-norm MHSA, residual    (B, 128, 7, 7)   49 tokens
    group3 conv, pool, conv           (B, 128, 3, 3)
    head   global max pool, linear    (B, 10)

The attention kind is taken from the attention registry (``attention="exact"`` by
default), so any ``"tokens"`` kind can be swapped in from a recipe.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.capture import capture_attention
from ..attention.registry import build_attention, attention_entry
from ..errors import InputError
from .registry import build_config, register_model

__all__ = ["FastAttentionCNN", "FastAttentionCNNConfig"]


@dataclass
class FastAttentionCNNConfig:
    num_classes: int = 10
    in_chans: int = 3
    stem_width: int = 24
    widths: tuple[int, ...] = (32, 128, 128)
    attention_after: tuple[int, ...] = (1,)  # 0-based groups followed by a self-attention block; () for none
    num_heads: int = 4
    attention: str = "exact"
    attention_options: dict[str, Any] = field(default_factory=dict)
    logit_scale: float = 1 / 9  # airbench's output scaling: small logits at the start of training

    def __post_init__(self) -> None:
        self.widths = tuple(self.widths)
        self.attention_after = tuple(self.attention_after)
        if not self.widths or any(not isinstance(w, int) or w <= 0 for w in self.widths):
            raise InputError(f"widths must be positive channel counts; got {self.widths!r}")
        for i in self.attention_after:
            if not 0 <= i < len(self.widths):
                raise InputError(f"attention_after must index widths (0..{len(self.widths) - 1}); got {i}")
            if self.widths[i] % self.num_heads:
                raise InputError(f"widths[{i}]={self.widths[i]} must be divisible by num_heads={self.num_heads}")
        if attention_entry(self.attention).family != "tokens":
            raise InputError(f"attention must be a 'tokens' kind; {self.attention!r} is a grid kind")


class ConvGroup(nn.Module):
    """conv 3x3 -> max pool 2 -> BN -> GELU -> conv 3x3 -> BN -> GELU: ``(B, cin, H, W) -> (B, cout, H//2, W//2)``."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x: Tensor) -> Tensor:
        x = F.gelu(self.bn1(F.max_pool2d(self.conv1(x), 2)))
        return F.gelu(self.bn2(self.conv2(x)))


class MapSelfAttention(nn.Module):
    """Pre-norm self-attention over the pixels of a map, with a residual:
    ``x + attn(LayerNorm(tokens(x)))``, ``(B, C, H, W) -> (B, C, H, W)``."""

    def __init__(self, dim: int, num_heads: int, attention: str = "exact", **options: Any) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = build_attention(attention, dim, num_heads, **options)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W) -> (B, C, H, W)``; the weights: capture_attention of ``attn``."""
        b, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)  # (B, H*W, C)
        out, _ = self.attn(self.norm(t))
        return x + out.transpose(1, 2).reshape(b, c, h, w)


class FastAttentionCNN(nn.Module):
    """See the module docstring. ``(B, in_chans, H, W) -> (B, num_classes)``; any ``H, W >= 2**len(widths) + 1``."""

    def __init__(self, config: FastAttentionCNNConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = build_config(FastAttentionCNNConfig, asdict(config or FastAttentionCNNConfig()), overrides)
        self.config = cfg
        self.stem = nn.Conv2d(cfg.in_chans, cfg.stem_width, 2)
        layers: list[nn.Module] = []
        cin = cfg.stem_width
        for i, width in enumerate(cfg.widths):
            layers.append(ConvGroup(cin, width))
            if i in cfg.attention_after:
                layers.append(MapSelfAttention(width, cfg.num_heads, cfg.attention, **cfg.attention_options))
            cin = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, cfg.num_classes, bias=False)

    def forward_features(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.config.in_chans:
            raise InputError(f"x must be (B, {self.config.in_chans}, H, W); got {tuple(x.shape)}")
        return self.features(F.gelu(self.stem(x)))

    def forward(self, x: Tensor) -> Tensor:
        feats = self.forward_features(x)
        return self.head(feats.amax(dim=(2, 3))) * self.config.logit_scale

    def attention_maps(self, x: Tensor) -> list[Tensor]:
        """``(B, heads, h*w, h*w)`` for every attention block, in order (query pixel, key
        pixel; row-major): :func:`~attnlab.attention.capture_attention` over a forward."""
        names = [f"{name}.attn" for name, m in self.named_modules() if isinstance(m, MapSelfAttention)]
        with capture_attention(self, include=names) as maps:
            self(x)
        return [maps[name][0] for name in names]


@register_model("attention_cnn")
def attention_cnn_fast(**overrides: Any) -> FastAttentionCNN:
    """Fast CIFAR CNN (airbench layout, widths 32-128-128) with 4-head self-attention on the 7x7 map; 0.56 M."""
    return FastAttentionCNN(**overrides)
