"""Image classification: digits or CIFAR-10, a validation split carved from the training
images for model selection, the test set evaluated once at the end.

Data (``data.name``): scikit-learn's digits (1,437 training and 360 test 8x8 grey
images) or CIFAR-10 (the image folders or the pickled batches of the data directory).
``data.val_size`` training images (a count, or a fraction below 1) are held out,
stratified by class with ``data.seed``, for the evaluations during training, which pick
``checkpoints/best``; 0 keeps none, and then the final weights are tested.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from ..attention.capture import capture_attention
from ..data import load_digits_dataset
from ..data.images import CIFAR10, CIFAR10_CLASSES, decompression_bomb_sizes
from ..data.transforms import cifar_eval_transforms, cifar_train_transforms, digits_transforms
from ..engine.device import select_device
from ..engine.trainer import evaluate_model
from ..errors import InputError
from ..models.botnet import BoTBlock, BoTNet
from ..models.vit import VisionTransformer
from .base import DataConfig, ImageSpec, ModelConfig, Recipe, Task, TrainedRun, register_task
from .runs import checkpoint_label, fit_run, load_run, load_weights, open_run, test_run, write_results
from .views import ClassifierPredictions, ImageAttention, LabelPrediction, PixelAttention

__all__ = ["ImageDataConfig", "ImageClassificationRecipe", "ImageClassification", "read_image", "build_data"]


@dataclass
class ImageDataConfig(DataConfig):
    name: Literal["digits", "cifar10"] = "digits"
    augment: bool = False  # random crop and flip (CIFAR-10), a 1-pixel shift (digits)
    # Training images held out for validation (model selection): a count, or a fraction below 1; 0: none.
    val_size: float = field(default=0.1, metadata={"min": 0.0})
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the validation split

    def __post_init__(self) -> None:
        if self.val_size >= 1 and self.val_size != int(self.val_size):
            raise InputError(f"data.val_size must be a fraction below 1 or a whole count of images; "
                             f"got {self.val_size!r}")


@dataclass
class ImageClassificationRecipe(Recipe):
    task: str = "image_classification"
    data: ImageDataConfig = field(default_factory=ImageDataConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("vit_digits_patch2"))


# What a model of each data set takes: class names, image mode and size (for predict).
DATA_INFO: dict[str, dict[str, Any]] = {
    "digits": {"classes": [str(d) for d in range(10)], "mode": "L", "size": (8, 8)},
    "cifar10": {"classes": list(CIFAR10_CLASSES), "mode": "RGB", "size": (32, 32)},
}


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
        xs, ys = zip(*(self[i] for i in indices))
        return torch.stack(xs), torch.as_tensor(ys)

    def image(self, i: int) -> Tensor:
        """The ``uint8`` image of sample ``i``, untransformed (as a person sees it)."""
        return self.ds.images[int(self.indices[i])]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        x, y = self.ds[int(self.indices[i])]
        return self.transform(x), int(y)


def _split(targets: Tensor, val_size: float, seed: int) -> tuple[Tensor, Tensor | None]:
    """``(train indices, validation indices or None)``, stratified by class."""
    if val_size == 0:
        return torch.arange(len(targets)), None
    from sklearn.model_selection import train_test_split  # sklearn is slow to import: only when splitting

    n = int(val_size) if val_size >= 1 else val_size
    if isinstance(n, int) and not 0 < n < len(targets):
        raise InputError(f"data.val_size must be below the {len(targets)} training images; got {n}")
    train, val = train_test_split(np.arange(len(targets)), test_size=n, stratify=targets.numpy(), random_state=seed)
    return torch.from_numpy(np.sort(train)), torch.from_numpy(np.sort(val))


def _eval_transform(name: str) -> Callable[[Tensor], Tensor]:
    return cifar_eval_transforms() if name == "cifar10" else digits_transforms(train=False)


def _load(recipe: ImageClassificationRecipe, split: str) -> Any:
    data = recipe.data
    return load_digits_dataset(split) if data.name == "digits" else CIFAR10(data.data_dir, split)


def build_data(recipe: ImageClassificationRecipe) -> tuple[_Transformed, _Transformed | None, _Transformed]:
    """``(train, validation or None, test)`` data sets of ``(float image, int label)``."""
    data = recipe.data
    train = _load(recipe, "train")
    train_idx, val_idx = _split(train.targets, data.val_size, data.seed)
    if data.name == "digits":
        augment = digits_transforms(train=data.augment)
    else:
        augment = cifar_train_transforms() if data.augment else cifar_eval_transforms()
    val = None if val_idx is None else _Transformed(train, _eval_transform(data.name), val_idx)
    return _Transformed(train, augment, train_idx), val, _test_data(recipe)


def _test_data(recipe: ImageClassificationRecipe) -> _Transformed:
    return _Transformed(_load(recipe, "test"), _eval_transform(recipe.data.name))


def read_image(path: str | Path, mode: str, size: tuple[int, int]) -> Tensor:
    """An image file as the ``uint8`` ``(C, H, W)`` a model of this data expects
    (converted to ``mode``, resized to ``size`` with bilinear filtering)."""
    try:
        with Image.open(path) as im:
            im = im.convert(mode)
            if im.size != (size[1], size[0]):
                im = im.resize((size[1], size[0]), Image.BILINEAR)
            array = np.array(im, dtype=np.uint8)  # a writable copy
    except FileNotFoundError:
        raise InputError(f"FILE {str(path)!r} does not exist") from None
    except Image.DecompressionBombError as exc:  # not an OSError
        pixels, limit = decompression_bomb_sizes(exc)
        raise InputError(
            f"FILE {str(path)!r} is too large to read safely: {pixels} pixels, more than Pillow's limit of "
            f"{limit} pixels (a guard against decompression bombs); downscale it (the model reads it at "
            f"{size[0]}x{size[1]}) and try again"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"FILE {str(path)!r} is not a readable image ({exc})") from None
    return torch.from_numpy(array.reshape(size[0], size[1], -1)).permute(2, 0, 1).contiguous()


def spread(n: int, count: int) -> list[int]:
    """``count`` indices evenly spaced over ``range(n)`` (all of them when ``n <= count``)."""
    return list(range(n)) if n <= count else [round(i * (n - 1) / (count - 1)) for i in range(count)]


@torch.no_grad()
def predict_labels(model: nn.Module, data: Any, device: torch.device,
                   batch_size: int = 256) -> tuple[list[int], list[int], list[float]]:
    """``(true, pred, prob)`` over a data set with ``get_batch`` (as the trainer reads it)."""
    model.to(device).eval()
    true, pred, prob = [], [], []
    for start in range(0, len(data), batch_size):
        x, y = data.get_batch(list(range(start, min(start + batch_size, len(data)))))
        x = {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)
        p, i = (model(**x) if isinstance(x, dict) else model(x)).float().softmax(-1).max(-1)
        true += y.tolist()
        pred += i.cpu().tolist()
        prob += p.cpu().tolist()
    return true, pred, prob


@register_task
class ImageClassification(Task):
    name = "image_classification"
    recipe_class = ImageClassificationRecipe
    summary = "classify images: digits or CIFAR-10"
    inputs = "images"
    sample_unit = "images"
    fixed_on_resume = ("task", "data.name", "data.val_size", "data.seed", "model", "train.optimizer")
    legacy_keys = ("text", "translate", "data.protocol", "data.source", "data.target")

    def upgrade(self, data: dict[str, Any]) -> dict[str, Any]:
        data = super().upgrade(data)
        if isinstance(data.get("data"), dict) and "val_size" not in data["data"]:
            data["data"]["val_size"] = 0  # runs trained before the validation split held none out
        return data

    def model_options(self, recipe: Recipe, info: Any = None) -> dict[str, Any]:
        return {"num_classes": len(DATA_INFO[recipe.data.name]["classes"])}

    def train(self, recipe: Recipe, run_dir: str | Path, *, resume: bool = False, allow_changes: bool = False,
              log: Callable[[str], None] = print) -> dict[str, Any]:
        run_dir = Path(run_dir)
        with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, log=log) as resume_from:
            train_set, val_set, test_set = build_data(recipe)
            build = lambda: self.build_model(recipe)  # noqa: E731
            results = fit_run(recipe, run_dir, build, train_set, val_set, resume_from=resume_from, log=log)
            tested, _ = test_run(recipe, run_dir, build, test_set)
            results = {**tested, **results, "classes": list(DATA_INFO[recipe.data.name]["classes"]),
                       "train_size": len(train_set), "val_size": len(val_set) if val_set else 0,
                       "test_size": len(test_set)}
            write_results(run_dir, results)
            return results

    def load(self, run_dir: Path, recipe: Recipe, checkpoint: str = "auto") -> TrainedRun:
        model = self.build_model(recipe)
        folder = load_weights(run_dir, model, checkpoint)
        info = DATA_INFO[recipe.data.name]
        return TrainedRun(self, run_dir, recipe, model.eval(), folder, classes=list(info["classes"]),
                          image=ImageSpec(info["mode"], info["size"], _eval_transform(recipe.data.name)))

    def evaluate(self, run: TrainedRun, *, device: str = "auto") -> dict[str, Any]:
        cfg = run.recipe.train
        res = evaluate_model(run.model, _test_data(run.recipe), batch_size=cfg.batch_size, device=device,
                             precision=cfg.precision, channels_last=cfg.channels_last)
        return {"test_accuracy": res["accuracy"], "test_loss": res["loss"], "test_samples": res["samples"]}

    @torch.no_grad()
    def predict(self, run: TrainedRun, inputs: Sequence[Any], *, top_k: int = 1) -> list[LabelPrediction]:
        """``inputs``: image files. Each gets its ``top_k`` labels with their probabilities."""
        spec = run.image
        images = torch.stack([read_image(f, spec.mode, spec.size) for f in inputs])
        probs = run.model(spec.transform(images)).float().softmax(-1)
        top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        return [LabelPrediction(str(f), [(run.classes[i], p) for p, i in zip(ps.tolist(), ix.tolist())])
                for f, ps, ix in zip(inputs, top.values, top.indices)]

    def report_items(self, run_dir: Path, *, device: str = "auto") -> list[Any]:
        """The test set's predictions by the weights ``results.json`` was tested with."""
        run = load_run(run_dir)
        test = _test_data(run.recipe)
        true, pred, prob = predict_labels(run.model, test, select_device(device))
        shown = spread(len(test), 12)
        return [ClassifierPredictions(run.classes, true, pred, prob, checkpoint_label(run.checkpoint),
                                      [test.image(i) for i in shown], shown)]

    @torch.no_grad()
    def attention_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                        queries: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        model = run.model
        if isinstance(model, VisionTransformer):
            if queries is not None:
                raise InputError(f"queries (--query) choose BoTNet query pixels; run {run.run_dir} is a ViT")
        elif not isinstance(model, BoTNet):
            raise InputError(f"run {run.run_dir} cannot be visualized: visualize draws ViT (hybrid too) and BoTNet "
                             f"image models, and this run's model is {run.recipe.model.name!r}")
        images, names = self._images(run, inputs, max_inputs)
        x = run.image.transform(images).to(next(model.parameters()).device)
        if isinstance(model, VisionTransformer):
            return _vit_views(model, images, x, names, run.classes)
        h, w = images.shape[-2:]
        for r, c in queries or ():
            if not (0 <= r < h and 0 <= c < w):
                raise InputError(f"queries: ({r}, {c}) lies outside the {h}x{w} image the model sees; "
                                 f"need 0 <= row < {h} and 0 <= col < {w}")
        return _botnet_views(model, images, x, names, run.classes,
                             list(queries or [(h // 2, w // 2), (h // 4, w // 4), (3 * h // 4, 3 * w // 4)]))

    def _images(self, run: TrainedRun, inputs: Sequence[Any] | None, max_inputs: int) -> tuple[Tensor, list[str]]:
        """``uint8`` ``(N, C, H, W)`` images as the model's data has them, and their names."""
        if inputs is not None:
            for i, f in enumerate(inputs):
                if not isinstance(f, (str, Path)):
                    raise InputError(f"inputs[{i}] must be an image file path for an image run; "
                                     f"got {type(f).__name__}")
            images = torch.stack([read_image(f, run.image.mode, run.image.size) for f in inputs])
            return images, [Path(f).name for f in inputs]
        test = _test_data(run.recipe)
        n = min(max_inputs, len(test))
        images = torch.stack([test.image(k) for k in range(n)])
        return images, [f"test image {k}, label {run.classes[int(test.ds.targets[k])]}" for k in range(n)]


def _vit_views(model: VisionTransformer, images: Tensor, x: Tensor, names: list[str],
               classes: list[str]) -> list[ImageAttention]:
    with capture_attention(model, cpu=True) as maps:
        probs = model(x).float().softmax(-1)
    layers = [calls[0] for calls in maps.values() if calls]  # (B, H, N, N) per block
    grid = model.patch_embed.grid_for(x.shape[-2], x.shape[-1])
    views = []
    for b in range(images.shape[0]):
        p, c = probs[b].max(0)
        views.append(ImageAttention(f"{names[b]} -> {classes[int(c)]} ({float(p):.2f})", images[b],
                                    [w[b] for w in layers], tuple(grid), model.num_prefix_tokens,
                                    "token" if model.config.global_pool == "token" else "avg"))
    return views


def _botnet_views(model: BoTNet, images: Tensor, x: Tensor, names: list[str], classes: list[str],
                  queries: list[tuple[int, int]]) -> list[PixelAttention]:
    blocks = [(name, m) for name, m in model.named_modules() if isinstance(m, BoTBlock)]
    sizes: dict[str, tuple[int, int]] = {}

    def note_size(name: str):
        def hook(module: nn.Module, args: tuple) -> None:  # returns None: the input stays as it is
            sizes.setdefault(name, tuple(args[0].shape[-2:]))
        return hook

    # The attention runs at the block's input resolution (its 1x1 reduce keeps the size).
    hooks = [m.register_forward_pre_hook(note_size(name)) for name, m in blocks]
    attn = [f"{n}.attn" if n else "attn" for n, _ in blocks]
    try:
        with capture_attention(model, include=attn, cpu=True) as maps:
            probs = model(x).float().softmax(-1)
    finally:
        for h in hooks:
            h.remove()
    views = []
    for b in range(images.shape[0]):
        p, c = probs[b].max(0)
        views.append(PixelAttention(f"{names[b]} -> {classes[int(c)]} ({float(p):.2f})", images[b],
                                    [(name, maps[a][0][b], sizes[name]) for (name, _), a in zip(blocks, attn)],
                                    queries))
    return views
