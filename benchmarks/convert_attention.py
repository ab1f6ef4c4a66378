"""What changing SmolLM2's attention costs before any fine-tuning: the validation loss of
SmolLM2-135M-Instruct (the packaged model, ``make models``) on Tiny Shakespeare's validation
part (the character recipe's split) right after ``model.convert_attention`` turns every layer
into sliding windows or latent attention of each size, with the decoding cache's bytes a token.

The rows choose the settings the fine-tuning runs of the results page start from; the
fine-tuning itself is the recipe's (``attnlab train lm-shakespeare-pretrained
"model.convert_attention={to: latent, ...}"``), not this script's.

    python benchmarks/convert_attention.py --windows 8 --out /tmp/convert.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from attnlab.data import data_dir
from attnlab.models.convert import ConvertAttention, cache_bytes_per_token, convert_options, convert_weights
from attnlab.models.gpt import GPT
from attnlab.models.gpt_config import GPTConfig
from attnlab.formats.hf.load import read_hf
from attnlab.formats.hf.files import open_checkpoint
from attnlab.formats.packaged import packaged_model
from attnlab.viz.ablation import next_token_loss

SETTINGS = [None, ConvertAttention(to="sliding", window=256)] + [
    ConvertAttention(to="latent", rope_dim=rope, kv_rank=rank)
    for rope, rank in [(16, 336), (32, 288),  # full rank: what partial RoPE alone costs
                       (16, 144), (24, 120), (32, 96), (40, 72), (48, 48),  # half the cache
                       (8, 72), (16, 48), (24, 24)]  # a quarter of it
] + [ConvertAttention(to="latent", rope_dim=32, kv_rank=96, calibrate=0)]  # from the weights alone


def _windows(tokenizer, n: int, length: int, part: str = "val") -> torch.Tensor:
    """``n`` windows of ``length`` tokens from the start of Tiny Shakespeare's validation part
    (or its training part)."""
    text = (data_dir() / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    start = int(0.9 * len(text))
    val = text[start: start + (len(text) - start) // 2] if part == "val" else text[:start]
    ids = tokenizer.encode(val[: n * length * 8])[: n * length]
    if len(ids) < n * length:
        raise SystemExit(f"the validation part has {len(ids)} tokens, fewer than {n} windows of {length}")
    return torch.tensor(ids).view(n, length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=8, help="windows of the validation part scored")
    parser.add_argument("--length", type=int, default=1024, help="tokens a window (the recipe's context)")
    parser.add_argument("--calibrate", type=int, default=8,
                        help="windows of the training part the latent factorisation weighs (0: the weights alone)")
    parser.add_argument("--only", type=int, nargs="*", help="the settings of these indices alone (0: unchanged)")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    source = packaged_model("smollm2-135m-instruct")
    _, cfg, weights = read_hf(source)
    options = asdict(cfg)
    if options.get("tie_embeddings") and "head.weight" not in weights:
        weights["head.weight"] = weights["tok_embed.weight"]
    tokenizer = open_checkpoint(source).tokenizer()
    ids = _windows(tokenizer, args.windows, args.length)
    calibration = list(_windows(tokenizer, args.calibrate, args.length, "train")[:, None]) if args.calibrate else []
    rows = []
    for index, spec in enumerate(SETTINGS):
        if args.only and index not in args.only:
            continue
        started = time.perf_counter()
        converted = options if spec is None else convert_options(options, spec)
        model = GPT(GPTConfig(**converted)).eval()
        if spec is not None and spec.to == "latent" and spec.calibrate:
            spec.calibrate = args.calibrate
        model.load_state_dict(weights if spec is None else convert_weights(weights, options, spec, calibration))
        with torch.no_grad():
            loss = float(torch.cat([next_token_loss(model(row[None]), row[None]) for row in ids]).mean())
        label = "unchanged" if spec is None else ", ".join(
            f"{k}: {v}" for k, v in asdict(spec).items() if v is not None and (spec.to == "latent" or k != "calibrate"))
        row = {"setting": label, "val_loss": round(loss, 4),
               "cache_bytes_per_token": cache_bytes_per_token(GPTConfig(**converted), args.length),
               "seconds": round(time.perf_counter() - started, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"windows": args.windows, "length": args.length, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
