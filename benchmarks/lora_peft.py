"""LoRA training step: attnlab against peft on the same BERT (random weights), in one process.

Both start from one ``BertForSequenceClassification`` saved as a Hugging Face folder:
peft wraps the transformers model (``get_peft_model``), attnlab loads the folder into its
own encoder (``from_hf``) and adds its adapters (``apply_lora``), with the same rank,
alpha and targets (the attention projections, or those and the MLP). A step is forward,
cross-entropy, backward and AdamW on the trainable parameters (adapters and classifier);
dropout as configured (0.1). Timed interleaved, one step of each per round; the figure is
the median. The full fine-tuning step of each model is timed beside them for reference.

    OMP_NUM_THREADS=2 python benchmarks/lora_peft.py                 # BERT-base shape, batch 8 x 128 tokens
    python benchmarks/lora_peft.py --size small --batch 32            # 4 layers of width 256
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, time_interleaved  # noqa: E402

from attnlab.layers.lora import apply_lora, mark_only_lora_trainable  # noqa: E402
from attnlab.formats import from_hf  # noqa: E402

SIZES = {"base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
         "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)}
PEFT_TARGETS = {"attention": r".*encoder\.layer\.\d+\.attention\.(self\.(query|key|value)|output\.dense)",
                "mlp": r".*encoder\.layer\.\d+\.(intermediate\.dense|output\.dense)"}


def main() -> None:
    import peft
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default="attention", help="attention, or attention,mlp")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    roles = args.targets.split(",")
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512, num_labels=2, **SIZES[args.size])
    folder = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)

    def theirs(lora: bool) -> torch.nn.Module:
        model = transformers.BertForSequenceClassification.from_pretrained(folder, attn_implementation="sdpa")
        if lora:
            pattern = "|".join(f"(?:{PEFT_TARGETS[r]})" for r in roles)
            model = peft.get_peft_model(model, peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                               target_modules=pattern, modules_to_save=["classifier"]))
        return model.train()

    def ours(lora: bool) -> torch.nn.Module:
        model = from_hf(folder)
        if lora:
            apply_lora(model, rank=args.rank, alpha=2 * args.rank, targets=roles)
            mark_only_lora_trainable(model, keep=["head"])
        return model.train()

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 30000, (args.batch, args.length), generator=gen)
    mask = torch.ones_like(ids)
    mask[args.batch // 2:, args.length * 3 // 4:] = 0  # half the rows padded
    labels = torch.randint(0, 2, (args.batch,), generator=gen)

    def stepper(model: torch.nn.Module, hf: bool):
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4)

        def step() -> None:
            logits = model(input_ids=ids, attention_mask=mask).logits if hf else model(ids, mask)
            F.cross_entropy(logits, labels).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step, sum(p.numel() for p in params)

    models = {"attnlab LoRA": (ours(True), False), "peft LoRA": (theirs(True), True),
              "attnlab full": (ours(False), False), "transformers full": (theirs(False), True)}
    steps, counts = {}, {}
    for name, (model, hf) in models.items():
        steps[name], counts[name] = stepper(model, hf)
    samples = time_interleaved(steps, args.repeats, warmup=2)
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"LoRA training step, BERT-{args.size} shape ({config.num_hidden_layers} layers, width "
          f"{config.hidden_size}), batch {args.batch} x {args.length} tokens, rank {args.rank}, alpha "
          f"{2 * args.rank}, targets {'+'.join(roles)}; {cpu_model()}, {args.threads} threads, fp32, torch "
          f"{torch.__version__}, peft {peft.__version__}, transformers {transformers.__version__}; median of "
          f"{args.repeats} interleaved steps\n")
    print("| step | trainable parameters | ms / step | vs peft LoRA |\n| --- | --- | --- | --- |")
    for name in models:
        print(f"| {name} | {counts[name]:,} | {1000 * med[name]:.0f} | {med['peft LoRA'] / med[name]:.2f}x |")


if __name__ == "__main__":
    main()
