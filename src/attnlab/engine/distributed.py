"""Data-parallel runs launched by ``torchrun``: one process per device, one process group.

``torchrun`` sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` (with ``MASTER_ADDR`` and
``MASTER_PORT``) in every process it starts; :func:`init_distributed` reads them and joins
the group. Rank ``r`` of ``world`` processes trains on its share of each global batch and
DistributedDataParallel averages the gradients, so every rank holds the same weights.

In a plain single-process run none of those variables is set, no group exists and every
function here is a no-op: ``rank()`` is 0, ``world_size()`` is 1, ``is_main()`` is True,
``all_reduce_sum(t)`` and ``broadcast_object(x)`` return their argument, ``barrier()`` and
``cleanup()`` do nothing.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from typing import Any

import torch
import torch.distributed as dist

from ..errors import InputError
from .device import select_device

__all__ = ["launched", "initialized", "init_distributed", "local_device", "rank", "world_size", "is_main",
           "barrier", "all_reduce_sum", "broadcast_object", "cleanup", "lost_process", "ProcessStopped",
           "stop_on_sigterm"]


def launched() -> bool:
    """True in a process started by torchrun (``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` set)."""
    return all(k in os.environ for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"))


def initialized() -> bool:
    """True when this process is in a process group."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank in ``0 .. world_size() - 1``; 0 without a group."""
    return dist.get_rank() if initialized() else 0


def world_size() -> int:
    """Number of processes in the group; 1 without a group."""
    return dist.get_world_size() if initialized() else 1


def is_main() -> bool:
    """True on rank 0, the one process that writes files and prints."""
    return rank() == 0


def local_device(device_pref: str = "auto") -> torch.device:
    """The device to train on: ``select_device(device_pref)`` without a group; in a group,
    ``"auto"`` is CUDA when available else CPU (MPS has no collective backend), and a bare
    ``"cuda"`` is this process's current CUDA device (``cuda:LOCAL_RANK`` after
    :func:`init_distributed`)."""
    if not initialized():
        return select_device(device_pref)
    if device_pref == "auto":
        device_pref = "cuda" if torch.cuda.is_available() else "cpu"
    device = select_device(device_pref)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"distributed training runs on cpu or cuda devices; got {device}")
    return device


def init_distributed(device_pref: str = "auto") -> torch.device:
    """Join torchrun's process group (once) and return the device this process trains on.

    Not launched by torchrun: no group, ``select_device(device_pref)``. Launched: on CUDA
    (``"auto"`` with CUDA available, or ``"cuda"``) the process takes ``cuda:LOCAL_RANK`` and
    the backend is NCCL; on CPU it is gloo. The rendezvous is torchrun's (``env://``).
    """
    if not launched():
        return select_device(device_pref)
    pref = ("cuda" if torch.cuda.is_available() else "cpu") if device_pref == "auto" else device_pref
    if pref == "cuda":
        pref = f"cuda:{int(os.environ['LOCAL_RANK'])}"
    device = select_device(pref)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        raise InputError(f"distributed training runs on cpu or cuda devices; got {device}")
    if not initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        processes = [None] * dist.get_world_size()
        dist.all_gather_object(processes, (socket.gethostname(), os.getpid()))
        _PROCESSES[:] = processes  # to name the one that is gone if a connection to it breaks
    return device


_PROCESSES: list[Any] = []  # (host, pid) of each rank, from init_distributed
# How a collective says that a peer's process has gone (killed, crashed): gloo's broken connections,
# NCCL's remote errors. Said by message: both raise plain RuntimeErrors.
_LOST = re.compile(r"Connection (reset|closed) by peer|Broken pipe|Socket closed|remote process exited|"
                   r"NCCL communicator was aborted|ncclRemoteError")


class ProcessStopped(KeyboardInterrupt):
    """SIGTERM in a process of a run under torchrun (:func:`stop_on_sigterm`): torchrun stops the
    other processes so when one of them has ended, often before a collective could notice."""


def stop_on_sigterm() -> None:
    """Turn SIGTERM into :class:`ProcessStopped`, so that a process torchrun stops says why."""
    def stopped(signum: int, frame: Any) -> None:
        raise ProcessStopped("SIGTERM")

    signal.signal(signal.SIGTERM, stopped)


def lost_process(exc: BaseException) -> str | None:
    """What ``exc`` says of the run's processes when a process of another rank has ended (killed
    or crashed): a collective that lost its peer, or torchrun's SIGTERM to the others
    (:class:`ProcessStopped`) after it. In words: "rank 1 (pid 10055) of the run has ended";
    ``None`` for any other exception, and for a SIGTERM while every process runs (torchrun
    stopping them all, a Ctrl-C)."""
    broken = isinstance(exc, RuntimeError) and _LOST.search(str(exc)) is not None
    if not initialized() or not (broken or isinstance(exc, ProcessStopped)):
        return None
    here = socket.gethostname()
    local = [(r, pid) for r, (host, pid) in enumerate(_PROCESSES) if r != rank() and host == here]
    # a killed process's sockets close before it is gone: give it a moment to be seen as ended
    deadline = time.monotonic() + 2.0
    while not (gone := [f"rank {r} (pid {pid})" for r, pid in local if not _alive(pid)]) and \
            local and time.monotonic() < deadline:
        time.sleep(0.05)
    if gone:
        return f"{' and '.join(gone)} of the run {'has' if len(gone) == 1 else 'have'} ended"
    if broken:
        return "a process of the run on another host has ended (its connection was lost)"
    return None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs: not gone, and not a zombie (ended, not yet reaped by torchrun)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


def barrier() -> None:
    """Wait until every rank gets here."""
    if not initialized():
        return
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place; every rank gets the same result, same shape
    and dtype. The tensor must be on this process's device (CUDA for NCCL)."""
    if initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` (any picklable value) on every rank; e.g. a path chosen on rank 0."""
    if not initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def cleanup(wait: bool = True) -> None:
    """Leave and destroy the process group, if any. ``wait``: meet the other ranks first
    (pass ``False`` on an error path, where a peer may never arrive)."""
    if initialized():
        if wait:
            # A rank that tears down its connections while a peer is still inside a
            # collective makes gloo abort that peer (SIGABRT) instead of letting it finish.
            dist.barrier()
        dist.destroy_process_group()
