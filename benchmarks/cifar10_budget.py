"""CIFAR-10 under a wall-clock budget: accuracy after ~15 and ~30 minutes of training.

Each recipe is sized (steps x batch) to train for about 30 minutes on a 2-core CPU on
45,000 of the 50,000 training images, evaluates the other 5,000 (validation) half-way
(about 15 minutes) and at the end, keeps the better of the two as ``best/``, and tests
those weights once on the 10,000 test images. The recipes run one
after another, each through the ``attnlab train`` command in its own process, so that
nothing else competes for the cores; the table is then read back from each run
directory's ``metrics.jsonl`` and ``results.json``.

    python benchmarks/cifar10_budget.py                   # train all four, print the table
    python benchmarks/cifar10_budget.py --table-only      # re-print from existing runs
    python benchmarks/cifar10_budget.py --recipes attncnn-cifar10 --run-root runs/cifar10-budget
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model  # noqa: E402

RECIPES = ["attncnn-cifar10", "botnet-cifar10", "vit-cifar10", "resnet-cifar10", "cct-cifar10"]


def train(recipe: str, run_dir: Path) -> None:
    cmd = [sys.executable, "-m", "attnlab", "train", recipe, "--run-dir", str(run_dir)]
    if (run_dir / "checkpoints").is_dir() and not (run_dir / "results.json").exists():
        cmd.append("--resume")  # an interrupted run continues instead of starting over
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def row(recipe: str, run_dir: Path) -> str:
    results = json.loads((run_dir / "results.json").read_text())
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e.get("kind") == "eval"]
    val = lambda e: f"{100 * e['accuracy']:.2f}% ({e['elapsed_s'] / 60:.1f} min)" if e else "n/a"  # noqa: E731
    return (f"| {recipe} | {results['model']} | {results['params'] / 1e6:.2f} M | "
            f"{val(evals[0] if len(evals) > 1 else None)} | {val(evals[-1] if evals else None)} | "
            f"**{100 * results['test_accuracy']:.2f}%** ({results['test_checkpoint']}) | "
            f"{results['samples_per_s']:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=RECIPES)
    parser.add_argument("--run-root", default="runs/cifar10-budget")
    parser.add_argument("--table-only", action="store_true", help="do not train; print the table of existing runs")
    args = parser.parse_args()
    root = Path(args.run_root)
    if not args.table_only:
        for recipe in args.recipes:
            if not (root / recipe / "results.json").exists():
                train(recipe, root / recipe)
    print(f"\nCIFAR-10 under a time budget; {cpu_model()}, fp32\n")
    print("| recipe | model | params | validation accuracy half-way | at the end | test accuracy (weights) "
          "| train images/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for recipe in args.recipes:
        if (root / recipe / "results.json").exists():
            print(row(recipe, root / recipe))


if __name__ == "__main__":
    main()
