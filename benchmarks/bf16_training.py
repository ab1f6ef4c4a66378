"""bfloat16 autocast against float32 for training steps of the shipped models on the CPU.

What it measures
----------------
One training step (forward and loss under ``torch.autocast("cpu", torch.bfloat16)`` for
``bf16``, backward, AdamW step; weights and optimizer in float32) of

* ``vit-cifar10``: the recipe's ViT (patch 4, width 128, 6 blocks), batch 256 (the
  recipe's is 128), 32x32;
* ``attncnn-cifar10``: the recipe's attention CNN, batch 512, channels-last;
* ``cct-cifar10`` and ``cct-fast-cifar10``: the recipes' compact convolutional transformers
  (the paper's tokenizer; the fast CNN's), batch 256, channels-last;
* ``translate-multi30k``: the recipe's Transformer (3+3 layers, width 256), batch 128 of
  source/target sentences of 24 tokens (Multi30k's sentences are about that long), 6,000
  BPE tokens per language;
* ``vit_small_patch16_224``: ViT-S/16 (22 M parameters, 197 tokens), batch 32 at 224x224.

on random inputs (the data path is not timed), in three settings interleaved round by
round (:func:`benchmarks.common.time_interleaved`): ``fp32``; ``bf16`` as attnlab runs it;
and ``bf16, flash`` with attnlab's short-row rule switched off
(``attention.kernels.SHORT_HALF_KEYS_CPU = 0``), so that every attention call goes to
torch's fused kernel, as before the rule existed. Each figure is the median step.

``--profile NAME`` prints torch.profiler's top operators of one workload in fp32 and bf16.
The header names the CPU and its bfloat16 flags: on a CPU without ``avx512_bf16`` or
``amx_bf16`` bfloat16 is emulated, and the script says so and measures float32 only.

Run (from the repository root)::

    .venv/bin/python benchmarks/bf16_training.py            # the table (about 3 minutes on 2 cores)
    .venv/bin/python benchmarks/bf16_training.py --quick    # smaller batches, fewer steps
    .venv/bin/python benchmarks/bf16_training.py --profile vit-cifar10
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, time_interleaved  # noqa: E402

from attnlab.attention import kernels as functional  # noqa: E402  (where SHORT_HALF_KEYS_CPU lives)
from attnlab.engine.device import cpu_bf16_flags  # noqa: E402
from attnlab.models import create_model  # noqa: E402
from attnlab.recipes import load_recipe  # noqa: E402

# name -> (batch, quick batch)
WORKLOADS = {
    "vit-cifar10": (256, 32),
    "attncnn-cifar10": (512, 64),
    "cct-cifar10": (256, 32),
    "cct-fast-cifar10": (256, 32),
    "translate-multi30k": (128, 16),
    "vit_small_patch16_224": (32, 4),
}
SENTENCE, VOCAB = 24, 6000


def build(name: str, batch: int) -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    """The model in train mode and a function computing the loss of one fixed random batch."""
    torch.manual_seed(0)
    if name == "vit_small_patch16_224":
        model, size, classes, channels_last = create_model(name, num_classes=1000), 224, 1000, False
    else:
        recipe = load_recipe(name)
        options = dict(recipe.model.options)
        if name == "translate-multi30k":
            model = create_model(recipe.model.name, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, **options).train()
            src = torch.randint(4, VOCAB, (batch, SENTENCE))
            tgt = torch.randint(4, VOCAB, (batch, SENTENCE + 1))
            return model, lambda: F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten(),
                                                  label_smoothing=0.1)
        model, size, classes = create_model(recipe.model.name, num_classes=10, **options), 32, 10
        channels_last = recipe.train.channels_last
    model.train()
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, classes, (batch,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    return model, lambda: F.cross_entropy(model(x), y, label_smoothing=0.1)


def trainer_step(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor], precision: str,
                 short_rule: bool = True) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        functional.SHORT_HALF_KEYS_CPU = keys
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    keys = functional.SHORT_HALF_KEYS_CPU if short_rule else 0
    return step


def profile(name: str, batch: int) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    keys = functional.SHORT_HALF_KEYS_CPU
    for precision in ("fp32", "bf16"):
        model, loss_fn = build(name, batch)
        step = trainer_step(model, loss_fn, precision)
        for _ in range(2):
            step()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                step()
        functional.SHORT_HALF_KEYS_CPU = keys
        print(f"\n{name}, {precision}, batch {batch}, 3 steps")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batches and 3 timed steps")
    parser.add_argument("--repeats", type=int, default=8, help="timed steps per setting (default 8)")
    parser.add_argument("--only", nargs="*", choices=list(WORKLOADS), help="some workloads only")
    parser.add_argument("--profile", choices=list(WORKLOADS), help="print the top operators of one workload")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    flags = cpu_bf16_flags()
    print(f"CPU: {cpu_model()}, {torch.get_num_threads()} threads, bfloat16 flags: {', '.join(flags) or 'none'}; "
          f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}")
    if args.profile:
        profile(args.profile, WORKLOADS[args.profile][1 if args.quick else 0])
        return
    original = functional.SHORT_HALF_KEYS_CPU
    settings = ["fp32"] + (["bf16", "bf16, flash"] if flags else [])
    if not flags:
        print("This CPU has no native bfloat16: bfloat16 would be emulated (10-100x slower); float32 only.")
    repeats, warmup = (3, 1) if args.quick else (args.repeats, 2)
    print(f"\n| workload | batch | {' | '.join(s + ' samples/s' for s in settings)} |"
          + (" bf16 / fp32 | flash bf16 / fp32 |" if flags else ""))
    print("|" + " --- |" * (2 + len(settings) + (2 if flags else 0)))
    for name in args.only or WORKLOADS:
        batch = WORKLOADS[name][1 if args.quick else 0]
        steps = {}
        for setting in settings:
            model, loss_fn = build(name, batch)  # each setting its own model: same start, no shared state
            steps[setting] = trainer_step(model, loss_fn, setting.split(",")[0], short_rule="flash" not in setting)
        times = time_interleaved(steps, repeats, warmup)
        rate = {s: batch / statistics.median(t) for s, t in times.items()}
        row = f"| {name} | {batch} | " + " | ".join(f"{rate[s]:.0f}" if rate[s] >= 100 else f"{rate[s]:.3g}"
                                                  for s in settings) + " |"
        if flags:
            row += f" {rate['bf16'] / rate['fp32']:.2f}x | {rate['bf16, flash'] / rate['fp32']:.2f}x |"
        print(row, flush=True)
    functional.SHORT_HALF_KEYS_CPU = original


if __name__ == "__main__":
    main()
