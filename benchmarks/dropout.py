"""attnlab's CPU dropout against ``torch.nn.functional.dropout``: forward, and forward +
backward, on activation-sized float32 tensors (median of interleaved runs, ms).

Run: ``.venv/bin/python benchmarks/dropout.py`` (about 20 s on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from attnlab.dropout import dropout
from common import busy_cores, cpu_model, time_interleaved  # benchmarks/common.py, beside this script

SHAPES = [(4032, 128), (4032, 512), (64, 4, 63, 63), (16384, 1024)]  # residual, FF hidden, attention weights, large


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=float, default=0.1, help="drop probability (default 0.1)")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    busy = busy_cores()
    print(f"machine: {cpu_model()} | torch {torch.__version__} | threads {torch.get_num_threads()} | "
          f"cores busy before start: {'?' if busy is None else f'{busy:.1f}'} | p = {args.p}\n")
    print("| shape | pass | torch ms | attnlab ms | speed-up |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        x = torch.randn(shape, requires_grad=True)
        g = torch.ones(shape)
        for name, make in (("fwd", lambda f: lambda: f(x.detach())),
                           ("fwd+bwd", lambda f: lambda: f(x).backward(g))):
            fns = {"torch": make(lambda t: F.dropout(t, args.p, True)), "attnlab": make(lambda t: dropout(t, args.p))}
            times = {k: statistics.median(v) * 1e3 for k, v in time_interleaved(fns, args.repeats, 2).items()}
            print(f"| {'x'.join(map(str, shape))} | {name} | {times['torch']:.2f} | {times['attnlab']:.2f} | "
                  f"{times['torch'] / times['attnlab']:.2f}x |")


if __name__ == "__main__":
    main()
