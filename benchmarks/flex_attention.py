"""FlexAttention (attnlab.attention.flex) against the standard path, inference, per mask pattern:
flex's steady time and its compile time (first call minus the steady median), torch's fused
kernel alone where the pattern allows it (causal), the band the exact kind runs a causal window
over a whole input as (window), the standard path (torch's fused kernel with the dense mask the
exact kind builds, as it does for a window with a cache or padding; the explicit path for
soft-capping) and the explicit path (the weights formed). B = 1, 8 heads of 64, float32.

    python benchmarks/flex_attention.py --out /tmp/flex.json                  # CUDA if there is one
    python benchmarks/flex_attention.py --lengths 512 --repeats 1             # a smoke run

The explicit path forms (H, L, L) float32 logits: 8 GiB at L = 16,384 (and as much again for
the weights), so it is skipped above ``--explicit-max`` (default 8,192).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from attnlab.attention.alibi import alibi_bias, alibi_slopes
from attnlab.attention.blocksparse import window_attention
from attnlab.attention.flex import flex_attention_forward, flex_runs
from attnlab.attention.functional import combine_masks, scaled_dot_product_attention
from attnlab.attention.exact import band_mask
from attnlab.bench.machine import machine_info, machine_label
from common import busy_cores, time_interleaved  # benchmarks/common.py, beside this script

HEADS, HEAD_DIM = 8, 64
PATTERNS = ("causal", "window 256", "alibi", "softcap 50", "sinks", "documents 1024", "block-sparse")


def _structure(pattern: str, length: int, device: torch.device) -> dict:
    """The pattern's arguments of flex_attention_forward (all causal but the block-sparse one)."""
    if pattern == "causal":
        return {"causal": True}
    if pattern == "window 256":
        return {"causal": True, "window": 256}
    if pattern == "alibi":
        return {"causal": True, "alibi_slopes": alibi_slopes(HEADS).to(device)}
    if pattern == "softcap 50":
        return {"causal": True, "softcap": 50.0}
    if pattern == "sinks":
        return {"causal": True, "sinks": torch.linspace(-1, 2, HEADS, device=device)}
    if pattern == "documents 1024":
        return {"causal": True, "documents": (torch.arange(length, device=device) // 1024)[None]}
    if pattern == "block-sparse":  # blocks of 128: each query block sees its own and a quarter of the others
        g = torch.Generator().manual_seed(0)
        n = max(length // 128, 1)
        select = (torch.rand(1, HEADS, n, n, generator=g) < 0.25) | torch.eye(n, dtype=torch.bool)
        return {"block_sparse": select.to(device)}
    raise ValueError(pattern)


def _standard(q, k, v, structure: dict, weights: bool) -> torch.Tensor:
    """The standard path with the dense masks the exact module builds: torch's fused kernel with
    the mask (the explicit path for soft-capping), or, ``weights``, the explicit path that forms
    the weights."""
    lq, lk = q.shape[2], k.shape[2]
    slots = torch.arange(lk, device=q.device)
    mask = band_mask(slots, slots, causal=structure.get("causal", False), window=structure.get("window"))
    if structure.get("documents") is not None:
        ids = structure["documents"]
        mask = combine_masks(mask, (ids[:, :, None] != ids[:, None, :])[:, None])
    if structure.get("block_sparse") is not None:
        select = structure["block_sparse"]
        blk = lq // select.shape[2]
        mask = combine_masks(mask, ~select.repeat_interleave(blk, 2).repeat_interleave(blk, 3))
    if structure.get("alibi_slopes") is not None:
        mask = combine_masks(mask, alibi_bias(structure["alibi_slopes"], slots, slots))
    return scaled_dot_product_attention(q, k, v, attn_mask=mask, softcap=structure.get("softcap"),
                                        sinks=structure.get("sinks"), need_weights=weights)[0]


# The patterns whose standard path holds a boolean (L, L) mask at most (268 MB at 16,384), not float logits
# or an additive float mask (8 GiB at 16,384 for 8 heads): measured at every length.
LIGHT = ("causal", "window 256", "sinks", "documents 1024", "block-sparse")


def _peak(fn: Callable[[], object], device: torch.device) -> float | None:
    """Peak memory of one call in MiB (CUDA only; None elsewhere)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


def measure(pattern: str, length: int, device: torch.device, repeats: int, explicit_max: int) -> dict:
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, length, HEAD_DIM, generator=g).to(device) for _ in range(3))
    structure = _structure(pattern, length, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                fn()
            sync()
        return run

    fns = {"flex": timed(lambda: flex_attention_forward(q, k, v, **structure))}
    if pattern == "causal":
        fns["fused"] = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    if structure.get("window") is not None and structure.get("causal"):
        fns["band"] = timed(lambda: window_attention(q, k, v, structure["window"]))
    if length <= explicit_max or pattern in LIGHT:
        fns["standard"] = timed(lambda: _standard(q, k, v, structure, False))
    if length <= explicit_max:
        fns["explicit"] = timed(lambda: _standard(q, k, v, structure, True))
    start = time.perf_counter()
    fns["flex"]()  # compiles this shape and pattern
    first = time.perf_counter() - start
    times = {name: statistics.median(s) for name, s in time_interleaved(fns, repeats, warmup=1).items()}
    row = {"pattern": pattern, "length": length, "flex_ms": times["flex"] * 1e3,
           "flex_compile_s": max(first - times["flex"], 0.0),
           "fused_ms": times["fused"] * 1e3 if "fused" in times else None,
           "band_ms": times["band"] * 1e3 if "band" in times else None,
           "standard_ms": times["standard"] * 1e3 if "standard" in times else None,
           "explicit_ms": times["explicit"] * 1e3 if "explicit" in times else None}
    if device.type == "cuda":
        row["flex_peak_mib"] = _peak(fns["flex"], device)
        row["explicit_peak_mib"] = _peak(fns["explicit"], device) if "explicit" in fns else None
    return row


def _cell(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS, metavar="PATTERN",
                        help=f"of: {', '.join(repr(p) for p in PATTERNS)}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--explicit-max", type=int, default=8192, help="the longest length the explicit path runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="write the rows and the machine as JSON here")
    args = parser.parse_args()
    device = torch.device(args.device)
    runs, why = flex_runs(device, needs_grad=False)
    if not runs:
        parser.error(f"flex_attention cannot run on {device}: {why}")
    # Each (pattern, length) is a new compile; dynamo's default of 8 per function would fall back to eager.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit,
                                               2 * len(args.patterns) * len(args.lengths))
    machine = machine_info(args.device)
    busy = busy_cores()
    print(f"machine: {machine_label(machine)} | cores busy before start: {'?' if busy is None else f'{busy:.1f}'} | "
          f"B=1, {HEADS} heads of {HEAD_DIM}, float32, inference\n")
    print("| pattern | length | flex ms | flex compile s | fused ms (causal) | band ms (window) | "
          "standard ms (dense mask) | explicit ms (weights formed) | standard / flex |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for length in args.lengths:
        for pattern in args.patterns:
            row = measure(pattern, length, device, args.repeats, args.explicit_max)
            rows.append(row)
            ratio = None if row["standard_ms"] is None else row["standard_ms"] / row["flex_ms"]
            print(f"| {pattern} | {length} | {row['flex_ms']:.2f} | {row['flex_compile_s']:.1f} | "
                  f"{_cell(row['fused_ms'], '{:.2f}')} | {_cell(row['band_ms'], '{:.2f}')} | "
                  f"{_cell(row['standard_ms'], '{:.2f}')} | "
                  f"{_cell(row['explicit_ms'], '{:.2f}')} | {_cell(ratio, '{:.2f}x')} |", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine, "busy_cores_before": busy, "rows": rows}, indent=2))
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
