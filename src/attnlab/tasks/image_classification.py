"""Image classification: labelled images from any image source (``data.name``: the
built-in ``digits`` and ``cifar10``, a ``folder`` of one's own, or a source one
registers), a validation split for model selection, the test set evaluated once at the
end. The sources and their keys are described in :mod:`attnlab.data.kinds.labelled_images`
and :mod:`attnlab.data.sources.image_folder`.

The validation split picks ``checkpoints/best``; ``data.val_size: 0`` keeps none, and then
the final weights are tested.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from PIL import Image
from torch import Tensor

from ..data.kinds.labelled_images import ImageSource, ImageSourceConfig, labelled_folder, read_image
from ..data.source import Splits, source_of
from ..engine.checkpoint import checkpoint_label
from ..engine.device import autocast, select_device
from ..engine.trainer import evaluate_model
from ..attention.capture import attention_modules
from ..errors import AttentionUnavailable, InputError
from ..models.maps import TokenGridMaps, attention_maps_adapter, families_with_maps
from ..models.registry import config_class
from ..run.recipe import ModelConfig, Recipe
from ..run.task import Prepared, Preprocessing, Task, register_task
from ..run.trained import TrainedRun
from .classify import check_label_options, predict_labels, read_classes, spread, top_labels, write_classes
from ..run.views import ClassifierPredictions, ImageAttention, LabelPrediction, PixelAttention

__all__ = ["ImageClassificationRecipe", "ImageClassification"]


@dataclass
class ImageClassificationRecipe(Recipe):
    task: str = "image_classification"
    data: ImageSourceConfig = field(default_factory=ImageSourceConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("vit_digits_patch2"))


# What to train to see an image model's attention: a model of a family with a drawing (models.maps).
_DRAWN_INSTEAD = ("To see attention, train a ViT or a BoTNet: the same recipe with model.name=vit_cifar_patch4 "
                  "model.options={} (or model.name=botnet_cifar), or the recipes vit-cifar10, cct-cifar10 and "
                  "botnet-cifar10 (CIFAR-10) or image-folder-pretrained (a pretrained ViT on images of one's own).")


def _source(recipe: Recipe) -> ImageSource:
    return source_of(recipe.data)


def _name(image: Any, index: int) -> str:
    """How a prediction names its input: a file's path, else its position."""
    return str(image) if isinstance(image, (str, Path)) else f"image {index}"


@register_task
class ImageClassification(Task):
    name = "image_classification"
    recipe_class = ImageClassificationRecipe
    summary = "classify images: digits, CIFAR-10 or a folder of one's own (root/<class>/<image>)"
    inputs = "images"
    sample_unit = "images"
    legacy_keys = ("text", "translate", "data.protocol", "data.source", "data.target")

    def upgrade(self, data: dict[str, Any]) -> dict[str, Any]:
        data = super().upgrade(data)
        if isinstance(data.get("data"), dict) and "val_size" not in data["data"]:
            data["data"]["val_size"] = 0  # runs trained before the validation split held none out
        return data

    def model_options(self, recipe: Recipe, info: list[str] | None = None) -> dict[str, Any]:
        """``num_classes`` from the data (``info``: the class names; ``None``, for checking a
        recipe: the source's own classes, or 2 standing in for a folder's), and what the
        source says of its images (a folder's size and channels) when the model's
        configuration has such keys."""
        source = _source(recipe)
        classes = info if info is not None else source.known_classes(recipe.data)
        options: dict[str, Any] = {"num_classes": len(classes) if classes is not None else 2}
        config = config_class(recipe.model.name)
        names = {f.name for f in fields(config)} if config is not None else set()
        options.update({k: v for k, v in source.model_facts(recipe.data).items() if k in names})
        return options

    def describe(self, recipe: Recipe) -> str:
        return _source(recipe).describe(recipe.data)

    # ------------------------------------------------------------------ training
    def prepare(self, recipe: Recipe, run_dir: Path, data: Splits, log: Callable[[str], None]) -> Prepared:
        write_classes(run_dir, data.classes)
        return Prepared(data.train, data.val, data.test, data.classes, data.classes,
                        {"train_size": len(data.train), "val_size": len(data.val) if data.val else 0,
                         "test_size": len(data.test)})

    # ------------------------------------------------------------------ a finished run
    def preprocessing(self, run_dir: Path, recipe: Recipe) -> Preprocessing:
        source = _source(recipe)
        classes = read_classes(run_dir, source.known_classes(recipe.data))  # (older runs of built-in sets: none)
        return Preprocessing(classes, classes, image=source.image_spec(recipe.data))

    def evaluate(self, run: TrainedRun, *, device: str = "auto", data: str | Path | None = None) -> dict[str, Any]:
        """The test set's metrics, or (``data``) those of a labelled folder ``data/<class>/<image>``."""
        cfg = run.recipe.train
        test = _source(run.recipe).load_test(run.recipe.data) if data is None else \
            labelled_folder(data, run.image, run.classes)
        res = evaluate_model(run.model, test, batch_size=cfg.batch_size, device=device,
                             precision=run.precision, channels_last=cfg.channels_last)
        return {"test_accuracy": res["accuracy"], "test_loss": res["loss"], "test_samples": res["samples"]}

    @torch.no_grad()
    def predict(self, run: TrainedRun, inputs: Sequence[Any], *, top_k: int = 1,
                batch_size: int = 64) -> list[LabelPrediction]:
        """``inputs``: image files, PIL images or ``uint8`` tensors ``(C, H, W)``, read as the
        run was trained (mode, size, resizing) and classified in batches of ``batch_size``.
        Each gets its ``top_k`` labels with their probabilities, most probable first."""
        check_label_options(top_k, batch_size)
        spec = run.image
        out: list[LabelPrediction] = []
        for start in range(0, len(inputs), batch_size):
            chunk = list(inputs[start : start + batch_size])
            images = torch.stack([read_image(f, spec.mode, spec.size, spec.resize) for f in chunk])
            with autocast(run.device, run.precision):
                logits = run.model(spec.transform(images).to(run.device))
            out += top_labels(logits, run.classes, [_name(f, start + k) for k, f in enumerate(chunk)], top_k)
        return out

    def report_items(self, runs: Sequence[TrainedRun], *, device: str = "auto") -> list[Any]:
        """The test set's predictions by the weights ``results.json`` was tested with."""
        [run] = runs
        test = _source(run.recipe).load_test(run.recipe.data)
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
            recordable, _ = attention_modules(model)
            has = (f"its family ({type(model).__name__}) has no drawing of its attention over the image" if recordable
                   else "it has no attention layer")
            raise AttentionUnavailable(
                f"run {run.run_dir} cannot be visualized: visualize draws image models whose family says how its "
                f"attention maps are drawn ({', '.join(families_with_maps())}), and this run's model is "
                f"{run.recipe.model.name!r}", reason=f"{has}; the image models whose attention is drawn are the "
                f"families {', '.join(families_with_maps())}", instead=_DRAWN_INSTEAD)
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
                if not isinstance(f, (str, Path, Image.Image)):
                    raise InputError(f"inputs[{i}] must be an image file path or a PIL image for an image run; "
                                     f"got {type(f).__name__}")
            images = torch.stack([read_image(f, run.image.mode, run.image.size, run.image.resize) for f in inputs])
            return images, [Path(f).name if isinstance(f, (str, Path)) else "the image" for f in inputs]
        test = _source(run.recipe).load_test(run.recipe.data)
        n = min(max_inputs, len(test))
        images = torch.stack([test.image(k) for k in range(n)])
        return images, [f"test image {k}, label {run.classes[int(test.targets[k])]}" for k in range(n)]


