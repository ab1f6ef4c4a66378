"""How much memory this machine can give a new allocation, read before making one."""

from __future__ import annotations

import os

from .errors import InputError

__all__ = ["available_memory", "gib", "require_memory"]


def available_memory() -> int | None:
    """Bytes of memory available for new allocations: Linux's ``MemAvailable`` (free memory
    and the caches the kernel can drop), else the free pages ``sysconf`` reports; ``None``
    when neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def gib(n: int | float) -> str:
    """Bytes as a message writes them: ``"12.3 GiB"``, below a GiB ``"640.0 MiB"``, ``"12.0 KiB"``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def require_memory(nbytes: int, what: str) -> None:
    """Refuse, before allocating, ``what`` (a message's subject: the recipe key or file and
    what it sizes) when its ``nbytes`` exceed the memory available."""
    room = available_memory()
    if room is not None and nbytes > room:
        raise InputError(f"{what} needs {gib(nbytes)}; this machine has {gib(room)} available")
