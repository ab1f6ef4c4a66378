"""How much memory this machine can give a new allocation, read before making one."""

from __future__ import annotations

import os

from .errors import InputError

__all__ = ["available_memory", "gib", "keep_freed_memory", "require_memory"]


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


def keep_freed_memory() -> bool:
    """Make glibc's ``malloc`` keep freed memory in the process: no block is mapped on
    its own (``M_MMAP_MAX`` 0), so none is unmapped when freed, and the heap's top is not
    given back below 2 GiB (``M_TRIM_THRESHOLD``). A loop that allocates the same large
    tensors every call then reuses the same pages instead of faulting in fresh, zeroed
    ones. False where the C library has no ``mallopt`` (not glibc); the settings hold for
    the rest of the process.

    Why: by default glibc maps every block over its mmap threshold (at most 32 MiB) on its
    own and unmaps it when freed, so a tensor that large costs its size in page faults on
    every step (page faults and times: results page "The kinds of attention compared",
    ``attnlab bench attention --parts allocator``). The ``attnlab`` command does this at its start
    (``ATTNLAB_KEEP_FREED_MEMORY=0`` leaves glibc's default); the price is that the
    process's resident size does not shrink below its peak.

    The reuse depends on the heap's layout: in a process that has imported little besides
    torch, a small allocation lands right after a freed large block and the next aligned
    request of the same size no longer fits in it, so its pages are faulted in afresh; once
    attnlab's tasks and models are imported, as a training or a benchmark has, it was not seen."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # from glibc's malloc.h
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
