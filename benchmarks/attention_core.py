"""Benchmark of attnlab's attention core on the CPU: multi-head attention and greedy decoding.

What it measures
----------------
1. Multi-head self-attention (float32, no mask), forward ("fwd": eval mode, no grad) and
   forward + backward ("fwd+bwd": train mode, dropout 0, gradients of the input and of
   every parameter, loss ``out.sum()``), for three implementations sharing one set of
   weights:

   * ``attnlab``: ``MultiHeadAttention.from_torch(t)`` called as ``m(x)``;
   * ``torch``:   ``torch.nn.MultiheadAttention`` called as ``t(x, x, x, need_weights=False)``;
   * ``floor``:   the least work possible, written inline below: one packed input
     projection, ``F.scaled_dot_product_attention``, the output projection.

   Each time is the median of N runs after a warm-up. The implementations are
   interleaved (one run each per round, in rotating order) so that drift of the machine
   affects them all alike. GFLOP/s counts the matrix products only and is to be compared
   with the 2048x2048 matmul rate printed at the top (the machine's practical peak).

2. Greedy decoding with ``transformer_base`` (6+6 layers, d=512; random weights, a
   smaller vocabulary so the output layer does not dominate), with and without the
   key/value cache. The time includes encoding the source. The issue's target: the cache
   makes decoding at least 4x faster.

Run (from the repository root)::

    .venv/bin/python benchmarks/attention_core.py              # full measurement
    .venv/bin/python benchmarks/attention_core.py --quick      # smoke run, fewer repeats
    .venv/bin/python benchmarks/attention_core.py --threads 4 --json results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.multihead import MultiHeadAttention
from common import busy_cores, cpu_model, pass_runners, time_interleaved  # benchmarks/common.py, beside this script
from attnlab.models import create_model
from attnlab.generation.search import greedy_search

MHA_SHAPES = [(8, 512, 512, 8), (2, 2048, 512, 8)]  # (B, L, E, H)
VOCAB, DEC_BATCH, SRC_LEN = 8000, 8, 32


def matmul_gflops(repeats: int, n: int = 2048) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    ms = statistics.median(time_interleaved({"mm": lambda: a @ b}, repeats, warmup=2)["mm"]) * 1e3
    return 2 * n**3 / ms / 1e6


def floor_mha(x: Tensor, w_in: Tensor, b_in: Tensor, w_out: Tensor, b_out: Tensor, heads: int) -> Tensor:
    """The minimum work of multi-head self-attention."""
    b, n, e = x.shape
    q, k, v = (t.view(b, n, heads, e // heads).transpose(1, 2) for t in F.linear(x, w_in, b_in).chunk(3, -1))
    out = F.scaled_dot_product_attention(q, k, v)
    return F.linear(out.transpose(1, 2).reshape(b, n, e), w_out, b_out)


def mha_flops(b: int, n: int, e: int, h: int) -> int:
    projections = 2 * b * n * e * 3 * e + 2 * b * n * e * e
    attention = 2 * 2 * b * h * n * n * (e // h)  # q kᵀ and p v
    return projections + attention


def bench_mha(shape: tuple[int, int, int, int], mode: str, repeats: int, warmup: int) -> dict:
    b, n, e, h = shape
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(e, h, dropout=0.0, batch_first=True)
    ours = MultiHeadAttention.from_torch(ref)
    weights = (ref.in_proj_weight, ref.in_proj_bias, ref.out_proj.weight, ref.out_proj.bias)
    x = torch.randn(b, n, e)
    forwards = {
        "attnlab": lambda: ours(x)[0],
        "torch": lambda: ref(x, x, x, need_weights=False)[0],
        "floor": lambda: floor_mha(x, *weights, h),
    }
    with torch.no_grad():  # the three must compute the same function, or the comparison is void
        outs = [f() for f in forwards.values()]
        max_diff = max((o - outs[-1]).abs().max().item() for o in outs)
    seconds = time_interleaved(pass_runners(forwards, mode, [x], [ours, ref]), repeats, warmup)
    samples = {k: [s * 1e3 for s in v] for k, v in seconds.items()}
    ms = {k: statistics.median(v) for k, v in samples.items()}
    flops = mha_flops(*shape) * (3 if mode == "fwd+bwd" else 1)
    return {"shape": dict(B=b, L=n, E=e, H=h), "pass": mode, "ms": ms, "samples_ms": samples,
            "gflop": flops / 1e9, "attnlab_gflops": flops / ms["attnlab"] / 1e6, "max_abs_diff": max_diff}


def bench_decoding(new_tokens: int, repeats: int) -> list[dict]:
    torch.manual_seed(0)
    model = create_model("transformer_base", src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, drop_rate=0.0).eval()
    src = torch.randint(3, VOCAB, (DEC_BATCH, SRC_LEN))
    outputs: dict[bool, Tensor] = {}

    def decoder(use_cache: bool) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                outputs[use_cache] = greedy_search(model, src, new_tokens, use_cache=use_cache)[0]
        return run

    with torch.no_grad():  # short warm-up: first-call allocations, thread pool start
        for use_cache in (True, False):
            greedy_search(model, src, 4, use_cache=use_cache)
    seconds = time_interleaved({"cache": decoder(True), "no cache": decoder(False)}, repeats, warmup=0)
    samples = {k: [s * 1e3 for s in v] for k, v in seconds.items()}
    same = torch.equal(outputs[True], outputs[False])
    records = []
    for name, use_cache in (("cache", True), ("no cache", False)):
        steps = outputs[use_cache].shape[1]  # < new_tokens only if every sentence chose EOS
        ms = statistics.median(samples[name])
        records.append({"decoding": name, "vocab": VOCAB, "batch": DEC_BATCH, "src_len": SRC_LEN,
                        "requested_steps": new_tokens, "steps": steps, "tokens": DEC_BATCH * steps, "ms": ms,
                        "tokens_per_s": DEC_BATCH * steps / ms * 1e3, "samples_ms": samples[name],
                        "outputs_equal": same})
    for r in records:
        r["speedup"] = r["tokens_per_s"] / records[1]["tokens_per_s"]
    return records


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 repeats, 32 decoded tokens")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--json", metavar="FILE", help="also write every record to FILE")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    repeats, warmup = (3, 1) if args.quick else (15, 3)
    dec_tokens, dec_repeats = (32, 1) if args.quick else (128, 3)

    load = busy_cores() or 0.0  # measured before we add to it
    peak = matmul_gflops(repeats)
    print(f"machine: {cpu_model()} | torch {torch.__version__} | threads {torch.get_num_threads()}"
          f" | 2048x2048 fp32 matmul: {peak:.1f} GFLOP/s | cores busy before start: {load:.1f}"
          + (" | --quick" if args.quick else ""))
    if load > 0.5:
        print("WARNING: other processes are using the CPUs; with several threads per op every small op waits"
              " for a busy core, so these timings (decoding above all) are not representative.")
    print()

    print(f"## Multi-head self-attention, float32, median of {repeats} runs\n")
    mha = [bench_mha(s, m, repeats, warmup) for s in MHA_SHAPES for m in ("fwd", "fwd+bwd")]
    rows = []
    for r in mha:
        ms, s = r["ms"], r["shape"]
        rows.append([f"B={s['B']} L={s['L']} E={s['E']} H={s['H']}", r["pass"],
                     *(f"{ms[k]:.1f}" for k in ("attnlab", "torch", "floor")),
                     f"{ms['attnlab'] / ms['torch']:.2f}", f"{ms['attnlab'] / ms['floor']:.2f}",
                     f"{r['attnlab_gflops']:.1f}"])
    print(markdown(["shape", "pass", "attnlab ms", "torch ms", "floor ms", "attnlab/torch", "attnlab/floor",
                    "attnlab GFLOP/s"], rows))
    worst = max(r["max_abs_diff"] for r in mha)
    print(f"\nmax |output - floor| over all cases: {worst:.1e}{'  <-- MISMATCH' if worst > 1e-3 else ''}")

    print(f"\n## Greedy decoding, transformer_base (vocab {VOCAB}), B={DEC_BATCH}, source length {SRC_LEN},"
          f" median of {dec_repeats} run(s)\n")
    dec = bench_decoding(dec_tokens, dec_repeats)
    print(markdown(["decoding", "tokens", "ms", "tokens/s", "speed-up"],
                   [[r["decoding"], f"{r['tokens']} ({r['batch']} x {r['steps']})", f"{r['ms']:.0f}",
                     f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}x"] for r in dec]))
    notes = [f"cache speed-up {dec[0]['speedup']:.2f}x (target >= 4x)",
             "same tokens with and without cache" if dec[0]["outputs_equal"] else "tokens DIFFER with/without cache"]
    if any(r["steps"] < dec_tokens for r in dec):
        notes.append(f"stopped early at EOS: fewer than the {dec_tokens} requested steps")
    print("\n" + "; ".join(notes))

    if args.json:
        meta = {"cpu": cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                "quick": args.quick, "matmul_gflops": peak, "busy_cores_before": load}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "mha": mha, "decoding": dec}, f, indent=2)
        print(f"records written to {args.json}")


if __name__ == "__main__":
    main()
