"""The tutorials' attention CNNs, made correct: pixel attention blocks inside small CNNs.

* :class:`AttentionBlock`: self-attention over the pixels of a feature map with 1x1-conv
  queries, keys and values (as in SAGAN), a learned residual gate starting at zero.
* :class:`ConvSelfAttentionBN`: conv -> token self-attention normalized by the token
  BatchNorm (over batch *and* positions, not the tutorials' wrong axis) -> conv ->
  BatchNorm2d. Any H x W, square or not.
* :class:`AttentionCNN`: conv, conv, attention, pool, classifier for 32x32 images.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attention.functional import scaled_dot_product_attention
from ..attention.registry import build_attention, attention_entry
from ..dropout import Dropout
from ..errors import InputError
from ..layers.channel_attention import build_channel_attention
from ..layers.norms import TokenBatchNorm
from .registry import build_config, register_model

__all__ = ["AttentionBlock", "ConvSelfAttentionBN", "AttentionCNN", "AttentionCNNConfig"]


class AttentionBlock(nn.Module):
    """Pixel self-attention with 1x1-conv projections: ``(B, C, H, W) -> (B, C, H, W)``.

    Queries and keys have ``C / reduction`` channels, values ``C``. Logits are scaled by
    ``1/sqrt(C / reduction)``, the key size, as the tutorials' block scales them (SAGAN's
    block, which this one follows, leaves them unscaled, which saturates the softmax as
    channels grow). The output is ``x + gamma * attention(x)`` with ``gamma``
    starting at 0, so the block starts as the identity and learns how much to attend.
    """

    forms_weights = True  # capture_attention records its (B, 1, H*W, H*W) weights
    _attn_capture = None  # a recorder, set on an instance by capture_attention only

    def __init__(self, channels: int, reduction: int = 8) -> None:
        super().__init__()
        inner = max(1, channels // reduction)
        self.query = nn.Conv2d(channels, inner, 1)
        self.key = nn.Conv2d(channels, inner, 1)
        self.value = nn.Conv2d(channels, channels, 1)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W) -> (B, C, H, W)``; its weights ``(B, 1, H*W, H*W)`` (query pixel,
        key pixel): :func:`~attnlab.attention.capture_attention`."""
        b, c, h, w = x.shape
        tokens = lambda t: t.flatten(2).transpose(1, 2)  # (B, C', H, W) -> (B, H*W, C')
        capture = self._attn_capture  # set only inside capture_attention
        out, weights = scaled_dot_product_attention(
            tokens(self.query(x)), tokens(self.key(x)), tokens(self.value(x)),
            need_weights=capture is not None,
        )
        if capture is not None:
            capture(weights[:, None])  # one head: (B, 1, H*W, H*W)
        return x + self.gamma * out.transpose(1, 2).reshape(b, c, h, w)


class ConvSelfAttentionBN(nn.Module):
    """Conv -> self-attention over pixels with token BatchNorm -> conv -> BatchNorm2d.

    ``(B, in_channels, H, W) -> (B, out_channels, H, W)`` for any ``H`` and ``W``. The
    attention sub-block is post-norm: ``norm(t + attn(t))`` with
    :class:`~attnlab.layers.norms.TokenBatchNorm` over the ``H*W`` tokens.
    """

    def __init__(self, in_channels: int, out_channels: int, num_heads: int = 4, dropout: float = 0.0, *,
                 attention: str = "exact", attention_options: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False), nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True)
        )
        # Any "tokens" kind of the registry attends over the H*W pixels as tokens.
        # (the block has no dropout setting of its own beside `dropout`: attention_options may set it)
        self.attn = build_attention(attention, out_channels, num_heads, **{"dropout": dropout, **(attention_options or {})})
        self.norm = TokenBatchNorm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv1(x)
        b, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)  # (B, H*W, C)
        t = self.norm(t + self.attn(t)[0])
        x = t.transpose(1, 2).reshape(b, c, h, w)
        return self.act(self.bn(self.conv2(x)))


def _conv_bn(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


@dataclass
class AttentionCNNConfig:
    num_classes: int = 10
    in_chans: int = 3
    widths: tuple[int, int] = (64, 128)
    block: str = "pixel"  # "pixel" (AttentionBlock) or "conv_sa_bn" (ConvSelfAttentionBN)
    num_heads: int = 4  # for "conv_sa_bn"
    attention: str = "exact"  # for "conv_sa_bn": a "tokens" kind of attnlab.attention.list_attention()
    attention_options: dict[str, Any] = field(default_factory=dict)
    channel_attention: str | None = None  # None, "se" or "cbam" after each conv stage
    drop_rate: float = 0.1  # before the classifier

    # Names before attnlab took timm's: read in older runs, pointed to in errors.
    renamed: ClassVar[dict[str, str]] = {"dropout": "drop_rate"}

    @staticmethod
    def upgrade(options: dict) -> dict:
        """Options of an older run in today's names (``attention`` named the block then)."""
        options = {AttentionCNNConfig.renamed.get(k, k): v for k, v in options.items()}
        if options.get("attention") in ("pixel", "conv_sa_bn"):
            options["block"] = options.pop("attention")
        return options

    def __post_init__(self) -> None:
        self.widths = tuple(self.widths)  # type: ignore[assignment]
        if len(self.widths) != 2 or any(w <= 0 for w in self.widths):
            raise InputError(f"widths must be two positive channel counts; got {self.widths!r}")
        if self.block not in ("pixel", "conv_sa_bn"):
            raise InputError(f"block must be 'pixel' or 'conv_sa_bn'; got {self.block!r}")
        if attention_entry(self.attention).family != "tokens":  # unknown names fail here, with suggestions
            raise InputError(f"attention must be a 'tokens' kind; {self.attention!r} is a grid kind")


class AttentionCNN(nn.Module):
    """conv -> pool -> conv -> pool -> attention -> global pool -> classifier.

    For 32x32 images the attention runs over the 8x8 map (64 pixels). Shapes:
    ``(B, in_chans, H, W) -> (B, num_classes)``.
    """

    def __init__(self, config: AttentionCNNConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = build_config(AttentionCNNConfig, asdict(config or AttentionCNNConfig()), overrides)
        self.config = cfg
        w1, w2 = cfg.widths
        self.stage1 = nn.Sequential(_conv_bn(cfg.in_chans, w1), _conv_bn(w1, w1),
                                    build_channel_attention(cfg.channel_attention, w1), nn.MaxPool2d(2))
        self.stage2 = nn.Sequential(_conv_bn(w1, w2), _conv_bn(w2, w2),
                                    build_channel_attention(cfg.channel_attention, w2), nn.MaxPool2d(2))
        self.attention = AttentionBlock(w2) if cfg.block == "pixel" else ConvSelfAttentionBN(
            w2, w2, cfg.num_heads, attention=cfg.attention, attention_options=cfg.attention_options)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = Dropout(cfg.drop_rate)
        self.head = nn.Linear(w2, cfg.num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        return self.attention(self.stage2(self.stage1(x)))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.drop(self.pool(self.forward_features(x)).flatten(1)))


@register_model("attention_cnn")
def attention_cnn_cifar(**overrides: Any) -> AttentionCNN:
    """The tutorials' attention CNN for 32x32: two conv stages, pixel attention, pool, head."""
    return AttentionCNN(**overrides)


@register_model("attention_cnn")
def conv_sa_bn_cifar(**overrides: Any) -> AttentionCNN:
    """Attention CNN whose attention is conv + self-attention with token BatchNorm + conv."""
    return AttentionCNN(**{"block": "conv_sa_bn", **overrides})
