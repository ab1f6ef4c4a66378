"""Beam search of a decoder: attnlab against transformers on the same random Llama weights.

    .venv/bin/python benchmarks/beam_decoder.py [--beams 4] [--new 64] [--rounds 5]

Prints the median seconds of each over the rounds (interleaved) and their ratio, and checks that
the two give the same tokens. Run it alone on the machine: two torch processes slow each other.
"""

import argparse
import statistics
import tempfile
import time

import torch
import transformers

from attnlab.formats import from_hf


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                                   eos_token_id=5, pad_token_id=2)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    with tempfile.TemporaryDirectory() as folder:
        ref.save_pretrained(folder)
        ours = from_hf(folder).eval()
    ids = torch.randint(6, 2048, (args.batch, 16))
    runs = {
        "transformers": lambda: ref.generate(ids, num_beams=args.beams, max_new_tokens=args.new, do_sample=False,
                                             eos_token_id=5, pad_token_id=2),
        "attnlab": lambda: ours.generate(ids, args.new, num_beams=args.beams, eos_id=5, pad_id=2),
    }
    outputs = {name: run() for name, run in runs.items()}  # warm-up, and the tokens compared
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            with torch.no_grad():
                run()
            times[name].append(time.perf_counter() - start)
    same = outputs["attnlab"].tolist() == outputs["transformers"].tolist()
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads; "
          f"batch {args.batch}, {args.beams} beams, {args.new} new tokens, width 256, 4 layers")
    for name, t in med.items():
        print(f"{name:13s} {t:.3f} s (median of {args.rounds})")
    print(f"attnlab / transformers speed: {med['transformers'] / med['attnlab']:.2f}x; same tokens: {same}")


if __name__ == "__main__":
    main()
