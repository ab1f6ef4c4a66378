"""``attnlab demo``: a tiny Transformer trained to reverse strings, in a temporary folder."""

from __future__ import annotations

import argparse
import tempfile

from .. import __version__
from .common import UsageError, positive_int, table


def cmd_demo(args: argparse.Namespace) -> int:
    """``attnlab train demo-reverse`` into a temporary folder, with its examples."""
    import torch

    from ..recipes import load_recipe
    from ..tasks import get_task, load_run, train

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: CUDA is not available on this machine")
    recipe = load_recipe("demo-reverse", [f"train.steps={args.steps}", f"train.seed={args.seed}",
                                          f"data.seed={args.seed}", f"train.device={args.device}",
                                          "train.tensorboard=false", "train.progress=false"])
    print(f"attnlab {__version__}: training {recipe.model.name} to reverse token strings "
          f"({args.steps} steps, device {args.device})")
    with tempfile.TemporaryDirectory(prefix="attnlab-demo-") as folder:
        task = get_task(recipe.task)
        results = train(recipe, folder)
        run = load_run(folder)
        examples = run.predict(["5 9 3 7", "12 4 4 18 6", "3 14 8 19 11 10 5"])
    print()
    table([("training steps", f"{results['steps']}"), ("training time", f"{results['train_seconds']:.1f} s"),
            *task.metric_rows(results)], ("metric", "value"))
    print()
    for p in examples:
        print(f"  {p.input} -> {p.output}")
    return 0


def add_demo(sub, plugins: argparse.ArgumentParser) -> None:
    """``attnlab demo``."""
    p = sub.add_parser("demo", help="train a tiny Transformer to reverse strings, then decode (about a minute)")
    p.add_argument("--steps", type=positive_int, default=600, help="training steps (default 600)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    p.set_defaults(func=cmd_demo)
