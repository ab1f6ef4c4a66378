"""Loading foreign checkpoints into attnlab models, safely and with readable key maps."""

from __future__ import annotations

import warnings
from pathlib import Path

from torch import Tensor, nn

from ..attention.projections import upgrade_weights
from ..errors import InputError
from ..io import read_state_dict
from ..layers.lora import is_adapter_key
from ..layers.pos_embed_2d import resample_pos_embed
from ..weight_rules import Rule, apply_map, expand, their_name

__all__ = ["read_state_dict", "timm_vit_to_attnlab", "attnlab_vit_to_timm", "load_checkpoint", "load_pretrained",
           "classifier_name", "CLASSIFIER_NAMES"]


# timm's ViT names -> ours (attnlab.weight_rules' rules). Everything else (blocks.i.norm1,
# mlp.fc1, ...) is named alike.
_TIMM_VIT: list[Rule] = [("blocks.{i}.attn.qkv", tuple(f"blocks.{{i}}.attn.{n}_proj" for n in "qkv"), "split"),
                         ("blocks.{i}.attn.proj", "blocks.{i}.attn.o_proj", "")]
_TIMM_VIT_BACK: list[Rule] = [(ours, theirs, "join" if how == "split" else how) for theirs, ours, how in _TIMM_VIT]


def _depth(state: dict[str, Tensor]) -> int:
    layers = [int(k.split(".")[1]) for k in state if k.startswith("blocks.") and k.split(".")[1].isdigit()]
    return max(layers) + 1 if layers else 0


def timm_vit_to_attnlab(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A timm ViT's state dict in attnlab's names (its packed ``qkv`` cut into the query, key
    and value projections); an attnlab state dict passes unchanged."""
    converted, _, rest = apply_map(state, expand(_TIMM_VIT, _depth(state)))
    return {**rest, **converted}


def attnlab_vit_to_timm(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse map: export an attnlab ViT in timm's layout."""
    converted, _, rest = apply_map(state, expand(_TIMM_VIT_BACK, _depth(state)))
    return {**rest, **converted}


def _timm_name(key: str) -> str:
    """The timm name of attnlab's ``key`` (for messages), by the same rules."""
    return their_name(key, _TIMM_VIT)


CLASSIFIER_NAMES = ("head", "fc")  # where attnlab's (and timm's) classifiers keep their final linear layer


def classifier_name(model: nn.Module) -> str | None:
    """The attribute holding ``model``'s classifier (a linear layer): ``"head"`` or ``"fc"``."""
    return next((n for n in CLASSIFIER_NAMES if isinstance(getattr(model, n, None), nn.Linear)), None)


def load_checkpoint(model: nn.Module, path: str | Path) -> nn.Module:
    """Load a timm-layout (or attnlab-layout) checkpoint file into ``model`` (see
    :func:`load_pretrained`); warns when the classifier head was left fresh."""
    dropped = load_pretrained(model, read_state_dict(path), path)
    if dropped:
        warnings.warn(f"{path}: the checkpoint's classifier head does not fit this model's "
                      f"num_classes and was not loaded ({', '.join(dropped)}); it starts fresh")
    return model


def load_pretrained(model: nn.Module, state: dict[str, Tensor], source: str | Path, *,
                    new_head: bool = False) -> list[str]:
    """Load ``state`` (timm's ViT names are read as attnlab's) into ``model`` for fine-tuning.

    * A learned position grid of another (square) size is resized to the model's grid.
    * A classifier head (``head`` or ``fc``) for another number of classes is not loaded,
      so that fine-tuning starts from a fresh head; neither is any head when the model
      has none (``num_classes=0``), nor with ``new_head`` (the classes differ by name).
      Returns the model keys so left fresh.
    * Any other missing, unexpected or mis-shaped key is an error that lists them, in
      the checkpoint's own (timm) names.
    """
    state = upgrade_weights(model, timm_vit_to_attnlab(dict(state)))
    own = {k: v for k, v in model.state_dict().items() if not is_adapter_key(k)}  # LoRA's adapters keep theirs
    dropped_head = _drop_foreign_head(state, own, classifier_name(model) or "head", always=new_head)
    if "pooler.weight" in state and "pooler.weight" not in own and getattr(getattr(model, "config", None), "pooler",
                                                                           None) == "mean":
        state.pop("pooler.weight")  # a model that pools by the mean has no dense pooler to fill
        state.pop("pooler.bias", None)
    pos = state.get("pos_embed")
    ckpt_prefix = int("cls_token" in state)
    if (pos is not None and "pos_embed" in own and pos.shape != own["pos_embed"].shape and hasattr(model, "patch_embed")
            and ckpt_prefix == getattr(model, "num_prefix_tokens", -1) and pos.shape[-1] == own["pos_embed"].shape[-1]):
        # Only a square grid can be inferred from a count; a non-square one must match.
        state["pos_embed"] = resample_pos_embed(pos, model.patch_embed.grid_size, None, ckpt_prefix)
    bad_shapes = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                  for k, v in state.items() if k in own and v.shape != own[k].shape]
    missing = sorted(set(own) - set(state) - set(dropped_head))
    unexpected = sorted(set(state) - set(own))
    if bad_shapes or missing or unexpected:
        timm_name = _timm_name

        def few(keys: list[str]) -> str:
            return ", ".join(keys[:40]) + (f" and {len(keys) - 40} more" if len(keys) > 40 else "")

        parts = []
        if missing:
            parts.append(f"missing keys: {few([timm_name(k) for k in missing])}")
        if unexpected:
            parts.append(f"unexpected keys: {few([timm_name(k) for k in unexpected])}")
        if bad_shapes:
            parts.append("shape mismatches: " + few([timm_name(b.split(':')[0]) + ':' + b.split(':', 1)[1]
                                                     for b in bad_shapes]))
        raise InputError(f"checkpoint {source} does not fit {type(model).__name__}: " + " | ".join(parts))
    model.load_state_dict(state, strict=not dropped_head and len(own) == len(model.state_dict()))
    return dropped_head


def _drop_foreign_head(state: dict[str, Tensor], own: dict[str, Tensor], head: str = "head",
                       always: bool = False) -> list[str]:
    """Remove a head made for another number of classes (same input width; with
    ``always``, for the same number) from ``state``, or any head when the model has
    none; return the model keys left unset: those, or the model's head when the
    checkpoint has none (a backbone saved without a classifier, such as ``ViTModel``)."""
    keys = (f"{head}.weight", f"{head}.bias")
    weight = state.get(keys[0])
    if weight is None:
        return [k for k in keys if k in own and k not in state]
    if keys[0] not in own:  # num_classes=0: the model has no head to fill
        for k in keys:
            state.pop(k, None)
        return []
    mine = own[keys[0]]
    if weight.shape[1:] != mine.shape[1:] or (weight.shape[0] == mine.shape[0] and not always):
        return []  # a width mismatch is an error reported with the others
    for k in keys:
        state.pop(k, None)
    return [k for k in keys if k in own]
