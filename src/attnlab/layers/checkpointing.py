"""Gradient checkpointing that leaves BatchNorm's running statistics as a plain forward would.

``torch.utils.checkpoint`` runs a module's forward twice: once without keeping activations,
once again in backward. A BatchNorm inside (``nn.BatchNorm2d``, :class:`TokenBatchNorm`)
folds the batch into its running mean and variance, and counts it in
``num_batches_tracked``, both times; after ``.eval()`` the model then computes with other
statistics than it would have without checkpointing. :func:`checkpointed` restores them
after the recomputation, so every model that offers ``set_grad_checkpointing`` trains the
same statistics with it as without.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

__all__ = ["checkpointed"]


@contextlib.contextmanager
def _running_stats_kept(module: nn.Module) -> Iterator[None]:
    """Undo the running-statistics updates of every BatchNorm in ``module`` on exit."""
    bufs = [
        b for m in module.modules() if getattr(m, "track_running_stats", False)
        for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None
    ]
    saved = [b.clone() for b in bufs]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, s in zip(bufs, saved):
                b.copy_(s)


def checkpointed(module: nn.Module, *args: Any, **kwargs: Any) -> Tensor:
    """``module(*args, **kwargs)`` through non-reentrant gradient checkpointing, the
    recomputation in backward leaving the running statistics untouched."""
    return checkpoint(module, *args, use_reentrant=False,
                      context_fn=lambda: (contextlib.nullcontext(), _running_stats_kept(module)), **kwargs)
