"""Training recipes shipped with attnlab: YAML files, validated against :class:`Recipe`."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from ..engine.config import ConfigError, apply_overrides, from_dict
from ..engine.trainer import TrainConfig
from ..suggest import did_you_mean

__all__ = ["Recipe", "DataConfig", "ModelConfig", "TextConfig", "list_recipes", "load_recipe"]


@dataclass
class DataConfig:
    name: Literal["digits", "cifar10", "mr"] = "digits"
    data_dir: str | None = None  # default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab
    augment: bool = False
    # MR: "split" trains on a fixed 80/10/10 split (dev for model selection, test once);
    # "cv10" is the standard protocol: 10 stratified folds, mean and spread of test accuracy.
    protocol: Literal["split", "cv10"] = "split"
    seed: int = 0  # of the split and the folds


@dataclass
class TextConfig:
    """Tokenization of text tasks (ignored by image tasks)."""

    tokenizer: Literal["wordpiece", "bpe"] = "wordpiece"
    vocab_size: int = field(default=8000, metadata={"min": 263})
    lowercase: bool = True
    min_frequency: int = field(default=1, metadata={"min": 0})
    max_length: int = field(default=64, metadata={"min": 3})  # tokens per text, [CLS] and [SEP] included
    tokenizer_file: str | None = None  # a tokenizer.json to use instead of training one


@dataclass
class ModelConfig:
    name: str = "vit_digits_patch2"
    options: dict = field(default_factory=dict)


@dataclass
class Recipe:
    description: str = ""
    task: Literal["image_classification", "sentiment"] = "image_classification"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    text: TextConfig = field(default_factory=TextConfig)

    def __post_init__(self) -> None:
        wanted = {"image_classification": ("digits", "cifar10"), "sentiment": ("mr",)}[self.task]
        if self.data.name not in wanted:
            raise ValueError(f"data.name must be one of {', '.join(map(repr, wanted))} for task {self.task!r}; "
                             f"got {self.data.name!r}")
    train: TrainConfig = field(default_factory=TrainConfig)


def _shipped() -> dict[str, Any]:
    folder = resources.files(__name__)
    return {p.name[: -len(".yaml")]: p for p in folder.iterdir() if p.name.endswith(".yaml")}


def list_recipes() -> list[tuple[str, str]]:
    """``(name, description)`` of every shipped recipe."""
    return [(name, yaml.safe_load(path.read_text()).get("description", "")) for name, path in sorted(_shipped().items())]


def load_recipe(name_or_path: str, overrides: list[str] = ()) -> Recipe:
    """A shipped recipe by name, or a YAML file by path, with ``key.sub=value`` overrides."""
    shipped = _shipped()
    if name_or_path in shipped:
        text = shipped[name_or_path].read_text()
    elif Path(name_or_path).is_file():
        text = Path(name_or_path).read_text()
    else:
        raise ConfigError(f"unknown recipe {name_or_path!r} (neither a shipped recipe nor a file)"
                          + did_you_mean(name_or_path, shipped, "recipes"))
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {name_or_path!r} must be a YAML mapping")
    return from_dict(Recipe, apply_overrides(data, overrides))
