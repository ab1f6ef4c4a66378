"""What ``attnlab explore`` can look inside, and the views each one gives.

* a run directory or a loaded :class:`~attnlab.tasks.TrainedRun`: its task decides the
  inputs and the views (:meth:`~attnlab.tasks.Task.explore_views`);
* a Hugging Face decoder folder: loaded as a language-model run
  (:func:`~attnlab.tasks.lm_folders.load_folder`), so its prompts are continued;
* a Hugging Face encoder folder (BERT, RoBERTa, DistilBERT): its ``tokenizer.json`` and its
  encoder's self-attention on each text;
* a Hugging Face ViT folder: each image, read as its ``preprocessor_config.json`` says
  (resized to the model's size; its mean and standard deviation, 0.5 when absent).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from PIL import Image

from ...attention.capture import capture_attention
from ...engine.device import select_device
from ...errors import InputError
from ...io import read_json_mapping
from ...formats.gguf.reader import is_gguf
from ...formats.hf.load import HF_FAMILIES, from_hf, is_pretrained
from ...formats.hf.files import open_checkpoint
from ...tasks import TrainedRun, load_run
from ...run.recipe import model_label
from ...run.task import check_texts
from ...tasks.lm_folders import DECODER_TYPES, load_folder
from ...run.views import ImageAttention, TextAttention

__all__ = ["Target", "check_inputs", "load_target", "target_views"]


@dataclass
class Target:
    """A loaded target: a run (``run``) or a Hugging Face encoder or ViT folder (``model``)."""

    title: str
    subtitle: str
    run: TrainedRun | None = None
    model: Any = None
    folder: Path | None = None
    family: str = ""


def check_inputs(inputs: Any) -> list[Any] | None:
    """``inputs`` as a list (one text or file alone is one input), refused when empty or an empty text."""
    if inputs is None:
        return None
    inputs = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    if not inputs:
        raise InputError("inputs must hold at least one text or image file (None: the run's own examples)")
    for i, text in enumerate(inputs):
        if isinstance(text, str) and not text.strip():
            raise InputError(f"inputs[{i}] is an empty text; give words to look at")
    return inputs


def load_target(target: Any, *, checkpoint: str = "auto", device: str = "cpu", has_inputs: bool = True) -> Target:
    """The run or folder ``target`` names, loaded; a folder is refused before loading when
    ``has_inputs`` is false (a folder has no examples of its own)."""
    if isinstance(target, TrainedRun):
        return _run_target(target)
    if not isinstance(target, (str, Path)):
        raise InputError(f"target must be a run directory, a Hugging Face folder, a loaded run or a model "
                         f"(nn.Module); got {type(target).__name__}")
    path = Path(target).expanduser()
    if not path.exists():
        raise InputError(f"TARGET {path} does not exist; give a run directory (attnlab train's) or a Hugging Face "
                         f"folder (config.json and its weights)")
    if (path / "config.yaml").is_file() or (path / "fold_0").is_dir():
        return _run_target(load_run(path, checkpoint, device=device))
    if not is_pretrained(path):
        raise InputError(f"TARGET {path} is neither a run directory (config.yaml), a Hugging Face folder "
                         f"(config.json) nor a GGUF file")
    family = open_checkpoint(path).config().get("model_type")
    source = f"GGUF file ({family}) {path}" if is_gguf(path) else f"Hugging Face {family} folder {path}"
    if not has_inputs:
        raise InputError(f"INPUT must be given for the Hugging Face folder {path}: "
                         f"{'image files' if family == 'vit' else 'texts'} to look at")
    if family in DECODER_TYPES:
        run = load_folder(path, device=device)
        return Target(path.name, source, run=run, folder=path, family=str(family))
    if family not in HF_FAMILIES:
        raise InputError(f"{path / 'config.json'}: model_type {family!r} is not one attnlab reads; it reads "
                         f"{', '.join(HF_FAMILIES)}")
    if family != "vit" and not (path / "tokenizer.json").is_file():
        raise InputError(f"{path} has no tokenizer.json: the explorer labels an encoder's tokens with it")
    model = from_hf(path).to(select_device(device))
    return Target(path.name, source, model=model, folder=path, family=str(family))


def _run_target(run: TrainedRun) -> Target:
    return Target(run.run_dir.name, f"{run.task.name} run {run.run_dir} (model {model_label(run.recipe.model)})", run=run)


def target_views(target: Target, inputs: Sequence[Any] | None, *, max_inputs: int, new_tokens: int) -> list[Any]:
    """The attention views of ``target`` on ``inputs`` (see :mod:`attnlab.run.views`)."""
    inputs = check_inputs(inputs)
    if target.run is not None:
        return target.run.task.explore_views(target.run, inputs, max_inputs=max_inputs, new_tokens=new_tokens)
    if inputs is None:
        raise InputError(f"INPUT must be given for the Hugging Face folder {target.folder}: "
                         f"{'image files' if target.family == 'vit' else 'texts'} to look at")
    if target.family == "vit":
        return _vit_views(target, inputs)
    return _encoder_views(target, check_texts(inputs, f"Hugging Face {target.family}"))


@torch.no_grad()
def _encoder_views(target: Target, texts: list[str]) -> list[Any]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(target.folder / "tokenizer.json"))  # type: ignore[operator]
    tokenizer.no_padding()
    tokenizer.no_truncation()
    model, device = target.model, next(target.model.parameters()).device
    longest = model.config.longest
    views = []
    for text in texts:
        enc = tokenizer.encode(text)
        ids = enc.ids
        if len(ids) > longest:
            raise InputError(f"{text[:40]!r}... gives {len(ids)} tokens; the model's positions hold {longest}")
        with capture_attention(model, cpu=True) as maps:
            model.forward_features(torch.tensor([ids], device=device), torch.ones(1, len(ids), dtype=torch.long,
                                                                                     device=device))
        layers = [(name, calls[0][0]) for name, calls in maps.items() if calls]
        views.append(TextAttention(f'"{text if len(text) <= 60 else text[:57] + "..."}" (self-attention)',
                                   list(enc.tokens), layers))
    return views


@torch.no_grad()
def _vit_views(target: Target, files: list[Any]) -> list[Any]:
    from ...data.kinds.labelled_images import read_image

    model = target.model
    cfg = model.config
    size = tuple(cfg.img_size)
    pre = target.folder / "preprocessor_config.json"  # type: ignore[operator]
    pre_cfg = read_json_mapping(pre) if pre.is_file() else {}
    mean = torch.tensor(pre_cfg.get("image_mean", [0.5, 0.5, 0.5]), dtype=torch.float32)[:, None, None]
    std = torch.tensor(pre_cfg.get("image_std", [0.5, 0.5, 0.5]), dtype=torch.float32)[:, None, None]
    views = []
    for i, f in enumerate(files):
        if not isinstance(f, (str, Path, Image.Image)):
            raise InputError(f"inputs[{i}] must be an image file path or a PIL image for a ViT folder; "
                             f"got {type(f).__name__}")
        image = read_image(f, "RGB" if cfg.in_chans == 3 else "L", size)
        x = ((image.float() / 255 - mean[: cfg.in_chans]) / std[: cfg.in_chans])[None]
        x = x.to(next(model.parameters()).device)
        with capture_attention(model, cpu=True) as maps:
            model.forward_features(x)
        layers = [calls[0][0] for calls in maps.values() if calls]
        grid = (size[0] // cfg.patch_size, size[1] // cfg.patch_size)
        prefix = layers[0].shape[-1] - grid[0] * grid[1]
        name = Path(f).name if isinstance(f, (str, Path)) else "the image"
        views.append(ImageAttention(name, image, layers, grid, prefix, "token"))
    return views
