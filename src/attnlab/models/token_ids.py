"""The check that every model reading token ids makes: ids outside the vocabulary are the
caller's mistake, said in one line, instead of torch's ``index out of range in self`` (CPU)
or a device-side assert that poisons the CUDA context (GPU).

Its cost: one ``aminmax`` reduction and one read of its two numbers, small against the
embedding lookup that follows it, for a training batch as for one decoding step. On CPU
reading the numbers costs nothing more, so the check always runs there.
On CUDA reading them waits for the GPU (a host sync): a training step (gradients on) skips
the check, so that the GPU's queue never stalls on it, and ids that come from
the run's own tokenizer are in range by construction; evaluation, prediction and
generation (gradients off), where a user's ids arrive, check. Graphs being captured
(``torch.compile``, ``torch.export``, ``torch.jit.trace``) skip it too: they cannot hold a
branch on the ids' values.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InputError

__all__ = ["check_token_ids"]


def _capturing() -> bool:
    compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(torch.jit.is_tracing() or torch.jit.is_scripting() or (compiling is not None and compiling()))


def check_token_ids(ids: Tensor, vocab_size: int, name: str = "input_ids", size_name: str = "vocab_size") -> None:
    """An :class:`~attnlab.errors.InputError` naming ``name``, an offending value (the smallest
    or the largest id) and the vocabulary size (the model's option ``size_name``) when an id
    of ``ids`` lies outside ``[0, vocab_size)``; see the module docstring for when it is skipped."""
    if ids.numel() == 0 or ids.device.type == "meta" or _capturing():
        return
    if ids.device.type != "cpu" and torch.is_grad_enabled():
        return  # a training step on an accelerator: no host sync (see the module docstring)
    low, high = torch.aminmax(ids)
    low, high = int(low), int(high)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InputError(f"{name} must be token ids in [0, {vocab_size}) ({size_name}={vocab_size}, the model's "
                         f"vocabulary); got {bad}")
