"""A language model back out to the ecosystem: a run's decoder (LoRA merged) as a Hugging Face
folder (:mod:`attnlab.formats.hf.export`) or a GGUF file (:mod:`attnlab.formats.gguf.writer`),
which ``transformers``, llama.cpp and attnlab read with the same greedy tokens.

::

    run = load_run("runs/shakespeare-lora")
    export_language_model(run, "out/hf", "hf")                 # config.json, model.safetensors, tokenizer
    export_language_model(run, "out/model.gguf", "gguf", weight_type="q8_0")
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..layers.lora import lora_layers, merge_lora
from ..formats.gguf.writer import GGUF_TYPES, save_gguf
from ..models.gpt import GPT
from ..formats.hf.export import save_hf

__all__ = ["MODEL_FORMATS", "ModelExport", "export_language_model", "default_model_out"]

MODEL_FORMATS = ("hf", "gguf")


@dataclass
class ModelExport:
    """What :func:`export_language_model` wrote: the folder or file, its format, the GGUF
    weights' type, and the largest logit difference of the written model read back."""

    path: Path
    format: str
    weight_type: str | None
    difference: float
    lora_merged: int


def default_model_out(run_dir: str | Path, format: str, weight_type: str = "f16") -> Path:
    """``RUN_DIR/export/hf`` or ``RUN_DIR/export/model-<type>.gguf``."""
    return Path(run_dir) / "export" / ("hf" if format == "hf" else f"model-{weight_type}.gguf")


def check_model_format(format: str, weight_type: str | None) -> None:
    """``format`` and ``weight_type`` as a command line gives them, before any work."""
    if format not in MODEL_FORMATS:
        raise InputError(f"format must be one of {', '.join(MODEL_FORMATS)}; got {format!r}")
    if weight_type is not None and (format != "gguf" or weight_type not in GGUF_TYPES):
        raise InputError(f"--gguf-type takes {', '.join(GGUF_TYPES)}, with --format gguf; got {weight_type!r} with "
                         f"--format {format}")


def export_language_model(run: Any, out: str | Path, format: str = "hf", *, weight_type: str | None = None,
                          overwrite: bool = False) -> ModelExport:
    """Write ``run``'s language model (a :class:`~attnlab.models.gpt.GPT` with the pretrained
    tokenizer it was fine-tuned with) as ``format``: ``"hf"`` (the folder ``out``) or
    ``"gguf"`` (the file ``out``, 2-D weights of ``weight_type``: ``f32``, ``f16``
    (default), ``q8_0``). LoRA adapters are merged into a copy of the weights; the run is
    left as it is."""
    check_model_format(format, weight_type)
    model = run.model
    if not isinstance(model, GPT):
        raise InputError(f"run_dir must be a language-model run (a decoder) for --format {format}; "
                         f"{run.run_dir} is a {run.task.name} run (its classifiers export as onnx or torchscript)")
    if not hasattr(run.tokenizer, "special"):
        raise InputError(f"--format {format} writes a model with its pretrained tokenizer; {run.run_dir} was trained "
                         f"with a tokenizer of its own ({type(run.tokenizer).__name__}), which neither transformers nor "
                         f"llama.cpp reads: start the run from a pretrained model (model.checkpoint=)")
    merged = len(lora_layers(model))
    if merged:
        model = merge_lora(copy.deepcopy(model))
    model = model.eval()
    with torch.no_grad():
        if format == "hf":
            path, difference = save_hf(model, run.tokenizer, out, overwrite=overwrite)
        else:
            path, difference = save_gguf(model, run.tokenizer, out, weight_type or "f16", overwrite=overwrite,
                                         name=Path(run.run_dir).name)
    return ModelExport(Path(path), format, weight_type or ("f16" if format == "gguf" else None), difference, merged)
