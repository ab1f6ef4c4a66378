"""ResNet (He et al., 2016), torchvision's layout and names, with optional channel attention.

The module tree and every parameter/buffer name match ``torchvision.models.resnet``
(``conv1, bn1, relu, maxpool, layer1..layer4, fc``; blocks ``conv1/bn1/conv2/bn2[/conv3/bn3]``
and ``downsample.0/.1``), and the stride of a downsampling bottleneck sits on its 3x3
conv ("ResNet v1.5"), so a torchvision state dict loads by name. ``resnet50`` has
25,557,032 parameters, ``resnet18`` 11,689,512.

``channel_attention="se"`` / ``"cbam"`` puts :mod:`~attnlab.layers.channel_attention` on
each residual branch after its last BatchNorm, before the addition (SE-ResNet, Hu et al.
2018, Fig. 3; CBAM, Woo et al. 2018, Fig. 3). With ``None`` the slot is an
``nn.Identity`` and the state dict is torchvision's exactly.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from ..errors import InputError
from ..layers.channel_attention import CHANNEL_ATTENTION, build_channel_attention
from ..layers.checkpointing import checkpointed
from .registry import build_config, register_model

__all__ = ["ResNet", "ResNetConfig", "BasicBlock", "Bottleneck", "conv1x1", "conv3x3"]


def conv3x3(in_chans: int, out_chans: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_chans, out_chans, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_chans: int, out_chans: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_chans, out_chans, 1, stride=stride, bias=False)


def projection(in_chans: int, out_chans: int, stride: int) -> nn.Sequential | None:
    """The shortcut where the shape changes: 1x1 conv (strided) + BN; ``None`` otherwise."""
    if stride == 1 and in_chans == out_chans:
        return None
    return nn.Sequential(conv1x1(in_chans, out_chans, stride), nn.BatchNorm2d(out_chans))


class BasicBlock(nn.Module):
    """Two 3x3 convs (ResNet-18/34). ``(B, in_chans, H, W) -> (B, planes, H/stride, W/stride)``."""

    expansion = 1

    def __init__(self, in_chans: int, planes: int, stride: int = 1, channel_attention: str | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_chans, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.channel_attn = build_channel_attention(channel_attention, planes)
        self.downsample = projection(in_chans, planes, stride)

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn2

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.channel_attn(self.bn2(self.conv2(out)))
        return self.relu(out + shortcut)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided, v1.5), 1x1 expand by 4.

    ``(B, in_chans, H, W) -> (B, 4 * planes, H/stride, W/stride)``.
    """

    expansion = 4

    def __init__(self, in_chans: int, planes: int, stride: int = 1, channel_attention: str | None = None) -> None:
        super().__init__()
        out_chans = planes * self.expansion
        self.conv1 = conv1x1(in_chans, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        # Stride on the 3x3 rather than the first 1x1 (v1.5): a strided 1x1 would skip
        # three quarters of its input; about +0.5% top-1 for the same parameters.
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, out_chans)
        self.bn3 = nn.BatchNorm2d(out_chans)
        self.relu = nn.ReLU(inplace=True)
        self.channel_attn = build_channel_attention(channel_attention, out_chans)
        self.downsample = projection(in_chans, out_chans, stride)

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.channel_attn(self.bn3(self.conv3(out)))
        return self.relu(out + shortcut)


BLOCKS: dict[str, type[BasicBlock] | type[Bottleneck]] = {"basic": BasicBlock, "bottleneck": Bottleneck}
STEMS = ("imagenet", "cifar")


@dataclass
class ResNetConfig:
    """Configuration of :class:`ResNet`; defaults are ResNet-50 for ImageNet."""

    block: str = "bottleneck"  # "basic" (ResNet-18/34) or "bottleneck" (50 and deeper)
    layers: tuple[int, ...] = (3, 4, 6, 3)  # blocks per stage
    widths: tuple[int, ...] = (64, 128, 256, 512)  # "planes" per stage, before the block's expansion
    num_classes: int = 1000  # 0: no classifier, forward returns the pooled features
    in_chans: int = 3
    stem: str = "imagenet"  # 7x7/2 conv + 3x3/2 max pool; "cifar": 3x3/1 conv, no pool (32x32 inputs)
    stem_width: int = 64
    channel_attention: str | None = None  # None, "se" or "cbam" on every residual branch
    zero_init_residual: bool = False  # zero each branch's last BN scale: blocks start as identities

    def __post_init__(self) -> None:
        self.layers, self.widths = tuple(self.layers), tuple(self.widths)
        if self.block not in BLOCKS:
            raise InputError(f"block must be one of {sorted(BLOCKS)}; got {self.block!r}")
        for name in ("layers", "widths"):
            value = getattr(self, name)
            if len(value) != 4 or not all(isinstance(v, int) and v > 0 for v in value):
                raise InputError(f"{name} must be 4 positive integers, one per stage; got {value!r}")
        if self.stem not in STEMS:
            raise InputError(f"stem must be one of {', '.join(map(repr, STEMS))}; got {self.stem!r}")
        for name in ("in_chans", "stem_width"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise InputError(f"{name} must be a positive integer; got {getattr(self, name)!r}")
        if not isinstance(self.num_classes, int) or self.num_classes < 0:
            raise InputError(f"num_classes must be a non-negative integer; got {self.num_classes!r}")
        if self.channel_attention is not None and self.channel_attention not in CHANNEL_ATTENTION:
            raise InputError(
                f"channel_attention must be None or one of {', '.join(map(repr, CHANNEL_ATTENTION))}; "
                f"got {self.channel_attention!r}"
            )


class ResNet(nn.Module):
    """ResNet classifier built from a :class:`ResNetConfig` (keyword overrides accepted).

    Shapes (ImageNet stem; the CIFAR stem keeps the full resolution until ``layer2``):

    ==================  ========================================================
    ``x``               ``(B, in_chans, H, W)``
    after the stem      ``(B, 64, H/4, W/4)``
    after ``layerN``    ``(B, stage_channels[N-1], H/2^(N+1), W/2^(N+1))``
    forward_features    ``(B, num_features, H/32, W/32)`` (2048 for ResNet-50)
    forward             ``(B, num_classes)`` (``(B, num_features)`` if ``num_classes=0``)
    ==================  ========================================================

    The stem (``conv1, bn1, relu, maxpool``) and the stages (``layer1..layer4``) are plain
    attributes; :meth:`stages` hands out the stem plus the first ``n`` stages as one
    ``nn.Sequential`` (e.g. a ResNet-50 to ``layer3`` as a hybrid ViT's backbone).
    """

    config_class: type[ResNetConfig] = ResNetConfig

    def __init__(self, config: ResNetConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = build_config(self.config_class, asdict(config or self.config_class()), overrides)
        self.config = cfg
        if cfg.stem == "imagenet":
            self.conv1 = nn.Conv2d(cfg.in_chans, cfg.stem_width, 7, stride=2, padding=3, bias=False)
            self.maxpool: nn.Module = nn.MaxPool2d(3, stride=2, padding=1)
        else:  # 32x32 inputs: downsampling by 4 at once would leave an 8x8 map for layer1
            self.conv1 = conv3x3(cfg.in_chans, cfg.stem_width)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(cfg.stem_width)
        self.relu = nn.ReLU(inplace=True)

        chans, stage_channels = cfg.stem_width, []
        for i, (depth, width) in enumerate(zip(cfg.layers, cfg.widths)):
            stage, chans = self._make_stage(i, chans, width, depth, stride=1 if i == 0 else 2)
            self.add_module(f"layer{i + 1}", stage)
            stage_channels.append(chans)
        self.stage_channels = tuple(stage_channels)
        self.num_features = chans
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc: nn.Module = nn.Linear(chans, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.grad_checkpointing = False
        self._init_weights()

    def _make_stage(self, index: int, in_chans: int, planes: int, depth: int, stride: int) -> tuple[nn.Sequential, int]:
        """Stage ``index`` (0-based) and its output channels; subclasses replace stages here."""
        block = BLOCKS[self.config.block]
        blocks = []
        for j in range(depth):
            blocks.append(block(in_chans, planes, stride if j == 0 else 1, self.config.channel_attention))
            in_chans = planes * block.expansion
        return nn.Sequential(*blocks), in_chans

    def _init_weights(self) -> None:
        # As torchvision: He-normal (fan-out) convs, unit-scale BNs, PyTorch's default Linear.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.config.zero_init_residual:  # Goyal et al. 2017: +0.2-0.3% top-1
            for m in self.modules():
                if hasattr(m, "last_bn"):
                    nn.init.zeros_(m.last_bn().weight)

    # ----------------------------------------------------------------- structure
    def stage_list(self) -> list[nn.Sequential]:
        return [self.layer1, self.layer2, self.layer3, self.layer4]

    def stages(self, n: int) -> nn.Sequential:
        """The stem plus the first ``n`` stages (0 to 4), sharing this model's modules.

        Names are kept (``conv1``, ``bn1``, ..., ``layer3``), so the result's state dict
        keys are a subset of this model's. ``stage_channels[n - 1]`` is its output width.
        """
        if not isinstance(n, int) or not 0 <= n <= 4:
            raise InputError(f"n must be an integer in [0, 4]; got {n!r}")
        mods = OrderedDict(conv1=self.conv1, bn1=self.bn1, relu=self.relu, maxpool=self.maxpool)
        for i in range(n):
            mods[f"layer{i + 1}"] = self.stage_list()[i]
        return nn.Sequential(mods)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each stage in the backward pass instead of storing its activations.

        Applies in training mode with gradients enabled only. BatchNorm running statistics
        are updated once per forward, as without checkpointing.
        """
        self.grad_checkpointing = enable

    # ----------------------------------------------------------------- forward
    def forward_stem(self, x: Tensor) -> Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def _run_stage(self, stage: nn.Module, x: Tensor) -> Tensor:
        if self.grad_checkpointing and self.training and torch.is_grad_enabled():
            return checkpointed(stage, x)
        return stage(x)

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.config.in_chans:
            raise InputError(
                f"x must have shape (B, {self.config.in_chans}, H, W); got ({', '.join(map(str, x.shape))})"
            )

    def forward_features(self, x: Tensor) -> Tensor:
        """``(B, in_chans, H, W)`` -> last feature map ``(B, num_features, h, w)``."""
        self._check_input(x)
        x = self.forward_stem(x)
        for stage in self.stage_list():
            x = self._run_stage(stage, x)
        return x

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Feature map ``(B, num_features, h, w)`` -> logits ``(B, num_classes)``, or the
        pooled features ``(B, num_features)`` with ``pre_logits``."""
        x = torch.flatten(self.avgpool(x), 1)
        return x if pre_logits else self.fc(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


# --------------------------------------------------------------------------- registry
def _build(defaults: dict, overrides: dict) -> ResNet:
    return ResNet(ResNetConfig(**defaults), **overrides)


@register_model("resnet")
def resnet18(**overrides) -> ResNet:
    """ResNet-18: basic blocks 2-2-2-2, ImageNet stem; 11.7 M parameters."""
    return _build(dict(block="basic", layers=(2, 2, 2, 2)), overrides)


@register_model("resnet")
def resnet34(**overrides) -> ResNet:
    """ResNet-34: basic blocks 3-4-6-3, ImageNet stem; 21.8 M parameters."""
    return _build(dict(block="basic", layers=(3, 4, 6, 3)), overrides)


@register_model("resnet")
def resnet50(**overrides) -> ResNet:
    """ResNet-50 (v1.5): bottlenecks 3-4-6-3, ImageNet stem; 25.6 M parameters."""
    return _build({}, overrides)


@register_model("resnet")
def resnet101(**overrides) -> ResNet:
    """ResNet-101 (v1.5): bottlenecks 3-4-23-3, ImageNet stem; 44.5 M parameters."""
    return _build(dict(layers=(3, 4, 23, 3)), overrides)


@register_model("resnet")
def resnet18_cifar(**overrides) -> ResNet:
    """ResNet-18 for 32x32 inputs: 3x3/1 stem, no max pool, 10 classes; 11.2 M parameters."""
    return _build(dict(block="basic", layers=(2, 2, 2, 2), stem="cifar", num_classes=10), overrides)
