"""Patch embedding: image -> sequence of patch tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["PatchEmbed", "ShiftedImages", "to_2tuple"]


def to_2tuple(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(x, int):
        return (x, x)
    t = tuple(x)
    if len(t) != 2:
        raise InputError(f"expected an int or a pair (height, width); got {x!r}")
    return t  # type: ignore[return-value]


class PatchEmbed(nn.Module):
    """Cut ``(B, C, H, W)`` into ``p x p`` patches and project each linearly (a strided
    convolution), giving ``(B, (H/p)*(W/p), E)`` tokens in row-major order.

    ``backbone`` (hybrid models) first turns the image into a feature map whose positions
    are then the "pixels" being patched, as in the ViT paper's hybrid (§3.1). Its map is
    ``backbone_stride`` times smaller than the image, or, when the backbone has an
    ``output_size(height, width)`` method (a stem without padding, say), that method's size.
    """

    def __init__(
        self, img_size: int | tuple[int, int] = 224, patch_size: int | tuple[int, int] = 16, in_chans: int = 3,
        embed_dim: int = 768, *, backbone: nn.Module | None = None, backbone_stride: int = 1,
        backbone_channels: int | None = None, bias: bool = True,
    ) -> None:
        super().__init__()
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        self.backbone = backbone
        self.stride = backbone_stride
        self.grid_size = self.grid_for(*self.img_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        chans = backbone_channels if backbone is not None else in_chans
        if chans is None:
            raise InputError("backbone_channels is required with a backbone")
        self.in_chans = in_chans
        self.proj = nn.Conv2d(chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    def grid_for(self, height: int, width: int) -> tuple[int, int]:
        """The token grid an input of this size gives; raises if it does not divide."""
        output_size = getattr(self.backbone, "output_size", None)
        if output_size is not None:
            fh, fw = output_size(height, width)
            if fh % self.patch_size[0] or fw % self.patch_size[1] or fh <= 0 or fw <= 0:
                raise InputError(f"image size ({height}, {width}) gives a ({fh}, {fw}) feature map, which patches "
                                 f"of {self.patch_size} do not tile")
            return fh // self.patch_size[0], fw // self.patch_size[1]
        ph, pw = self.patch_size[0] * self.stride, self.patch_size[1] * self.stride
        if height % ph or width % pw:
            raise InputError(
                f"image size ({height}, {width}) must be divisible by the patch size ({ph}, {pw})"
            )
        return height // ph, width // pw

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise InputError(f"images must have shape (B, {self.in_chans}, H, W); got {tuple(x.shape)}")
        self.grid_for(x.shape[2], x.shape[3])
        if self.backbone is not None:
            x = self.backbone(x)
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, N, E)


class ShiftedImages(nn.Module):
    """Shifted patch tokenization's input (Lee, Lee and Song, 2021): the image and four
    copies shifted by ``shift`` pixels towards each diagonal (zeros fill the edges),
    stacked channel-wise: ``(B, C, H, W) -> (B, 5C, H, W)``. A patch embedding over them
    sees, in each patch, its neighbours' pixels too: a wider receptive field for the same
    linear projection."""

    def __init__(self, shift: int) -> None:
        super().__init__()
        if not isinstance(shift, int) or shift < 1:
            raise InputError(f"shift must be a positive number of pixels; got {shift!r}")
        self.shift = shift

    def forward(self, x: Tensor) -> Tensor:
        s = self.shift
        h, w = x.shape[-2:]
        padded = F.pad(x, (s, s, s, s))
        shifted = [padded[..., dy : dy + h, dx : dx + w] for dy, dx in ((0, 0), (0, 2 * s), (2 * s, 0), (2 * s, 2 * s))]
        return torch.cat([x, *shifted], dim=1)

    def extra_repr(self) -> str:
        return f"shift={self.shift}"
