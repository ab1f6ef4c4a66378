"""CIFAR-10 under a wall-clock budget: every shipped CIFAR-10 recipe, trained and tested.

The reference is ``attncnn-cifar10`` (about 30 minutes on an AVX2-only 2-core CPU, under
9 on an AVX512-BF16 one with ``precision: auto``); the Transformer recipes
(``vit-cifar10``, ``cct-cifar10``, ``cct-fast-cifar10``) are sized to train within 1.5
times its time on the same machine. Each trains on 45,000 of the 50,000 training images,
evaluates the other 5,000 (validation) five times, keeps the best weights as ``best/``,
and tests those once on the 10,000 test images. The recipes run one after another, each
through the ``attnlab train`` command in its own process, so that nothing else competes
for the cores; the table is then read back from each run directory's ``metrics.jsonl``
and ``results.json``, and ``--plot`` draws the validation accuracy against minutes.

    python benchmarks/cifar10_budget.py                   # train them all, print the table
    python benchmarks/cifar10_budget.py --table-only --plot docs/bench/cifar10_curves.png
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

RECIPES = ["attncnn-cifar10", "botnet-cifar10", "vit-cifar10", "resnet-cifar10", "cct-cifar10", "cct-fast-cifar10"]


def train(recipe: str, run_dir: Path) -> None:
    cmd = [sys.executable, "-m", "attnlab", "train", recipe, "--run-dir", str(run_dir)]
    if (run_dir / "checkpoints").is_dir() and not (run_dir / "results.json").exists():
        cmd.append("--resume")  # an interrupted run continues instead of starting over
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def _evals(run_dir: Path) -> list[dict]:
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e for e in evals if e.get("kind") == "eval"]


def row(recipe: str, run_dir: Path) -> str:
    results = json.loads((run_dir / "results.json").read_text())
    evals = _evals(run_dir)
    val = lambda e: f"{100 * e['accuracy']:.2f}% ({e['elapsed_s'] / 60:.1f} min)" if e else "n/a"  # noqa: E731
    half = evals[(len(evals) - 1) // 2] if len(evals) > 1 else None
    return (f"| {recipe} | {results['model']} | {results['params'] / 1e6:.2f} M | {results.get('precision', 'fp32')} | "
            f"{val(half)} | {val(evals[-1] if evals else None)} | "
            f"**{100 * results['test_accuracy']:.2f}%** ({results['test_checkpoint']}) | "
            f"{results['samples_per_s']:.0f} |")


def plot(recipes: list[str], root: Path, path: Path) -> None:
    """Validation accuracy against training minutes, one curve per recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for recipe in recipes:
        if (root / recipe / "results.json").exists():
            evals = _evals(root / recipe)
            precision = json.loads((root / recipe / "results.json").read_text()).get("precision", "fp32")
            ax.plot([e["elapsed_s"] / 60 for e in evals], [100 * e["accuracy"] for e in evals], marker="o",
                    label=f"{recipe} ({precision})")
    ax.set_xlabel("training minutes (evaluations included)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(f"CIFAR-10 recipes, {cpu_model()}, 2 cores")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=RECIPES)
    parser.add_argument("--run-root", default="runs/cifar10-budget")
    parser.add_argument("--table-only", action="store_true", help="do not train; print the table of existing runs")
    parser.add_argument("--plot", default=None, metavar="PNG", help="also draw validation accuracy against minutes")
    args = parser.parse_args()
    root = Path(args.run_root)
    if not args.table_only:
        for recipe in args.recipes:
            if not (root / recipe / "results.json").exists():
                train(recipe, root / recipe)
    print(f"\nCIFAR-10 under a time budget; {cpu_model()}\n")
    print("| recipe | model | params | precision | validation accuracy half-way | at the end | test accuracy (weights) "
          "| train images/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for recipe in args.recipes:
        if (root / recipe / "results.json").exists():
            print(row(recipe, root / recipe))
    if args.plot:
        plot(args.recipes, root, Path(args.plot))


if __name__ == "__main__":
    main()
