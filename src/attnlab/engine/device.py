"""Device, precision and seeding: chosen at run time, nothing assumes CPU or CUDA."""

from __future__ import annotations

import contextlib
import os
import random
from typing import ContextManager

import numpy as np
import torch

from ..errors import InputError

__all__ = ["select_device", "autocast", "make_grad_scaler", "seed_everything", "PRECISIONS"]

PRECISIONS = ("fp32", "bf16", "fp16")


def select_device(name: str = "auto") -> torch.device:
    """``"auto"`` picks cuda, then mps, then cpu; ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or
    ``"mps"`` are taken as asked, with an error when that device is not available."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"device must be auto, cpu, cuda, cuda:N or mps; got {name!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {name!r}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise InputError(f"device {name!r}: MPS is not available on this machine")
    return device


def autocast(device: torch.device, precision: str) -> ContextManager:
    """Mixed-precision context for the forward pass and the loss: bf16 on CPU and CUDA,
    fp16 on CUDA only (with :func:`make_grad_scaler`); fp32 is a no-op."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise InputError(f"precision 'fp16' needs a CUDA device (a gradient scaler); got {device.type}; use bf16")
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def make_grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """A loss scaler that is active only for fp16 (bf16 has fp32's range and needs none)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16" and device.type == "cuda")


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch; ``deterministic`` also asks torch for deterministic
    kernels (an error where an operation has none), for bitwise-repeatable runs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
