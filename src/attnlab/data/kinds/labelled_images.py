"""Labelled images, the data of image classification: the keys every image source has,
how a model of the data reads one image (:class:`ImageSpec`), the per-split transform
(:class:`TransformedImages`), and the built-in sets ``digits`` and ``cifar10``.

An image source (:class:`ImageSource`) gives :class:`~attnlab.data.source.Splits` of
:class:`TransformedImages`: ``(float image, int label)`` through the split's transform,
the training part augmented when ``data.augment``; the validation part is held out of the
training images (``data.val_size``, stratified with ``data.seed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional

import torch
from PIL import Image
from torch import Tensor

from ...errors import InputError
from ..readers.cifar import CIFAR10, CIFAR10_CLASSES
from ..readers.image_sets import ImageFolder, load_digits_dataset
from ..readers.image_decode import decode_image, decompression_bomb_sizes
from ..readers.image_scan import scan_images
from ..source import Source, SourceConfig, Splits, register_source
from ..splits import cap_per_class, stratified_split
from ..transforms.images import cifar_eval_transforms, cifar_train_transforms, digits_transforms

__all__ = ["ImageSourceConfig", "ImageSpec", "TransformedImages", "ImageSource", "Digits", "Cifar10", "read_image",
           "labelled_folder"]


@dataclass
class ImageSourceConfig(SourceConfig):
    """The ``data`` keys of every image source."""

    kind: ClassVar[str] = "images"
    changeable: ClassVar[tuple[str, ...]] = ("data_dir", "augment", "crop_padding")

    name: str = "digits"
    augment: bool = False  # random crop and flip (CIFAR-10, folder), a 1-pixel shift (digits)
    # with augment: the random crop's padding in pixels (0: flips only; digits: the shift);
    # null: the data set's default (CIFAR-10 4, digits 1, a folder an eighth of img_size)
    crop_padding: Optional[int] = field(default=None, metadata={"min": 0})
    # Training images held out for validation (model selection): a count, or a fraction below 1; 0: none.
    val_size: float = field(default=0.1, metadata={"min": 0.0})
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the validation (and test) split
    # at most this many training images per class (after the validation split), drawn with seed
    # (small-data studies, quick runs); 0: all
    max_per_class: int = field(default=0, metadata={"min": 0})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_held_out(("val_size",), "images")
        if self.crop_padding is not None and not self.augment:
            raise InputError(f"data.crop_padding applies with data.augment=true; got crop_padding={self.crop_padding} "
                             f"and augment=false")


@dataclass
class ImageSpec:
    """What an image model takes: files are read in ``mode`` (``"L"`` or ``"RGB"``),
    resized to ``size`` ``(H, W)`` (``resize``: ``"squash"`` both sides, or ``"crop"``: the
    shorter side, then the centre) and passed through ``transform`` (``uint8``
    ``(B, C, H, W)`` -> the model's float input)."""

    mode: str
    size: tuple[int, int]
    transform: Callable[[Tensor], Tensor]
    resize: str = "squash"


class TransformedImages:
    """Images of ``ds`` (those at ``indices``, default all) through ``transform``;
    ``(image, int label)``. ``get_batch`` transforms a whole batch at once (the transforms
    are batched), several times cheaper than one image at a time."""

    def __init__(self, ds: Any, transform: Callable, indices: Tensor | None = None) -> None:
        self.ds, self.transform = ds, transform
        self.indices = torch.arange(len(ds)) if indices is None else torch.as_tensor(indices, dtype=torch.long)

    def get_batch(self, indices: list[int]) -> tuple[Tensor, Tensor]:
        index = self.indices[torch.as_tensor(indices, dtype=torch.long)]
        if isinstance(self.ds.images, Tensor):
            return self.transform(self.ds.images[index]), self.ds.targets[index]
        # decoded now (a streamed folder: every image has the folder's size), transformed as a batch
        images, labels = zip(*(self.ds[int(i)] for i in index))
        return self.transform(torch.stack(images)), torch.as_tensor(labels)

    def image(self, i: int) -> Tensor:
        """The ``uint8`` image of sample ``i``, untransformed (as a person sees it)."""
        k = int(self.indices[i])
        return self.ds.images[k] if self.ds.images is not None else self.ds[k][0]

    @property
    def streamed(self) -> bool:
        """Whether images are decoded at each use rather than held in memory."""
        return self.ds.images is None

    @property
    def targets(self) -> Tensor:
        return self.ds.targets[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        x, y = self.ds[int(self.indices[i])]
        return self.transform(x), int(y)


class ImageSource(Source):
    """A source of labelled images: :meth:`load` gives :class:`TransformedImages` splits
    with their ``classes``."""

    kind = "images"
    config_class = ImageSourceConfig

    def image_spec(self, config: Any) -> ImageSpec:
        """How a model trained on ``config``'s images reads a new one (``predict``)."""
        raise NotImplementedError

    def model_facts(self, config: Any) -> dict[str, Any]:
        """What a model needs to know of the images beyond the classes (``img_size``,
        ``in_chans``), for the models whose configuration has such keys; the built-in sets
        have models of their own size and give none."""
        return {}


class _BuiltIn(ImageSource):
    """A fixed set with a train and a test part: the validation part is held out of train."""

    classes: ClassVar[tuple[str, ...]]
    spec: ClassVar[tuple[str, tuple[int, int]]]  # mode, size

    def read(self, config: Any, split: str) -> Any:
        raise NotImplementedError

    def train_transform(self, config: Any, padding: dict[str, int]) -> Callable:
        raise NotImplementedError

    def eval_transform(self) -> Callable:
        raise NotImplementedError

    def load(self, config: Any) -> Splits[TransformedImages]:
        train = self.read(config, "train")
        train_idx, val_idx = stratified_split(train.targets, config.val_size, config.seed)
        train_idx = cap_per_class(train_idx, train.targets, config.max_per_class, config.seed)
        padding = {} if config.crop_padding is None else {"padding": config.crop_padding}  # else the preset's default
        val = None if val_idx is None else TransformedImages(train, self.eval_transform(), val_idx)
        return Splits(TransformedImages(train, self.train_transform(config, padding), train_idx), val,
                      self.load_test(config), list(self.classes))

    def load_test(self, config: Any) -> TransformedImages:
        return TransformedImages(self.read(config, "test"), self.eval_transform())

    def known_classes(self, config: Any) -> list[str]:
        return list(self.classes)

    def image_spec(self, config: Any) -> ImageSpec:
        mode, size = self.spec
        return ImageSpec(mode, size, self.eval_transform(), "squash")


@register_source
class Digits(_BuiltIn):
    name = "digits"
    summary = "scikit-learn's 1,437 training and 360 test 8x8 grey digits (no download)"
    classes = tuple(str(d) for d in range(10))
    spec = ("L", (8, 8))

    def read(self, config: Any, split: str) -> Any:
        return load_digits_dataset(split)

    def train_transform(self, config: Any, padding: dict[str, int]) -> Callable:
        return digits_transforms(config.augment, **padding)

    def eval_transform(self) -> Callable:
        return digits_transforms(train=False)


@register_source
class Cifar10(_BuiltIn):
    name = "cifar10"
    summary = "CIFAR-10: 50,000 training and 10,000 test 32x32 colour images, 10 classes"
    classes = CIFAR10_CLASSES
    spec = ("RGB", (32, 32))

    def read(self, config: Any, split: str) -> Any:
        return CIFAR10(config.data_dir, split)

    def train_transform(self, config: Any, padding: dict[str, int]) -> Callable:
        return cifar_train_transforms(**padding) if config.augment else cifar_eval_transforms()

    def eval_transform(self) -> Callable:
        return cifar_eval_transforms()

    def describe(self, config: Any) -> str:
        return "CIFAR-10"


def labelled_folder(path: str | Path, spec: ImageSpec, classes: list[str]) -> TransformedImages:
    """A labelled folder of one's own (``path/<class>/<image>``) as a run with ``classes``
    reads it, for ``attnlab eval --data``: class folders the run does not know are an error."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise InputError(f"--data must be a folder of class folders (PATH/<class>/<image>); {path} is "
                         f"{'a file' if path.exists() else 'missing'}")
    found = scan_images(path, None, missing_ok=True)[2]
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise InputError(f"{path} has class folders the run was not trained on: {', '.join(unknown)}; "
                         f"its classes are {', '.join(classes)}")
    folder = ImageFolder(path, classes=classes, on_error="skip", mode=spec.mode, size=spec.size[0],
                         resize=spec.resize, missing_ok=True)
    return TransformedImages(folder, spec.transform)


def read_image(image: Any, mode: str, size: tuple[int, int], resize: str = "squash") -> Tensor:
    """An image (a file path, a PIL image, or a ``uint8`` tensor ``(C, H, W)``) as the
    ``uint8`` ``(C, H, W)`` a model of this data expects: converted to ``mode`` and resized
    to ``size`` (``resize``: ``"squash"`` or ``"crop"``, as the run was trained)."""
    if isinstance(image, Tensor):
        if image.dim() != 3 or image.dtype != torch.uint8 or image.shape[0] not in (1, 3):
            raise InputError(f"an image tensor must be uint8 (C, H, W) with 1 or 3 channels; got {image.dtype} "
                             f"{tuple(image.shape)}")
        array = image.permute(1, 2, 0).numpy()
        image = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
    if size[0] != size[1]:
        raise InputError(f"size must be square (H == W); got {size}")
    if isinstance(image, Image.Image):
        return torch.from_numpy(decode_image(image, mode, size[0], resize))
    if not isinstance(image, (str, Path)):
        raise InputError(f"an image must be a file path, a PIL image or a uint8 tensor (C, H, W); "
                         f"got {type(image).__name__}")
    path = image
    try:
        with Image.open(path) as im:
            array = decode_image(im, mode, size[0], resize)
    except FileNotFoundError:
        raise InputError(f"FILE {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"FILE {str(path)!r} is a folder, not an image file") from None
    except Image.DecompressionBombError as exc:  # not an OSError
        pixels, limit = decompression_bomb_sizes(exc)
        raise InputError(
            f"FILE {str(path)!r} is too large to read safely: {pixels} pixels, more than Pillow's limit of "
            f"{limit} pixels (a guard against decompression bombs); downscale it (the model reads it at "
            f"{size[0]}x{size[1]}) and try again"
        ) from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"FILE {str(path)!r} is not a readable image ({exc})") from None
    return torch.from_numpy(array)
