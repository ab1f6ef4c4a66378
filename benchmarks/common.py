"""Helpers shared by the benchmark scripts: interleaved timing and a description of the machine."""

from __future__ import annotations

import os
import platform
import time
from typing import Callable

__all__ = ["time_interleaved", "pass_runners", "cpu_model", "busy_cores"]


def time_interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int) -> dict[str, list[float]]:
    """Seconds of ``repeats`` runs of each function, one run each per round, the order
    rotating from round to round (so drift of the machine affects all alike)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            start = time.perf_counter()
            fns[name]()
            samples[name].append(time.perf_counter() - start)
    return samples


def pass_runners(forwards: dict[str, Callable[[], "torch.Tensor"]], mode: str, inputs: list["torch.Tensor"],
                 modules: list["torch.nn.Module"]) -> dict[str, Callable[[], None]]:
    """Each forward as one timed pass: ``"fwd"`` in eval mode without autograd; otherwise
    (forward + backward) in train mode, ``out.sum().backward()`` into ``inputs`` and every
    parameter of ``modules``, the gradients cleared before each run."""
    import torch

    if mode == "fwd":
        for m in modules:
            m.eval()

        def wrap(fwd: Callable[[], torch.Tensor]) -> Callable[[], None]:
            def run() -> None:
                with torch.no_grad():
                    fwd()
            return run
    else:
        for m in modules:
            m.train()
        for t in inputs:
            t.requires_grad_(True)
        leaves = [*inputs, *(p for m in modules for p in m.parameters())]

        def wrap(fwd: Callable[[], torch.Tensor]) -> Callable[[], None]:
            def run() -> None:
                for p in leaves:
                    p.grad = None
                fwd().sum().backward()
            return run

    return {k: wrap(f) for k, f in forwards.items()}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def busy_cores(seconds: float = 0.5) -> float | None:
    """Cores kept busy by other processes right now (from /proc/stat), to flag a loaded machine."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:]]
        return sum(ticks), ticks[3] + ticks[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / max(total1 - total0, 1))
