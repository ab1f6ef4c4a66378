"""Fine-tuning on small data: a model trained on one data set against the same model
trained from scratch on a small second one, fine-tuned whole, with LoRA adapters, or by
its head alone.

Two pairs, each read as data of one's own:

* ``images``: CIFAR-10's image folders (``attnlab train image-folder``, the attention
  CNN). Source: airplane, automobile, bird, cat, deer (22,500 training images after a 10%
  validation split). Target: dog, frog, horse, ship, truck, with 200 training images per
  class (``data.max_per_class=200``), tested on their 5,000 CIFAR-10 test images.
* ``text``: MR's sentences as CSV files (``attnlab train text-classification``, the
  2-layer attention classifier). Source: half of the sentences (5,338, balanced). Target:
  500 sentences of the other half (200 more for validation), tested on the remaining
  4,640: the same task on new sentences with a tenth of the labels. The target runs that
  start from the source read its tokenizer (``text.tokenizer_file``), as they must.

On the target, the same recipe and budget run six ways: from scratch, fine-tuned from the
source run (``model.checkpoint=RUN``: its head is replaced), with the backbone at a
tenth of the rate (``model.backbone_lr_scale=0.1``), the head alone
(``model.freeze_backbone=true``), and LoRA on the attention projections at ranks 4 and
16 (``model.lora.rank=R``, alpha 2R: the adapters and the head train). Each run goes
in its own process (``attnlab.train``, as ``attnlab train`` runs it, without the HTML
report), whose peak resident memory is read from the operating system when it ends; the
table is read back from the run directories.

    python benchmarks/finetune_small_data.py                  # the images pair: train all, print the table
    python benchmarks/finetune_small_data.py --pair text
    python benchmarks/finetune_small_data.py --table-only     # re-print it
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model  # noqa: E402

SOURCE = ["airplane", "automobile", "bird", "cat", "deer"]
TARGET = ["dog", "frog", "horse", "ship", "truck"]
TARGET_BATCH = 64
RANKS = (4, 16)
TRAIN = ("import sys; from attnlab.recipes import load_recipe; from attnlab.run.skeleton import train; "
         "train(load_recipe(sys.argv[1], sys.argv[4:]), sys.argv[2], resume=sys.argv[3] == 'True')")
PEAK = "bench_peak_rss_mb.txt"  # written beside the run's files: its process's peak resident memory


def data_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


def ways(source: Path, target: list[str], from_source: list[str]) -> dict[str, list[str]]:
    """The six target runs: ``target`` overrides, ``from_source`` added to those that start
    from the source run."""
    start = [*target, f"model.checkpoint={source}", *from_source]
    return {
        "from scratch": target,
        "fine-tuned, all weights (`model.checkpoint=RUN`)": start,
        "fine-tuned, backbone at 0.1x (`model.backbone_lr_scale=0.1`)": [*start, "model.backbone_lr_scale=0.1"],
        "head alone (`model.freeze_backbone=true`)": [*start, "model.freeze_backbone=true"],
        **{f"LoRA rank {r} on the attention projections (`model.lora.rank={r}`)":
           [*start, f"model.lora.rank={r}", f"model.lora.alpha={2 * r}"] for r in RANKS},
    }


def target_steps(steps: int) -> list[str]:
    return [f"train.steps={steps}", "train.warmup_steps=30", f"train.batch_size={TARGET_BATCH}",
            f"train.eval_every={steps // 3}", f"train.checkpoint_every={steps // 3}", "train.progress=false"]


def image_plan(out: Path, source_steps: int, steps: int) -> tuple[str, dict[str, list[str]]]:
    root = data_dir() / "cifar10"
    common = lambda classes: [f"data.root={root}", "data.img_size=32",  # noqa: E731
                              f"data.classes=[{','.join(classes)}]", "train.progress=false"]
    source = [*common(SOURCE), f"train.steps={source_steps}", "train.batch_size=256", "train.lr=0.003",
              "train.warmup_steps=60", f"train.eval_every={source_steps // 2}",
              f"train.checkpoint_every={source_steps // 4}"]
    target = [*common(TARGET), "data.max_per_class=200", *target_steps(steps)]
    return "image-folder", {"source": source, **ways(out / "source", target, [])}


def mr_csvs(folder: Path) -> dict[str, Path]:
    """MR split in two halves by a seeded shuffle of each class: the source's sentences, and
    the target's 500 training, 200 validation and 4,640 test sentences, as CSV files."""
    files = {k: folder / f"{k}.csv" for k in ("source", "target_train", "target_val", "target_test")}
    if all(f.is_file() for f in files.values()):
        return files
    rows: dict[str, list[tuple[str, str]]] = {k: [] for k in files}
    for label in ("pos", "neg"):
        lines = (data_dir() / "mr" / f"rt-polarity.{label}").read_bytes().decode("latin-1").splitlines()
        lines = [line.strip() for line in lines if line.strip()]
        random.Random(0).shuffle(lines)
        half = len(lines) // 2
        named = "positive" if label == "pos" else "negative"
        parts = {"source": lines[:half], "target_train": lines[half:half + 250],
                 "target_val": lines[half + 250:half + 350], "target_test": lines[half + 350:]}
        for k, part in parts.items():
            rows[k] += [(t, named) for t in part]
    folder.mkdir(parents=True, exist_ok=True)
    for k, path in files.items():
        random.Random(1).shuffle(rows[k])
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(rows[k])
    return files


def text_plan(out: Path, source_steps: int, steps: int) -> tuple[str, dict[str, list[str]]]:
    files = mr_csvs(out / "data")
    source = [f"data.train={files['source']}", f"train.steps={source_steps}", "train.progress=false"]
    target = [f"data.train={files['target_train']}", f"data.val={files['target_val']}",
              f"data.test={files['target_test']}", *target_steps(steps)]
    tokenizer = [f"text.tokenizer_file={out / 'source' / 'tokenizer.json'}"]  # the source's words
    return "text-classification", {"source": source, **ways(out / "source", target, tokenizer)}


PAIRS = {"images": image_plan, "text": text_plan}


def train(recipe: str, name: str, overrides: list[str], run_dir: Path) -> None:
    if (run_dir / "results.json").is_file():
        print(f"{name}: done already ({run_dir})", flush=True)
        return
    # attnlab.train as `attnlab train` calls it, without the HTML report it writes afterwards (the
    # peak memory is then training's and testing's)
    cmd = [sys.executable, "-c", TRAIN, recipe, str(run_dir), str((run_dir / "checkpoints").is_dir()), *overrides]
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage: its peak resident memory (KiB on Linux)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    (run_dir / PEAK).write_text(f"{usage.ru_maxrss / 1024:.0f}\n")


def table(out: Path, plan: dict[str, list[str]], pair: str) -> str:
    lines = [f"Fine-tuning on small data ({pair}); {cpu_model()}, seed 0", "",
             "| target run | trainable parameters | val accuracy | test accuracy | train time | ms / step | "
             "peak memory |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in plan:
        run_dir = out / slug(name)
        if not (run_dir / "results.json").is_file():
            continue
        r = json.loads((run_dir / "results.json").read_text())
        if name == "source":
            lines.insert(1, f"source run: {r.get('train_size', '?'):,} training samples, {r['steps']} steps of "
                            f"{r['samples_per_s']:.0f} samples/s: test accuracy {100 * r['test_accuracy']:.2f}% on "
                            f"{r.get('test_size', r.get('test_samples', '?')):,}; {r['precision']}")
            continue
        peak = (run_dir / PEAK).read_text().strip() + " MB" if (run_dir / PEAK).is_file() else "?"
        trainable = r.get("trainable_params", r["params"])
        lines.append(f"| {name} | {trainable:,} of {r['params']:,} | {100 * r['best_val_accuracy']:.2f}% | "
                     f"**{100 * r['test_accuracy']:.2f}%** | {r['train_seconds']:.0f} s | "
                     f"{1000 * TARGET_BATCH / r['samples_per_s']:.1f} | {peak} |")
    return "\n".join(lines)


def slug(name: str) -> str:
    """A run's folder: its row name up to the first parenthesis, in lower case with dashes."""
    return "-".join(name.split("(")[0].replace(",", " ").replace(".", "").split()).lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="images")
    parser.add_argument("--out", default=None, help="folder of the runs (default runs/finetune-small-data[-text])")
    parser.add_argument("--source-steps", type=int, default=600)
    parser.add_argument("--target-steps", type=int, default=300)
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out or ("runs/finetune-small-data" + ("-text" if args.pair == "text" else "")))
    recipe, plan = PAIRS[args.pair](out, args.source_steps, args.target_steps)
    if not args.table_only:
        for name, overrides in plan.items():
            train(recipe, name, overrides, out / slug(name))
    print(table(out, plan, args.pair))


if __name__ == "__main__":
    main()
