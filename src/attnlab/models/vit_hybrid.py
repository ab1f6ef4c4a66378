"""Hybrid CNN + ViT (Dosovitskiy et al., 2021, §3.1): the tokens are the positions of a
ResNet feature map instead of image patches.

The backbone is attnlab's (torchvision-layout) ResNet with BatchNorm and 3-4-6 blocks in
stages 1-3. The paper's R50 (and timm's ``vit_base_r50_s16_224``) uses GroupNorm with
weight standardization and 9 blocks in stage 3, so those weights do not load here.
"""

from __future__ import annotations

from typing import Any

from .registry import create_model, register_model
from .vit import VisionTransformer, _vit

__all__ = ["vit_hybrid_r50_base_224", "vit_hybrid_cifar"]


@register_model("vit")
def vit_hybrid_r50_base_224(**overrides: Any) -> VisionTransformer:
    """R50+ViT-B/16 hybrid: ResNet-50 stem and stages 1-3 (stride 16, 1024 ch) -> 14x14 tokens."""
    backbone = create_model("resnet50", num_classes=0).stages(3)
    return _vit(dict(embed_dim=768, depth=12, num_heads=12, patch_size=1), overrides,
                backbone=backbone, backbone_stride=16, backbone_channels=1024)


@register_model("vit")
def vit_hybrid_cifar(**overrides: Any) -> VisionTransformer:
    """CIFAR hybrid: ResNet-18 stages 1-2 (16x16x128) -> 2x2 patches -> 64 tokens -> 6-block ViT."""
    backbone = create_model("resnet18_cifar", num_classes=0).stages(2)
    return _vit(dict(img_size=32, patch_size=2, num_classes=10, embed_dim=192, depth=6, num_heads=3,
                     mlp_ratio=2.0, drop_path_rate=0.1), overrides,
                backbone=backbone, backbone_stride=2, backbone_channels=128)
