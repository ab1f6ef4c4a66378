"""What this CPU can do, for the choices that depend on it (a shared helper: it imports
nothing of attnlab)."""

from __future__ import annotations

from functools import lru_cache

__all__ = ["cpu_bf16_flags", "native_bf16_cpu"]


def cpu_bf16_flags() -> list[str]:
    """The CPU's bfloat16 instruction flags (``avx512_bf16``, ``amx_bf16``), from
    ``/proc/cpuinfo`` (Linux; elsewhere an empty list)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return sorted({flag for flag in line.split(":", 1)[1].split() if flag in ("avx512_bf16", "amx_bf16")})
    except OSError:
        pass
    return []


@lru_cache(maxsize=1)
def native_bf16_cpu() -> bool:
    """Whether this CPU computes bfloat16 natively (read once per process)."""
    return bool(cpu_bf16_flags())
