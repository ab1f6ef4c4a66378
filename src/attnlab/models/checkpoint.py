"""Loading foreign checkpoints into attnlab models, safely and with readable key maps."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

__all__ = ["read_state_dict", "timm_vit_to_attnlab", "attnlab_vit_to_timm", "load_checkpoint"]


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Tensors from ``.safetensors``, or from ``.pth``/``.pt``/``.bin`` loaded with
    ``weights_only=True`` (no pickled code runs). A ``{"state_dict": ...}`` or
    ``{"model": ...}`` wrapper is unwrapped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    if path.suffix not in (".pth", ".pt", ".bin"):
        raise ValueError(f"checkpoint must be .safetensors, .pth, .pt or .bin; got {path.name}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # an unpickling error names the forbidden global
        raise ValueError(f"could not load {path} as a weights-only state dict: {exc}") from None
    for key in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return obj


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

    A learned position grid of another size is resized to the model's grid. A head
    whose shape differs (another number of classes) is skipped with a warning, so that
    fine-tuning starts from a fresh head. Any other missing, unexpected or mis-shaped
    key is an error that lists them.
    """
    from ..layers.pos_embed_2d import resample_pos_embed

    state = timm_vit_to_attnlab(read_state_dict(path))
    own = model.state_dict()
    pos = state.get("pos_embed")
    if pos is not None and "pos_embed" in own and pos.shape != own["pos_embed"].shape:
        grid = model.patch_embed.grid_size
        state["pos_embed"] = resample_pos_embed(pos, grid, None, model.num_prefix_tokens)
    skipped = [k for k in ("head.weight", "head.bias") if k in state and k in own and state[k].shape != own[k].shape]
    for k in skipped:
        del state[k]
    if skipped:
        warnings.warn(f"{path}: head has another number of classes; it was not loaded ({', '.join(skipped)})")
    bad_shapes = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                  for k, v in state.items() if k in own and v.shape != own[k].shape]
    missing = sorted(set(own) - set(state) - set(skipped))
    unexpected = sorted(set(state) - set(own))
    if bad_shapes or missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        if bad_shapes:
            parts.append(f"shape mismatches: {'; '.join(bad_shapes)}")
        raise ValueError(f"checkpoint {path} does not fit {type(model).__name__}: " + " | ".join(parts))
    model.load_state_dict(state, strict=not skipped)
    return model
