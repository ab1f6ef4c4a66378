"""Loading foreign checkpoints into attnlab models, safely and with readable key maps."""

from __future__ import annotations

import warnings
from pathlib import Path

from torch import Tensor, nn

from ..errors import InputError
from ..io import read_state_dict
from ..layers.pos_embed_2d import resample_pos_embed

__all__ = ["read_state_dict", "timm_vit_to_attnlab", "attnlab_vit_to_timm", "load_checkpoint"]


# timm's ViT names -> ours. Everything else (blocks.i.norm1, mlp.fc1, ...) is named alike.
_TIMM_VIT_RENAMES = (
    (".attn.qkv.", ".attn.in_proj."),
    (".attn.proj.", ".attn.out_proj."),
)


def timm_vit_to_attnlab(state: dict[str, Tensor]) -> dict[str, Tensor]:
    out = {}
    for key, value in state.items():
        for old, new in _TIMM_VIT_RENAMES:
            key = key.replace(old, new)
        out[key] = value
    return out


def attnlab_vit_to_timm(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The inverse map: export an attnlab ViT in timm's layout."""
    out = {}
    for key, value in state.items():
        for old, new in _TIMM_VIT_RENAMES:
            key = key.replace(new, old)
        out[key] = value
    return out


def load_checkpoint(model: nn.Module, path: str | Path) -> nn.Module:
    """Load a timm-layout (or attnlab-layout) ViT checkpoint into ``model``.

    * A learned position grid of another (square) size is resized to the model's grid.
    * A classifier head for another number of classes is skipped with a warning, so that
      fine-tuning starts from a fresh head; so is any head when the model has none
      (``num_classes=0``).
    * Any other missing, unexpected or mis-shaped key is an error that lists them, in
      the checkpoint's own (timm) names.
    """
    state = timm_vit_to_attnlab(read_state_dict(path))
    own = model.state_dict()
    dropped_head = _drop_foreign_head(state, own)
    pos = state.get("pos_embed")
    ckpt_prefix = int("cls_token" in state)
    if (pos is not None and "pos_embed" in own and pos.shape != own["pos_embed"].shape
            and ckpt_prefix == model.num_prefix_tokens and pos.shape[-1] == own["pos_embed"].shape[-1]):
        # Only a square grid can be inferred from a count; a non-square one must match.
        state["pos_embed"] = resample_pos_embed(pos, model.patch_embed.grid_size, None, ckpt_prefix)
    bad_shapes = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                  for k, v in state.items() if k in own and v.shape != own[k].shape]
    missing = sorted(set(own) - set(state) - set(dropped_head))
    unexpected = sorted(set(state) - set(own))
    if bad_shapes or missing or unexpected:
        timm_name = lambda k: next(iter(attnlab_vit_to_timm({k: None})))  # noqa: E731
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(map(timm_name, missing))}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(map(timm_name, unexpected))}")
        if bad_shapes:
            parts.append(f"shape mismatches: {'; '.join(timm_name(b.split(':')[0]) + ':' + b.split(':', 1)[1] for b in bad_shapes)}")
        raise InputError(f"checkpoint {path} does not fit {type(model).__name__}: " + " | ".join(parts))
    if dropped_head:
        warnings.warn(f"{path}: the checkpoint's classifier head does not fit this model's "
                      f"num_classes and was not loaded ({', '.join(dropped_head)}); it starts fresh")
    model.load_state_dict(state, strict=not dropped_head)
    return model


def _drop_foreign_head(state: dict[str, Tensor], own: dict[str, Tensor]) -> list[str]:
    """Remove a head made for another number of classes (same input width) from
    ``state``, or any head when the model has none; return the model keys left unset."""
    head = state.get("head.weight")
    if head is None:
        return []
    if "head.weight" not in own:  # num_classes=0: the model has no head to fill
        for k in ("head.weight", "head.bias"):
            state.pop(k, None)
        return []
    mine = own["head.weight"]
    if head.shape[1:] != mine.shape[1:] or head.shape[0] == mine.shape[0]:
        return []  # a width mismatch is an error reported with the others
    for k in ("head.weight", "head.bias"):
        state.pop(k, None)
    return [k for k in ("head.weight", "head.bias") if k in own]
