"""Image classification: digits, CIFAR-10 or a folder of one's own images; a validation
split for model selection, the test set evaluated once at the end.

Data (``data.name``):

* ``digits``: scikit-learn's 1,437 training and 360 test 8x8 grey images.
* ``cifar10``: the image folders or the pickled batches of the data directory.
* ``folder``: ``data.root`` laid out as ``root/<class>/<image>`` (classes from the folder
  names), or as ``root/train/<class>/...`` with optional sibling ``val/`` and ``test/``.
  Without a ``test/`` folder, ``data.test_size`` of the images are held out for the test;
  without a ``val/`` folder, ``data.val_size`` of the rest for validation (both stratified
  by class with ``data.seed``). Every image, of any size and mode (grey, RGB, RGBA,
  palette, 16-bit, EXIF-rotated JPEG) is read as ``data.mode`` and resized to
  ``data.img_size`` (``data.resize``: ``crop`` the centre square or ``squash``). Files that
  are not images or cannot be read are skipped, with one line that counts them. A data set
  whose decoded images fit ``data.cache_mb`` is decoded once and kept in memory; a larger
  one streams from disk, decoded by ``train.workers`` DataLoader processes.

The validation split picks ``checkpoints/best``; ``data.val_size: 0`` keeps none, and then
the final weights are tested.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

import torch
from PIL import Image
from torch import Tensor, nn

from ..data import load_digits_dataset
from ..data.images import CIFAR10, CIFAR10_CLASSES, ImageFolder, decode_image, decompression_bomb_sizes, scan_images
from ..data.transforms import cifar_eval_transforms, cifar_train_transforms, digits_transforms, folder_transforms
from ..engine import distributed
from ..engine.device import autocast, select_device
from ..engine.trainer import evaluate_model
from ..errors import InputError
from ..io import atomic_write_bytes, read_json_mapping
from ..models.registry import config_class
from ..models.maps import TokenGridMaps, attention_maps_adapter, families_with_maps
from .base import DataConfig, ImageSpec, ModelConfig, Recipe, Task, TrainedRun, register_task
from .splits import cap_per_class, stratified_split
from .runs import checkpoint_label, fit_run, load_run, load_weights, open_run, test_run, write_results
from .views import ClassifierPredictions, ImageAttention, LabelPrediction, PixelAttention

__all__ = ["ImageDataConfig", "ImageClassificationRecipe", "ImageClassification", "read_image", "build_data",
           "image_folder_splits"]

CLASSES_FILE = "classes.json"
FOLDER = {"only": ("folder",)}  # a data key that applies to image folders alone


@dataclass
class ImageDataConfig(DataConfig):
    name: Literal["digits", "cifar10", "folder"] = "digits"
    # folder: root/<class>/<image>, or root/train/<class>/<image> with optional root/val/ and root/test/
    root: str | None = field(default=None, metadata=FOLDER)
    augment: bool = False  # random crop and flip (CIFAR-10, folder), a 1-pixel shift (digits)
    # with augment: the random crop's padding in pixels (0: flips only; digits: the shift);
    # null: the data set's default (CIFAR-10 4, digits 1, a folder an eighth of img_size)
    crop_padding: Optional[int] = field(default=None, metadata={"min": 0})
    # Training images held out for validation (model selection): a count, or a fraction below 1; 0: none.
    val_size: float = field(default=0.1, metadata={"min": 0.0})
    # folder without a test/ folder: images held out for the test, a count or a fraction below 1
    test_size: float = field(default=0.1, metadata={"min": 0.0, **FOLDER})
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the validation (and test) split
    img_size: int = field(default=32, metadata={"min": 1, **FOLDER})  # folder: images are resized to img_size x img_size
    mode: Literal["RGB", "L"] = field(default="RGB", metadata=FOLDER)  # folder: colour (RGB) or grey (L)
    # folder: "crop": the shorter side to img_size, then the centre square; "squash": both sides
    resize: Literal["crop", "squash"] = field(default="crop", metadata=FOLDER)
    classes: list = field(default_factory=list, metadata=FOLDER)  # folder: class folders to use, in label order; []: all
    # at most this many training images per class (after the validation split), drawn with seed
    # (small-data studies, quick runs); 0: all
    max_per_class: int = field(default=0, metadata={"min": 0})
    # folder: "memory" decodes every image once and keeps it; "stream" decodes at each use (DataLoader
    # workers: train.workers); "auto" keeps them in memory when the decoded images fit cache_mb.
    cache: Literal["auto", "memory", "stream"] = field(default="auto", metadata=FOLDER)
    cache_mb: float = field(default=2048.0, metadata={"min": 0.0, **FOLDER})

    def __post_init__(self) -> None:
        self.check_held_out(("val_size", "test_size"), "images")
        self.check_applies()
        if self.crop_padding is not None and not self.augment:
            raise InputError(f"data.crop_padding applies with data.augment=true; got crop_padding={self.crop_padding} "
                             f"and augment=false")
        if any(not isinstance(c, str) or not c for c in self.classes) or len(set(self.classes)) != len(self.classes):
            raise InputError(f"data.classes must be distinct class folder names; got {self.classes!r}")


@dataclass
class ImageClassificationRecipe(Recipe):
    task: str = "image_classification"
    data: ImageDataConfig = field(default_factory=ImageDataConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("vit_digits_patch2"))


# The built-in data sets: class names, image mode and size (for predict).
DATA_INFO: dict[str, dict[str, Any]] = {
    "digits": {"classes": [str(d) for d in range(10)], "mode": "L", "size": (8, 8)},
    "cifar10": {"classes": list(CIFAR10_CLASSES), "mode": "RGB", "size": (32, 32)},
}


def image_spec(data: ImageDataConfig) -> ImageSpec:
    """How a model of ``data`` reads an image: mode, size, resizing and eval transform."""
    if data.name == "folder":
        return ImageSpec(data.mode, (data.img_size, data.img_size), folder_transforms(data.img_size, data.mode, False),
                         data.resize)
    info = DATA_INFO[data.name]
    transform = cifar_eval_transforms() if data.name == "cifar10" else digits_transforms(train=False)
    return ImageSpec(info["mode"], info["size"], transform, "squash")


class _Transformed:
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
    def targets(self) -> Tensor:
        return self.ds.targets[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        x, y = self.ds[int(self.indices[i])]
        return self.transform(x), int(y)


# ----------------------------------------------------------------------------- an image folder


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


def _folder(path: Path, data: ImageDataConfig, classes: list[str] | None, cache: bool,
            missing_ok: bool = False) -> ImageFolder:
    return ImageFolder(path, classes=classes, on_error="skip", cache=cache, mode=data.mode, size=data.img_size,
                       resize=data.resize, missing_ok=missing_ok)


def _check_classes(classes: list[str], root: Path) -> None:
    if len(classes) < 2:
        found = f"only {classes[0]!r}" if classes else "none"
        raise InputError(f"data.root must hold at least 2 class folders (root/<class>/<image>) for a classifier; "
                         f"{root} has {found}")


def image_folder_splits(data: ImageDataConfig, *, lazy: bool = False,
                        ) -> tuple[list[str], _Transformed, _Transformed | None, _Transformed]:
    """``(classes, train, validation or None, test)`` of an image folder, before transforms
    (each ``_Transformed`` holds its transform; train's augments when ``data.augment``).
    ``lazy``: decode nothing now, each image when it is read (for evaluating the test part
    alone: the same pixels as the cache, without decoding the whole folder first)."""
    root = Path(data.root).expanduser()
    layout = _layout(root)
    paths = {"train": scan_images(layout["train"], list(data.classes) or None)}
    classes = paths["train"][0]
    _check_classes(classes, layout["train"])
    for name in ("val", "test"):
        if name in layout:
            paths[name] = scan_images(layout[name], classes, missing_ok=True)
    for name in ("val", "test"):
        if name in paths and not data.classes:  # (data.classes picks classes: other folders are left out)
            extra = sorted(set(paths[name][2]) - set(classes))
            if extra:
                raise InputError(f"{layout[name]} has class folders that {layout['train']} lacks: "
                                 f"{', '.join(extra)}; a model cannot learn a class it never saw")
    count = sum(len(p[1]) for p in paths.values())
    channels = 3 if data.mode == "RGB" else 1
    decoded_mb = count * channels * data.img_size**2 / 2**20
    cache = not lazy and (data.cache == "memory" or (data.cache == "auto" and decoded_mb <= data.cache_mb))
    sets = {name: _folder(folder, data, classes, cache, missing_ok=name != "train") for name, folder in layout.items()}
    train_all = sets["train"]
    pool = torch.arange(len(train_all))
    if "test" in sets:
        test = _Transformed(sets["test"], folder_transforms(data.img_size, data.mode, False))
    else:
        keep, held = stratified_split(train_all.targets, data.test_size, data.seed, "data.test_size")
        if held is None:
            raise InputError(f"data.test_size must be above 0 when {root} has no test/ folder")
        pool = keep
        test = _Transformed(train_all, folder_transforms(data.img_size, data.mode, False), held)
    if "val" in sets:
        val = _Transformed(sets["val"], folder_transforms(data.img_size, data.mode, False))
    else:
        keep, held = stratified_split(train_all.targets[pool], data.val_size, data.seed)
        val = None if held is None else _Transformed(train_all, folder_transforms(data.img_size, data.mode, False),
                                                     pool[held])
        pool = pool[keep]
    pool = cap_per_class(pool, train_all.targets, data.max_per_class, data.seed)
    train = _Transformed(train_all, folder_transforms(data.img_size, data.mode, data.augment, data.crop_padding),
                         pool)
    return classes, train, val, test


# ----------------------------------------------------------------------------- the built-in sets and both


def _eval_transform(name: str) -> Callable[[Tensor], Tensor]:
    return cifar_eval_transforms() if name == "cifar10" else digits_transforms(train=False)


def _load(recipe: ImageClassificationRecipe, split: str) -> Any:
    data = recipe.data
    return load_digits_dataset(split) if data.name == "digits" else CIFAR10(data.data_dir, split)


def build_data(recipe: ImageClassificationRecipe) -> tuple[_Transformed, _Transformed | None, _Transformed]:
    """``(train, validation or None, test)`` data sets of ``(float image, int label)``."""
    data = recipe.data
    if data.name == "folder":
        return image_folder_splits(data)[1:]
    train = _load(recipe, "train")
    train_idx, val_idx = stratified_split(train.targets, data.val_size, data.seed)
    train_idx = cap_per_class(train_idx, train.targets, data.max_per_class, data.seed)
    padding = {} if data.crop_padding is None else {"padding": data.crop_padding}  # else the preset's default
    if data.name == "digits":
        augment = digits_transforms(data.augment, **padding)
    else:
        augment = cifar_train_transforms(**padding) if data.augment else cifar_eval_transforms()
    val = None if val_idx is None else _Transformed(train, _eval_transform(data.name), val_idx)
    return _Transformed(train, augment, train_idx), val, _test_data(recipe)


def _test_data(recipe: ImageClassificationRecipe) -> _Transformed:
    if recipe.data.name == "folder":
        return image_folder_splits(recipe.data, lazy=True)[3]
    return _Transformed(_load(recipe, "test"), _eval_transform(recipe.data.name))


def labelled_folder(path: str | Path, spec: ImageSpec, classes: list[str]) -> _Transformed:
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
    return _Transformed(folder, spec.transform)


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



def _name(image: Any, index: int) -> str:
    """How a prediction names its input: a file's path, else its position."""
    return str(image) if isinstance(image, (str, Path)) else f"image {index}"


def spread(n: int, count: int) -> list[int]:
    """``count`` indices evenly spaced over ``range(n)`` (all of them when ``n <= count``)."""
    return list(range(n)) if n <= count else [round(i * (n - 1) / (count - 1)) for i in range(count)]


@torch.no_grad()
def predict_labels(model: nn.Module, data: Any, device: torch.device, batch_size: int = 256, *,
                   precision: str = "fp32", channels_last: bool = False) -> tuple[list[int], list[int], list[float]]:
    """``(true, pred, prob)`` over a data set with ``get_batch`` (as the trainer reads it), in
    the precision and memory format the run was evaluated in (so they agree with its figures)."""
    model.to(device).eval()
    if channels_last:
        model.to(memory_format=torch.channels_last)
    true, pred, prob = [], [], []
    for start in range(0, len(data), batch_size):
        x, y = data.get_batch(list(range(start, min(start + batch_size, len(data)))))
        x = {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)
        if channels_last and isinstance(x, Tensor) and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast(device, precision):
            logits = model(**x) if isinstance(x, dict) else model(x)
        p, i = logits.float().softmax(-1).max(-1)
        true += y.tolist()
        pred += i.cpu().tolist()
        prob += p.cpu().tolist()
    return true, pred, prob


@register_task
class ImageClassification(Task):
    name = "image_classification"
    recipe_class = ImageClassificationRecipe
    summary = "classify images: digits, CIFAR-10 or a folder of one's own (root/<class>/<image>)"
    inputs = "images"
    sample_unit = "images"
    fixed_on_resume = ("task", "data.name", "data.root", "data.val_size", "data.test_size", "data.seed",
                       "data.img_size", "data.mode", "data.resize", "data.classes", "data.max_per_class", "model",
                       "train.optimizer")
    legacy_keys = ("text", "translate", "data.protocol", "data.source", "data.target")

    def upgrade(self, data: dict[str, Any]) -> dict[str, Any]:
        data = super().upgrade(data)
        if isinstance(data.get("data"), dict) and "val_size" not in data["data"]:
            data["data"]["val_size"] = 0  # runs trained before the validation split held none out
        return data

    def model_options(self, recipe: Recipe, info: list[str] | None = None) -> dict[str, Any]:
        """``num_classes`` from the data (``info``: the class names; ``None``, for checking a
        recipe: a folder's count is not known yet, 2 stands in); for a folder also the image
        size and channels, when the model's configuration has them."""
        data = recipe.data
        if data.name != "folder":
            return {"num_classes": len(DATA_INFO[data.name]["classes"])}
        options: dict[str, Any] = {"num_classes": len(info) if info is not None else 2}
        config = config_class(recipe.model.name)
        names = {f.name for f in fields(config)} if config is not None else set()
        if "img_size" in names:
            options["img_size"] = data.img_size
        if "in_chans" in names:
            options["in_chans"] = 3 if data.mode == "RGB" else 1
        return options

    def train(self, recipe: Recipe, run_dir: str | Path, *, resume: bool = False, allow_changes: bool = False,
              log: Callable[[str], None] = print) -> dict[str, Any]:
        run_dir = Path(run_dir)
        if recipe.data.name == "folder":  # before a run directory is made
            if not recipe.data.root:
                raise InputError("data.root must name the image folder when data.name is 'folder' "
                                 "(for example data.root=photos/, holding photos/<class>/<image>)")
            _layout(Path(recipe.data.root).expanduser())
        with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, log=log) as resume_from:
            if recipe.data.name == "folder":
                classes, train_set, val_set, test_set = image_folder_splits(recipe.data)
                self._say_folder(recipe, classes, train_set, val_set, test_set, log)
            else:
                classes = list(DATA_INFO[recipe.data.name]["classes"])
                train_set, val_set, test_set = build_data(recipe)
            if distributed.is_main():
                atomic_write_bytes(run_dir / CLASSES_FILE, json.dumps({"classes": classes}, indent=1).encode())
            build = lambda: self.build_model(recipe, classes)  # noqa: E731
            results = fit_run(recipe, run_dir, build, train_set, val_set, resume_from=resume_from, log=log,
                              classes=classes)
            tested, _ = test_run(recipe, run_dir, build, test_set)
            results = {**tested, **results, "classes": classes,
                       "train_size": len(train_set), "val_size": len(val_set) if val_set else 0,
                       "test_size": len(test_set)}
            write_results(run_dir, results)
            return results

    @staticmethod
    def _say_folder(recipe: Recipe, classes: list[str], train: _Transformed, val: _Transformed | None,
                    test: _Transformed, log: Callable[[str], None]) -> None:
        data = recipe.data
        streamed = train.ds.images is None
        counts = torch.bincount(train.targets, minlength=len(classes)).tolist()
        shown = ", ".join(f"{c} {n}" for c, n in list(zip(classes, counts))[:8]) + (" ..." if len(classes) > 8 else "")
        log(f"data: {len(classes)} classes, {len(train)} training ({shown}), {len(val) if val else 0} validation, "
            f"{len(test)} test images, {data.mode} {data.img_size}x{data.img_size}, "
            + ("streamed from disk" + (f" by {recipe.train.workers} workers" if recipe.train.workers else
                                       " (set train.workers=N to decode beside training)")
               if streamed else "decoded once, in memory"))

    def load(self, run_dir: Path, recipe: Recipe, checkpoint: str = "auto") -> TrainedRun:
        if (run_dir / CLASSES_FILE).is_file():
            classes = read_json_mapping(run_dir / CLASSES_FILE).get("classes")
            if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
                raise InputError(f"{run_dir / CLASSES_FILE} must hold {{\"classes\": [names]}}; got {classes!r}")
        elif recipe.data.name in DATA_INFO:  # runs of older attnlab: the built-in sets' classes
            classes = list(DATA_INFO[recipe.data.name]["classes"])
        else:
            raise InputError(f"run_dir must hold {CLASSES_FILE} (the class names of an image-folder run); "
                             f"{run_dir} has none")
        model = self.build_model(recipe, classes)
        folder = load_weights(run_dir, model, checkpoint)
        return TrainedRun(self, run_dir, recipe, model.eval(), folder, classes=classes, image=image_spec(recipe.data))

    def evaluate(self, run: TrainedRun, *, device: str = "auto", data: str | Path | None = None) -> dict[str, Any]:
        """The test set's metrics, or (``data``) those of a labelled folder ``data/<class>/<image>``."""
        cfg = run.recipe.train
        test = _test_data(run.recipe) if data is None else labelled_folder(data, run.image, run.classes)
        res = evaluate_model(run.model, test, batch_size=cfg.batch_size, device=device,
                             precision=run.precision, channels_last=cfg.channels_last)
        return {"test_accuracy": res["accuracy"], "test_loss": res["loss"], "test_samples": res["samples"]}

    @torch.no_grad()
    def predict(self, run: TrainedRun, inputs: Sequence[Any], *, top_k: int = 1,
                batch_size: int = 64) -> list[LabelPrediction]:
        """``inputs``: image files, PIL images or ``uint8`` tensors ``(C, H, W)``, read as the
        run was trained (mode, size, resizing) and classified in batches of ``batch_size``.
        Each gets its ``top_k`` labels with their probabilities, most probable first."""
        spec = run.image
        device = next(run.model.parameters()).device
        out: list[LabelPrediction] = []
        for start in range(0, len(inputs), batch_size):
            chunk = list(inputs[start : start + batch_size])
            images = torch.stack([read_image(f, spec.mode, spec.size, spec.resize) for f in chunk])
            with autocast(device, run.precision):
                probs = run.model(spec.transform(images).to(device)).float().softmax(-1).cpu()
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
            out += [LabelPrediction(_name(f, start + k), [(run.classes[i], p) for p, i in zip(ps.tolist(), ix.tolist())])
                    for k, (f, ps, ix) in enumerate(zip(chunk, top.values, top.indices))]
        return out

    def report_items(self, run_dir: Path, *, device: str = "auto") -> list[Any]:
        """The test set's predictions by the weights ``results.json`` was tested with."""
        run = load_run(run_dir)
        test = _test_data(run.recipe)
        true, pred, prob = predict_labels(run.model, test, select_device(device), precision=run.precision,
                                          channels_last=run.recipe.train.channels_last)
        shown = spread(len(test), 12)
        return [ClassifierPredictions(run.classes, true, pred, prob, checkpoint_label(run.checkpoint),
                                      [test.image(i) for i in shown], shown)]

    @torch.no_grad()
    def attention_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                        queries: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        model = run.model
        adapter = attention_maps_adapter(model)  # the model's family says how its attention is drawn
        if adapter is None:
            raise InputError(f"run {run.run_dir} cannot be visualized: visualize draws image models whose family "
                             f"says how its attention maps are drawn ({', '.join(families_with_maps())}), and this "
                             f"run's model is {run.recipe.model.name!r}")
        images, names = self._images(run, inputs, max_inputs)
        x = run.image.transform(images).to(next(model.parameters()).device)
        logits, maps = adapter(model, x)
        probs = logits.float().softmax(-1)
        titles = []
        for b in range(images.shape[0]):
            p, c = probs[b].max(0)
            titles.append(f"{names[b]} -> {run.classes[int(c)]} ({float(p):.2f})")
        if isinstance(maps, TokenGridMaps):
            if queries is not None:
                raise InputError(f"queries (--query) choose query pixels of a model with 2-D attention (BoTNet); run "
                                 f"{run.run_dir} is a {type(model).__name__} over patch tokens")
            return [ImageAttention(titles[b], images[b], [w[b] for w in maps.layers], maps.grid, maps.prefix,
                                   maps.pooling) for b in range(images.shape[0])]
        h, w = images.shape[-2:]
        for r, c in queries or ():
            if not (0 <= r < h and 0 <= c < w):
                raise InputError(f"queries: ({r}, {c}) lies outside the {h}x{w} image the model sees; "
                                 f"need 0 <= row < {h} and 0 <= col < {w}")
        shown = list(queries or [(h // 2, w // 2), (h // 4, w // 4), (3 * h // 4, 3 * w // 4)])
        return [PixelAttention(titles[b], images[b], [(name, weights[b], size) for name, weights, size in maps.blocks],
                               shown) for b in range(images.shape[0])]

    def _images(self, run: TrainedRun, inputs: Sequence[Any] | None, max_inputs: int) -> tuple[Tensor, list[str]]:
        """``uint8`` ``(N, C, H, W)`` images as the model's data has them, and their names."""
        if inputs is not None:
            for i, f in enumerate(inputs):
                if not isinstance(f, (str, Path)):
                    raise InputError(f"inputs[{i}] must be an image file path for an image run; "
                                     f"got {type(f).__name__}")
            images = torch.stack([read_image(f, run.image.mode, run.image.size, run.image.resize) for f in inputs])
            return images, [Path(f).name for f in inputs]
        test = _test_data(run.recipe)
        n = min(max_inputs, len(test))
        images = torch.stack([test.image(k) for k in range(n)])
        return images, [f"test image {k}, label {run.classes[int(test.ds.targets[k])]}" for k in range(n)]


