"""A pretrained decoder's Hugging Face folder (or GGUF file) as a language model: which folders
are decoders (:data:`DECODER_TYPES`), what a run from one may set (:data:`TRAINING_OPTIONS`,
:data:`FOLDER_TEXT_KEYS`), its ``generation_config.json`` as sampling defaults
(:func:`folder_sampling`), and the folder read as a finished run (:func:`load_folder`), which
``attnlab generate FOLDER "prompt"`` continues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..data.tokenizers.lm import GENERATION_CONFIG, LMTokenizer
from ..engine.device import select_device
from ..errors import InputError
from ..formats.hf.files import open_checkpoint
from ..formats.hf.load import HF_FAMILIES, from_hf, hf_model_spec, is_pretrained
from ..formats.packaged import resolve_packaged
from ..generation.sampling import check_generation
from ..io import read_json_mapping
from ..models.gpt import GPT
from ..run.recipe import ModelConfig, Recipe
from ..run.task import get_task
from ..run.trained import TrainedRun
from .lm_recipe import DEFAULT_MAX_NEW_TOKENS, LanguageModelingRecipe, LMTextConfig, SampleConfig

__all__ = ["DECODER_TYPES", "TRAINING_OPTIONS", "FOLDER_TEXT_KEYS", "folder_of", "check_decoder", "check_vocabulary",
           "folder_sampling", "load_folder"]


DECODER_TYPES = tuple(kind for kind, family in HF_FAMILIES.items() if family.model is GPT)
"""The ``model_type`` values of ``config.json`` whose folders a language model starts from
(those that :func:`~attnlab.formats.from_hf` reads as a :class:`~attnlab.models.gpt.GPT`)."""

# model.options that a run from a pretrained folder may set: how it trains, not what its weights compute
TRAINING_OPTIONS = ("drop_rate", "attn_drop_rate", "grad_checkpointing")
# the text keys whose values the folder's tokenizer.json decides
FOLDER_TEXT_KEYS = ("tokenizer", "vocab_size", "min_frequency", "tokenizer_file")


def folder_of(recipe: Recipe) -> Path | None:
    """``model.checkpoint`` when it is a Hugging Face folder or a GGUF file, else ``None``."""
    source = recipe.model.checkpoint
    return Path(source).expanduser() if source is not None and is_pretrained(source) else None


def check_decoder(folder: Path, key: str) -> None:
    """Refuse a folder whose ``config.json`` is not of a decoder that attnlab reads, naming ``key``."""
    checkpoint = open_checkpoint(folder)
    file, kind = checkpoint.config_file, checkpoint.config().get("model_type")
    if kind not in DECODER_TYPES:
        what = {"vit": "an image model"}.get(kind, "an encoder" if kind in HF_FAMILIES else "a model attnlab does not "
                                             "read")
        raise InputError(f"{key}: {file} has model_type {kind!r} ({what}); a language model (lm-text, the "
                         f"language_modeling task) starts from a decoder folder: model_type "
                         f"{', '.join(DECODER_TYPES)}")


def check_vocabulary(tokenizer: LMTokenizer, options: dict[str, Any], folder: Path) -> None:
    """The folder's tokenizer gives no id past its model's embedding."""
    if tokenizer.vocab_size > options["vocab_size"]:
        raise InputError(f"{folder / 'tokenizer.json'} has {tokenizer.vocab_size:,} tokens but the model of "
                         f"{folder / 'config.json'} embeds {options['vocab_size']:,} (vocab_size): ids past it have no "
                         f"embedding")


def folder_sampling(folder: str | Path) -> SampleConfig:
    """The sampling defaults of a Hugging Face folder, read from its ``generation_config.json``
    as ``model.generate`` reads them: ``do_sample`` false (its default) decodes greedily,
    true samples at ``temperature`` (default 1.0) within ``top_k`` (50), ``top_p`` (1.0) and
    ``min_p``; ``repetition_penalty`` (1.0) applies either way; ``max_new_tokens`` (absent:
    attnlab's 200, which a model with learned positions cuts where they end); ``stop_strings``
    end a continuation. ``max_length`` (prompt and continuation together) is not read. A
    value out of its range is one error naming the file and its key."""
    file = Path(folder).expanduser() / GENERATION_CONFIG
    config = read_json_mapping(file) if file.is_file() else {}
    sample = config.get("do_sample")
    if sample is not None and not isinstance(sample, bool):
        raise InputError(f"{file}: do_sample must be true or false; got {sample!r}")

    def given(key: str, default: Any) -> Any:
        return default if config.get(key) is None else config[key]

    options = {"max_new_tokens": given("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
               "temperature": given("temperature", 1.0) if sample else 0.0, "top_k": given("top_k", 50),
               "top_p": given("top_p", 1.0), "min_p": config.get("min_p"),
               "repetition_penalty": given("repetition_penalty", 1.0)}
    if config.get("stop_strings") is not None:
        options["stop"] = config["stop_strings"]
    keys = {"stop": "stop_strings"}
    options = check_generation(names=lambda key: f"{file}: {keys.get(key, key)}", **options)
    return SampleConfig(**options)


def load_folder(folder: str | Path, *, device: str = "cpu") -> TrainedRun:
    """A Hugging Face decoder folder (of a family in :data:`attnlab.families.DECODERS`: ``config.json``,
    its weights, ``tokenizer.json``) as a finished language-model run, whose ``task.stream`` and
    ``predict`` continue prompts as a run's do (``attnlab generate FOLDER "prompt"``): its
    model (:func:`~attnlab.formats.from_hf`, float32, eval mode, on ``device``), its tokenizer
    with the folder's special tokens, stop ids and chat template
    (:class:`~attnlab.data.tokenizers.lm.HFTokenizer`), and a recipe whose ``generate`` section
    holds the defaults of its ``generation_config.json`` (:func:`folder_sampling`). A folder
    that is not a decoder's, or lacks ``tokenizer.json``, is refused naming the file; a packaged
    model's name (``"smollm2-135m-instruct"``) is its installed file."""
    path = Path(resolve_packaged(folder) if isinstance(folder, str) else folder).expanduser()
    if not is_pretrained(path):
        raise InputError(f"folder must be a Hugging Face checkpoint folder (config.json, model.safetensors, "
                         f"tokenizer.json) or a GGUF file; {path} "
                         f"{'has no config.json' if path.is_dir() else 'is neither' if path.exists() else 'is missing'}")
    check_decoder(path, str(path))
    tokenizer = open_checkpoint(path).tokenizer()
    name, options = hf_model_spec(path)
    check_vocabulary(tokenizer, options, path)
    recipe = LanguageModelingRecipe(model=ModelConfig(name, options, checkpoint=str(path)),
                                    text=LMTextConfig(context=options["max_len"]), generate=folder_sampling(path))
    model = from_hf(path).to(select_device(device))
    return TrainedRun(get_task("language_modeling"), path, recipe, model, path,
                      tokenizer=tokenizer)  # type: ignore[arg-type]  # an LMTokenizer
