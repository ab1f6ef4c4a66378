"""Time and peak memory of each attention kind against sequence length.

One *point* is (variant, n, pass): a self-attention module of width ``heads * head_dim``
(projections included, as a model pays them) on ``x`` ``(batch, n, width)``, float32 by
default, for

* ``pass="fwd"``: eval mode, no autograd;
* ``pass="fwd_bwd"``: train mode (dropout 0), ``out.sum().backward()`` into the input
  and every parameter.

Each point runs in a fresh Python process (:func:`run_point`), so that its peak memory
is its own and not the high-water mark of an earlier, larger point. Peak memory is
measured on the first call, before any warm-up:

* CPU: the process's resident-set high-water mark (``VmHWM``, reset through
  ``/proc/self/clear_refs``) minus its resident size just before the call: what the
  pass added, activations, weights matrices and workspace included.
* CUDA: ``torch.cuda.max_memory_allocated`` minus the memory allocated before.

Time is the median of repeated calls after that first one (at least 2, up to 10, or
about ``min_time`` seconds in all).

Beside time and memory, each point records what does not depend on the machine, to tell
work that grows faster than ``n`` from a machine that slows down as the data grows
(:func:`count_work`): ``flops``, the multiply-adds of its matrix products and fused
attention (x 2), and ``bytes_written``, the bytes of every tensor its operators produce
(a lower bound on its memory traffic); and ``faults_per_call``, the minor page faults
of one repeated call (the kernel handing the process fresh, zeroed pages: glibc's
``malloc`` returns a freed block larger than its mmap threshold, at most 32 MiB, to the
system, so a tensor that big is paid for in page faults on every call). ``heap="kept"``
measures the point with freed memory kept in the process
(:func:`attnlab.memory.keep_freed_memory`).

Variants (:data:`VARIANTS`): ``exact`` is the fused kernel (no weights formed),
``exact_weights`` the same attention asked for its per-head weights (the explicit
``n x n`` path); the rest are the efficient kinds with the options given here.
Points that would need more memory than the machine has are skipped and recorded as
such (:func:`predicted_bytes`), never run into the out-of-memory killer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import InputError
from ..memory import keep_freed_memory

__all__ = ["Variant", "VARIANTS", "HEAPS", "measure_point", "count_work", "first_call_peak", "repeat_times", "run_module",
           "run_point", "fit_exponent", "crossover", "predicted_bytes"]

PASSES = ("fwd", "fwd_bwd")
HEAPS = ("default", "kept")


@dataclass(frozen=True)
class Variant:
    """How to build and call one benchmarked kind."""

    kind: str  # registry name
    options: Callable[[int], dict[str, Any]] = field(default=lambda n: {})  # n -> constructor options
    call: dict[str, Any] = field(default_factory=dict)  # extra forward kwargs
    note: str = ""  # settings, for the table


# The settings are the usual ones of each paper at this head size, and fixed in n (that
# is what makes a kind linear): window 256, blocks of 64, 256 features or projections,
# 64 landmarks.
VARIANTS: dict[str, Variant] = {
    "exact": Variant("exact", note="fused scaled_dot_product_attention, weights never formed"),
    "exact_weights": Variant("exact", call=dict(need_weights=True, average_attn_weights=False),
                             note="explicit path, per-head n x n weights returned"),
    # the reference of the causal kinds below: the fused kernel skips the blocks above the diagonal
    "exact_causal": Variant("exact", call=dict(is_causal=True), note="fused scaled_dot_product_attention, causal"),
    "local": Variant("local", lambda n: dict(sliding_window=256), note="window 256 (511 keys), blocked"),
    "sparse": Variant("sparse", lambda n: dict(pattern="bigbird", block=64, window_blocks=3, global_blocks=1,
                                               random_blocks=2),
                      note="BigBird blocks of 64: 3 window + 1 global + 2 random"),
    "linear": Variant("linear", note="elu+1 feature map"),
    "performer": Variant("performer", lambda n: dict(num_features=256), note="FAVOR+, 256 orthogonal features"),
    "linformer": Variant("linformer", lambda n: dict(seq_len=n, k=256), note="k = 256 projections, seq_len = n"),
    "nystrom": Variant("nystrom", lambda n: dict(num_landmarks=64, pinv_iters=6), note="64 landmarks, 6 pinv iterations"),
    "topk": Variant("topk", lambda n: dict(top_k=32), note="the 32 best keys of each query; n x n scores formed"),
    # the Reformer's setting: chunks of 64 and about n / 64 buckets
    "lsh": Variant("lsh", lambda n: dict(bucket_size=64, n_buckets=max(2, n // 128 * 2)),
                   note="chunks of 64, n / 64 buckets, one hashing round"),
    # The attention of 2024-2026, causal as decoders use it (the gated delta rule is causal only).
    "latent": Variant("latent", lambda n: dict(kv_rank=256), call=dict(is_causal=True),
                      note="a latent of 256 expanded to every head's keys and values; causal"),
    "sinks": Variant("sinks", call=dict(is_causal=True),
                     note="a sink logit a head: the fused kernel with the sink as one key more; causal"),
    "differential": Variant("differential", call=dict(is_causal=True),
                            note="pairs of heads, values of 2 x 64, fused kernel; causal"),
    "gated_delta": Variant("gated_delta", call=dict(is_causal=True),
                           note="chunks of 64, a state of 64 x 64 a head; causal"),
    "dsa": Variant("dsa", lambda n: dict(kv_rank=256, index_topk=256), call=dict(is_causal=True),
                   note="latent attention on the 256 keys an indexer of 4 heads picks, the indexer a chunk of "
                        "queries at a time; causal"),
    # NSA at the paper's sizes for heads of 64 (selection blocks of 64, 16 of them, a window of 512), one block
    # size for compression and selection
    "nsa": Variant("nsa", lambda n: dict(block=64, num_selected=16, branch_window=512), call=dict(is_causal=True),
                   note="blocks of 64 compressed, 16 selected + its own, window 512; blocked; causal"),
}


def predicted_bytes(variant: str, n: int, pass_: str, batch: int, heads: int) -> int:
    """A generous estimate of what a point needs, for the kinds that form ``n x n``
    matrices (the others need far less than any machine has)."""
    square = batch * heads * n * n * 4
    if variant == "exact_weights":
        return (2 if pass_ == "fwd" else 4) * square  # logits + weights; and their gradients
    if variant == "topk":  # scores, the kept mask, the masked scores, the weights; and the gradients
        return (4 if pass_ == "fwd" else 7) * square
    return 0


def _rss_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field_name} not found in /proc/self/status")


def first_call_peak(step: Callable[[], None], dev: Any) -> tuple[float, int]:
    """Run ``step()`` once: ``(seconds, bytes of memory it added at its peak)``; see the module docstring."""
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0, torch.cuda.max_memory_allocated(dev) - before
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size
    # the mark just set, not VmRSS read again: the resident size may have dropped in between (another
    # thread freeing), which made the memory a small step added come out negative (-0.14 MB, seen)
    before = _rss_kb("VmHWM")
    t0 = time.perf_counter()
    step()
    seconds = time.perf_counter() - t0
    # Linux counts a thread's resident pages in batches (up to 64 pages, 256 KiB, held per thread before
    # they reach the process's count), so a step that adds less than that can read a little below the
    # mark (-0.15 MB seen for a local attention of 128 positions): such a step added nothing measurable.
    return seconds, max(0, _rss_kb("VmHWM") - before) * 1024


def repeat_times(step: Callable[[], None], first: float, min_time: float, max_repeats: int,
                 faults: list[int] | None = None) -> list[float]:
    """Seconds of each of ``clamp(min_time / first, 2, max_repeats)`` further calls of
    ``step()``; with a list ``faults``, each call's minor page faults are appended to it."""
    import resource

    repeats = max(2, min(max_repeats, math.ceil(min_time / max(first, 1e-6))))
    times = []
    for _ in range(repeats):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if faults is not None:
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return times


def count_work(step: Callable[[], None]) -> dict[str, int]:
    """Run ``step()`` once under a dispatch mode that counts what it does, whatever the
    machine: ``{"flops", "bytes_written"}``; see the module docstring. Matrix products
    (``mm``, ``bmm``, ``addmm``, ``baddbmm``) and fused attention count ``2 x``
    multiply-adds (fused attention in full, causal or not: the products it is asked for);
    element-wise work counts only in the bytes. An output that is a view of an input
    writes nothing."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    aten = torch.ops.aten

    def product_flops(func: Any, args: tuple, out: Any) -> int:
        if func in (aten.mm.default, aten.bmm.default):
            return 2 * out.numel() * args[0].shape[-1]
        if func in (aten.addmm.default, aten.baddbmm.default):
            return 2 * out.numel() * args[1].shape[-1]
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        if "scaled_dot_product" in name and "backward" not in name:
            q, k, v = args[:3]
            return 2 * q.shape[:-1].numel() * k.shape[-2] * (q.shape[-1] + v.shape[-1])
        if "scaled_dot_product" in name:  # the backward recomputes the scores and forms four products
            q, k, v = args[1:4]  # after the output's gradient
            return 4 * q.shape[:-1].numel() * k.shape[-2] * (q.shape[-1] + v.shape[-1])
        return 0

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.flops = self.written = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if outs:
                ins = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                       if isinstance(t, torch.Tensor)}
                self.written += sum(t.numel() * t.element_size() for t in outs
                                    if t.untyped_storage().data_ptr() not in ins)
                self.flops += product_flops(func, args, outs[0])
            return out

    with Count() as count:
        step()
    return {"flops": count.flops, "bytes_written": count.written}


def measure_point(variant: str, n: int, pass_: str, *, device: str = "cpu", batch: int = 1, heads: int = 8,
                  head_dim: int = 64, dtype: str = "float32", min_time: float = 2.0, max_repeats: int = 10,
                  seed: int = 0, heap: str = "default") -> dict[str, Any]:
    """Measure one point in this process; see the module docstring. Returns a record
    ``{variant, n, pass, ms, peak_mb, repeats, faults_per_call, flops, bytes_written, ...}``
    (the last two from one more call, counted)."""
    import torch

    from ..attention import build_attention

    if variant not in VARIANTS:
        raise InputError(f"variant must be one of {sorted(VARIANTS)}; got {variant!r}")
    if pass_ not in PASSES:
        raise InputError(f"pass must be one of {PASSES}; got {pass_!r}")
    if heap not in HEAPS:
        raise InputError(f"heap must be one of {HEAPS}; got {heap!r}")
    if heap == "kept" and not keep_freed_memory():
        raise InputError("heap='kept' needs glibc's mallopt, which this C library lacks")
    spec = VARIANTS[variant]
    torch.manual_seed(seed)
    dev, dt = torch.device(device), getattr(torch, dtype)
    width = heads * head_dim
    module = build_attention(spec.kind, width, heads, **spec.options(n)).to(dev, dt)
    x = torch.randn(batch, n, width, device=dev, dtype=dt)
    train = pass_ == "fwd_bwd"
    module.train(train)
    if train:
        x.requires_grad_(True)

    def step() -> None:
        if train:
            out, _ = module(x, **spec.call)
            out.sum().backward()
            x.grad = None
            for p in module.parameters():
                p.grad = None
        else:
            with torch.no_grad():
                module(x, **spec.call)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    first, peak = first_call_peak(step, dev)
    faults: list[int] = []
    times = repeat_times(step, first, min_time, max_repeats, faults)
    repeats = len(times)
    counted = count_work(step)
    return dict(variant=variant, kind=spec.kind, n=n, **{"pass": pass_}, ms=1e3 * statistics.median(times),
                ms_min=1e3 * min(times), first_ms=1e3 * first, repeats=repeats, peak_mb=peak / 2**20,
                faults_per_call=statistics.median(faults), **counted, heap=heap,
                batch=batch, heads=heads, head_dim=head_dim, dtype=dtype, device=device,
                threads=torch.get_num_threads())


def run_point(variant: str, n: int, pass_: str, *, timeout: float = 900.0, memory_limit: int | None = None,
              **kwargs: Any) -> dict[str, Any]:
    """:func:`measure_point` in a fresh interpreter. A point that is predicted to need more
    than ``memory_limit`` bytes, fails or times out gives a record with ``ms`` and
    ``peak_mb`` None and the reason in ``skipped``."""
    base = {"variant": variant, "kind": VARIANTS[variant].kind, "n": n, "pass": pass_, "ms": None, "peak_mb": None}
    need = predicted_bytes(variant, n, pass_, kwargs.get("batch", 1), kwargs.get("heads", 8))
    if memory_limit is not None and need > memory_limit:
        return base | {"skipped": f"needs about {need / 2**30:.0f} GiB, more than the {memory_limit / 2**30:.0f} "
                                  f"GiB available"}
    return run_module(["attnlab.bench.scaling", "--point", variant, str(n), pass_, "--kwargs", json.dumps(kwargs)],
                      base, timeout)


def run_module(args: list[str], base: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``python -m *args`` in a fresh interpreter; its last stdout line that is a JSON
    object is the record. A failure or a timeout gives ``base`` with the reason in ``skipped``."""
    try:
        proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return base | {"skipped": f"took over {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return base | {"skipped": f"failed: {err[:200]}"}
    return json.loads(lines[-1])


def fit_exponent(records: list[dict[str, Any]], variant: str, pass_: str, key: str = "ms",
                 lo: int = 2048, hi: int = 16384) -> float | None:
    """Least-squares slope of ``log(key)`` against ``log(n)`` for ``lo <= n <= hi``: the
    measured complexity exponent. None with fewer than two usable points."""
    pts = [(r["n"], r[key]) for r in records if r["variant"] == variant and r["pass"] == pass_
           and lo <= r["n"] <= hi and r.get(key) is not None and r[key] > 0]
    if len(pts) < 2:
        return None
    xs = [math.log(n) for n, _ in pts]
    ys = [math.log(v) for _, v in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None


def crossover(records: list[dict[str, Any]], fast: str, slow: str, pass_: str) -> dict[str, Any]:
    """The length from which ``fast`` takes less time than ``slow``: interpolated in
    log-log between the two measured lengths around the change of sign.

    Returns ``{"n": float | None, "relation": "between" | "below" | "above" | "none"}``:
    ``below`` when ``fast`` wins at every measured length (n is the smallest),
    ``above`` when it never does (n is the largest measured), ``none`` without data.
    """
    def times(v: str) -> dict[int, float]:
        return {r["n"]: r["ms"] for r in records if r["variant"] == v and r["pass"] == pass_ and r.get("ms")}

    a, b = times(fast), times(slow)
    ns = sorted(set(a) & set(b))
    if not ns:
        return {"n": None, "relation": "none"}
    diff = [math.log(a[n]) - math.log(b[n]) for n in ns]  # < 0: fast wins
    if diff[0] < 0:
        return {"n": ns[0], "relation": "below"}
    for (n0, d0), (n1, d1) in zip(zip(ns, diff), zip(ns[1:], diff[1:])):
        if d0 >= 0 > d1:
            t = d0 / (d0 - d1)
            return {"n": math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0))), "relation": "between"}
    return {"n": ns[-1], "relation": "above"}


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="measure one point (used by run_point)")
    p.add_argument("--point", nargs=3, metavar=("VARIANT", "N", "PASS"), required=True)
    p.add_argument("--kwargs", default="{}")
    a = p.parse_args(argv)
    variant, n, pass_ = a.point
    record = measure_point(variant, int(n), pass_, **json.loads(a.kwargs))
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(_main())
