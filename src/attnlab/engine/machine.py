"""The machine a figure was measured on, or a run started on: recorded with it and named in its
tables and messages."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

__all__ = ["SPEED_FLAGS", "machine_info", "machine_label"]

# The CPU flags that change how fast attnlab trains: float32 vector width, native bfloat16.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def machine_info(device: str = "cpu") -> dict[str, Any]:
    """What a measured figure depends on: the CPU (model and :data:`SPEED_FLAGS` it has,
    where ``/proc/cpuinfo`` says), cores, threads, torch, Python, device, memory."""
    cpu = platform.processor() or platform.machine()
    flags: list[str] | None = None
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), cpu)
        have = next((set(ln.split(":", 1)[1].split()) for ln in lines if ln.startswith("flags")), None)
        flags = None if have is None else [f for f in SPEED_FLAGS if f in have]
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version(), "device": device}
    if flags is not None:
        info["cpu_flags"] = flags
    try:
        with open("/proc/meminfo") as f:
            info["memory_gb"] = round(int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def machine_label(machine: dict[str, Any]) -> str:
    """``AMD EPYC (AVX2, AVX512-BF16), 2 threads, torch 2.13.0+cpu`` (``cuda: <GPU>`` on a GPU)."""
    flags = machine.get("cpu_flags")
    cpu = str(machine.get("cpu", "?"))
    if flags is not None:
        cpu += f" ({', '.join(f.upper().replace('_', '-') for f in flags) or 'no AVX2'})"
    text = f"{cpu}, {machine.get('threads', '?')} threads, torch {machine.get('torch', '?')}"
    if machine.get("gpu"):
        text += f", {machine.get('device', 'cuda')}: {machine['gpu']}"
    return text
