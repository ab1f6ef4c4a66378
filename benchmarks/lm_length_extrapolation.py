"""Length extrapolation: a character model of Tiny Shakespeare trained with a context of 256,
scored at 256, 512 and 1,024, for each kind of position (learned, sinusoidal, rotary, ALiBi).

    .venv/bin/python benchmarks/lm_length_extrapolation.py --out /tmp/extrapolation [--steps 300]

Each position kind trains ``lm-shakespeare-char`` with ``text.context=256`` and only
``model.options.pos_embed`` changed (learned and sinusoidal tables get 1,024 rows, of which
training reaches the first 256), for ``--steps`` steps; then the validation part is scored
in windows of each length (every token but the first of a window predicted once, so a
longer window gives most tokens more to read). ALiBi's claim (Press et al., 2022): its
loss keeps falling past the training length, while sinusoidal positions break down. Runs
are kept in ``--out``: a second call scores them again without training. Time it alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

KINDS = ("learned", "sinusoidal", "rope", "alibi")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="a folder for the four runs")
    parser.add_argument("--steps", type=int, default=300, help="training steps of each model (default 300)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    args = parser.parse_args()

    import attnlab
    from attnlab.bench.machine import machine_info, machine_label
    from attnlab.data.lm_dataset import LMDataset
    from attnlab.data.source import source_of
    from attnlab.engine.trainer import evaluate_model
    from attnlab.recipes import load_recipe
    from attnlab.tasks import train

    out = Path(args.out)
    longest = max(args.lengths)
    print(f"machine: {machine_label(machine_info())}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"lm-shakespeare-char, context 256 in training, {args.steps} steps of batch {args.batch_size}; "
          f"validation loss in nats per character\n")
    rows = []
    for kind in KINDS:
        run_dir = out / kind
        if not (run_dir / "results.json").is_file():
            recipe = load_recipe("lm-shakespeare-char", [
                f"model.options.pos_embed={kind}", f"model.options.max_len={longest}", "text.context=256",
                f"train.steps={args.steps}", f"train.batch_size={args.batch_size}", f"train.eval_every={args.steps}",
                f"train.checkpoint_every={args.steps}", f"train.warmup_steps={min(100, args.steps // 10)}",
                "train.progress=false", "train.tensorboard=false", "train.precision=fp32",
                "generate.max_new_tokens=1"])
            train(recipe, run_dir, log=lambda line: None)
        run = attnlab.load_run(run_dir)
        val = source_of(run.recipe.data).load(run.recipe.data).val
        losses = []
        for length in args.lengths:
            data = LMDataset(val, run.tokenizer, length)
            losses.append(evaluate_model(run.model, data, batch_size=max(1, 4096 // length), device="cpu",
                                         precision="fp32")["loss"])
        rows.append((kind, losses))
        print(f"  {kind}: " + ", ".join(f"{n}: {v:.4f}" for n, v in zip(args.lengths, losses)), flush=True)
    print("\n| positions | " + " | ".join(f"loss at {n}" for n in args.lengths) + " |")
    print("| --- |" + " ---: |" * len(args.lengths))
    for kind, losses in rows:
        print(f"| {kind} | " + " | ".join(f"{v:.4f}" for v in losses) + " |")


if __name__ == "__main__":
    main()
