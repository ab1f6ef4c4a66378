"""Vision Transformer (Dosovitskiy et al., 2021), timm-compatible, with any attention kind."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..attention.capture import capture_attention
from ..attention.registry import build_attention, attention_entry
from ..dropout import Dropout
from ..errors import InputError
from ..layers.checkpointing import checkpointed
from ..layers.drop_path import DropPath, drop_path_rates
from ..layers.init import mimetic_init_
from ..layers.mlp import Mlp
from ..layers.norms import build_norm
from ..layers.patch_embed import PatchEmbed, ShiftedImages, to_2tuple
from ..layers.pos_embed_2d import LearnedPosEmbed2d, RelativePositionBias2d, resample_pos_embed, sincos_2d
from ..layers.transformer_layers import EncoderBlock
from .checkpoint import load_checkpoint
from .maps import TokenGridMaps, register_attention_maps
from .registry import build_config, refuse_options_the_model_sets, check_attention_values, register_model

__all__ = ["ViTConfig", "VisionTransformer", "Block"]


POS_EMBEDS = ("learned", "learned2d", "sincos2d", "relative", "none")


@dataclass
class ViTConfig:
    """Configuration of :class:`VisionTransformer`; defaults are ViT-B/16 at 224x224."""

    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    class_token: bool = True
    # "token" (class token), "avg" (mean of patch tokens) or "seq" (sequence pooling, CCT's: a
    # softmax-weighted mean of the patch tokens, the weights from a learned linear score)
    global_pool: str = "token"
    # "learned" (1-D, one vector per token), "learned2d" (a learned row half and column half),
    # "sincos2d" (fixed), "relative" (a learned 2-D relative bias per head) or "none"
    pos_embed: str = "learned"
    pre_logits: bool = False  # Linear + tanh before the head (the paper's pre-training head)
    drop_rate: float = 0.0  # dropout after position embedding, attention output, MLP, head input
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0  # stochastic depth of the last block; linear from 0
    norm_eps: float = 1e-6
    attention: str = "exact"
    attention_options: dict[str, Any] = field(default_factory=dict)
    # The blocks' norms: "layernorm" (timm's) or "batchnorm" (token BatchNorm: each feature over the
    # batch and the tokens); norm_first=False puts them after each residual sum (post-norm: the
    # first tutorial's attention -> projection -> BatchNorm arrangement).
    norm: str = "layernorm"
    norm_first: bool = True
    # "linear": patches -> linear projection (timm's); "shifted": shifted patch tokenization (the image
    # and four diagonal shifts by half a patch, stacked, then the linear projection of their patches)
    patch_embed: str = "linear"
    # "default": timm's (truncated normal, std 0.02); "mimetic": each head's W_q W_k^T near a
    # multiple of the identity and W_v W_o near a negative one (Trockman and Kolter, 2023, report
    # faster training from scratch on small data; in 4 CIFAR-10 epochs here it changed nothing)
    attn_init: str = "default"
    # with pos_embed="relative": "normal" (small random, BEiT's) or "local" (head i starts at
    # -distance / 2**i: convolution-like attention at first, ConViT's locality prior)
    rel_pos_init: str = "normal"

    def __post_init__(self) -> None:
        self.img_size = to_2tuple(self.img_size)
        build_norm(self.norm, 1)  # an unknown norm fails here, naming the choices
        if self.patch_embed not in ("linear", "shifted"):
            raise InputError(f"patch_embed must be 'linear' or 'shifted'; got {self.patch_embed!r}")
        for name in ("patch_size", "in_chans", "embed_dim", "depth", "num_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InputError(f"{name} must be a positive integer; got {value!r}")
        if self.num_classes < 0:
            raise InputError(f"num_classes must be >= 0 (0: no head); got {self.num_classes}")
        if self.embed_dim % self.num_heads:
            raise InputError(f"embed_dim must be divisible by num_heads; got {self.embed_dim} and {self.num_heads}")
        if self.global_pool not in ("token", "avg", "seq"):
            raise InputError(f"global_pool must be 'token', 'avg' or 'seq'; got {self.global_pool!r}")
        if self.global_pool == "token" and not self.class_token:
            raise InputError("global_pool='token' needs class_token=True; use global_pool='avg' without one")
        if self.attn_init not in ("default", "mimetic"):
            raise InputError(f"attn_init must be 'default' or 'mimetic'; got {self.attn_init!r}")
        if self.pos_embed not in POS_EMBEDS:
            raise InputError(f"pos_embed must be one of {', '.join(POS_EMBEDS)}; got {self.pos_embed!r}")
        if self.rel_pos_init not in ("normal", "local"):
            raise InputError(f"rel_pos_init must be 'normal' or 'local'; got {self.rel_pos_init!r}")
        if self.rel_pos_init != "normal" and self.pos_embed != "relative":
            raise InputError(f"rel_pos_init applies to pos_embed='relative'; got pos_embed={self.pos_embed!r}")
        if attention_entry(self.attention).family != "tokens":  # unknown names fail here, with suggestions
            raise InputError(f"attention must be a 'tokens' kind; {self.attention!r} is a grid kind")
        refuse_options_the_model_sets(self.attention_options, {"dropout": "attn_drop_rate", "bias": "qkv_bias"})
        check_attention_values(type(self), self.attention, self.attention_options)


class Block(EncoderBlock):
    """timm's ViT block: :class:`~attnlab.layers.EncoderBlock` (pre-norm: ``x + attn(norm(x))``,
    then ``x + mlp(norm(x))``, each branch with dropout and stochastic depth; post-norm with
    ``norm_first=False``) with timm's module names (``norm1``, ``attn``, ``norm2``, ``mlp``),
    a GELU MLP of width ``int(embed_dim * mlp_ratio)`` (timm's rounding), ``qkv_bias`` on the
    attention only, and an optional relative position bias ``rel_pos``, added to the attention
    logits. ``norm``: ``"layernorm"`` or ``"batchnorm"`` (token BatchNorm). ``(B, N, E) -> (B, N, E)``."""

    def __init__(
        self, embed_dim: int, num_heads: int, *, mlp_ratio: float = 4.0, qkv_bias: bool = True,
        drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0, norm_eps: float = 1e-6,
        attention: str = "exact", attention_options: dict[str, Any] | None = None,
        rel_pos: RelativePositionBias2d | None = None, norm: str = "layernorm", norm_first: bool = True,
    ) -> None:
        super().__init__(norm_first=norm_first)
        self.norm1 = build_norm(norm, embed_dim, norm_eps)
        self.attn = build_attention(attention, embed_dim, num_heads, dropout=attn_drop_rate, bias=qkv_bias,
                                    **(attention_options or {}))
        self.rel_pos = rel_pos
        self.drop = Dropout(drop_rate)
        self.drop_path = DropPath(drop_path_rate)
        self.norm2 = build_norm(norm, embed_dim, norm_eps)
        self.mlp = Mlp(embed_dim, int(embed_dim * mlp_ratio), activation="gelu", dropout=drop_rate)

    def attend(self, x: Tensor, *, key_padding_mask: Tensor | None, attn_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        if self.rel_pos is not None:
            if attn_mask is not None:
                raise InputError("this block adds its relative position bias as the attention mask; "
                                 "it takes no attn_mask of its own")
            attn_mask = self.rel_pos()
        return self.attn(x, key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=is_causal)[0]

    def feed_forward(self, x: Tensor) -> Tensor:
        return self.mlp(x)


class VisionTransformer(nn.Module):
    """Image -> patches -> Transformer encoder -> class token (or mean) -> head.

    Parameter names and counts follow timm's ``VisionTransformer``, so timm checkpoints
    load with :func:`load_checkpoint` (``create_model(name, checkpoint=PATH)``).
    Inputs of another size than ``img_size`` work: a learned position grid is resized
    (bicubic), a sin-cos table recomputed.

    Shapes: ``x`` ``(B, in_chans, H, W)`` -> logits ``(B, num_classes)``;
    :meth:`forward_features` -> tokens ``(B, prefix + N, E)``.
    """

    def __init__(self, config: ViTConfig | None = None, *, backbone: nn.Module | None = None,
                 backbone_stride: int = 1, backbone_channels: int | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = build_config(ViTConfig, asdict(config or ViTConfig()), overrides)
        self.config = cfg
        e = cfg.embed_dim
        self.num_prefix_tokens = 1 if cfg.class_token else 0
        if cfg.patch_embed == "shifted":
            if backbone is not None:
                raise InputError("patch_embed='shifted' shifts the image itself; a model with a backbone cannot")
            backbone, backbone_stride = ShiftedImages(max(1, cfg.patch_size // 2)), 1
            backbone_channels = 5 * cfg.in_chans
        self.patch_embed = PatchEmbed(
            cfg.img_size, cfg.patch_size, cfg.in_chans, e, backbone=backbone, backbone_stride=backbone_stride,
            backbone_channels=backbone_channels,
        )
        grid = self.patch_embed.grid_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, e)) if cfg.class_token else None
        if cfg.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + grid[0] * grid[1], e))
        else:
            self.register_parameter("pos_embed", None)
        self.pos_embed2d = LearnedPosEmbed2d(grid, e) if cfg.pos_embed == "learned2d" else None
        self.pos_drop = Dropout(cfg.drop_rate)
        rates = drop_path_rates(cfg.drop_path_rate, cfg.depth)
        self.blocks = nn.ModuleList(
            Block(
                e, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, drop_rate=cfg.drop_rate,
                attn_drop_rate=cfg.attn_drop_rate, drop_path_rate=rates[i], norm_eps=cfg.norm_eps,
                attention=cfg.attention, attention_options=cfg.attention_options, norm=cfg.norm,
                norm_first=cfg.norm_first,
                rel_pos=RelativePositionBias2d(grid, cfg.num_heads, cfg.class_token, cfg.rel_pos_init)
                if cfg.pos_embed == "relative" else None,
            )
            for i in range(cfg.depth)
        )
        # timm's layout: the final norm before pooling for the class token, after it for "avg".
        avg = cfg.global_pool == "avg"
        self.norm = nn.Identity() if avg else nn.LayerNorm(e, eps=cfg.norm_eps)
        self.fc_norm = nn.LayerNorm(e, eps=cfg.norm_eps) if avg else nn.Identity()
        self.attn_pool = nn.Linear(e, 1) if cfg.global_pool == "seq" else None
        self.pre_logits = nn.Sequential()
        if cfg.pre_logits:
            self.pre_logits.add_module("fc", nn.Linear(e, e))
            self.pre_logits.add_module("act", nn.Tanh())
        self.head_drop = Dropout(cfg.drop_rate)
        self.head = nn.Linear(e, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.grad_checkpointing = False
        self._init_weights()

    def _init_weights(self) -> None:
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        # Patch projection as a Linear on flattened patches (as in the JAX reference).
        w = self.patch_embed.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        if self.config.attn_init == "mimetic":
            for block in self.blocks:
                projs = [getattr(block.attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
                width = self.config.embed_dim
                if not all(isinstance(p, nn.Linear) and p.weight.shape == (width, width) for p in projs):
                    raise InputError(f"attn_init='mimetic' needs attention with query, key, value and output "
                                     f"projections of the width; attention={self.config.attention!r} has none")
                with torch.no_grad():
                    packed = torch.cat([p.weight for p in projs[:3]])  # (3d, d): [W_q; W_k; W_v]
                    mimetic_init_(packed, projs[3].weight, self.config.num_heads)
                    for p, part in zip(projs[:3], packed.chunk(3)):
                        p.weight.copy_(part)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def shard_blocks(self) -> list[nn.Module]:
        """Its transformer blocks: the units sharded training gathers one at a time
        (:mod:`attnlab.engine.sharding`)."""
        return list(self.blocks)

    def _positions(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        cfg = self.config
        if cfg.pos_embed == "relative" and grid != self.patch_embed.grid_size:
            raise InputError(
                f"relative position bias is built for a {self.patch_embed.grid_size} grid; got {grid}"
            )
        if cfg.pos_embed == "learned":
            pos = resample_pos_embed(self.pos_embed, grid, self.patch_embed.grid_size, self.num_prefix_tokens)
            if self.cls_token is not None:
                x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            return x + pos
        if cfg.pos_embed == "sincos2d":
            x = x + sincos_2d(grid, cfg.embed_dim).to(x)
        elif self.pos_embed2d is not None:
            x = x + self.pos_embed2d(grid).to(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x

    def forward_features(self, x: Tensor) -> Tensor:
        grid = self.patch_embed.grid_for(x.shape[-2], x.shape[-1]) if x.dim() == 4 else None
        x = self.patch_embed(x)
        x = self.pos_drop(self._positions(x, grid))  # type: ignore[arg-type]
        for block in self.blocks:
            if self.grad_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpointed(block, x)
            else:
                x = block(x)
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        pool = self.config.global_pool
        if pool == "seq":
            tokens = x[:, self.num_prefix_tokens :]
            x = (self.attn_pool(tokens).softmax(dim=1) * tokens).sum(dim=1)  # (B, N, 1) weights over the tokens
        else:
            x = x[:, self.num_prefix_tokens :].mean(dim=1) if pool == "avg" else x[:, 0]
        x = self.pre_logits(self.fc_norm(x))
        return x if pre_logits else self.head(self.head_drop(x))

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


# --------------------------------------------------------------------------- registry
def _vit(defaults: dict[str, Any], overrides: dict[str, Any], **kwargs: Any) -> VisionTransformer:
    path = overrides.pop("checkpoint", None)
    model = VisionTransformer(build_config(ViTConfig, defaults, overrides), **kwargs)
    if path is not None:
        load_checkpoint(model, path)
    return model


@register_model("vit")
def vit_tiny_patch16_224(**overrides: Any) -> VisionTransformer:
    """ViT-Ti/16: 12 blocks, width 192, 3 heads, 224x224."""
    return _vit(dict(embed_dim=192, depth=12, num_heads=3), overrides)


@register_model("vit")
def vit_small_patch16_224(**overrides: Any) -> VisionTransformer:
    """ViT-S/16: 12 blocks, width 384, 6 heads, 224x224."""
    return _vit(dict(embed_dim=384, depth=12, num_heads=6), overrides)


@register_model("vit")
def vit_base_patch16_224(**overrides: Any) -> VisionTransformer:
    """ViT-B/16: 12 blocks, width 768, 12 heads, 224x224 (196 + 1 tokens)."""
    return _vit(dict(embed_dim=768, depth=12, num_heads=12), overrides)


@register_model("vit")
def vit_large_patch16_224(**overrides: Any) -> VisionTransformer:
    """ViT-L/16: 24 blocks, width 1024, 16 heads, 224x224."""
    return _vit(dict(embed_dim=1024, depth=24, num_heads=16), overrides)


@register_model("vit")
def vit_cifar_patch4(**overrides: Any) -> VisionTransformer:
    """CIFAR-scale ViT: 32x32, patch 4 (64 tokens), width 192, 6 blocks, 3 heads, 10 classes."""
    return _vit(dict(img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=6, num_heads=3,
                     mlp_ratio=2.0, drop_path_rate=0.1), overrides)


@register_model("vit")
def vit_digits_patch2(**overrides: Any) -> VisionTransformer:
    """Digits-scale ViT: 8x8 grey images, patch 2 (16 tokens), width 64, 4 blocks, 10 classes."""
    return _vit(dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, depth=4, num_heads=4,
                     mlp_ratio=2.0), overrides)


@register_model("vit")
def vit_sketch_cifar(**overrides: Any) -> VisionTransformer:
    """The tutorials' single-block ViT sketch: 32x32, patch 4, width 128, 1 block, 4 heads."""
    return _vit(dict(img_size=32, patch_size=4, num_classes=10, embed_dim=128, depth=1, num_heads=4), overrides)


@register_attention_maps(VisionTransformer)
def _vit_maps(model: VisionTransformer, x: Tensor) -> tuple[Tensor, TokenGridMaps]:
    """Every block's attention over the class token(s) and the patch grid."""
    with capture_attention(model, cpu=True) as maps:
        logits = model(x)
    layers = [calls[0] for calls in maps.values() if calls]  # (B, H, N, N) per block
    grid = model.patch_embed.grid_for(x.shape[-2], x.shape[-1])
    return logits, TokenGridMaps(layers, tuple(grid), model.num_prefix_tokens,
                                 "token" if model.config.global_pool == "token" else "avg")
