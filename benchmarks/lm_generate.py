"""Cached generation speed of attnlab's decoder against transformers' ``generate``, with
the same weights (a Llama-style model: 4 layers of width 256, 8 query and 2 key/value
heads), greedy, the tokens checked identical; and attnlab with its cache against
recomputing the whole sequence at each step.

    .venv/bin/python benchmarks/lm_generate.py [--new 256] [--batches 1 8] [--repeats 3]

Prints a table (tokens per second: new tokens of all rows over wall time; best of the
repeats). Needs ``transformers`` (the dev extra). Time it alone on the machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def _best(fn, repeats: int) -> tuple[float, torch.Tensor]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=256, help="new tokens per row (default 256)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens (default 16)")
    args = parser.parse_args()

    import transformers

    from attnlab.bench.machine import machine_info, machine_label
    from attnlab.models import from_hf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                                      eos_token_id=None, bos_token_id=None, pad_token_id=None)
    theirs = transformers.LlamaForCausalLM(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        theirs.save_pretrained(folder)
        ours = from_hf(folder)
    print(f"machine: {machine_label(machine_info())}; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"Llama-style model, 4 layers of width 256, 8 query / 2 key-value heads; prompt {args.prompt}, "
          f"{args.new} new tokens, greedy, best of {args.repeats}\n")
    print("| batch | transformers generate | attnlab generate | ratio | attnlab without cache | cache speed-up |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch in args.batches:
        ids = torch.randint(0, 256, (batch, args.prompt), generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            t_hf, out_hf = _best(lambda: theirs.generate(ids, max_new_tokens=args.new, do_sample=False,
                                                         pad_token_id=0), args.repeats)
            t_ours, out_ours = _best(lambda: ours.generate(ids, args.new), args.repeats)

            def uncached() -> torch.Tensor:
                x = ids
                for _ in range(args.new):
                    x = torch.cat([x, ours(x)[:, -1].argmax(-1, keepdim=True)], 1)
                return x

            t_plain, out_plain = _best(uncached, 1)
        if not (torch.equal(out_hf, out_ours) and torch.equal(out_ours, out_plain)):
            raise SystemExit("the generated tokens differ: the comparison is void")
        rate = lambda t: batch * args.new / t  # noqa: E731
        print(f"| {batch} | {rate(t_hf):,.0f} tok/s | {rate(t_ours):,.0f} tok/s | {t_hf / t_ours:.2f}x | "
              f"{rate(t_plain):,.0f} tok/s | {t_plain / t_ours:.2f}x |")


if __name__ == "__main__":
    main()
