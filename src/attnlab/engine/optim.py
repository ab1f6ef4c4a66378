"""Optimizers and learning-rate schedules, model-agnostic.

Weight decay is for weight matrices only: biases, norm scales, embeddings, position
embeddings and special tokens are excluded, as is standard for Transformers (decaying a
LayerNorm gain or a class token only pulls it towards zero for no benefit).
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from ..errors import InputError

__all__ = ["param_groups", "build_optimizer", "warmup_cosine", "NO_DECAY_NAMES"]

# Parameter-name fragments that never get weight decay (besides every 1-D tensor).
NO_DECAY_NAMES = ("pos_embed", "cls_token", "reg_token", "dist_token", "rel_height", "rel_width", "table")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed weight matrices, and everything else with ``weight_decay=0``.

    Excluded from decay: tensors with fewer than 2 dimensions (biases, norm weights),
    all ``nn.Embedding`` weights, and parameters whose names contain one of
    :data:`NO_DECAY_NAMES`. Tied parameters are counted once.
    """
    embedding_params = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if p.dim() < 2 or id(p) in embedding_params or any(tag in name for tag in NO_DECAY_NAMES):
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, name: str = "adamw", lr: float = 1e-3, weight_decay: float = 0.05,
                    betas: Iterable[float] = (0.9, 0.999), momentum: float = 0.9,
                    nesterov: bool = True) -> torch.optim.Optimizer:
    """``"adamw"`` or ``"sgd"`` over :func:`param_groups`."""
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas))  # type: ignore[arg-type]
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0)
    raise InputError(f"optimizer must be 'adamw' or 'sgd'; got {name!r}")


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 0,
                  min_lr_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up from 0 to the base rate over ``warmup_steps``, then a cosine decay
    to ``min_lr_ratio`` x the base rate at ``total_steps``. Step it once per optimizer step."""
    if total_steps <= 0 or not 0 <= warmup_steps <= total_steps:
        raise InputError(f"need 0 <= warmup_steps <= total_steps and total_steps > 0; "
                         f"got warmup_steps={warmup_steps}, total_steps={total_steps}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
