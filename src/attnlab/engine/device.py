"""Device, precision and seeding: chosen at run time, nothing assumes CPU or CUDA."""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import ContextManager

import numpy as np
import torch

from ..cpu import cpu_bf16_flags
from ..errors import InputError

__all__ = ["select_device", "autocast", "make_grad_scaler", "seed_everything", "PRECISIONS", "resolve_precision",
           "cpu_bf16_flags"]

PRECISIONS = ("fp32", "bf16", "fp16")
_CHOSEN: dict[str, tuple[str, str]] = {}  # device -> (precision, why): measured once per process


def _matmul_speedup(device: torch.device, n: int = 512, repeats: int = 6) -> float:
    """How much faster an ``n x n`` matmul runs in bfloat16 than in float32 here: the best of
    ``repeats`` each, the two timed alternately so that a busy moment slows both alike."""
    pairs = {dtype: (torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype))
             for dtype in (torch.float32, torch.bfloat16)}
    best = dict.fromkeys(pairs, float("inf"))
    for _ in range(repeats + 1):  # one round more: the first is a warm-up (the best counts anyway)
        for dtype, (a, b) in pairs.items():
            start = time.perf_counter()
            (a @ b).sum().item()
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def resolve_precision(precision: str, device: torch.device) -> tuple[str, str]:
    """``(precision, why)``: ``"auto"`` becomes ``bf16`` where bfloat16 is fast and ``fp32``
    where it is not; the others stay as asked.

    CUDA: bf16 where the GPU supports it. CPU: bf16 when the CPU has native bfloat16
    instructions (``avx512_bf16`` or ``amx_bf16``) and a 512x512 bfloat16 matmul measures
    at least 1.5x faster than float32 (on a CPU without them bfloat16 is emulated, 10-100x
    slower). The check runs once per process and device."""
    if precision != "auto":
        return precision, "as asked"
    key = str(device)
    if key not in _CHOSEN:
        if device.type == "cuda":
            ok = torch.cuda.is_bf16_supported()
            _CHOSEN[key] = ("bf16", "the GPU supports bfloat16") if ok else ("fp32", "the GPU lacks bfloat16")
        elif device.type == "cpu":
            flags = cpu_bf16_flags()
            if not flags:
                _CHOSEN[key] = ("fp32", "the CPU has no native bfloat16 (no avx512_bf16 or amx_bf16)")
            else:
                speedup = _matmul_speedup(device)
                fast = speedup >= 1.5
                _CHOSEN[key] = ("bf16" if fast else "fp32",
                                f"the CPU has {', '.join(flags)}; a bfloat16 matmul ran {speedup:.1f}x float32's speed")
        else:
            _CHOSEN[key] = ("fp32", f"{device.type}: float32 unless asked")
    return _CHOSEN[key]


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
    fp16 on CUDA only (with :func:`make_grad_scaler`); fp32 is a no-op; auto: see
    :func:`resolve_precision`."""
    precision = resolve_precision(precision, device)[0]
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of auto, {', '.join(PRECISIONS)}; got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "fp16" and device.type != "cuda":
        raise InputError(f"precision 'fp16' needs a CUDA device (a gradient scaler); got {device.type}; use bf16")
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def make_grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """A loss scaler that is active only for fp16 (bf16 has fp32's range and needs none)."""
    precision = resolve_precision(precision, device)[0]
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
