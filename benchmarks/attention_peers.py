"""Speed of attnlab's efficient attention kinds against the public reference implementations (CPU).

What it measures
----------------
For each pair (attnlab kind, peer package), both at the same settings: float32, batch 1,
8 heads, head dim 64, sequence lengths ``n`` in {1024, 4096, 16384} (``--lengths``), two
passes:

* ``fwd``: eval mode, ``torch.no_grad()``;
* ``fwd+bwd``: train mode (dropout 0 everywhere), loss ``out.sum()``, gradients of the
  inputs and of every parameter (only the Nyström pair has parameters).

Function-level pairs get the same per-head inputs ``q, k, v`` ``(1, 8, n, 64)`` from
``torch.randn`` (the layout ``(b, h, n, d)`` that every peer takes). The pairs:

* ``local``: ``attnlab.attention.variants.local.local_attention(q, k, v, window=W)`` against
  ``local_attention.LocalAttention(window_size=W, look_backward=1, look_forward=1,
  causal=False, dim=64, use_rotary_pos_emb=False)``, ``W = 256`` (``--window``). Both cut
  the sequence into blocks of ``W`` and let each query block attend to the blocks
  [i-1, i, i+1] (``3W`` logits a query): the same work. What a query *sees* differs: the
  peer (``exact_windowsize=False``, its default) sees the whole three blocks (between 2W
  and 3W keys), attnlab the exact band ``|i - j| < W`` (2W - 1 keys). ``dim=64`` alone
  would switch on the peer's rotary position embedding, which attnlab's function does not
  have, so it is switched off. ``local-causal``: the same with ``look_backward=1,
  look_forward=0, causal=True`` against attnlab's ``is_causal=True`` (2 blocks; peer: W+1 to
  2W keys, attnlab: the W keys ``0 <= i - j < W``).
* ``performer``: attnlab's ``PerformerAttention(512, 8, num_features=256).attend`` (no
  redraw) against ``performer_pytorch.FastAttention(dim_heads=64, nb_features=256,
  causal=False)``, with the peer's ``projection_matrix`` set to attnlab's ``projection``
  (same random features). Both are FAVOR+ with the same stabilisers; the peer adds 1e-4
  to every feature. Non-causal only: without the CUDA extension of ``fast_transformers``
  the peer's causal path falls back to ``causal_linear_attention_noncuda``, which
  materialises an ``(n, m, d)`` prefix state (8.6 GB at n=16384; the peer itself calls it
  "memory inefficient") and uses a non-causal key stabiliser.
* ``linear``: attnlab ``LinearAttention.attend`` (elu+1 features; not causal: its fused path)
  against ``linear_attention_transformer``'s
  ``linear_attn(q, k, v)``. **The feature maps differ**: attnlab uses ``elu(x) + 1`` on
  q and k with the normaliser ``phi(q) . sum phi(k)``; the peer softmaxes q over the
  features and k over the sequence and scales by ``d^-1/2`` (no explicit normaliser).
  Same shapes and the same O(n d^2) structure, different function. ``linear-causal``:
  attnlab ``is_causal=True`` (chunks of 64, exact causal) against ``causal_linear_attn(q,
  k, v, bucket_size=64)``, whose feature map is softmax(q) and exp(k) and which (with
  buckets > 1) lets a query see only *earlier* buckets, not the keys before it in its own
  bucket: it skips the within-chunk (C x C) products that attnlab computes.
* ``nystrom``: module level, projections included, ``x`` ``(1, n, 512)``: attnlab
  ``NystromAttention(512, 8, num_landmarks=256, pinv_iters=6, bias=False)`` against
  ``nystrom_attention.NystromAttention(dim=512, dim_head=64, heads=8, num_landmarks=256,
  pinv_iterations=6, residual=False)`` (no conv residual on either side; the peer's input
  projection has no bias, its output projection has one). The peer pads ``n`` at the
  front to a multiple of the landmarks; the default lengths are multiples, so neither pads.

Before timing, each pair is checked at a small ``n`` (``max(512, 4W)``) for computing
comparable things: ``local`` against the peer with ``exact_windowsize=True`` (which sees
``|i - j| <= W``, the band of attnlab's ``window = W + 1``): max |difference| should be
float rounding; ``performer`` with shared features: the difference, and each one's mean
error against exact softmax attention (they differ by the peer's 1e-4 feature offset,
which is large next to the stabilised features of these randn inputs); ``nystrom`` with
shared weights (differs by the scale of the first pseudo-inverse iterate: per matrix in
attnlab, over all heads in the peer); ``linear``: not comparable (other feature maps).

Each time is the median of N runs after a warm-up (fewer runs at larger ``n``: 10, 5 and
3 runs for n <= 1024, <= 4096 and above), attnlab and the peer interleaved in rotating order
(``common.time_interleaved``) so that drift of the machine affects both alike. The ratio
peer/attnlab > 1 means attnlab is faster.

Run (from the repository root; the peers live in their own venv, ``.venv-peers``, which
``make bench-peers`` creates)::

    make bench-peers                                                    # full measurement
    .venv-peers/bin/python benchmarks/attention_peers.py --quick       # smoke run
    .venv-peers/bin/python benchmarks/attention_peers.py --lengths 4096 --passes fwd --kinds local nystrom
    .venv-peers/bin/python benchmarks/attention_peers.py --threads 2 --json peers.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import warnings
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Callable

import torch
from torch import Tensor, nn

from common import busy_cores, cpu_model, pass_runners, time_interleaved  # benchmarks/common.py, beside this script

PEER_PACKAGES = {  # distribution -> module
    "local-attention": "local_attention",
    "performer-pytorch": "performer_pytorch",
    "linear-attention-transformer": "linear_attention_transformer",
    "nystrom-attention": "nystrom_attention",
}
HEADS, HEAD_DIM, FEATURES, LANDMARKS, PINV_ITERS = 8, 64, 256, 256, 6
EMBED = HEADS * HEAD_DIM
KINDS = ["local", "local-causal", "performer", "linear", "linear-causal", "nystrom"]
PASSES = ["fwd", "fwd+bwd"]


def import_peers() -> dict[str, str]:
    """Import every peer (exit 2 with one line if one is missing); return distribution -> version."""
    versions = {}
    with warnings.catch_warnings():  # performer_pytorch imports distutils and torch.cuda.amp: deprecation noise
        warnings.simplefilter("ignore")
        for dist, module in PEER_PACKAGES.items():
            try:
                import_module(module)
                versions[dist] = version(dist)
            except (ImportError, PackageNotFoundError) as e:
                print(f"attention_peers: cannot import the peer package {dist} ({e}); run `make bench-peers`, "
                      f"which creates .venv-peers with the peers, and use .venv-peers/bin/python", file=sys.stderr)
                sys.exit(2)
    return versions


@dataclass
class Pair:
    kind: str
    peer: str  # distribution name
    setting: str  # what is compared, for the settings table
    make: Callable[[int, int], tuple[dict[str, Callable[[], Tensor]], list[Tensor], list[nn.Module]]]


def qkv(n: int, seed: int = 0) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, HEADS, n, HEAD_DIM, generator=g) for _ in range(3)]


def build_pairs(window: int) -> list[Pair]:
    from attnlab.attention.variants.linear import LinearAttention
    from attnlab.attention.variants.local import local_attention
    from attnlab.attention.variants.nystrom import NystromAttention as OurNystrom
    from attnlab.attention.variants.performer import PerformerAttention
    import linear_attention_transformer.linear_attention_transformer as lat
    import local_attention as la
    import nystrom_attention as na
    import performer_pytorch as pp

    def local(causal: bool):
        def make(n: int, seed: int):
            q, k, v = qkv(n, seed)
            peer = la.LocalAttention(window_size=window, look_backward=1, look_forward=0 if causal else 1,
                                     causal=causal, dim=HEAD_DIM, use_rotary_pos_emb=False)
            return ({"attnlab": lambda: local_attention(q, k, v, window, is_causal=causal),
                     "peer": lambda: peer(q, k, v)}, [q, k, v], [peer])
        return make

    def performer(n: int, seed: int):
        q, k, v = qkv(n, seed)
        ours = PerformerAttention(EMBED, HEADS, num_features=FEATURES, redraw=False)
        peer = pp.FastAttention(dim_heads=HEAD_DIM, nb_features=FEATURES, causal=False)
        with torch.no_grad():
            peer.projection_matrix.copy_(ours.projection)  # the same random features
        return ({"attnlab": lambda: ours.attend(q, k, v, key_padding_mask=None, is_causal=False),
                 "peer": lambda: peer(q, k, v)}, [q, k, v], [ours, peer])

    def linear(causal: bool):
        def make(n: int, seed: int):
            q, k, v = qkv(n, seed)
            peer_fn = (lambda: lat.causal_linear_attn(q, k, v, bucket_size=64)) if causal \
                else (lambda: lat.linear_attn(q, k, v))
            ours = LinearAttention(EMBED, HEADS)  # its attend(): the fused path when not causal
            return ({"attnlab": lambda: ours.attend(q, k, v, key_padding_mask=None, is_causal=causal),
                     "peer": peer_fn}, [q, k, v], [])
        return make

    def nystrom(n: int, seed: int):
        torch.manual_seed(seed)
        ours = OurNystrom(EMBED, HEADS, num_landmarks=LANDMARKS, pinv_iters=PINV_ITERS, bias=False)
        peer = na.NystromAttention(dim=EMBED, dim_head=HEAD_DIM, heads=HEADS, num_landmarks=LANDMARKS,
                                   pinv_iterations=PINV_ITERS, residual=False)
        with torch.no_grad():  # shared weights (the same layout: q, k, v blocks of (head, dim) rows)
            peer.to_qkv.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
            peer.to_out[0].weight.copy_(ours.o_proj.weight)
            peer.to_out[0].bias.zero_()
        x = torch.randn(1, n, EMBED, generator=torch.Generator().manual_seed(seed))
        return ({"attnlab": lambda: ours(x)[0], "peer": lambda: peer(x)}, [x], [ours, peer])

    w = window
    return [
        Pair("local", "local-attention",
             f"attnlab `local_attention(window={w})` (band \\|i-j\\| < {w}) vs `LocalAttention(window_size={w}, "
             f"look_backward=1, look_forward=1)` (whole blocks i-1..i+1: {2 * w}-{3 * w} keys); both blocked by {w}; "
             f"peer rotary off", local(False)),
        Pair("local-causal", "local-attention",
             f"attnlab `is_causal=True, window={w}` (0 <= i-j < {w}) vs `LocalAttention(window_size={w}, "
             f"causal=True, look_backward=1, look_forward=0)` (blocks i-1..i, causal: {w + 1}-{2 * w} keys)",
             local(True)),
        Pair("performer", "performer-pytorch",
             f"`PerformerAttention(num_features={FEATURES}).attend` vs `FastAttention(dim_heads=64, "
             f"nb_features={FEATURES})`, same projection; peer adds 1e-4 to features; non-causal only (peer's "
             f"CPU causal path is its memory-inefficient fallback)", performer),
        Pair("linear", "linear-attention-transformer",
             "`LinearAttention.attend` (elu+1 features) vs `linear_attn`: **feature maps differ** (peer: softmax of q "
             "over features, of k over the sequence, times d^-1/2)", linear(False)),
        Pair("linear-causal", "linear-attention-transformer",
             "attnlab exact causal, chunks of 64, elu+1 vs `causal_linear_attn(bucket_size=64)`: **feature maps "
             "differ** (softmax(q), exp(k)); peer queries see earlier buckets only (no within-bucket term)",
             linear(True)),
        Pair("nystrom", "nystrom-attention",
             f"module with projections, x (1, n, {EMBED}): `NystromAttention({EMBED}, {HEADS}, "
             f"num_landmarks={LANDMARKS}, pinv_iters={PINV_ITERS}, bias=False)` vs `NystromAttention(dim={EMBED}, "
             f"dim_head=64, heads=8, num_landmarks={LANDMARKS}, pinv_iterations={PINV_ITERS}, residual=False)`",
             nystrom),
    ]


def check(pair: Pair, window: int, n: int) -> str:
    """At a small n: do the two compute comparable things? One short line."""
    from attnlab.attention.variants.local import local_attention
    import local_attention as la

    with torch.no_grad():
        if pair.kind in ("local", "local-causal"):
            causal = pair.kind == "local-causal"
            q, k, v = qkv(n, seed=1)
            peer = la.LocalAttention(window_size=window, look_backward=1, look_forward=0 if causal else 1,
                                     causal=causal, exact_windowsize=True, use_rotary_pos_emb=False)
            diff = (local_attention(q, k, v, window + 1, is_causal=causal) - peer(q, k, v)).abs().max().item()
            band = "0 <= i-j" if causal else "\\|i-j\\|"
            return (f"n={n}: peer with exact_windowsize=True ({band} <= {window}) vs attnlab window={window + 1}: "
                    f"max abs diff {diff:.1e}")
        if pair.kind in ("linear", "linear-causal"):
            return "feature maps differ: no numeric check"
        fns, inputs, modules = pair.make(n, 1)
        for m in modules:
            m.eval()
        ours, theirs = fns["attnlab"](), fns["peer"]()
        diff = (ours - theirs).abs().max().item()
        if pair.kind == "nystrom":
            return (f"n={n}, shared weights: max abs diff {diff:.1e} (max \\|out\\| {theirs.abs().max().item():.1e}; "
                    f"pinv start scaled per matrix vs over all heads)")
        exact = torch.nn.functional.scaled_dot_product_attention(*inputs)
        err = [(o - exact).abs().mean().item() for o in (ours, theirs)]
        return (f"n={n}, shared features: max abs diff {diff:.1e}; mean abs error vs exact softmax: attnlab "
                f"{err[0]:.1e}, peer {err[1]:.1e} (randn q, k: logits of std 1, where FAVOR+ is noisy; the peer's "
                f"+1e-4 outweighs its stabilised features, pulling it toward the mean of v)")


def bench(pair: Pair, n: int, mode: str, repeats: int, warmup: int) -> dict[str, float]:
    fns, inputs, modules = pair.make(n, 0)
    seconds = time_interleaved(pass_runners(fns, mode, inputs, modules), repeats, warmup)
    return {k: statistics.median(v) * 1e3 for k, v in seconds.items()}


def schedule(n: int, quick: bool) -> tuple[int, int]:
    """(repeats, warm-up runs) for length n."""
    if quick:
        return 2, 1
    return (10, 2) if n <= 1024 else (5, 1) if n <= 4096 else (3, 1)


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def write_json(path: str, records: list[dict]) -> None:
    """Atomically: a temporary file in the same directory, then os.replace."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".attention_peers.", suffix=".json.tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(records, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def int_list(values: list[str]) -> list[int]:
    return [int(x) for v in values for x in v.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", nargs="+",
                        help="sequence lengths, space- or comma-separated (default 1024 4096 16384; --quick: 512 1024)")
    parser.add_argument("--passes", nargs="+", choices=PASSES, default=PASSES, help="default: both")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=KINDS, help="default: all pairs")
    parser.add_argument("--window", type=int, default=256, help="local: attnlab window = peer window_size (256)")
    parser.add_argument("--quick", action="store_true", help="smoke run: n = 512, 1024 and 2 repeats")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--json", metavar="FILE", help="also write the records (a list) to FILE")
    args = parser.parse_args()
    versions = import_peers()  # before anything slow: exit 2 if the peers are missing
    torch.set_num_threads(args.threads)
    lengths = int_list(args.lengths) if args.lengths else [512, 1024] if args.quick else [1024, 4096, 16384]
    bad = [n for n in lengths if n <= 0 or ("local" in " ".join(args.kinds) and n % args.window)
           or ("linear-causal" in args.kinds and n % 64)]
    if bad:
        parser.error(f"lengths {bad}: local needs multiples of --window ({args.window}), linear-causal of 64")

    load = busy_cores() or 0.0  # measured before we add to it
    print(f"machine: {cpu_model()} | torch {torch.__version__} | threads {torch.get_num_threads()}"
          f" | cores busy before start: {load:.1f}" + (" | --quick" if args.quick else ""))
    if load > 0.5:
        print("WARNING: other processes are using the CPUs; these timings are not representative.")
    print(f"\nfloat32, batch 1, {HEADS} heads, head dim {HEAD_DIM}; fwd = eval + no_grad, fwd+bwd = train, "
          f"loss out.sum(), grads of inputs and parameters; median of "
          + ", ".join(f"{schedule(n, args.quick)[0]} (n={n})" for n in lengths) + " runs\n")

    pairs = [p for p in build_pairs(args.window) if p.kind in args.kinds]
    check_n = max(512, 4 * args.window)
    print("## Pairs: settings and check\n")
    print(markdown(["kind", "peer (version)", "settings", "check"],
                   [[p.kind, f"{p.peer} {versions[p.peer]}", p.setting, check(p, args.window, check_n)]
                    for p in pairs]))

    print("\n## Time\n")
    headers = ["kind", "peer (version)", "n", "pass", "attnlab ms", "peer ms", "peer/attnlab"]
    print("| " + " | ".join(headers) + " |\n|" + "|".join("---" for _ in headers) + "|", flush=True)
    records = []
    for p in pairs:
        for n in lengths:
            repeats, warmup = schedule(n, args.quick)
            for mode in args.passes:
                ms = bench(p, n, mode, repeats, warmup)
                rec = {"kind": p.kind, "peer": p.peer, "peer_version": versions[p.peer], "n": n, "pass": mode,
                       "attnlab_ms": ms["attnlab"], "peer_ms": ms["peer"], "ratio": ms["peer"] / ms["attnlab"]}
                records.append(rec)
                print(f"| {p.kind} | {p.peer} {rec['peer_version']} | {n} | {mode} | {rec['attnlab_ms']:.1f} | "
                      f"{rec['peer_ms']:.1f} | {rec['ratio']:.2f} |", flush=True)
                if args.json:  # rewritten after each row: a long run killed half-way keeps what it measured
                    write_json(args.json, records)
    print("\nratio > 1: attnlab faster. linear rows compare different feature maps (see the settings).")
    if args.json:
        print(f"records written to {args.json}")


if __name__ == "__main__":
    main()
