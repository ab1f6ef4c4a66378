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
from ..data.transforms import DIGITS_MEAN, DIGITS_STD, Normalize, ToFloat
from ..engine.trainer import Trainer
from ..io import atomic_write_bytes
from ..models import count_parameters, create_model
from ..recipes import Recipe


class _Transformed:
    """A dataset whose images pass through ``transform``; ``(image, int label)``."""

    def __init__(self, ds: Any, transform: Callable) -> None:
        self.ds, self.transform = ds, transform

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x, y = self.ds[i]
        return self.transform(x), int(y)


def build_data(recipe: Recipe) -> tuple[Any, Any]:
    if recipe.data.name == "digits":
        prep = lambda x: Normalize(DIGITS_MEAN, DIGITS_STD)(ToFloat()(x))  # noqa: E731
        return _Transformed(load_digits_dataset("train"), prep), _Transformed(load_digits_dataset("test"), prep)
    raise ValueError(f"data.name {recipe.data.name!r} is not wired to a recipe yet")


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
