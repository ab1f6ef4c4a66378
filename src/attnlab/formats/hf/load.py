"""Hugging Face checkpoint folders as attnlab models: ``from_hf(folder)``.

A folder in the Hugging Face layout (``config.json`` and ``model.safetensors``, or an older
``pytorch_model.bin`` read with ``weights_only=True``; from a local disk: nothing is
downloaded) becomes an attnlab model in eval mode:

* decoders of every family in :data:`attnlab.families.DECODERS` (GPT-2 to DeepSeek-V3.2): a
  :class:`~attnlab.models.gpt.GPT`;
* encoders of the families in :data:`attnlab.families.ENCODERS`: a
  :class:`~attnlab.models.encoder.TextEncoder`, with the classification head of a
  ``*ForSequenceClassification`` folder (its class count read off the head's weights), or
  without one (``num_classes=0``: the pooled features) for a bare ``BertModel`` and the like;
* Hugging Face's ViT (``ViTModel``, ``ViTForImageClassification``): a
  :class:`~attnlab.models.vit.VisionTransformer` (timm's layout loads through
  ``model.checkpoint`` as before).

This module builds: the folder's files are read by :mod:`attnlab.formats.hf.files`, each
family's conversion is its entry in :mod:`attnlab.formats.hf.tables`, and every key of
``config.json`` is accounted for by :mod:`attnlab.formats.hf.keys`.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import InputError, shape_str
from ...layers.init import skip_init
from ...memory import gib, require_memory
from ...models.encoder import TextEncoder
from ...models.gpt import GPT
from .files import is_hf_folder, is_pretrained, open_checkpoint, weight_files
from .keys import Reading, check_keys, check_switched_off
from .tables import ENCODER_ARCHITECTURES, HF_FAMILIES, HFFamily, stored_layers
from ..packaged import resolve_packaged
from ...models.vit import VisionTransformer

__all__ = ["from_hf", "read_hf", "hf_model_spec", "is_hf_folder", "is_pretrained", "weight_files", "HF_FAMILIES", "HFFamily",
           "ENCODER_ARCHITECTURES"]


def _convert(folder: Path, family: str, cfg: Any, state: dict[str, Tensor],
             expected: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """``state`` (the checkpoint's tensors, real or meta) in attnlab's names by the family's
    table, and where each came from; a tensor the table leaves over is an error."""
    try:
        weights, source, left = HF_FAMILIES[family].convert(state, cfg, expected)
    except InputError as exc:
        raise InputError(f"{folder}: {exc}") from None
    if left:
        raise InputError(f"{folder}: weights that a {family} model of this config does not have: "
                         f"{', '.join(sorted(left)[:5])}{' ...' if len(left) > 5 else ''}")
    return weights, source




def _config_key(config: dict[str, Any], value: int, fallback: str) -> str:
    """The ``config.json`` key of ``value`` (the keys, when several have it), else ``fallback``."""
    keys = [k for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool) and v == value]
    return " / ".join(keys) or fallback


def _disagreement(config_file: Path, config: dict[str, Any], ours: str, theirs: str | None, stored: Tensor,
                  wanted: Tensor) -> str:
    """Weight ``ours`` (``theirs`` in the checkpoint, when only renamed) of a stored shape
    that is not the model's, said first as the ``config.json`` key whose value is the size
    the model expects where they differ (when one is)."""
    said = f"{ours} has shape {shape_str(stored)} in the checkpoint but {shape_str(wanted)} in its config"
    if stored.dim() == wanted.dim():
        size = next(w for s, w in zip(stored.shape, wanted.shape) if s != w)
        key = _config_key(config, size, "")
        if key:
            return (f"{config_file}: {key} {size} disagrees with the weights: {theirs or ours} is "
                    f"{shape_str(stored)} ({said})")
    return f"{config_file.parent if config_file.name == 'config.json' else config_file}: {said}"


def _inspect_hf(path: Path) -> tuple[Any, str, Any, nn.Module, dict[str, Tensor], dict[str, Tensor]]:
    """``(checkpoint, model_type, attnlab config, its model on the meta device, the
    checkpoint's tensors as meta tensors, the model's tensors to load)`` of a Hugging Face
    folder or a GGUF file (:func:`~attnlab.formats.hf.files.open_checkpoint`): the config
    checked against the weights' headers, each converted weight's shape against the model's,
    before a weight is read or anything of the model's size allocated (a ``vocab_size`` of
    10^10 beside a 300-row embedding is one line naming both)."""
    checkpoint = open_checkpoint(path)
    folder, config_file = checkpoint.path, checkpoint.config_file
    config = checkpoint.config()
    family = config.get("model_type")
    if family not in HF_FAMILIES:
        raise InputError(f"{config_file}: model_type {family!r} is not supported; from_hf reads "
                         f"{', '.join(HF_FAMILIES)}")
    spec = HF_FAMILIES[family]
    headers = checkpoint.headers()
    config = Reading(config)  # the keys its conversion reads are recorded: every other one is accounted for
    config.read.add("model_type")
    try:
        check_switched_off(config)
        cfg = spec.config(config, headers)
        check_keys(config, family)
    except KeyError as exc:
        raise InputError(f"{config_file} lacks the key {exc.args[0]!r} of a {family} config") from None
    except InputError as exc:  # (an InputError is a ValueError: first)
        raise InputError(f"{config_file.parent}/{exc}" if str(exc).startswith("config.json") and
                         config_file.name == "config.json" else f"{config_file}: {str(exc).removeprefix('config.json: ')}"
                         ) from None
    except (TypeError, ValueError) as exc:  # a size that is not a number
        raise InputError(f"{config_file}: a {family} config's value is of the wrong type: {exc}") from None
    # The layers first: a depth of 10^6 is refused here, not a million layers converted and built below.
    depth, stored = getattr(cfg, "depth", 0), len(stored_layers(headers))
    if isinstance(depth, int) and depth > stored:
        raise InputError(f"{config_file}: {_config_key(config, depth, 'depth')} {depth} disagrees with the weights: "
                         f"they hold {stored} layer{'s' * (stored != 1)}")
    try:
        with torch.device("meta"):  # the shapes alone: no memory, whatever config.json says
            model = spec.model(cfg)
    except InputError as exc:
        raise InputError(f"{config_file}: {exc}") from None
    except (TypeError, ValueError) as exc:  # a size that is not a number
        raise InputError(f"{config_file}: a {family} config's value is of the wrong type: {exc}") from None
    tied = bool(getattr(cfg, "tie_embeddings", False))
    expected = {k: v for k, v in model.state_dict().items() if not (tied and k == "head.weight")}
    weights, source = _convert(folder, family, cfg, headers, expected)
    if tied:
        weights.pop("head.weight", None)
    missing = [k for k in expected if k not in weights]
    if missing:
        said = [f"{source[k]} ({k})" if k in source else k for k in missing[:5]]
        raise InputError(f"{folder}: the checkpoint lacks {', '.join(said)}{' ...' if len(missing) > 5 else ''}")
    extra = sorted(k for k in weights if k not in expected)
    if extra:
        raise InputError(f"{folder}: weights that a {family} model of this config does not have: "
                         f"{', '.join(source.get(k, k) for k in extra[:5])}{' ...' if len(extra) > 5 else ''}")
    theirs = {id(t): k for k, t in headers.items()}  # a weight only renamed is the header's own tensor
    for k, wanted in expected.items():  # the model's order: the embeddings first
        stored = weights[k]
        if tuple(stored.shape) != tuple(wanted.shape):
            raise InputError(_disagreement(config_file, config, k, theirs.get(id(stored)), stored, wanted))
    return checkpoint, family, cfg, model, headers, expected


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def read_hf(folder: str | Path) -> tuple[str, Any, dict[str, Tensor]]:
    """``(model_type, attnlab config, weights in attnlab's names)`` of a Hugging Face folder,
    checked as :func:`from_hf` checks it, without building the model: ``config.json``
    against the weight files' headers first, and their size against the memory available,
    before a weight is read."""
    folder = Path(folder).expanduser()
    checkpoint, family, cfg, _, headers, expected = _inspect_hf(folder)
    require_memory(_nbytes(headers.values()), f"{folder}: reading its weights")
    return family, cfg, _convert(folder, family, cfg, checkpoint.weights(), expected)[0]


def hf_model_spec(folder: str | Path) -> tuple[str, dict[str, Any]]:
    """``(model.name, model.options)`` that build the model of a Hugging Face folder through
    :func:`~attnlab.models.create_model`, without what the task decides (its classifier's
    size; an image model's input size and channels, the data's): what a fine-tuning recipe
    records, so that its run rebuilds the model without the folder."""
    _, family, cfg, _, _, _ = _inspect_hf(Path(folder).expanduser())  # no weight read: the run loads them
    # The task's: the classes, and an image model's input (the data's size and channels; a learned position
    # grid of another size is resampled when the weights load).
    task_owned = ("num_classes", "attention", "attention_options", "img_size", "in_chans")
    return HF_FAMILIES[family].registered, {k: v for k, v in asdict(cfg).items() if k not in task_owned}


def from_hf(folder: str | Path, *, dtype: torch.dtype = torch.float32) -> GPT | TextEncoder | VisionTransformer:
    """The model of a Hugging Face checkpoint folder or a GGUF file (llama.cpp's format, read
    with the ``gguf`` package: :mod:`attnlab.formats.gguf.tables`), in eval mode, with its
    weights in ``dtype`` (a quantized GGUF tensor dequantized to float32 first).

    * a decoder (every family of :data:`attnlab.families.DECODERS`): a :class:`~attnlab.models.gpt.GPT`; ``model(ids)`` gives
      ``(B, L, vocab)`` logits and ``model.generate(ids, max_new_tokens=...)`` ``(B, L + new)`` ids.
    * an encoder (:data:`attnlab.families.ENCODERS`): a :class:`~attnlab.models.encoder.TextEncoder`;
      ``model(ids, attention_mask)`` gives ``(B, num_labels)`` logits for a
      ``*ForSequenceClassification`` folder, the pooled features ``(B, hidden)`` for the
      encoder alone; ``model.forward_features(ids, attention_mask)`` the last hidden states.
    * ViT: a :class:`~attnlab.models.vit.VisionTransformer`; ``model(images)`` gives
      ``(B, num_labels)`` logits (``ViTForImageClassification``) or the pooled features
      (``ViTModel``: its pooler's ``tanh(dense(cls))``); ``model.forward_features(images)``
      the last hidden states, after the final norm.

    ``folder`` may also name a packaged model (``"smollm2-135m-instruct"``: what ``make models``
    installs from the package registry, :data:`attnlab.formats.packaged.PACKAGED`)."""
    folder = Path(resolve_packaged(folder) if isinstance(folder, str) else folder).expanduser()
    checkpoint, family, cfg, meta, headers, expected = _inspect_hf(folder)  # every shape checked: what follows only reads and copies
    stored, built = _nbytes(headers.values()), _nbytes([*meta.parameters(), *meta.buffers()])
    require_memory(stored + built, f"{folder}: reading its weights ({gib(stored)}) and building its model "
                                   f"({sum(p.numel() for p in meta.parameters()):,} parameters, float32)")
    weights = _convert(folder, family, cfg, checkpoint.weights(), expected)[0]
    with skip_init():  # every weight is loaded below, strictly: its initial draw would be overwritten
        model = HF_FAMILIES[family].model(cfg)
    tied = bool(getattr(cfg, "tie_embeddings", False))
    if tied:
        weights.pop("head.weight", None)
        if set(model.state_dict()) - set(weights) != {"head.weight"}:  # only the tied head may be left out
            raise AssertionError(f"{folder}: weights left unloaded: {sorted(set(model.state_dict()) - set(weights))}")
    # The read tensors become the parameters (no copy of every weight), converted first
    # where the model keeps another dtype; the tied output layer is the embedding again afterwards.
    kept = model.state_dict()
    weights = {k: w.to(kept[k].dtype).contiguous() for k, w in weights.items()}  # (a no-op where it already is)
    model.load_state_dict(weights, strict=not tied, assign=True)
    if tied:
        model.head.weight = model.tok_embed.weight
    return model.to(dtype).eval()
