"""``attnlab bench attention``, ``vision`` and ``lm``: the benchmarks, resumable."""

from __future__ import annotations

import argparse

from ..bench.parts import LM_PARTS, VISION_PARTS
from .common import UsageError


def cmd_bench_attention(args: argparse.Namespace) -> int:
    from ..bench.attention import DEFAULT_LENGTHS, PARTS, run_bench
    from ..bench.report import markdown
    from ..bench.scaling import VARIANTS

    parts = _choices("--parts", args.parts, PARTS) if args.parts else list(PARTS)
    variants = _choices("--variants", args.variants, VARIANTS) if args.variants else None
    lengths = _lengths(args.lengths) if args.lengths else list(DEFAULT_LENGTHS)
    data = run_bench(args.out, parts=parts, variants=variants, lengths=lengths, device=args.device,
                     quick=args.quick, fresh=args.fresh, json_path=args.json, log=lambda s: print(s, flush=True))

    print(markdown(data))
    print(f"wrote {args.out}/results.json, table.md, time.png, memory.png, report.html"
          + (f" and {args.json}" if args.json else ""))
    return 0


def cmd_bench_vision(args: argparse.Namespace) -> int:
    from ..bench.vision import run_vision, vision_markdown

    parts = _choices("--parts", args.parts, VISION_PARTS) if args.parts else list(VISION_PARTS)
    seeds = _seeds(args.seeds) if args.seeds else None
    data = run_vision(args.out, parts=parts, seeds=seeds, variants=args.variant, quick=args.quick, fresh=args.fresh,
                      device=args.device, data_dir=args.data_dir, log=lambda s: print(s, flush=True))
    print(vision_markdown(data))
    print(f"wrote {args.out}/results.json, table.md, accuracy.png, time.png, report.html")
    return 0


def cmd_bench_lm(args: argparse.Namespace) -> int:
    from ..bench.lm import run_lm, lm_markdown

    parts = _choices("--parts", args.parts, LM_PARTS) if args.parts else list(LM_PARTS)
    data = run_lm(args.out, parts=parts, quick=args.quick, fresh=args.fresh, data_dir=args.data_dir,
                  log=lambda s: print(s, flush=True))
    print(lm_markdown(data))
    print(f"wrote {args.out}/results.json and table.md")
    return 0


def _seeds(text: str) -> dict[str, int]:
    """``norm=3,positions=2`` -> seeds per part."""
    seeds = {}
    for item in text.split(","):
        part, _, count = item.partition("=")
        if part.strip() not in VISION_PARTS or not count.strip().isdigit() or int(count) < 1:
            raise UsageError(f"--seeds takes PART=N,... with PART among {', '.join(VISION_PARTS)} and N >= 1; "
                             f"got {text!r}")
        seeds[part.strip()] = int(count)
    return seeds


def _lengths(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 2:
        raise UsageError(f"--lengths takes comma-separated integers of at least 2; got {text!r}")
    return values


def _choices(option: str, text: str, allowed) -> list[str]:
    values = [t.strip() for t in text.split(",") if t.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise UsageError(f"{option} takes a comma-separated list of {', '.join(allowed)}; got {text!r}")
    return values


def add_bench(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab bench attention``, ``vision`` and ``lm``."""
    p = sub.add_parser("bench", help="measure: 'attnlab bench attention' compares the attention kinds, "
                                     "'attnlab bench vision' the vision claims, 'attnlab bench lm' language models")
    bench_sub = p.add_subparsers(dest="bench_command", metavar="WHAT", required=True)
    q = bench_sub.add_parser("attention", help="time, memory, quality of each attention kind, and the studies "
                                              "(resumable; about 1.5 hours on 2 CPU cores)")
    q.add_argument("--out", default="runs/bench-attention", help="output folder (default runs/bench-attention)")
    q.add_argument("--json", default=None, metavar="FILE", help="also write the scaling records, as a list, here")
    q.add_argument("--parts", default=None, help="comma-separated: scaling, quality, fidelity, studies, allocator "
                                                 "(default: all)")
    q.add_argument("--variants", default=None, help="comma-separated variants (default: all)")
    q.add_argument("--lengths", default=None, help="comma-separated lengths (default 256,...,16384)")
    q.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    q.add_argument("--quick", action="store_true", help="tiny sizes and budgets: checks that it runs, nothing more")
    q.add_argument("--fresh", action="store_true", help="start over instead of keeping the finished items in --out")
    q.set_defaults(func=cmd_bench_attention)
    q = bench_sub.add_parser("vision", help="the tutorials' vision claims on CIFAR-10 (and norms on MR): every "
                                           "variant trained alike (resumable; hours on 2 CPU cores)")
    q.add_argument("--out", default="runs/bench-vision", help="output folder (default runs/bench-vision)")
    q.add_argument("--parts", default=None, help=f"comma-separated: {', '.join(VISION_PARTS)} (default: all)")
    q.add_argument("--seeds", default=None, metavar="PART=N,...",
                   help="seeds per part (default norm=3,text_norm=3,positions=2, the others 1)")
    q.add_argument("--variant", action="append", default=None, metavar="PART/NAME",
                   help="only this row, for example 'heads/8 heads of 16' (repeatable; default: every row of --parts)")
    q.add_argument("--data-dir", default=None, help="default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab")
    q.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    q.add_argument("--quick", action="store_true", help="two steps on a few images for the first two rows of each part, each tested on the whole "
                        "test set: checks that everything runs (about 25 minutes on 2 CPU cores)")
    q.add_argument("--fresh", action="store_true", help="start over instead of keeping the finished runs in --out")
    q.set_defaults(func=cmd_bench_vision)
    q = bench_sub.add_parser("lm", help="language models: generation with and without the cache, cache memory of "
                                       "grouped-query and sliding-window attention, length extrapolation of the "
                                       "position kinds (about 25 minutes on 2 CPU cores), and the attention kinds "
                                       "side by side, each trained for the shipped lm-shakespeare-char's time "
                                       "(kinds: about 10 x that time), and the long-context kinds at a context "
                                       "of 2,048 for the same time (kinds_long: about 6 x); resumable")
    q.add_argument("--out", default="runs/bench-lm", help="output folder (default runs/bench-lm)")
    q.add_argument("--parts", default=None, help=f"comma-separated: {', '.join(LM_PARTS)} (default: all)")
    q.add_argument("--data-dir", default=None, help="default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab")
    q.add_argument("--quick", action="store_true", help="tiny sizes and budgets: checks that it runs, nothing more")
    q.add_argument("--fresh", action="store_true", help="start over instead of keeping the finished items in --out")
    q.set_defaults(func=cmd_bench_lm)
