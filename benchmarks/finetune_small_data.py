"""Fine-tuning on small data: a model trained on one data set against the same model
trained from scratch on a small second one.

Both data sets come from the CIFAR-10 image folders that ship in ``../shared/data``, read
as any image folder of one's own (``attnlab train image-folder``):

* source: the five classes airplane, automobile, bird, cat, deer (22,500 training
  images after a 10% validation split), trained with the attention CNN;
* target: the five other classes, dog, frog, horse, ship, truck, with 200 training
  images per class (``data.max_per_class=200``), tested on their 5,000 CIFAR-10 test
  images.

On the target, the same recipe and budget run four ways: from scratch, fine-tuned from
the source run (``model.checkpoint=RUN``: its 5-class head does not fit and is replaced),
fine-tuned with the backbone at a tenth of the rate (``model.backbone_lr_scale=0.1``),
and with the backbone frozen (``model.freeze_backbone=true``, a linear probe). Each run
goes through the ``attnlab train`` command in its own process; the table is read back
from the run directories.

    python benchmarks/finetune_small_data.py                  # train all, print the table
    python benchmarks/finetune_small_data.py --table-only     # re-print it
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model  # noqa: E402

SOURCE = ["airplane", "automobile", "bird", "cat", "deer"]
TARGET = ["dog", "frog", "horse", "ship", "truck"]


def data_root() -> Path:
    root = Path(os.environ.get("ATTNLAB_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
    return root / "cifar10"


def common(classes: list[str]) -> list[str]:
    return [f"data.root={data_root()}", "data.img_size=32", f"data.classes=[{','.join(classes)}]",
            "train.progress=false"]


def runs(out: Path, source_steps: int, target_steps: int) -> dict[str, list[str]]:
    source = dirs(out)["source"]
    target = [*common(TARGET), "data.max_per_class=200", f"train.steps={target_steps}", "train.warmup_steps=30",
              f"train.eval_every={target_steps // 3}", f"train.checkpoint_every={target_steps // 3}"]
    return {
        "source": [*common(SOURCE), f"train.steps={source_steps}", "train.batch_size=256", "train.lr=0.003",
                   "train.warmup_steps=60", f"train.eval_every={source_steps // 2}",
                   f"train.checkpoint_every={source_steps // 4}"],
        "scratch": target,
        "fine-tuned": [*target, f"model.checkpoint={source}"],
        "fine-tuned, backbone at 0.1x": [*target, f"model.checkpoint={source}", "model.backbone_lr_scale=0.1"],
        "backbone frozen (linear probe)": [*target, f"model.checkpoint={source}", "model.freeze_backbone=true"],
    }


def train(name: str, overrides: list[str], run_dir: Path) -> None:
    if (run_dir / "results.json").is_file():
        print(f"{name}: done already ({run_dir})", flush=True)
        return
    cmd = [sys.executable, "-m", "attnlab", "train", "image-folder", *overrides, "--run-dir", str(run_dir)]
    if (run_dir / "checkpoints").is_dir():
        cmd.append("--resume")
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def table(out: Path, plan: dict[str, list[str]]) -> str:
    lines = [f"Fine-tuning on small data; {cpu_model()}, fp32, seed 0", "",
             "| target run (200 images per class, 5 classes) | val accuracy | test accuracy | train time |",
             "| --- | --- | --- | --- |"]
    for name in plan:
        run_dir = dirs(out)[name]
        if not (run_dir / "results.json").is_file():
            continue
        r = json.loads((run_dir / "results.json").read_text())
        if name == "source":
            head = (f"source run: 5 classes, {r['train_size']:,} training images, {r['steps']} steps of "
                    f"{r['samples_per_s']:.0f} img/s: test accuracy "
                    f"{100 * r['test_accuracy']:.2f}% on {r['test_size']:,} images")
            lines.insert(1, head)
            continue
        lines.append(f"| {name} | {100 * r['best_val_accuracy']:.2f}% | **{100 * r['test_accuracy']:.2f}%** | "
                     f"{r['train_seconds']:.0f} s |")
    return "\n".join(lines)


def dirs(out: Path) -> dict[str, Path]:
    return {"source": out / "source", "scratch": out / "scratch", "fine-tuned": out / "finetuned",
            "fine-tuned, backbone at 0.1x": out / "finetuned_lr0.1", "backbone frozen (linear probe)": out / "frozen"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/finetune-small-data", help="folder of the runs")
    parser.add_argument("--source-steps", type=int, default=600)
    parser.add_argument("--target-steps", type=int, default=300)
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    plan = runs(out, args.source_steps, args.target_steps)
    if not args.table_only:
        for name, overrides in plan.items():
            train(name, overrides, dirs(out)[name])
    print(table(out, plan))


if __name__ == "__main__":
    main()
