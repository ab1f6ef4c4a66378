"""The source ``folder``: a folder of one's own images, one sub-folder per class.

``data.root`` is laid out as ``root/<class>/<image>`` (classes from the folder names), or
as ``root/train/<class>/...`` with optional sibling ``val/`` and ``test/``. Without a
``test/`` folder, ``data.test_size`` of the images are held out for the test; without a
``val/`` folder, ``data.val_size`` of the rest for validation (both stratified by class
with ``data.seed``). Every image, of any size and mode (grey, RGB, RGBA, palette, 16-bit,
EXIF-rotated JPEG) is read as ``data.mode`` and resized to ``data.img_size``
(``data.resize``: ``crop`` the centre square or ``squash``). Files that are not images or
cannot be read are skipped, with one line that counts them. A data set whose decoded
images fit ``data.cache_mb`` is decoded once and kept in memory; a larger one streams
from disk, decoded by ``train.workers`` DataLoader processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from ...errors import InputError
from ..readers.image_sets import ImageFolder
from ..readers.image_scan import scan_images
from ..kinds.labelled_images import ImageSource, ImageSourceConfig, ImageSpec, TransformedImages
from ..source import Splits, register_source
from ..splits import cap_per_class, stratified_split
from ..transforms.images import folder_transforms

__all__ = ["FolderConfig", "Folder"]


@dataclass
class FolderConfig(ImageSourceConfig):
    changeable: ClassVar[tuple[str, ...]] = ImageSourceConfig.changeable + ("cache", "cache_mb")

    name: str = "folder"
    # root/<class>/<image>, or root/train/<class>/<image> with optional root/val/ and root/test/
    root: str | None = None
    # without a test/ folder: images held out for the test, a count or a fraction below 1
    test_size: float = field(default=0.1, metadata={"min": 0.0})
    img_size: int = field(default=32, metadata={"min": 1})  # images are resized to img_size x img_size
    mode: Literal["RGB", "L"] = "RGB"  # colour (RGB) or grey (L)
    # "crop": the shorter side to img_size, then the centre square; "squash": both sides
    resize: Literal["crop", "squash"] = "crop"
    classes: list = field(default_factory=list)  # class folders to use, in label order; []: all
    # "memory" decodes every image once and keeps it; "stream" decodes at each use (DataLoader
    # workers: train.workers); "auto" keeps them in memory when the decoded images fit cache_mb.
    cache: Literal["auto", "memory", "stream"] = "auto"
    cache_mb: float = field(default=2048.0, metadata={"min": 0.0})

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_held_out(("test_size",), "images")
        if any(not isinstance(c, str) or not c for c in self.classes) or len(set(self.classes)) != len(self.classes):
            raise InputError(f"data.classes must be distinct class folder names; got {self.classes!r}")


def _layout(root: Path) -> dict[str, Path]:
    """``{"train": ..., "val": ..., "test": ...}`` folders of ``root`` (sibling layout: a
    ``train/`` folder exists), or ``{"train": root}``."""
    if not root.exists():
        raise InputError(f"data.root must be an existing folder of images; {root} does not exist")
    if not root.is_dir():
        raise InputError(f"data.root must be a folder (root/<class>/<image>); {root} is a file")
    if (root / "train").is_dir():
        return {name: root / name for name in ("train", "val", "test") if (root / name).is_dir()}
    return {"train": root}


def _check_classes(classes: list[str], root: Path) -> None:
    if len(classes) < 2:
        found = f"only {classes[0]!r}" if classes else "none"
        raise InputError(f"data.root must hold at least 2 class folders (root/<class>/<image>) for a classifier; "
                         f"{root} has {found}")


@register_source
class Folder(ImageSource):
    name = "folder"
    config_class = FolderConfig
    summary = "a folder of one's own images: data.root/<class>/<image>, or with train/ val/ test/ folders"

    def check(self, config: FolderConfig) -> None:
        if not config.root:
            raise InputError("data.root must name the image folder when data.name is 'folder' "
                             "(for example data.root=photos/, holding photos/<class>/<image>)")
        _layout(Path(config.root).expanduser())

    def load(self, config: FolderConfig, *, lazy: bool = False) -> Splits[TransformedImages]:
        """The splits of the folder (each :class:`TransformedImages` with its transform;
        train's augments when ``data.augment``). ``lazy``: decode nothing now, each image
        when it is read (for the test part alone: the same pixels as the cache, without
        decoding the whole folder first)."""
        self.check(config)
        root = Path(config.root).expanduser()
        layout = _layout(root)
        paths = {"train": scan_images(layout["train"], list(config.classes) or None)}
        classes = paths["train"][0]
        _check_classes(classes, layout["train"])
        for name in ("val", "test"):
            if name in layout:
                paths[name] = scan_images(layout[name], classes, missing_ok=True)
        for name in ("val", "test"):
            if name in paths and not config.classes:  # (data.classes picks classes: other folders are left out)
                extra = sorted(set(paths[name][2]) - set(classes))
                if extra:
                    raise InputError(f"{layout[name]} has class folders that {layout['train']} lacks: "
                                     f"{', '.join(extra)}; a model cannot learn a class it never saw")
        count = sum(len(p[1]) for p in paths.values())
        channels = 3 if config.mode == "RGB" else 1
        decoded_mb = count * channels * config.img_size**2 / 2**20
        cache = not lazy and (config.cache == "memory" or (config.cache == "auto" and decoded_mb <= config.cache_mb))
        sets = {name: ImageFolder(folder, classes=classes, on_error="skip", cache=cache, mode=config.mode,
                                  size=config.img_size, resize=config.resize, missing_ok=name != "train")
                for name, folder in layout.items()}
        plain = folder_transforms(config.img_size, config.mode, False)
        train_all = sets["train"]
        pool = torch.arange(len(train_all))
        if "test" in sets:
            test = TransformedImages(sets["test"], plain)
        else:
            keep, held = stratified_split(train_all.targets, config.test_size, config.seed, "data.test_size")
            if held is None:
                raise InputError(f"data.test_size must be above 0 when {root} has no test/ folder")
            pool = keep
            test = TransformedImages(train_all, plain, held)
        if "val" in sets:
            val = TransformedImages(sets["val"], plain)
        else:
            keep, held = stratified_split(train_all.targets[pool], config.val_size, config.seed)
            val = None if held is None else TransformedImages(train_all, plain, pool[held])
            pool = pool[keep]
        pool = cap_per_class(pool, train_all.targets, config.max_per_class, config.seed)
        train = TransformedImages(train_all, folder_transforms(config.img_size, config.mode, config.augment,
                                                               config.crop_padding), pool)
        return Splits(train, val, test, classes, [self._note(config, classes, train, val, test)])

    def load_test(self, config: FolderConfig) -> TransformedImages:
        return self.load(config, lazy=True).test

    @staticmethod
    def _note(config: FolderConfig, classes: list[str], train: TransformedImages, val: TransformedImages | None,
              test: TransformedImages) -> str:
        counts = torch.bincount(train.targets, minlength=len(classes)).tolist()
        shown = ", ".join(f"{c} {n}" for c, n in list(zip(classes, counts))[:8]) + (" ..." if len(classes) > 8 else "")
        return (f"data: {len(classes)} classes, {len(train)} training ({shown}), {len(val) if val else 0} validation, "
                f"{len(test)} test images, {config.mode} {config.img_size}x{config.img_size}, "
                + ("streamed from disk (decoded by train.workers DataLoader processes)" if train.streamed
                   else "decoded once, in memory"))

    def image_spec(self, config: FolderConfig) -> ImageSpec:
        return ImageSpec(config.mode, (config.img_size, config.img_size),
                         folder_transforms(config.img_size, config.mode, False), config.resize)

    def model_facts(self, config: FolderConfig) -> dict[str, Any]:
        return {"img_size": config.img_size, "in_chans": 3 if config.mode == "RGB" else 1}

    def describe(self, config: FolderConfig) -> str:
        return Path(config.root or "").name or "folder"
