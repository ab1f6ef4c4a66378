"""Image classification: data set and model from a recipe, trained by the engine."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from PIL import Image
from torch import nn

from ..data import load_digits_dataset
from ..data.images import CIFAR10, CIFAR10_CLASSES
from ..data.transforms import cifar_eval_transforms, cifar_train_transforms, digits_transforms
from ..engine import distributed
from ..engine.checkpoint import latest_checkpoint, load_checkpoint, resolve_checkpoint
from ..engine.config import from_dict
from ..engine.device import select_device
from ..engine.trainer import Trainer
from ..io import atomic_write_bytes
from ..models import count_parameters, create_model
from ..recipes import Recipe


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
    raise ValueError(f"data.name must be 'digits' or 'cifar10'; got {data.name!r}")


def run(recipe: Recipe, run_dir: str | Path, *, resume: bool = False, log=print) -> dict[str, Any]:
    """Train ``recipe`` into ``run_dir`` (config.yaml, metrics.jsonl, checkpoints/, results.json)."""
    run_dir = Path(run_dir)
    main = distributed.is_main()  # under torchrun rank 0 alone writes to run_dir
    has_checkpoint = distributed.broadcast_object(main and latest_checkpoint(run_dir / "checkpoints") is not None)
    if has_checkpoint and not resume:  # before anything is written: never mix two runs in one folder
        raise ValueError(f"--run-dir {run_dir} already holds checkpoints of a run; pass --resume to continue it, "
                         f"or choose another --run-dir")
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(run_dir / "config.yaml", yaml.safe_dump(asdict(recipe), sort_keys=False).encode())
    train_set, test_set = build_data(recipe)
    torch.manual_seed(recipe.train.seed)  # the initial weights too are a function of the seed
    model = create_model(recipe.model.name, **recipe.model.options)
    trainer = Trainer(model, train_set, recipe.train, eval_data=test_set, run_dir=run_dir, log=log)
    if resume and has_checkpoint:
        trainer.resume()
    elif resume:
        log(f"--resume: {run_dir} has no complete checkpoint yet; starting from step 0")
    start = time.perf_counter()
    fit = trainer.fit()
    trainer.save()
    cfg = recipe.train
    if "accuracy" in fit and cfg.eval_every and trainer.step % cfg.eval_every == 0:
        test = {"loss": fit["loss"], "accuracy": fit["accuracy"]}  # fit has just evaluated the final weights
    else:
        test = trainer.evaluate(test_set)
        trainer.record_evaluation(test)
    trainer.close()
    results = {"test_accuracy": test["accuracy"], "test_loss": test["loss"], "best_accuracy": trainer.best,
               "params": count_parameters(model), "train_seconds": fit["train_seconds"],
               "samples_per_s": fit["samples_per_s"], "steps": fit["steps"],
               "wall_seconds": time.perf_counter() - start, "model": recipe.model.name,
               "classes": list(DATA_INFO[recipe.data.name]["classes"])}
    if main:
        atomic_write_bytes(run_dir / "results.json", json.dumps(results, indent=1).encode())
    return results


# ---------------------------------------------------------------------------- a finished run


def load_run(run_dir: str | Path, checkpoint: str = "auto") -> tuple[Recipe, nn.Module, Path]:
    """``(recipe, model in eval mode, checkpoint folder)`` of a run directory.

    ``checkpoint``: ``"best"``, ``"last"``, a checkpoint folder, or ``"auto"`` (best when
    the run has one, else last). The EMA weights are used when the run kept them.
    """
    run_dir = Path(run_dir)
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise ValueError(f"run_dir must be an attnlab run directory with config.yaml; {run_dir} has none")
    recipe = from_dict(Recipe, yaml.safe_load(config.read_text()) or {})
    root = run_dir / "checkpoints"
    if checkpoint == "auto":
        checkpoint = "best" if (root / "best").is_dir() else "last"
    folder = resolve_checkpoint(root, checkpoint)
    weights, state = load_checkpoint(folder)
    model = create_model(recipe.model.name, **recipe.model.options)
    model.load_state_dict(state.get("ema") or weights)
    return recipe, model.eval(), folder


@torch.no_grad()
def evaluate_run(run_dir: str | Path, checkpoint: str = "auto", batch_size: int = 256,
                 device: str = "auto") -> dict[str, Any]:
    """Test loss and accuracy of a run's checkpoint, recomputed from the data."""
    recipe, model, folder = load_run(run_dir, checkpoint)
    device_ = select_device(device)
    model.to(device_)
    _, test_set = build_data(recipe)
    loss_sum, correct = 0.0, 0
    for start in range(0, len(test_set), batch_size):
        x, y = test_set.get_batch(list(range(start, min(start + batch_size, len(test_set)))))
        out = model(x.to(device_)).float().cpu()
        loss_sum += F.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(-1) == y).sum().item()
    n = len(test_set)
    return {"accuracy": correct / n, "loss": loss_sum / n, "samples": n, "checkpoint": str(folder)}


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
        raise ValueError(f"FILE {str(path)!r} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"FILE {str(path)!r} is not a readable image ({exc})") from None
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

