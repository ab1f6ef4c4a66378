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

__all__ = ["Recipe", "DataConfig", "ModelConfig", "list_recipes", "load_recipe"]


@dataclass
class DataConfig:
    name: Literal["digits", "cifar10"] = "digits"
    data_dir: str | None = None  # default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab
    augment: bool = False


@dataclass
class ModelConfig:
    name: str = "vit_digits_patch2"
    options: dict = field(default_factory=dict)


@dataclass
class Recipe:
    description: str = ""
    task: Literal["image_classification"] = "image_classification"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
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
