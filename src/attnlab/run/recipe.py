"""A recipe's typed configuration: the keys every task has (:class:`Recipe`, its ``model``
section :class:`ModelConfig` with :class:`LoRAConfig`; each task subclasses it with its own
sections), a recipe as plain data (:func:`recipe_dict`), and the model a recipe names
(:func:`pretrained_model`, :func:`model_label`, :func:`require_model`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from ..data.source import SourceConfig
from ..engine.config import ConfigError
from ..engine.trainer import TrainConfig
from ..errors import InputError
from ..models.convert import ConvertAttention, convert_options
from ..formats.hf.load import hf_model_spec, is_pretrained
from ..formats.hf.files import open_checkpoint

__all__ = ["DataConfig", "LoRAConfig", "ModelConfig", "Recipe", "recipe_dict", "pretrained_model", "model_label", "require_model"]


DataConfig = SourceConfig
"""A recipe's ``data`` section: a registered source's config (:mod:`attnlab.data.source`),
or the plain section of a task of one's own that reads its own data."""


@dataclass
class LoRAConfig:
    """``model.lora``: LoRA adapters (:mod:`attnlab.layers.lora`) of rank ``rank``, scaled by
    ``alpha / rank``, on the linear layers of ``targets``: roles (``attention``: the query,
    key, value and output projections; ``mlp``: the feed-forward layers), layer names
    (``q_proj``) or patterns over qualified names (``blocks.*.attn.out_proj``); ``dropout``
    on the adapters' input. Only the adapters and the classifier head train; checkpoints
    hold them alone, with the sha256 of the frozen weights they adapt."""

    rank: int = field(default=8, metadata={"min": 1})  # the adapters' rank r
    alpha: float = field(default=16.0, metadata={"gt": 0.0})  # the update is scaled by alpha / rank
    dropout: float = field(default=0.0, metadata={"min": 0.0, "lt": 1.0})  # on the adapters' input
    targets: list = field(default_factory=lambda: ["attention"])  # roles (attention, mlp), layer names or patterns


@dataclass
class ModelConfig:
    name: str = ""  # a registered model (attnlab models)
    options: dict = field(default_factory=dict)  # overrides of its configuration, checked against it
    # Weights to start from (fine-tuning): a timm-layout .safetensors/.pth state dict, an attnlab run directory,
    # or a Hugging Face folder (BERT, RoBERTa, DistilBERT, ViT: its model becomes the run's, see pretrained_model).
    # A classifier head for another number of classes is replaced; every other key must fit.
    checkpoint: str | None = None
    freeze_backbone: bool = False  # with checkpoint: train the classifier head alone
    backbone_lr_scale: float = field(default=1.0, metadata={"gt": 0.0, "max": 1.0})  # the rest learns at train.lr x this
    lora: LoRAConfig | None = None  # with checkpoint: low-rank adapters and the head train, the rest stays frozen
    # with a decoder's checkpoint: its layers' attention changed before fine-tuning ({to: sliding, window: 256}
    # or {to: latent, kv_rank: 128})
    convert_attention: ConvertAttention | None = None


@dataclass
class Recipe:
    """A training recipe: the keys every task has. Each task subclasses it with its own
    ``data`` section and sections of its own (``text``, ``translate``, ...), so that a run's
    ``config.yaml`` holds only the keys of its task."""

    description: str = ""
    task: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def recipe_dict(recipe: Recipe) -> dict[str, Any]:
    """A recipe as plain YAML-ready data, in reading order: description, task, data,
    model, the task's own sections, train. The data section holds the keys of its
    source alone."""
    data = dataclasses.asdict(recipe)
    first = ("description", "task", "data", "model")
    return {**{k: data[k] for k in first}, **{k: v for k, v in data.items() if k not in first + ("train",)},
            "train": data["train"]}


def pretrained_model(recipe: Recipe, task: Task | None = None) -> None:
    """When ``model.checkpoint`` is a Hugging Face folder, its model becomes the recipe's:
    ``model.name`` the registered model of its family (``bert_base``, ``roberta_base``,
    ``distilbert_base``, ``vit_base_patch16_224``) and ``model.options`` its configuration,
    under the recipe's own options, so that the run's ``config.yaml`` rebuilds it without the
    folder. ``model.name`` must then be empty or that family's model. ``task`` first refuses a
    folder it cannot start from (:meth:`Task.check_folder`)."""
    source = recipe.model.checkpoint
    if source is None or not is_pretrained(source):
        return
    if task is not None:
        task.check_folder(Path(source).expanduser())
    name, options = hf_model_spec(source)
    if recipe.model.name not in ("", name):
        raise ConfigError(f"model.name must be empty or {name!r} with model.checkpoint={source} (a Hugging Face "
                          f"folder of that family); got {recipe.model.name!r}")
    recipe.model.name = name
    recipe.model.options = {**options, **recipe.model.options}
    if recipe.model.convert_attention is not None:
        from ..models.gpt import GPT
        from ..formats.hf.tables import HF_FAMILIES

        family = open_checkpoint(source).config().get("model_type")
        if HF_FAMILIES[family].model is not GPT:
            raise ConfigError(f"model.convert_attention changes a decoder's attention; model.checkpoint={source} is a "
                              f"{family} model")
        recipe.model.options = convert_options(recipe.model.options, recipe.model.convert_attention)


def model_label(model: ModelConfig) -> str:
    """The model a run trains, in a few words, as the banner, the report and the explorer name
    it: the registered model (``vit_digits_patch2``); for a Hugging Face folder its family,
    size and folder (``qwen3 of 2 layers of width 64 from models/qwen``: the registered model
    it is built as, ``llama_tiny`` and its options, is what config.yaml rebuilds); for weights
    of a run or a file, the model and where its weights come from."""
    source = model.checkpoint
    if not source:
        return model.name
    family = None
    if is_pretrained(source):
        try:
            family = open_checkpoint(source).config().get("model_type")
        except InputError:  # a folder gone bad since the run trained: named by what was built
            family = None
    if not isinstance(family, str) or not family:
        return f"{model.name} from {source}"
    depth, width = model.options.get("depth"), model.options.get("embed_dim")
    size = f" of {depth} layers of width {width}" if isinstance(depth, int) and isinstance(width, int) else ""
    return f"{family}{size} from {source}"


def require_model(recipe: Recipe) -> None:
    """A recipe that names no model (``text-classification-pretrained`` takes the model of
    ``model.checkpoint``) cannot train until it has one."""
    if not recipe.model.name:
        raise ConfigError("model.name is empty: give model.checkpoint=FOLDER, a Hugging Face checkpoint folder whose "
                          "model and tokenizer the run starts from, or name a registered model (attnlab models)")
