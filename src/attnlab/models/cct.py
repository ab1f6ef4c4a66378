"""Compact Convolutional Transformer (Hassani et al., 2021, "Escaping the Big Data Paradigm
with Compact Transformers"): a ViT whose tokens come from a small convolutional tokenizer
(conv 3x3, ReLU, max-pool 3x3/2, repeated) instead of linear patches, pooled by sequence
pooling instead of a class token. The convolutions give the locality prior that a ViT
lacks on small data sets; the paper's CCT-7/3x1 reaches 95% on CIFAR-10 after 300
epochs. Here it is attnlab's :class:`~attnlab.models.vit.VisionTransformer` with the
tokenizer as its backbone (a 1x1 projection follows it) and ``global_pool="seq"``.

Two tokenizers (``tokenizer=``):

* ``"cct"`` (the paper's): ``tokenizer_layers`` x (conv 3x3, ReLU, max-pool 3x3/2).
* ``"airbench"``: the first layers of attnlab's fast CIFAR CNN
  (:mod:`attnlab.models.fast_cnn`, after the fast-training literature's ResNet-9 and
  airbench): conv 2x2 to 24 channels, then two groups of (conv 3x3, max-pool 2, BN, GELU,
  conv 3x3, BN, GELU), 32x32 -> 7x7 tokens. Five convolutions with BatchNorm: a stronger
  stem that trains fast, the Transformer blocks after it doing the rest.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import InputError
from .fast_cnn import ConvGroup
from .registry import register_model
from .vit import VisionTransformer, _vit

__all__ = ["ConvTokenizer", "AirbenchTokenizer", "cct_cifar"]


class ConvTokenizer(nn.Sequential):
    """``layers`` x (conv 3x3, ReLU, max-pool 3x3 stride 2): ``(B, C, H, W) -> (B, out_chans,
    H / 2**layers, W / 2**layers)``, the widths doubling up to ``out_chans``."""

    def __init__(self, in_chans: int, out_chans: int, layers: int = 2) -> None:
        widths = [max(out_chans // 2 ** (layers - 1 - i), 16) for i in range(layers)]
        widths[-1] = out_chans
        modules: list[nn.Module] = []
        for i, w in enumerate(widths):
            modules += [nn.Conv2d(in_chans if i == 0 else widths[i - 1], w, 3, padding=1, bias=False),
                        nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        super().__init__(*modules)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")


class AirbenchTokenizer(nn.Sequential):
    """conv 2x2 without padding (``in_chans -> stem_width``), GELU, ``ConvGroup(stem_width,
    width)``, ``ConvGroup(width, out_chans)``: ``(B, C, H, W) -> (B, out_chans, h, w)`` with
    ``h = ((H - 1) // 2) // 2`` (32x32 -> 7x7: 49 tokens), the layout of
    :class:`~attnlab.models.fast_cnn.FastAttentionCNN`'s first two groups."""

    def __init__(self, in_chans: int, out_chans: int, width: int = 64, stem_width: int = 24) -> None:
        super().__init__(nn.Conv2d(in_chans, stem_width, 2), nn.GELU(),
                         ConvGroup(stem_width, width), ConvGroup(width, out_chans))

    @staticmethod
    def output_size(height: int, width: int) -> tuple[int, int]:
        """The map an input of ``height x width`` gives (read by ``PatchEmbed``)."""
        return ((height - 1) // 2) // 2, ((width - 1) // 2) // 2


TOKENIZERS = ("cct", "airbench")


@register_model("vit")
def cct_cifar(**overrides: Any) -> VisionTransformer:
    """CCT for 32x32: 2-layer conv tokenizer (64 tokens of width 128), 6 blocks, 4 heads, sequence pooling.

    Options besides :class:`~attnlab.models.vit.ViTConfig`'s: ``tokenizer`` (``"cct"`` or
    ``"airbench"``, see the module docstring), ``tokenizer_layers`` (``"cct"``: conv layers,
    each halving the map) and ``tokenizer_width`` (``"airbench"``: its first group's width)."""
    kind = overrides.pop("tokenizer", "cct")
    layers = int(overrides.pop("tokenizer_layers", 2))
    width = int(overrides.pop("tokenizer_width", 64))
    if kind not in TOKENIZERS:
        raise InputError(f"tokenizer must be one of {', '.join(map(repr, TOKENIZERS))}; got {kind!r}")
    e = overrides.get("embed_dim", 128)
    in_chans = overrides.get("in_chans", 3)
    if kind == "cct":
        backbone, stride = ConvTokenizer(in_chans, e, layers), 2**layers
    else:
        backbone, stride = AirbenchTokenizer(in_chans, e, width), 1  # the tokenizer gives its output size
    return _vit(dict(img_size=32, patch_size=1, num_classes=10, embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0,
                     class_token=False, global_pool="seq", drop_path_rate=0.1), overrides,
                backbone=backbone, backbone_stride=stride, backbone_channels=e)
