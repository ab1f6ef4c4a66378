"""Key/value cache memory and decoding speed of attnlab's decoder-only model with multi-head,
grouped-query, multi-query and sliding-window attention, as the generation grows long.

    .venv/bin/python benchmarks/lm_cache_memory.py [--lengths 1024 4096 16384] [--window 256] [--batch 1]
        [--rows mha gqa mqa window window-gqa] [--prompt 16] [--check 64]

The model: 4 layers of width 256, 8 query heads of size 32, SwiGLU (hidden 688), RMSNorm,
rotary positions, vocabulary 256, no biases, untied head, random weights
(``torch.manual_seed(0)``), eval mode. Each row changes only the key/value heads and the
window. For each length ``n`` it generates ``n`` new tokens greedily from a random prompt:
one prefill through ``forward`` with the cache, then ``n - 1`` calls of ``_decode_step``,
the loop ``GPT.stream`` runs, written out here so that the cache can be read at the end.
Before timing, that loop is checked to give exactly ``generate``'s tokens (over ``--check``
new tokens; for the window rows at least ``window + 16``, so that the window slides).

The first table: the cache's bytes at the end of each length (``DecodingCache.nbytes``
summed over the layers); the tokens per second of the decoding steps (new tokens of all
rows over the time of the steps after the prefill, one run); and the milliseconds per
step over the last 10% of the steps of the longest length (against the first 10%: does a
step slow down as the cache grows). The second table: the measured bytes against
``2 (k and v) x layers x kv heads x head size x positions x 4 bytes x batch``, the positions
being the preallocated capacity (prompt + n) without a window and, with one, the ``window -
1`` positions a step sees besides its own and ``DecodingCache.slide_room`` written before the
window moves to the front of a new buffer;
"positions stored" is ``DecodingCache.stored`` (the last token is chosen but never fed back,
so a full cache stores prompt + n - 1 of its prompt + n).
The full default run takes several minutes on a CPU; time it alone.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import dataclass

import torch

MODEL = dict(vocab_size=256, embed_dim=256, depth=4, num_heads=8, mlp="swiglu", mlp_hidden_dim=688, norm="rmsnorm",
             norm_eps=1e-6, pos_embed="rope", bias=False, tie_embeddings=False)


@dataclass
class Variant:
    key: str
    kv_heads: int
    windowed: bool

    def name(self, window: int) -> str:
        heads = f"{self.kv_heads} kv head{'s' if self.kv_heads > 1 else ''}"
        if self.windowed:
            return f"sliding window {window}, {heads}"
        kind = {8: "multi-head", 1: "multi-query"}.get(self.kv_heads, "grouped-query")
        return f"{kind} ({heads})"


VARIANTS = [Variant("mha", 8, False), Variant("gqa", 2, False), Variant("mqa", 1, False),
            Variant("window", 8, True), Variant("window-gqa", 2, True)]


@dataclass
class Run:
    cache_bytes: int
    positions_stored: int
    tokens_per_s: float
    step_seconds: list[float]


def decode(model, prompt: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, Run]:
    """``new_tokens`` greedy tokens ``(B, new_tokens)`` after ``prompt``, as ``GPT.stream`` makes them, and what the
    run measured."""
    cache = model.new_cache(prompt.shape[1] + new_tokens)
    weights = model._decode_weights()
    tokens = [model(prompt, cache=cache)[:, -1].float().argmax(-1)]
    step_seconds = []
    for _ in range(new_tokens - 1):
        start = time.perf_counter()
        logits = model._decode_step(tokens[-1][:, None], None, None, cache, weights)
        tokens.append(logits.float().argmax(-1))
        step_seconds.append(time.perf_counter() - start)
    decode_seconds = sum(step_seconds)
    rate = prompt.shape[0] * len(step_seconds) / decode_seconds if step_seconds else float("nan")
    run = Run(sum(c.nbytes() for c in cache), cache[0].stored, rate, step_seconds)
    return torch.stack(tokens, dim=1), run


def bytes_per_position(variant: Variant, batch: int) -> int:
    """Keys and values of one position in every layer, float32."""
    head_dim = MODEL["embed_dim"] // MODEL["num_heads"]
    return 2 * MODEL["depth"] * variant.kv_heads * head_dim * 4 * batch


def size_label(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    raise AssertionError


def length_label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def mean_ms(seconds: list[float]) -> float:
    return 1000 * sum(seconds) / len(seconds) if seconds else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384], help="new tokens per run")
    parser.add_argument("--window", type=int, default=256, help="the sliding window of the window rows (default 256)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens (default 16)")
    parser.add_argument("--rows", nargs="+", choices=[v.key for v in VARIANTS], default=[v.key for v in VARIANTS])
    parser.add_argument("--check", type=int, default=64, help="new tokens compared with generate's (default 64)")
    args = parser.parse_args()
    if min(args.lengths) < 2 or args.window < 2 or args.batch < 1 or args.prompt < 1:
        parser.error("lengths and window must be at least 2, batch and prompt at least 1")

    from attnlab.bench.machine import machine_info, machine_label
    from attnlab.models.gpt import GPT
    from attnlab.attention.cache import DecodingCache

    variants = [v for v in VARIANTS if v.key in args.rows]
    longest = max(args.lengths)
    print(f"machine: {machine_label(machine_info())}")
    print(f"GPT: 4 layers of width 256, 8 query heads of size 32, SwiGLU, RMSNorm, rope; float32, batch {args.batch}, "
          f"prompt {args.prompt}, greedy, one run per length\n")

    results: dict[str, dict[int, Run]] = {}
    for variant in variants:
        torch.manual_seed(0)
        model = GPT(**MODEL, num_kv_heads=variant.kv_heads, max_len=args.prompt + longest,
                    window=args.window if variant.windowed else None).eval()
        prompt = torch.randint(0, MODEL["vocab_size"], (args.batch, args.prompt),
                               generator=torch.Generator().manual_seed(1))
        check = max(args.check, args.window + 16) if variant.windowed else args.check
        with torch.no_grad():
            reference = model.generate(prompt, check)[:, args.prompt:]
            ours, _ = decode(model, prompt, check)  # also the warm-up: joined weights, the rotary table
            if not torch.equal(reference, ours):
                raise SystemExit(f"{variant.name(args.window)}: the timed loop generates other tokens than "
                                 f"generate: the figures would be void")
            results[variant.key] = {n: decode(model, prompt, n)[1] for n in args.lengths}
        print(f"  {variant.name(args.window)}: done", file=sys.stderr, flush=True)

    labels = [length_label(n) for n in args.lengths]
    print("| attention | " + " | ".join(f"cache at {x}" for x in labels) + " | "
          + " | ".join(f"tokens/s at {x}" for x in labels)
          + f" | ms/step, first 10% of {length_label(longest)} | ms/step, last 10% |")
    print("| --- |" + " ---: |" * (2 * len(labels) + 2))
    for variant in variants:
        runs = results[variant.key]
        steps = runs[longest].step_seconds
        tenth = max(1, len(steps) // 10)
        print(f"| {variant.name(args.window)} | " + " | ".join(size_label(runs[n].cache_bytes) for n in args.lengths)
              + " | " + " | ".join(f"{runs[n].tokens_per_s:,.0f}" for n in args.lengths)
              + f" | {mean_ms(steps[:tenth]):.2f} | {mean_ms(steps[-tenth:]):.2f} |")

    print("\nCache bytes at the end of each length, measured (DecodingCache.nbytes) against "
          "2 x layers x kv heads x head size x positions x 4 bytes x batch:\n")
    print("| attention | length | positions stored | buffer positions, measured | expected | measured bytes "
          "| expected bytes | equal |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    mismatches = 0
    for variant in variants:
        per_position = bytes_per_position(variant, args.batch)
        for n in args.lengths:
            run = results[variant.key][n]
            positions = args.window - 1 + DecodingCache.slide_room if variant.windowed else args.prompt + n
            want = per_position * positions
            mismatches += run.cache_bytes != want
            print(f"| {variant.name(args.window)} | {n} | {run.positions_stored} | "
                  f"{run.cache_bytes / per_position:g} | {positions} | {run.cache_bytes:,} | {want:,} "
                  f"| {'yes' if run.cache_bytes == want else 'NO'} |")
    if mismatches:
        print(f"\n{mismatches} measured size(s) differ from the expected ones.")
    # ru_maxrss is in KiB on Linux.
    print(f"\nprocess peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
