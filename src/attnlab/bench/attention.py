"""``attnlab bench attention``: the tutorials' comparison of attention kinds, measured.

Parts (``parts=``), each resumable (a finished item in ``OUT/results.json`` is kept,
not measured again, so an interrupted run goes on where it stopped):

* ``scaling``: time and peak memory against length, one fresh process per point
  (:mod:`attnlab.bench.scaling`);
* ``quality``: accuracy after a fixed budget on the needle task and on MR
  (:mod:`attnlab.bench.quality`);
* ``fidelity``: each kind's error against exact attention on the queries, keys and
  values of the MR model trained with exact attention (:mod:`attnlab.bench.fidelity`);
* ``studies``: heads, position encodings, attention dropout and gradient
  checkpointing (:mod:`attnlab.bench.studies`);
* ``allocator``: why a linear-cost kind's time can grow faster than ``n``: the forward
  pass from 2,048 to 16,384 tokens measured twice at each point, with glibc's default
  allocation and with freed memory kept in the process, beside the work counted
  whatever the machine (multiply-adds, bytes written) and the page faults of a call.

Outputs in ``OUT``: ``results.json`` (everything, rewritten atomically after each
item), ``table.md`` (the Markdown tables), ``time.png`` and ``memory.png``,
``report.html`` (all of it in one self-contained page); and with ``json_path`` the
scaling records alone, as a list.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import InputError
from .parts import ATTENTION_PARTS
from ..io import atomic_write_bytes
from ..memory import available_memory
from .fidelity import run_fidelity
from .quality import QUALITY_KINDS, run_quality
from .machine import machine_info
from .report import write_bench_report, write_report
from .scaling import HEAPS, VARIANTS, run_point
from .studies import run_studies

__all__ = ["run_bench", "PARTS", "ALLOCATOR_VARIANTS", "ALLOCATOR_LENGTHS", "DEFAULT_LENGTHS", "QUICK_LENGTHS",
           "machine_info", "ResultStore"]

PARTS = ATTENTION_PARTS
DEFAULT_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (256, 512)
# the allocator part: exact attention as the quadratic reference, and the kinds whose cost is linear in n
ALLOCATOR_VARIANTS = ("exact", "local", "sparse", "linear", "performer", "linformer", "nystrom", "lsh", "gated_delta")
ALLOCATOR_LENGTHS = (2048, 4096, 8192, 16384)


class ResultStore:
    """``results.json`` in ``out``: read on start, rewritten atomically after each item."""

    def __init__(self, out: Path, fresh: bool) -> None:
        self.path = out / "results.json"
        self.data: dict[str, Any] = {}
        if not fresh and self.path.is_file():
            self.data = json.loads(self.path.read_text())

    def items(self, part: str) -> list[dict[str, Any]]:
        return self.data.setdefault(part, [])

    def find(self, section: str, /, **key: Any) -> dict[str, Any] | None:
        """The first record of ``section`` whose fields equal ``key``'s."""
        return next((r for r in self.items(section) if all(r.get(k) == v for k, v in key.items())), None)

    def add(self, part: str, record: dict[str, Any]) -> None:
        self.items(part).append(record)
        self.save()

    def save(self) -> None:
        atomic_write_bytes(self.path, json.dumps(self.data, indent=1).encode())


def _scaling(store: ResultStore, variants: Sequence[str], lengths: Sequence[int], passes: Sequence[str], device: str,
             log: Callable[[str], None]) -> None:
    avail = available_memory()
    limit = None if avail is None or device != "cpu" else int(avail * 0.8)
    for pass_ in passes:
        for variant in variants:
            for n in lengths:
                if store.find("scaling", variant=variant, n=n, **{"pass": pass_}):
                    continue
                t0 = time.perf_counter()
                rec = run_point(variant, n, pass_, memory_limit=limit, device=device)
                store.add("scaling", rec)
                if rec["ms"] is None:
                    log(f"scaling {variant:>13} n={n:<6} {pass_:<7} skipped: {rec['skipped']}")
                else:
                    log(f"scaling {variant:>13} n={n:<6} {pass_:<7} {rec['ms']:10.1f} ms {rec['peak_mb']:9.1f} MB"
                        f"  ({time.perf_counter() - t0:.0f} s)")


def _allocator(store: ResultStore, variants: Sequence[str], lengths: Sequence[int], device: str,
               log: Callable[[str], None]) -> None:
    """The forward pass of each of ``variants`` at ``lengths``, with each heap of
    :data:`~attnlab.bench.scaling.HEAPS` one after the other at each point (so that a
    machine's drift touches both alike)."""
    for variant in variants:
        for n in lengths:
            for heap in HEAPS:
                if store.find("allocator", variant=variant, n=n, heap=heap):
                    continue
                rec = run_point(variant, n, "fwd", device=device, heap=heap)
                store.add("allocator", rec)
                if rec["ms"] is not None:
                    log(f"allocator {variant:>12} n={n:<6} heap {heap:<7} {rec['ms']:9.1f} ms, "
                        f"{rec['faults_per_call']:,.0f} page faults a call")


def run_bench(out: str | Path, *, parts: Sequence[str] = PARTS, variants: Sequence[str] | None = None,
              lengths: Sequence[int] = DEFAULT_LENGTHS, passes: Sequence[str] = ("fwd", "fwd_bwd"),
              device: str = "cpu", quick: bool = False, fresh: bool = False, json_path: str | Path | None = None,
              data_dir: str | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the chosen ``parts`` into ``out`` and write the report; returns ``results.json``'s content.

    ``quick``: the smallest settings (two short lengths, a few training steps), to see
    that everything runs; its figures mean nothing.
    """
    for p in parts:
        if p not in PARTS:
            raise InputError(f"parts must be among {list(PARTS)}; got {p!r}")
    variants = list(variants or VARIANTS)
    for v in variants:
        if v not in VARIANTS:
            raise InputError(f"variant must be one of {sorted(VARIANTS)}; got {v!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    store = ResultStore(out, fresh)
    store.data["machine"] = machine_info(device)
    store.data["quick"] = bool(quick)
    store.save()
    if "scaling" in parts:
        _scaling(store, variants, QUICK_LENGTHS if quick else lengths, passes, device, log)
    if "quality" in parts:
        run_quality(store, [v for v in variants if v in QUALITY_KINDS], out, quick=quick, device=device,
                    data_dir=data_dir, log=log)
    if "fidelity" in parts:
        run_fidelity(store, out, quick=quick, device=device, data_dir=data_dir, log=log)
    if "studies" in parts:
        run_studies(store, out, quick=quick, device=device, data_dir=data_dir, log=log)
    if "allocator" in parts and device == "cpu":  # the allocator studied is glibc's, the CPU's
        _allocator(store, [v for v in variants if v in ALLOCATOR_VARIANTS],
                   QUICK_LENGTHS if quick else ALLOCATOR_LENGTHS, device, log)
    write_report(store.data, out)

    write_bench_report(out)  # report.html: the tables and plots in one self-contained page
    if json_path is not None:
        atomic_write_bytes(Path(json_path), json.dumps(store.items("scaling"), indent=1).encode())
    return store.data
