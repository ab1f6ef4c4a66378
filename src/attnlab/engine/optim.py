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


def _scale_of(name: str, lr_scales: dict[str, float]) -> float:
    """The scale of the longest prefix of ``lr_scales`` that ``name`` starts with (``""``: all)."""
    best = max((p for p in lr_scales if name == p or name.startswith(p + ".") or p == ""), key=len, default=None)
    return 1.0 if best is None else lr_scales[best]


def param_groups(model: nn.Module, weight_decay: float, lr_scales: dict[str, float] | None = None) -> list[dict]:
    """Two groups: decayed weight matrices, and everything else with ``weight_decay=0``.

    Excluded from decay: tensors with fewer than 2 dimensions (biases, norm weights),
    all ``nn.Embedding`` weights, and parameters whose names contain one of
    :data:`NO_DECAY_NAMES`. Tied parameters are counted once; frozen ones
    (``requires_grad=False``) left out.

    ``lr_scales`` (``{name prefix: multiplier}``; ``""`` matches every parameter, the
    longest matching prefix wins): the two groups for each multiplier, each with an
    ``lr_scale`` key, those of scale 1 first (fine-tuning: ``{"": 0.1, "head": 1.0}``).
    """
    embedding_params = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    lr_scales = lr_scales or {}
    groups: dict[tuple[float, bool], list] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        decayed = not (p.dim() < 2 or id(p) in embedding_params or any(tag in name for tag in NO_DECAY_NAMES))
        groups.setdefault((_scale_of(name, lr_scales), decayed), []).append(p)
    scales = sorted({1.0, *(s for s, _ in groups)}, key=lambda s: (s != 1.0, -s))
    out = []
    for scale in scales:
        for decayed in (True, False):
            if scale == 1.0 or (scale, decayed) in groups:
                group = {"params": groups.get((scale, decayed), []), "weight_decay": weight_decay if decayed else 0.0}
                if lr_scales:
                    group["lr_scale"] = scale
                out.append(group)
    return out


def build_optimizer(model: nn.Module, name: str = "adamw", lr: float = 1e-3, weight_decay: float = 0.05,
                    betas: Iterable[float] = (0.9, 0.999), momentum: float = 0.9,
                    nesterov: bool = True, lr_scales: dict[str, float] | None = None) -> torch.optim.Optimizer:
    """``"adamw"`` or ``"sgd"`` over :func:`param_groups`; a group's rate is ``lr`` times its ``lr_scale``."""
    groups = param_groups(model, weight_decay, lr_scales)
    for group in groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    if name == "adamw":
        # The fused kernel (CPU since torch 2.4, and CUDA): one call for every tensor instead of a Python loop
        # over them, which torch picks by default on the CPU (results page "Why the fast paths", adamw-step).
        # Where the fused kernel does not run, the foreach one.
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=True)  # type: ignore[arg-type]
        except (RuntimeError, TypeError, ValueError):
            return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), foreach=True)  # type: ignore[arg-type]
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
