"""The weights of a run: those it starts from (``model.checkpoint``: a state-dict file, an
attnlab run directory or a Hugging Face folder), what of them trains
(``model.freeze_backbone``, ``model.backbone_lr_scale``, ``model.lora``), and a finished
run's checkpoint loaded back.

A LoRA run's checkpoints hold the adapters and the head alone; their manifest records
the *base*: the source of the frozen weights and the sha256 of each file they are read
from (:func:`base_reference`). Loading such a checkpoint loads the base first and refuses
a base that has changed since the run trained (:func:`load_base`), since adapters fit
only the weights they were trained on.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from torch import nn

from ..engine.checkpoint import (MANIFEST, checkpoint_base, load_checkpoint, load_weights_into,
                                 resolve_checkpoint)
from ..errors import InputError
from ..io import read_json_mapping, read_state_dict, sha256_file
from ..layers.lora import is_adapter_key, mark_only_lora_trainable
from ..layers.norms import freeze_batch_norm
from ..models.checkpoint import classifier_name, load_pretrained
from ..models.convert import ConvertAttention, convert_weights
from ..formats.hf.load import is_hf_folder, is_pretrained, read_hf, weight_files
from .recipe import ModelConfig
from .files import resolve_weights

__all__ = ["init_weights", "fine_tuning", "base_reference", "load_base", "load_weights"]


def init_weights(model: nn.Module, source: str | Path, classes: Sequence[str] | None = None,
                 convert: ConvertAttention | None = None, inputs: Sequence[Any] = ()) -> list[str]:
    """Load the weights of ``source`` (a state-dict file, timm's layout or attnlab's, a run
    directory: the weights its test figures came from, or a Hugging Face folder) into
    ``model`` for fine-tuning (its LoRA adapters, if any, are left as they are);
    returns the classifier keys left fresh: the number of classes differs, or (a run
    directory with ``classes.json``) their names do, given ``classes``. ``convert``
    (``model.convert_attention``, with a folder or a GGUF file): the folder's weights made
    into those of the converted ``model`` first (:func:`~attnlab.models.convert.convert_weights`,
    weighing the activations of ``inputs``)."""
    path = Path(source).expanduser()
    if is_pretrained(path):  # a Hugging Face folder or a GGUF file: its weights in attnlab's names
        _, cfg, weights = read_hf(path)
        if getattr(cfg, "tie_embeddings", False) and "head.weight" not in weights and "tok_embed.weight" in weights:
            weights["head.weight"] = weights["tok_embed.weight"]  # a tied output layer is the embedding, not a new head
        if convert is not None:
            weights = convert_weights(weights, asdict(cfg), convert, inputs)
        return load_pretrained(model, weights, path)
    if path.is_dir():
        folder = resolve_checkpoint(path / "checkpoints", resolve_weights(path))
        weights, state = load_checkpoint(folder)
        base = checkpoint_base(folder)
        if base is not None:
            raise InputError(f"model.checkpoint: {path} is a LoRA run, whose checkpoints hold its adapters alone; "
                             f"export it (attnlab export merges them) or start from its base, {base.get('source')}")
        theirs = read_json_mapping(path / "classes.json").get("classes") if (path / "classes.json").is_file() else None
        other = classes is not None and theirs is not None and list(theirs) != list(classes)
        return load_pretrained(model, state.get("ema") or weights, folder, new_head=other)
    return load_pretrained(model, read_state_dict(path), path)


def fine_tuning(model: nn.Module, config: ModelConfig, log: Any = None, *, classifier: bool = True
                ) -> dict[str, float] | None:
    """Apply ``model.freeze_backbone`` (everything but the classifier stops learning, BatchNorm
    statistics included: :func:`~attnlab.layers.norms.freeze_batch_norm`) or ``model.lora``
    (the adapters and, for a ``classifier``, its head learn, nothing else: a language
    model's output layer, often the embedding's own weights, stays frozen) and return the
    ``lr_scales`` of ``model.backbone_lr_scale`` for the trainer. ``log`` hears how many
    parameters train."""
    if not config.freeze_backbone and config.backbone_lr_scale == 1.0 and config.lora is None:
        return None
    head = classifier_name(model) if classifier or config.lora is None else None
    if head is None and config.lora is None:
        raise InputError(f"model.freeze_backbone and model.backbone_lr_scale need a model with a classifier head "
                         f"('head' or 'fc'); {type(model).__name__} has none")
    if config.lora is not None:
        total = sum(p.numel() for p in model.parameters())
        trainable = mark_only_lora_trainable(model, keep=[head] if head else [])
        if log is not None:
            log(f"LoRA: {trainable:,} of {total:,} parameters train ({100 * trainable / total:.2f}%): the adapters"
                + (f" and {head}" if head else ""))
    elif config.freeze_backbone:
        for name, p in model.named_parameters():
            if not name.startswith(head + "."):
                p.requires_grad_(False)
        if not any(p.requires_grad for p in model.parameters()):  # a head tied to the embedding is listed under it
            raise InputError(f"model.freeze_backbone=true would train nothing: {type(model).__name__}'s output layer "
                             f"'{head}' is its token embedding's own weights (tied), which freezing the backbone "
                             f"freezes; use model.lora, or model.backbone_lr_scale below 1")
    if config.lora is not None or config.freeze_backbone:
        for name, child in model.named_children():  # and its BatchNorm statistics stay those of the checkpoint
            if name != head:
                freeze_batch_norm(child)
    return None if head is None else {"": config.backbone_lr_scale, head: 1.0}


def _source_files(path: Path) -> list[Path]:
    """The files ``init_weights`` reads the weights of ``path`` from: a Hugging Face folder's
    weight files, a run directory's checkpoint manifest (whose sha256 cover its weights),
    or the file itself."""
    if is_hf_folder(path):
        return weight_files(path)
    if path.is_dir():
        return [resolve_checkpoint(path / "checkpoints", resolve_weights(path)) / MANIFEST]
    return [path]


# sha256 of the base files this process hashed, by (path, size, mtime): a run's evaluation
# and its test both load the base, and a hash reads every byte of it
_hashed: dict[tuple[str, int, int], str] = {}


def _sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _hashed:
        _hashed[key] = sha256_file(path)
    return _hashed[key]


def base_reference(source: str | Path) -> dict[str, Any]:
    """What a LoRA run's checkpoints record of the weights they adapt: ``{"source": the
    absolute path of model.checkpoint, "files": {file: sha256}}``."""
    path = Path(source).expanduser().resolve()
    return {"source": str(path), "files": {str(f): _sha256(f) for f in _source_files(path)}}


def load_base(model: nn.Module, base: dict[str, Any], folder: str | Path) -> set[str]:
    """Load the base weights a checkpoint's manifest records into ``model`` after checking
    that their files are the ones the run trained on; returns the state-dict keys they
    filled (the checkpoint holds the others)."""
    source, files = base.get("source"), base.get("files")
    if not isinstance(source, str) or not isinstance(files, dict):
        raise InputError(f"{Path(folder) / MANIFEST}: its 'base' must give 'source' and 'files'; got {base!r}")
    for name, digest in files.items():
        file = Path(name)
        why = ("is missing" if not file.is_file() else
               "has changed (its sha256 differs)" if _sha256(file) != digest else None)
        if why:
            raise InputError(f"the checkpoint {folder} holds LoRA adapters over the weights of {source}, whose file "
                             f"{file} {why} since the run trained: adapters fit only the weights they were trained "
                             f"on; put that file back, or train again from the new weights")
    fresh = set(init_weights(model, source))
    return {k for k in model.state_dict() if not is_adapter_key(k) and k not in fresh}


def load_weights(run_dir: str | Path, model: nn.Module, checkpoint: str = "auto") -> Path:
    """Load a run's checkpoint into ``model`` (EMA weights when the run kept them; over its
    base weights for a LoRA run) and return its folder; see
    :func:`~attnlab.run.files.resolve_weights` for ``checkpoint``."""
    run_dir = Path(run_dir)
    folder = resolve_checkpoint(run_dir / "checkpoints", resolve_weights(run_dir, checkpoint))
    weights, state = load_checkpoint(folder)
    base = checkpoint_base(folder)
    filled = load_base(model, base, folder) if base is not None else set()
    load_weights_into(model, state.get("ema") or weights, folder, base_keys=filled)
    return folder
