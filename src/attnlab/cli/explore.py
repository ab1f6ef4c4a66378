"""``attnlab visualize`` (PNGs of what a run's attention looks at) and ``attnlab explore``
(one offline page of every head of every layer)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..families import decoder_names, encoder_names
from .common import UsageError, nonnegative_int, positive_int, text_arguments


def cmd_visualize(args: argparse.Namespace) -> int:
    from ..viz.run import visualize_run

    queries = [_query(q) for q in args.query] if args.query else None
    paths = visualize_run(args.run_dir, args.inputs, args.out, max_inputs=args.max_inputs, checkpoint=args.checkpoint,
                          device=args.device, queries=queries)
    for path in paths:
        print(path)
    return 0


def cmd_explore(args: argparse.Namespace) -> int:
    from ..formats.packaged import resolve_packaged
    from ..viz.explorer import check_output, default_output, explore

    target = resolve_packaged(args.target)  # smollm2-135m-instruct: the installed package's file
    packaged = target != args.target  # its page goes here, not into the package's own folder
    out = Path(args.out).expanduser() if args.out else Path(f"{args.target}.explore.html") if packaged \
        else default_output(target)
    if not Path(target).expanduser().exists():
        raise UsageError(f"TARGET {args.target} does not exist; give a run directory (attnlab train's), a Hugging "
                         f"Face folder (config.json and its weights), a GGUF file or a packaged model's name")
    check_output(out, args.force)  # before any work: a page is never written over unasked
    inputs = text_arguments(args.inputs, "INPUT") if args.inputs else None
    page = explore(target, inputs, max_inputs=args.max_inputs, new_tokens=args.new_tokens,
                   checkpoint=args.checkpoint, device=args.device, title=args.title, ablate=args.ablate,
                   lang=args.lang)
    path = page.save(out, force=True)
    docs = page.data["documents"]
    layers = sum(len(g["layers"]) for g in docs[0]["groups"]) if docs else 0
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB: {len(docs)} input{'s' if len(docs) != 1 else ''}, "
          f"{layers} attention layer{'s' if layers != 1 else ''} each); open it in a browser")
    return 0


def _query(text: str) -> tuple[int, int]:
    """``--query ROW,COL`` -> ``(row, col)``."""
    parts = text.split(",")
    try:
        row, col = (int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--query takes ROW,COL (two integers, a pixel of the input image); got {text!r}") from None
    return row, col


def add_visualize(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab visualize``."""
    p = sub.add_parser("visualize", parents=[plugins], help="draw what a trained run's attention looks at (PNGs)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by 'attnlab train'")
    p.add_argument("--input", dest="inputs", action="extend", nargs="+", default=None, metavar="X",
                   help="texts (text runs) or image files (image runs), after RUN_DIR; "
                        "default: the first test examples")
    p.add_argument("--max-inputs", type=positive_int, default=2, help="test examples without --input (default 2)")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default RUN_DIR/visualize)")
    p.add_argument("--checkpoint", default="auto", help="auto, best, last, averaged or a checkpoint folder")
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default cpu)")
    p.add_argument("--query", action="append", default=None, metavar="ROW,COL",
                   help="BoTNet: a query pixel of the input image (repeatable; default: centre and diagonal)")
    p.set_defaults(func=cmd_visualize)


def add_explore(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab explore``."""
    p = sub.add_parser("explore", parents=[plugins],
                       help="write an interactive page of every head of every layer (one HTML file, offline)")
    p.add_argument("target", metavar="TARGET", help="a run directory written by 'attnlab train', or a Hugging Face "
                                                    f"folder (a decoder: {decoder_names()}; an encoder: {encoder_names()}; ViT), or a "
                                                    f"decoder's GGUF file")
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="texts (text and language-model runs, text folders), a source sentence (translation) or "
                        "image files (image models); -: lines of standard input; default: the run's first test examples or its "
                        "prompts")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="the page (default RUN_DIR/explore.html; beside a folder: FOLDER.explore.html)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--max-inputs", type=positive_int, default=2, help="test examples without INPUT (default 2)")
    p.add_argument("--new-tokens", type=nonnegative_int, default=20,
                   help="tokens a language model adds to each prompt, greedily (default 20)")
    p.add_argument("--checkpoint", default="auto", help="auto, best, last, averaged or a checkpoint folder")
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps or auto (default cpu)")
    p.add_argument("--title", default=None, help="the page's title (default: the target's name)")
    p.add_argument("--ablate", action="store_true",
                   help="a language model: each head's row gains the change in the loss on the input when the head's "
                        "output is removed")
    p.add_argument("--lang", choices=("en", "zh"), default="en",
                   help="the language the page opens in: en (English, default) or zh (Chinese); a button on the "
                        "page switches")
    p.set_defaults(func=cmd_explore)
