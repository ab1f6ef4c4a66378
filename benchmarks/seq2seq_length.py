"""Training-step time against sentence length: the recurrent translator against the Transformer.

The tutorials' first claim for the Transformer is that it trains in parallel over the
positions of a sentence, where a recurrent decoder must take them one after another. This
script times one training step (forward, cross-entropy, backward; no optimizer) of
``gru_attention_small`` and ``transformer_small`` (the two translation recipes' models: 6,000
BPE tokens per language, width 256, the Transformer with d_ff 512) on random batches whose
source and target both have ``L`` tokens, for growing ``L``, in one process, the two models
in turn at each length (so that drift of the machine affects both alike). Reported: the
median step time of ``--repeats`` steps after one untimed step, the time per target token,
and the ratio GRU / Transformer (above 1: the Transformer is faster).

    python benchmarks/seq2seq_length.py                       # lengths 8 ... 256, batch 32
    python benchmarks/seq2seq_length.py --device cuda         # where a GPU shows the parallelism

On a CPU of a few cores the parallelism a GPU gives the Transformer's positions is mostly
absent: both models' time then grows with the work, and what differs is how the work grows
(the GRU's steps are sequential small matrix products; the Transformer's attention is
quadratic in ``L``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import attnlab

MODELS = {  # as the recipes build them: a table of embeddings per language
    "gru_attention_small": dict(share_embeddings=False),
    "transformer_small": dict(mlp_ratio=2.0, drop_rate=0.1, share_embeddings=False),
}


def step_seconds(model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    logits = model(src, tgt[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8,16,32,64,128,256", help="tokens per source and target sentence")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=6000)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    models = {name: attnlab.create_model(name, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab,
                                         max_len=1024, **opts).to(device).train()
              for name, opts in MODELS.items()}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}, batch {args.batch}; "
          + ", ".join(f"{n} {p / 1e6:.2f} M parameters" for n, p in params.items()))
    print("| L (source = target) | " + " | ".join(f"{n} ms/step (µs/target token)" for n in models)
          + " | GRU / Transformer |")
    print("| ---: | " + " | ".join("---:" for _ in models) + " | ---: |")
    for length in (int(x) for x in args.lengths.split(",")):
        src = torch.randint(3, args.vocab, (args.batch, length), device=device)
        tgt = torch.randint(3, args.vocab, (args.batch, length + 1), device=device)
        tgt[:, 0] = 1  # BOS
        times: dict[str, list[float]] = {n: [] for n in models}
        for n, m in models.items():
            step_seconds(m, src, tgt, device)  # untimed: allocations, first-call work
        for i in range(args.repeats):
            for n in (list(models) if i % 2 == 0 else list(models)[::-1]):
                times[n].append(step_seconds(models[n], src, tgt, device))
        med = {n: statistics.median(t) for n, t in times.items()}
        cells = [f"{1e3 * s:.1f} ({1e6 * s / (args.batch * length):.0f})" for s in med.values()]
        print(f"| {length} | " + " | ".join(cells) + f" | {med['gru_attention_small'] / med['transformer_small']:.2f}x |")


if __name__ == "__main__":
    main()
