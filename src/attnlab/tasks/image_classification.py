"""Image classification: data set and model from a recipe, trained by the engine."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from ..data import load_digits_dataset
from ..data.images import CIFAR10
from ..data.transforms import cifar_eval_transforms, cifar_train_transforms, digits_transforms
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
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(run_dir / "config.yaml", yaml.safe_dump(asdict(recipe), sort_keys=False).encode())
    train_set, test_set = build_data(recipe)
    model = create_model(recipe.model.name, **recipe.model.options)
    trainer = Trainer(model, train_set, recipe.train, eval_data=test_set, run_dir=run_dir, log=log)
    if resume:
        trainer.resume()
    start = time.perf_counter()
    fit = trainer.fit()
    trainer.save()
    test = trainer.evaluate(test_set)
    results = {"test_accuracy": test["accuracy"], "test_loss": test["loss"], "params": count_parameters(model),
               "train_seconds": fit["train_seconds"], "samples_per_s": fit["samples_per_s"], "steps": fit["steps"],
               "wall_seconds": time.perf_counter() - start, "model": recipe.model.name}
    atomic_write_bytes(run_dir / "results.json", json.dumps(results, indent=1).encode())
    return results
