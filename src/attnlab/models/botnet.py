"""Bottleneck Transformers (BoTNet; Srinivas et al., 2021): a ResNet whose last stage
replaces each 3x3 convolution by multi-head self-attention over the feature map.

``botnet50`` is :func:`~attnlab.models.resnet.resnet50` with the three C5 (``layer4``)
bottlenecks swapped for :class:`BoTBlock` s: at 224x224 the first one attends over the
14x14 map and then average-pools 2x2 (the paper's replacement for the strided 3x3
conv), the other two attend over 7x7; 4 heads, 2-D relative positions. 20,852,008
parameters (paper: 20.8 M, against ResNet-50's 25.6 M).

The attention is any registered kind (``attention=`` plus ``attention_options=``):
``"grid"`` kinds are built for the map's ``size``; ``"tokens"`` kinds run over the
flattened map (:func:`~attnlab.attention.registry.attend_grid`) and, having no
positions of their own, see the pixels as an unordered set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn

from ..attention.capture import capture_attention
from ..attention.registry import attend_grid, build_attention, attention_entry
from ..attention.variants import relpos2d  # noqa: F401  (registers "relpos2d")
from ..errors import InputError
from ..layers.channel_attention import build_channel_attention
from .maps import PixelMaps, register_attention_maps
from .registry import register_model
from .resnet import Bottleneck, ResNet, ResNetConfig, conv1x1, projection

__all__ = ["BoTBlock", "BoTNet", "BoTNetConfig"]


class BoTBlock(nn.Module):
    """Bottleneck Transformer block: a ResNet bottleneck with MHSA in place of the 3x3 conv.

    ``conv1`` 1x1 reduce + BN + ReLU -> MHSA over ``size`` -> (``stride=2``: 2x2 average
    pool) -> BN + ReLU -> ``conv3`` 1x1 expand x4 + BN -> (channel attention) -> add the
    shortcut (projected where the shape changes) -> ReLU. Parameter names follow
    :class:`~attnlab.models.resnet.Bottleneck`, the MHSA being ``attn`` and ``bn2`` its BN.

    Shapes: ``(B, in_chans, H, W) -> (B, 4 * planes, H / stride, W / stride)``, with
    ``(H, W) = size``. Its attention's weights: :func:`~attnlab.attention.capture_attention`
    (``block.attn``), or :meth:`BoTNet.attention_maps`.
    """

    expansion = 4

    def __init__(
        self, in_chans: int, planes: int, *, size: tuple[int, int], num_heads: int = 4, stride: int = 1,
        attention: str = "relpos2d", attention_options: dict[str, Any] | None = None,
        channel_attention: str | None = None,
    ) -> None:
        super().__init__()
        if stride not in (1, 2):
            raise InputError(f"stride must be 1 or 2; got {stride!r}")
        if stride == 2 and (size[0] % 2 or size[1] % 2):
            # An odd map would pool to floor(H/2) but the strided shortcut gives ceil(H/2).
            raise InputError(f"a stride-2 BoT block needs an even map size; got size={tuple(size)}")
        out_chans = planes * self.expansion
        options = dict(attention_options or {})
        self.family = attention_entry(attention).family
        self.conv1 = conv1x1(in_chans, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        if self.family == "grid":
            if "size" in options:
                raise InputError("attention_options must not set 'size': it follows the model's img_size")
            self.attn = build_attention(attention, planes, num_heads, size=tuple(size), **options)
        else:
            self.attn = build_attention(attention, planes, num_heads, **options)
        # The paper downsamples after the attention: attending at the higher resolution
        # first gives the pooled pixels a global context.
        self.pool = nn.AvgPool2d(2, 2) if stride == 2 else nn.Identity()
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, out_chans)
        self.bn3 = nn.BatchNorm2d(out_chans)
        self.relu = nn.ReLU(inplace=True)
        self.channel_attn = build_channel_attention(channel_attention, out_chans)
        self.downsample = projection(in_chans, out_chans, stride)

    def last_bn(self) -> nn.BatchNorm2d:
        return self.bn3

    def _attend(self, x: Tensor) -> Tensor:
        return self.attn(x)[0] if self.family == "grid" else attend_grid(self.attn, x)

    def forward(self, x: Tensor) -> Tensor:
        if isinstance(self.pool, nn.AvgPool2d) and (x.shape[-2] % 2 or x.shape[-1] % 2):
            raise InputError(f"a stride-2 BoT block needs an even map size; this input gives "
                             f"{tuple(x.shape[-2:])} here (choose an image size that halves evenly down to it)")
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self._attend(out)
        out = self.relu(self.bn2(self.pool(out)))
        out = self.channel_attn(self.bn3(self.conv3(out)))
        return self.relu(out + shortcut)


@dataclass
class BoTNetConfig(ResNetConfig):
    """Configuration of :class:`BoTNet`: a :class:`ResNetConfig` whose last stage is BoT
    blocks (their width is ``widths[3]``, expanded x4 whatever ``block`` is)."""

    img_size: int | tuple[int, int] = 224  # the size the relative tables are made for; others are resized to
    attention: str = "relpos2d"
    attention_options: dict[str, Any] = field(default_factory=dict)
    num_heads: int = 4
    # Where the MHSA goes (the paper's ablation): "last_stage" (every block of layer4, the paper's
    # BoT50), "last_block" (only layer4's last block; its others are bottlenecks), or
    # "last_two_stages" (every block of layer3 and layer4)
    mhsa_in: str = "last_stage"

    # Names before attnlab took timm's: read in older runs, pointed to in errors.
    renamed: ClassVar[dict[str, str]] = {"image_size": "img_size", "heads": "num_heads"}

    def __post_init__(self) -> None:
        super().__post_init__()
        size = (self.img_size, self.img_size) if isinstance(self.img_size, int) else tuple(self.img_size)
        if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
            raise InputError(f"img_size must be a positive integer or a pair (H, W); got {self.img_size!r}")
        self.img_size = size
        if not isinstance(self.num_heads, int) or self.num_heads <= 0:
            raise InputError(f"num_heads must be a positive integer; got {self.num_heads!r}")
        if self.widths[3] % self.num_heads != 0:
            raise InputError(f"widths[3] must be divisible by num_heads; got widths[3]={self.widths[3]}, "
                             f"num_heads={self.num_heads}")
        if not isinstance(self.attention_options, dict):
            raise InputError(f"attention_options must be a dict; got {self.attention_options!r}")
        attention_entry(self.attention).family  # unknown kind: ValueError listing the known ones
        if self.mhsa_in not in MHSA_PLACES:
            raise InputError(f"mhsa_in must be one of {', '.join(map(repr, MHSA_PLACES))}; got {self.mhsa_in!r}")


MHSA_PLACES = ("last_stage", "last_block", "last_two_stages")


def _halve(n: int) -> int:
    return (n + 1) // 2  # every downsampling layer here (3x3/2, 1x1/2, 7x7/2, pool 3x3/2) gives ceil(n/2)


class BoTNet(ResNet):
    """ResNet with BoT blocks as its last stage; see the module docstring.

    Built for ``img_size``; other input sizes work too (the relative tables are resized to
    the feature map). Shapes as :class:`~attnlab.models.resnet.ResNet`;
    :meth:`attention_maps` gives one ``(B, heads, h*w, h*w)`` map per BoT block.
    """

    config_class = BoTNetConfig
    config: BoTNetConfig

    def _stage_input_size(self, index: int) -> tuple[int, int]:
        """Map size entering stage ``index`` (0-based): the stem, then stride 2 in stages 1, 2, ..."""
        h, w = self.config.img_size
        for _ in range((2 if self.config.stem == "imagenet" else 0) + max(index - 1, 0)):
            h, w = _halve(h), _halve(w)
        return h, w

    def _make_stage(self, index: int, in_chans: int, planes: int, depth: int, stride: int) -> tuple[nn.Sequential, int]:
        cfg = self.config
        first_bot_stage = 2 if cfg.mhsa_in == "last_two_stages" else 3
        if index < first_bot_stage:
            return super()._make_stage(index, in_chans, planes, depth, stride)
        size = self._stage_input_size(index)
        blocks: list[nn.Module] = []
        for j in range(depth):
            s = stride if j == 0 else 1
            if cfg.mhsa_in == "last_block" and j < depth - 1:
                blocks.append(Bottleneck(in_chans, planes, s, cfg.channel_attention))
            else:
                blocks.append(BoTBlock(
                    in_chans, planes, size=size, num_heads=cfg.num_heads, stride=s, attention=cfg.attention,
                    attention_options=cfg.attention_options, channel_attention=cfg.channel_attention,
                ))
            in_chans, size = planes * BoTBlock.expansion, (size[0] // s, size[1] // s)
        return nn.Sequential(*blocks), in_chans

    def bot_blocks(self) -> list[BoTBlock]:
        """The blocks with MHSA, in order (see ``mhsa_in``)."""
        return [m for m in self.modules() if isinstance(m, BoTBlock)]

    def _init_weights(self) -> None:
        super()._init_weights()
        # The blanket conv init above also hit the attention's own projections; give the
        # attention modules back their own initialization.
        for block in self.bot_blocks():
            if hasattr(block.attn, "reset_parameters"):
                block.attn.reset_parameters()

    def attention_maps(self, x: Tensor) -> list[Tensor]:
        """Per-head attention of every BoT block for input ``x`` ``(B, in_chans, H, W)``:
        :func:`~attnlab.attention.capture_attention` of the blocks' ``attn`` over a forward.

        One detached ``(B, heads, h*w, h*w)`` tensor per BoT block (see ``mhsa_in``; at
        224x224 for ``botnet50``: 196x196, then 49x49 twice), pixels in row-major order,
        rows summing to 1, in the model's train/eval mode. The attention kind must form
        its weight matrix (``relpos2d`` and the exact ``"tokens"`` kind do; capture names
        those that do not).
        """
        self._check_input(x)
        names = [f"{name}.attn" for name, m in self.named_modules() if isinstance(m, BoTBlock)]
        with capture_attention(self, include=names) as maps:
            self(x)
        return [maps[name][0] for name in names]


@register_attention_maps(BoTNet)
def _botnet_maps(model: BoTNet, x: Tensor) -> tuple[Tensor, PixelMaps]:
    """Every BoT block's attention, with the map size it attends over (its input's: the
    1x1 reduce keeps the size)."""
    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, BoTBlock)]
    sizes: dict[str, tuple[int, int]] = {}

    def note_size(name: str):
        def hook(module: nn.Module, args: tuple) -> None:  # returns None: the input stays as it is
            sizes.setdefault(name, tuple(args[0].shape[-2:]))
        return hook

    hooks = [m.register_forward_pre_hook(note_size(name)) for name, m in blocks]
    attn = [f"{n}.attn" if n else "attn" for n, _ in blocks]
    try:
        with capture_attention(model, include=attn, cpu=True) as maps:
            logits = model(x)
    finally:
        for h in hooks:
            h.remove()
    return logits, PixelMaps([(name, maps[a][0], sizes[name]) for (name, _), a in zip(blocks, attn)])


# --------------------------------------------------------------------------- registry
def _build(defaults: dict, overrides: dict) -> BoTNet:
    return BoTNet(BoTNetConfig(**defaults), **overrides)


@register_model("botnet")
def botnet50(**overrides) -> BoTNet:
    """BoT50: ResNet-50 with MHSA (relpos2d, 4 heads) in C5, 224x224; 20.85 M parameters."""
    return _build({}, overrides)


@register_model("botnet")
def botnet_cifar(**overrides) -> BoTNet:
    """BoTNet for 32x32: ResNet-18-like 3x3 stem and basic blocks, BoT stage on 8x8 then 4x4; 3.4 M."""
    return _build(
        dict(block="basic", layers=(2, 2, 2, 3), widths=(64, 128, 256, 128), stem="cifar", img_size=32,
             num_classes=10), overrides,
    )
