"""Image transforms on tensors: one image ``(C, H, W)`` or a batch ``(B, C, H, W)``.

Images enter as ``uint8`` (0..255) and leave :class:`ToFloat` as ``float`` in [0, 1];
the geometric and colour transforms accept either and return the dtype they got.
Random transforms draw from torch's global generator only, so ``torch.manual_seed``
makes a pipeline reproducible; on a batch each image gets its own draw.

Presets: :func:`cifar_train_transforms`, :func:`cifar_eval_transforms`,
:func:`digits_transforms`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import InputError

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "DIGITS_MEAN",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "folder_transforms",
    "DIGITS_STD",
    "Compose",
    "ToFloat",
    "Normalize",
    "RandomCrop",
    "RandomHorizontalFlip",
    "Resize",
    "TrivialAugment",
    "cifar_train_transforms",
    "cifar_eval_transforms",
    "digits_transforms",
]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
# Over all 1,797 images of sklearn's digits scaled to [0, 1] (see load_digits_dataset).
# timm's ImageNet defaults: what pretrained checkpoints expect, and a fair guess for photos.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DIGITS_MEAN = (0.3053,)
DIGITS_STD = (0.3759,)


def _check_image(x: Tensor, who: str) -> None:
    if not isinstance(x, Tensor) or x.dim() not in (3, 4):
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise InputError(f"{who} input must be an image (C, H, W) or a batch (B, C, H, W); got {shape}")
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise InputError(f"{who} input must be uint8 or floating point; got {x.dtype}")


def _pair(size: int | Sequence[int], name: str) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(s, int) and s > 0 for s in pair):
        raise InputError(f"{name} must be a positive int or a pair (height, width); got {size!r}")
    return pair  # type: ignore[return-value]


class Compose:
    """Apply ``transforms`` in order."""

    def __init__(self, transforms: Sequence[Callable[[Tensor], Tensor]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Tensor) -> Tensor:
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self) -> str:
        inner = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose([{inner}\n])" if inner else "Compose([])"


class ToFloat:
    """``uint8`` 0..255 -> ``dtype`` in [0, 1]. Floating input passes through unchanged."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        if not dtype.is_floating_point:
            raise InputError(f"dtype must be a floating dtype; got {dtype}")
        self.dtype = dtype

    def __call__(self, x: Tensor) -> Tensor:
        _check_image(x, "ToFloat")
        if x.is_floating_point():
            return x
        return x.to(self.dtype).div_(255.0)

    def __repr__(self) -> str:
        return f"ToFloat(dtype={self.dtype})"


class Normalize:
    """``(x - mean) / std`` per channel, on floating images (put :class:`ToFloat` first)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if len(mean) != len(std) or not mean:
            raise InputError(f"mean and std must have one value per channel each; got {len(mean)} and {len(std)}")
        if any(s <= 0 for s in std):
            raise InputError(f"std must be positive; got {std}")
        self.mean, self.std = mean, std

    def __call__(self, x: Tensor) -> Tensor:
        _check_image(x, "Normalize")
        if not x.is_floating_point():
            raise InputError(f"Normalize input must be floating point (put ToFloat() first); got {x.dtype}")
        channels = x.shape[-3]
        if len(self.mean) not in (1, channels):
            raise InputError(f"Normalize input must have {len(self.mean)} channels; got shape {tuple(x.shape)}")
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        return (x - mean) / std

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


class RandomCrop:
    """Pad every side by ``padding``, then cut a random ``size`` window.

    ``padding_mode``: ``"constant"`` (pads with ``fill``, in the image's own units)
    or ``"reflect"`` (mirrors the border; needs ``padding`` < the image side).
    """

    def __init__(
        self, size: int | Sequence[int], padding: int = 4, padding_mode: str = "constant", fill: float = 0
    ) -> None:
        self.size = _pair(size, "size")
        if not isinstance(padding, int) or padding < 0:
            raise InputError(f"padding must be an int >= 0; got {padding!r}")
        if padding_mode not in ("constant", "reflect"):
            raise InputError(f"padding_mode must be 'constant' or 'reflect'; got {padding_mode!r}")
        self.padding, self.padding_mode, self.fill = padding, padding_mode, fill

    def __call__(self, x: Tensor) -> Tensor:
        _check_image(x, "RandomCrop")
        single = x.dim() == 3
        xb = x.unsqueeze(0) if single else x
        p = self.padding
        if p:
            if self.padding_mode == "reflect":
                if p >= min(xb.shape[-2:]):
                    raise InputError(
                        f"padding must be smaller than the image side for reflect padding; "
                        f"got {p} for shape {tuple(x.shape)}"
                    )
                xb = F.pad(xb, (p, p, p, p), mode="reflect")
            else:
                xb = F.pad(xb, (p, p, p, p), mode="constant", value=self.fill)
        b, c, hp, wp = xb.shape
        h, w = self.size
        if h > hp or w > wp:
            raise InputError(f"size must fit the padded image {hp}x{wp}; got {h}x{w}")
        top = torch.randint(0, hp - h + 1, (b,))
        left = torch.randint(0, wp - w + 1, (b,))
        rows = (top[:, None] + torch.arange(h)).to(x.device)  # (B, h)
        cols = (left[:, None] + torch.arange(w)).to(x.device)  # (B, w)
        batch = torch.arange(b, device=x.device)[:, None, None, None]
        chans = torch.arange(c, device=x.device)[None, :, None, None]
        out = xb[batch, chans, rows[:, None, :, None], cols[:, None, None, :]]
        return out[0] if single else out

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, padding={self.padding}, padding_mode={self.padding_mode!r})"


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p`` (per image on a batch)."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise InputError(f"p must be in [0, 1]; got {p!r}")
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        _check_image(x, "RandomHorizontalFlip")
        if x.dim() == 3:
            return x.flip(-1) if float(torch.rand(())) < self.p else x
        flip = (torch.rand(x.shape[0]) < self.p).to(x.device).view(-1, 1, 1, 1)
        return torch.where(flip, x.flip(-1), x)

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Resize:
    """Bilinear resize. ``size`` int: the shorter side becomes ``size``, keeping the
    aspect ratio; ``(height, width)``: exactly that. ``uint8`` stays ``uint8`` (rounded)."""

    def __init__(self, size: int | Sequence[int], antialias: bool = True) -> None:
        self.size = size if isinstance(size, int) else _pair(size, "size")
        if isinstance(size, int) and size <= 0:
            raise InputError(f"size must be a positive int or a pair (height, width); got {size!r}")
        self.antialias = antialias

    def _target(self, h: int, w: int) -> tuple[int, int]:
        if not isinstance(self.size, int):
            return self.size
        if h <= w:
            return self.size, max(1, round(w * self.size / h))
        return max(1, round(h * self.size / w)), self.size

    def __call__(self, x: Tensor) -> Tensor:
        _check_image(x, "Resize")
        size = self._target(*x.shape[-2:])
        if size == tuple(x.shape[-2:]):
            return x
        xb = x.unsqueeze(0) if x.dim() == 3 else x
        y = F.interpolate(
            xb if xb.is_floating_point() else xb.float(),
            size=size, mode="bilinear", align_corners=False, antialias=self.antialias,
        )
        if not x.is_floating_point():
            y = y.round_().clamp_(0, 255).to(x.dtype)
        return y[0] if x.dim() == 3 else y

    def __repr__(self) -> str:
        return f"Resize(size={self.size}, antialias={self.antialias})"


# ---------------------------------------------------------------------------- TrivialAugment
# Each op takes one float image (C, H, W) in [0, 1] and a signed magnitude in the
# op's own units, and returns an image in [0, 1].


def _blend(image: Tensor, degenerate: Tensor, factor: float) -> Tensor:
    """factor 1 -> image, 0 -> degenerate; beyond 1 extrapolates (PIL's ImageEnhance)."""
    return (degenerate + factor * (image - degenerate)).clamp_(0.0, 1.0)


def _grey(x: Tensor) -> Tensor:
    if x.shape[0] != 3:
        return x
    return (0.299 * x[0] + 0.587 * x[1] + 0.114 * x[2]).unsqueeze(0)  # ITU-R 601 luma, as PIL


def _identity(x: Tensor, v: float) -> Tensor:
    return x


def _brightness(x: Tensor, v: float) -> Tensor:
    return _blend(x, torch.zeros_like(x), 1.0 + v)


def _contrast(x: Tensor, v: float) -> Tensor:
    return _blend(x, _grey(x).mean().expand_as(x), 1.0 + v)


def _color(x: Tensor, v: float) -> Tensor:
    return _blend(x, _grey(x).expand_as(x), 1.0 + v) if x.shape[0] == 3 else x


def _sharpness(x: Tensor, v: float) -> Tensor:
    c, h, w = x.shape
    if h < 3 or w < 3:
        return x
    kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]], dtype=x.dtype, device=x.device) / 13.0
    smooth = F.conv2d(x.unsqueeze(1), kernel.view(1, 1, 3, 3)).squeeze(1)  # (C, H-2, W-2)
    degenerate = x.clone()
    degenerate[:, 1:-1, 1:-1] = smooth  # PIL leaves the border alone
    return _blend(x, degenerate, 1.0 + v)


def _as_levels(x: Tensor) -> Tensor:
    return (x * 255.0).round_().to(torch.int64)


def _posterize(x: Tensor, v: float) -> Tensor:
    bits = 8 - int(round(v))
    mask = (0xFF << (8 - bits)) & 0xFF
    return (_as_levels(x) & mask).to(x.dtype) / 255.0


def _solarize(x: Tensor, v: float) -> Tensor:
    threshold = 256.0 - v  # v = 0: nothing inverted; v = 256: everything
    return torch.where(_as_levels(x) >= threshold, 1.0 - x, x)


def _autocontrast(x: Tensor, v: float) -> Tensor:
    lo = x.amin(dim=(-2, -1), keepdim=True)
    hi = x.amax(dim=(-2, -1), keepdim=True)
    flat = hi <= lo
    scale = torch.where(flat, torch.ones_like(hi), hi - lo)
    return torch.where(flat, x, (x - lo) / scale).clamp_(0.0, 1.0)


def _equalize(x: Tensor, v: float) -> Tensor:
    # PIL's ImageOps.equalize, per channel: a lookup table from the cumulative histogram.
    levels = _as_levels(x)
    out = []
    for ch in levels:
        hist = torch.bincount(ch.flatten(), minlength=256)
        nonzero = hist[hist > 0]
        step = (int(hist.sum()) - int(nonzero[-1])) // 255
        if step == 0:
            out.append(ch)
            continue
        lut = ((torch.cumsum(hist, 0) - hist + step // 2) // step).clamp_(0, 255)
        out.append(lut[ch])
    return torch.stack(out).to(x.dtype) / 255.0


def _affine(x: Tensor, matrix: Sequence[float], offset: Sequence[float], fill: float, mode: str) -> Tensor:
    """Sample ``x`` at ``matrix @ p + offset`` for each output pixel ``p``, both in pixels
    from the image centre (x right, y down). Outside the image: ``fill``."""
    c, h, w = x.shape
    a, b, cc, d = matrix
    # Pixels -> affine_grid's [-1, 1] coordinates (align_corners=False): x_px = x_n * W / 2.
    theta = torch.tensor(
        [[a, b * h / w, 2.0 * offset[0] / w], [cc * w / h, d, 2.0 * offset[1] / h]], dtype=x.dtype, device=x.device
    )
    grid = F.affine_grid(theta.unsqueeze(0), [1, c + 1, h, w], align_corners=False)
    # An extra channel of ones tells how much of each output pixel came from inside the image.
    src = torch.cat([x, torch.ones_like(x[:1])]).unsqueeze(0)
    out = F.grid_sample(src, grid, mode=mode, padding_mode="zeros", align_corners=False)[0]
    inside = out[-1:]
    return (out[:-1] + (1.0 - inside) * fill).clamp_(0.0, 1.0)


def _rotate(x: Tensor, v: float, fill: float, mode: str) -> Tensor:
    # Positive v turns the picture counter-clockwise on screen (y points down).
    t = math.radians(v)
    return _affine(x, (math.cos(t), -math.sin(t), math.sin(t), math.cos(t)), (0.0, 0.0), fill, mode)


def _shear_x(x: Tensor, v: float, fill: float, mode: str) -> Tensor:
    return _affine(x, (1.0, v, 0.0, 1.0), (0.0, 0.0), fill, mode)


def _shear_y(x: Tensor, v: float, fill: float, mode: str) -> Tensor:
    return _affine(x, (1.0, 0.0, v, 1.0), (0.0, 0.0), fill, mode)


def _translate_x(x: Tensor, v: float, fill: float, mode: str) -> Tensor:
    return _affine(x, (1.0, 0.0, 0.0, 1.0), (-v, 0.0), fill, mode)  # content moves right by v


def _translate_y(x: Tensor, v: float, fill: float, mode: str) -> Tensor:
    return _affine(x, (1.0, 0.0, 0.0, 1.0), (0.0, -v), fill, mode)  # content moves down by v


_COLOR_OPS: dict[str, tuple[Callable[[Tensor, float], Tensor], float, bool]] = {
    # name: (op, largest magnitude, random sign); the "wide" ranges of Müller & Hutter (2021).
    "identity": (_identity, 0.0, False),
    "brightness": (_brightness, 0.99, True),
    "color": (_color, 0.99, True),
    "contrast": (_contrast, 0.99, True),
    "sharpness": (_sharpness, 0.99, True),
    "posterize": (_posterize, 6.0, False),  # keep 8 .. 2 bits
    "solarize": (_solarize, 256.0, False),  # threshold 256 .. 0 (uint8 levels)
    "autocontrast": (_autocontrast, 0.0, False),
    "equalize": (_equalize, 0.0, False),
}
_GEOMETRIC_OPS: dict[str, tuple[Callable[[Tensor, float, float, str], Tensor], float | None, bool]] = {
    "rotate": (_rotate, 135.0, True),  # degrees
    "shear_x": (_shear_x, 0.99, True),
    "shear_y": (_shear_y, 0.99, True),
    "translate_x": (_translate_x, None, True),  # pixels, TrivialAugment.max_translate
    "translate_y": (_translate_y, None, True),
}


class TrivialAugment:
    """TrivialAugment (Müller & Hutter, 2021): per image, one op chosen uniformly from
    ``ops`` at a magnitude chosen uniformly from ``num_magnitude_bins`` levels, with a
    random sign for the signed ops.

    Ops and largest magnitudes (the paper's "wide" space): identity; brightness,
    color (saturation), contrast, sharpness (factor 1 ± 0.99); posterize (8 down to 2
    bits); solarize (threshold 256 down to 0); autocontrast; equalize; rotate (±135°);
    shear_x / shear_y (±0.99); translate_x / translate_y (± ``max_translate`` pixels).

    Input: ``uint8`` or float in [0, 1] (apply before :class:`Normalize`), one image
    ``(C, H, W)`` or a batch ``(B, C, H, W)``; output has the same shape and dtype.
    Pixels uncovered by rotate/shear/translate get ``fill`` (0 = black, 1 = white).
    """

    OPS = tuple(_COLOR_OPS) + tuple(_GEOMETRIC_OPS)

    def __init__(
        self,
        num_magnitude_bins: int = 31,
        ops: Sequence[str] | None = None,
        max_translate: float = 32.0,
        fill: float = 0.0,
        interpolation: str = "nearest",
    ) -> None:
        if not isinstance(num_magnitude_bins, int) or num_magnitude_bins < 2:
            raise InputError(f"num_magnitude_bins must be an int >= 2; got {num_magnitude_bins!r}")
        ops = tuple(self.OPS if ops is None else ops)
        unknown = [o for o in ops if o not in self.OPS]
        if unknown or not ops:
            raise InputError(f"ops must be a non-empty list drawn from {list(self.OPS)}; got {list(ops)}")
        if not 0.0 <= fill <= 1.0:
            raise InputError(f"fill must be in [0, 1] (0 = black, 1 = white); got {fill!r}")
        if interpolation not in ("nearest", "bilinear"):
            raise InputError(f"interpolation must be 'nearest' or 'bilinear'; got {interpolation!r}")
        self.num_magnitude_bins, self.ops = num_magnitude_bins, ops
        self.max_translate, self.fill, self.interpolation = float(max_translate), float(fill), interpolation

    def apply(self, x: Tensor, op: str, magnitude: float) -> Tensor:
        """Apply ``op`` to one float image ``(C, H, W)`` in [0, 1] at a signed ``magnitude``
        in the op's own units (degrees, pixels, factor - 1, bits removed, levels)."""
        if op in _COLOR_OPS:
            return _COLOR_OPS[op][0](x, magnitude)
        if op in _GEOMETRIC_OPS:
            return _GEOMETRIC_OPS[op][0](x, magnitude, self.fill, self.interpolation)
        raise InputError(f"op must be one of {list(self.OPS)}; got {op!r}")

    def _sample(self) -> tuple[str, float]:
        op = self.ops[int(torch.randint(len(self.ops), ()))]
        _, largest, signed = _COLOR_OPS[op] if op in _COLOR_OPS else _GEOMETRIC_OPS[op]
        largest = self.max_translate if largest is None else largest
        level = int(torch.randint(self.num_magnitude_bins, ()))
        magnitude = largest * level / (self.num_magnitude_bins - 1)
        if signed and float(torch.rand(())) < 0.5:
            magnitude = -magnitude
        return op, magnitude

    def _one(self, x: Tensor) -> Tensor:
        op, magnitude = self._sample()
        if op == "identity":
            return x
        unit = x.float() / 255.0 if x.dtype == torch.uint8 else x
        out = self.apply(unit, op, magnitude)
        if x.dtype == torch.uint8:
            return (out * 255.0).round_().clamp_(0, 255).to(torch.uint8)
        return out.to(x.dtype)

    def __call__(self, x: Tensor) -> Tensor:
        _check_image(x, "TrivialAugment")
        if x.is_floating_point() and x.numel() and (float(x.min()) < 0.0 or float(x.max()) > 1.0):
            raise InputError(
                "TrivialAugment input must be uint8 or floating point in [0, 1] (apply it before Normalize); "
                f"got values in [{float(x.min()):.3g}, {float(x.max()):.3g}]"
            )
        if x.dim() == 3:
            return self._one(x)
        return torch.stack([self._one(im) for im in x]) if len(x) else x

    def __repr__(self) -> str:
        return (
            f"TrivialAugment(num_magnitude_bins={self.num_magnitude_bins}, ops={list(self.ops)}, "
            f"max_translate={self.max_translate}, fill={self.fill}, interpolation={self.interpolation!r})"
        )


# ---------------------------------------------------------------------------- presets


def cifar_train_transforms(strong: bool = False, padding: int = 4) -> Compose:
    """Random crop (pad ``padding``; 0: none) + horizontal flip [+ TrivialAugment when
    ``strong``], then ``uint8`` -> float and CIFAR-10 normalization. Input: ``uint8`` ``(3, 32, 32)``."""
    steps: list[Callable[[Tensor], Tensor]] = [RandomCrop(32, padding=padding)] if padding else []
    steps.append(RandomHorizontalFlip())
    if strong:
        steps.append(TrivialAugment())
    return Compose(steps + [ToFloat(), Normalize(CIFAR10_MEAN, CIFAR10_STD)])


def cifar_eval_transforms() -> Compose:
    """``uint8`` -> float and CIFAR-10 normalization."""
    return Compose([ToFloat(), Normalize(CIFAR10_MEAN, CIFAR10_STD)])


def digits_transforms(train: bool, padding: int = 1) -> Compose:
    """Digits ``(1, 8, 8)``: a random shift of up to ``padding`` pixels when ``train`` (no
    flips: a mirrored digit is another glyph), then float and normalization."""
    steps: list[Callable[[Tensor], Tensor]] = [RandomCrop(8, padding=padding)] if train and padding else []
    return Compose(steps + [ToFloat(), Normalize(DIGITS_MEAN, DIGITS_STD)])


def folder_transforms(size: int, mode: str, train: bool, padding: int | None = None) -> Compose:
    """Images of a folder, already ``uint8`` ``(C, size, size)``: a random crop (padded by
    ``padding``, default an eighth of the side; 0: no crop) and horizontal flip when
    ``train``, then float and ImageNet's normalization (RGB; a grey image: mean 0.5, std 0.5)."""
    steps: list[Callable[[Tensor], Tensor]] = []
    padding = max(1, size // 8) if padding is None else padding
    if train:
        steps += [RandomCrop(size, padding=padding)] if padding else []
        steps.append(RandomHorizontalFlip())
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if mode == "RGB" else ((0.5,), (0.5,))
    return Compose(steps + [ToFloat(), Normalize(mean, std)])
