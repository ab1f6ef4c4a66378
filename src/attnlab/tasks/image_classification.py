"""Image classification: data set and model from a recipe, trained by the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..data import load_digits_dataset
from ..data.images import CIFAR10, CIFAR10_CLASSES, decompression_bomb_sizes
from ..data.transforms import cifar_eval_transforms, cifar_train_transforms, digits_transforms
from ..errors import InputError
from ..models import create_model
from ..recipes import Recipe
from .common import evaluate_model, load_weights, open_run, read_recipe, train_and_test


class _Transformed:
    """A dataset whose images pass through ``transform``; ``(image, int label)``.

    ``get_batch`` transforms a whole batch at once (the transforms are batched), which
    is several times cheaper than one image at a time when images sit in one tensor.
    """

    def __init__(self, ds: Any, transform: Callable) -> None:
        self.ds, self.transform = ds, transform

    def get_batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        if isinstance(self.ds.images, torch.Tensor):
            return self.transform(self.ds.images[index]), self.ds.targets[index]
        xs, ys = zip(*(self[i] for i in indices))
        return torch.stack(xs), torch.as_tensor(ys)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x, y = self.ds[i]
        return self.transform(x), int(y)


# What a model of each data set takes: class names, image mode and size (for predict).
DATA_INFO: dict[str, dict[str, Any]] = {
    "digits": {"classes": [str(d) for d in range(10)], "mode": "L", "size": (8, 8)},
    "cifar10": {"classes": list(CIFAR10_CLASSES), "mode": "RGB", "size": (32, 32)},
}


def build_data(recipe: Recipe) -> tuple[Any, Any]:
    """``(train, test)`` data sets of ``(float image, int label)`` for the recipe's data."""
    data = recipe.data
    if data.name == "digits":
        train, test = load_digits_dataset("train"), load_digits_dataset("test")
        return (_Transformed(train, digits_transforms(train=data.augment)),
                _Transformed(test, digits_transforms(train=False)))
    if data.name == "cifar10":
        train, test = CIFAR10(data.data_dir, "train"), CIFAR10(data.data_dir, "test")
        augment = cifar_train_transforms() if data.augment else cifar_eval_transforms()
        return _Transformed(train, augment), _Transformed(test, cifar_eval_transforms())
    raise InputError(f"data.name must be 'digits' or 'cifar10'; got {data.name!r}")


def run(recipe: Recipe, run_dir: str | Path, *, resume: bool = False, allow_changes: bool = False,
        log=print) -> dict[str, Any]:
    """Train ``recipe`` into ``run_dir`` (config.yaml, metrics.jsonl, checkpoints/, results.json);
    see :func:`~attnlab.tasks.common.open_run` for ``resume`` and ``allow_changes``."""
    run_dir = Path(run_dir)
    with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, log=log) as resume_from:
        train_set, test_set = build_data(recipe)
        return train_and_test(
            recipe, run_dir, lambda: create_model(recipe.model.name, **recipe.model.options), train_set, test_set,
            test_set, resume_from=resume_from, log=log,
            extra={"classes": list(DATA_INFO[recipe.data.name]["classes"])},
        )


# ---------------------------------------------------------------------------- a finished run


def load_run(run_dir: str | Path, checkpoint: str = "auto") -> tuple[Recipe, nn.Module, Path]:
    """``(recipe, model in eval mode, checkpoint folder)`` of a run directory; see
    :func:`~attnlab.tasks.common.load_weights` for ``checkpoint``."""
    recipe = read_recipe(run_dir)
    model = create_model(recipe.model.name, **recipe.model.options)
    folder = load_weights(run_dir, model, checkpoint)
    return recipe, model.eval(), folder


def evaluate_run(run_dir: str | Path, checkpoint: str = "auto", batch_size: int = 256,
                 device: str = "auto") -> dict[str, Any]:
    """Test loss and accuracy of a run's checkpoint, recomputed from the data."""
    recipe, model, folder = load_run(run_dir, checkpoint)
    _, test_set = build_data(recipe)
    return {**evaluate_model(model, test_set, batch_size, device), "checkpoint": str(folder)}


def read_image(path: str | Path, mode: str, size: tuple[int, int]) -> torch.Tensor:
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


@torch.no_grad()
def predict_files(run_dir: str | Path, files: list[str], checkpoint: str = "auto",
                  top_k: int = 1) -> list[tuple[str, list[tuple[str, float]]]]:
    """``(file, [(label, probability), ...])`` for each image file, best first."""
    recipe, model, _ = load_run(run_dir, checkpoint)
    info = DATA_INFO[recipe.data.name]
    prep = cifar_eval_transforms() if recipe.data.name == "cifar10" else digits_transforms(train=False)
    images = torch.stack([read_image(f, info["mode"], info["size"]) for f in files])
    probs = model(prep(images)).float().softmax(-1)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [(f, [(info["classes"][i], p) for p, i in zip(ps.tolist(), ix.tolist())])
            for f, ps, ix in zip(files, top.values, top.indices)]

