"""Training recipes shipped with attnlab: YAML files, validated against :class:`Recipe`."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from ..engine.config import ConfigError, apply_overrides, from_dict
from ..engine.trainer import TrainConfig
from ..errors import InputError
from ..suggest import did_you_mean

__all__ = ["Recipe", "DataConfig", "ModelConfig", "TextConfig", "TranslateConfig", "list_recipes", "load_recipe"]


@dataclass
class DataConfig:
    name: Literal["digits", "cifar10", "mr", "multi30k"] = "digits"
    data_dir: str | None = None  # default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab
    augment: bool = False
    # MR: "split" trains on a fixed 80/10/10 split (dev for model selection, test once);
    # "cv10" is the standard protocol: 10 stratified folds, mean and spread of test accuracy.
    protocol: Literal["split", "cv10"] = "split"
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the split and the folds
    source: Literal["de", "en", "fr", "cs"] = "de"  # translation: source and target languages
    target: Literal["de", "en", "fr", "cs"] = "en"


@dataclass
class TextConfig:
    """Tokenization of text tasks (ignored by image tasks)."""

    tokenizer: Literal["wordpiece", "bpe"] = "wordpiece"
    vocab_size: int = field(default=8000, metadata={"min": 263})
    lowercase: bool = True
    min_frequency: int = field(default=1, metadata={"min": 0})
    max_length: int = field(default=64, metadata={"min": 3})  # tokens per text, [CLS] and [SEP] included
    tokenizer_file: str | None = None  # a tokenizer.json to use instead of training one
    joint_vocab: bool = True  # translation: one vocabulary (and embedding) for both languages


@dataclass
class TranslateConfig:
    """Decoding and scoring of translation runs (ignored by other tasks)."""

    num_beams: int = field(default=4, metadata={"min": 1})
    length_penalty: float = field(default=1.0, metadata={"min": 0.0})  # hypotheses ranked by log p / length**this
    batch_size: int = field(default=64, metadata={"min": 1})  # sentences per decoding batch
    average_checkpoints: int = field(default=0, metadata={"min": 0})  # average the last N checkpoints (0, 1: no)
    checkpoint: str = "auto"  # weights to translate with: auto (averaged > best > last), best, last, averaged


@dataclass
class ModelConfig:
    name: str = "vit_digits_patch2"
    options: dict = field(default_factory=dict)


@dataclass
class Recipe:
    description: str = ""
    task: Literal["image_classification", "sentiment", "translation"] = "image_classification"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    text: TextConfig = field(default_factory=TextConfig)
    translate: TranslateConfig = field(default_factory=TranslateConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        wanted = {"image_classification": ("digits", "cifar10"), "sentiment": ("mr",),
                  "translation": ("multi30k",)}[self.task]
        if self.data.name not in wanted:
            raise InputError(f"data.name must be one of {', '.join(map(repr, wanted))} for task {self.task!r}; "
                             f"got {self.data.name!r}")
        if self.task == "translation":
            if self.data.source == self.data.target:
                raise InputError(f"data.source and data.target must differ; got {self.data.source!r} for both")
            if self.text.tokenizer_file and not self.text.joint_vocab:
                raise InputError("text.tokenizer_file gives one joint vocabulary; set text.joint_vocab=true with it")
            if self.translate.average_checkpoints > self.train.keep_checkpoints:
                raise InputError(
                    f"translate.average_checkpoints must not exceed train.keep_checkpoints (the checkpoints kept); "
                    f"got {self.translate.average_checkpoints} > {self.train.keep_checkpoints}")


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
