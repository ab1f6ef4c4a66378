"""What ``auto`` became for one run: decided once, when the run starts, and kept in
``run_dir/resolved.json``.

``train.precision: auto`` depends on the machine: its bfloat16 instructions and a timed
bfloat16 matmul, which a busy moment can push below the threshold. Deciding it again in
every process let one run train its first segment in float32 and its resumed segment in
bfloat16. So the decision is a record of the run: :func:`resolve_run` makes it when the
run starts, and a resume, ``eval``, ``predict`` and ``report`` read it back
(:func:`run_precision`) instead of measuring again.

The file holds one record per stretch of training, oldest first: the step it began at,
the precision and why, the device and the machine (CPU with its AVX2/AVX512/bfloat16
flags, threads, torch). A resume adds a record only when what it trains with changes
(another precision asked with ``--allow-changes``, or a machine that cannot run the
recorded one, accepted with ``--allow-changes``); the last record is what the run's
final weights and test figures were computed with.

Nothing else that attnlab resolves from the machine changes what is computed: the device
(``train.device: auto``) is recorded with each record, and the number of threads, which
can change float sums in their last bits, is recorded with the machine.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..io import atomic_write_bytes, read_json_mapping
from .device import cpu_bf16_flags, resolve_precision
from .machine import machine_info, machine_label

__all__ = ["RESOLVED", "Resolution", "resolve_run", "read_resolutions", "write_resolutions", "run_precision",
           "precision_problem"]

RESOLVED = "resolved.json"
"""A run's resolved settings: what ``auto`` became, on which machine, from which step."""


@dataclass(frozen=True)
class Resolution:
    """One stretch of a run: trained from ``step`` on in ``precision``, which ``asked``
    (``train.precision``) became for ``why`` (``"as asked"`` unless ``auto``), on ``device``
    (``cpu``, ``cuda``, ...) of ``machine`` (:func:`~attnlab.engine.machine.machine_label`),
    with ``threads`` torch threads."""

    step: int
    asked: str
    precision: str
    why: str
    device: str
    machine: str
    threads: int


def resolve_run(asked: str, device: torch.device, step: int = 0) -> Resolution:
    """The resolution of ``asked`` (``train.precision``) on ``device``, for a stretch that
    starts at ``step``."""
    precision, why = resolve_precision(asked, device)
    return Resolution(step=step, asked=asked, precision=precision, why=why, device=device.type,
                      machine=machine_label(machine_info(str(device))), threads=torch.get_num_threads())


def precision_problem(precision: str, device: torch.device) -> str | None:
    """Why ``device`` cannot train in ``precision`` as the run did (``None``: it can).
    bfloat16 on a CPU without native bfloat16 instructions is emulated, 10-100x slower."""
    if precision == "fp16" and device.type != "cuda":
        return f"float16 autocast needs a CUDA device (a gradient scaler); this is {device.type}"
    if precision == "bf16" and device.type == "cpu" and not cpu_bf16_flags():
        return ("this CPU has no native bfloat16 (no avx512_bf16 or amx_bf16): bfloat16 would run emulated, "
                "10-100x slower")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU does not support bfloat16"
    return None


def read_resolutions(run_dir: str | Path) -> list[Resolution]:
    """The records of ``run_dir/resolved.json``, oldest first; ``[]`` for a run of an
    attnlab before it. ``InputError`` naming the file when it is damaged."""
    path = Path(run_dir) / RESOLVED
    if not path.is_file():
        return []
    records = read_json_mapping(path).get("resolutions")
    try:
        if not isinstance(records, list) or not records:
            raise TypeError
        return [Resolution(**r) for r in records]
    except TypeError:
        raise InputError(f"{path} is damaged: expected {{\"resolutions\": [{{step, asked, precision, why, device, machine, "
                         f"threads}}, ...]}}") from None


def write_resolutions(run_dir: str | Path, records: list[Resolution]) -> None:
    """Write ``run_dir/resolved.json`` atomically."""
    data: dict[str, Any] = {"precision": records[-1].precision, "resolutions": [asdict(r) for r in records]}
    atomic_write_bytes(Path(run_dir) / RESOLVED, json.dumps(data, indent=1).encode())


def run_precision(run_dir: str | Path) -> str | None:
    """The precision a run trains (and trained its last stretch) in; ``None`` when the run
    has no ``resolved.json`` (an older attnlab's)."""
    records = read_resolutions(run_dir)
    return records[-1].precision if records else None
