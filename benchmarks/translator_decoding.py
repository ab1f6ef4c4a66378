"""The translator's cached greedy search against recomputation: ``transformer_base``'s layers
(6+6, d=512; a vocabulary of 8,000, random weights), a batch of 4 sources of 32 tokens, 128 new
tokens, float32, 2 threads; the two interleaved, the best of the rounds; the tokens checked
identical. The target: the cache at least 4x faster on every CPU.

    .venv/bin/python benchmarks/translator_decoding.py [--batch 4] [--new 128] [--rounds 3]

Run it with ``PYTHONPATH=OTHER/src`` to time another checkout the same way (before and after a
change, in one session on one machine). Time it alone on the machine.
"""

from __future__ import annotations

import argparse
import time

import torch

from attnlab.models import create_model
from attnlab.generation.search import greedy_search
from common import cpu_model  # benchmarks/common.py, beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--new", type=int, default=128, help="new tokens per row")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = create_model("transformer_base", src_vocab_size=8000, tgt_vocab_size=8000, drop_rate=0.0).eval()
    src = torch.randint(3, 8000, (args.batch, 32))
    best: dict[bool, float] = {}
    out: dict[bool, torch.Tensor] = {}
    with torch.no_grad():
        for cached in (True, False):  # warm-up: first-call allocations, the thread pool
            greedy_search(model, src, 4, use_cache=cached)
        for _ in range(args.rounds):
            for cached in (True, False):
                start = time.perf_counter()
                out[cached] = greedy_search(model, src, args.new, use_cache=cached)[0]
                best[cached] = min(best.get(cached, float("inf")), time.perf_counter() - start)
    if not torch.equal(out[True], out[False]):
        raise SystemExit("cached and recomputed decoding chose different tokens: the figures would be void")
    print(f"machine: {cpu_model()}, {args.threads} threads, torch {torch.__version__}")
    print(f"transformer_base, batch {args.batch}, {out[True].shape[1]} new tokens, best of {args.rounds}: "
          f"cache {best[True]:.3f} s, recomputation {best[False]:.3f} s, {best[False] / best[True]:.2f}x")


if __name__ == "__main__":
    main()
