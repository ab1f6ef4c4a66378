"""A synthetic sequence task that trains in a minute on a CPU: reverse a token string.

It exercises the whole encoder-decoder path (padding masks, causal decoder, tied
embeddings, greedy and beam-search generation with the cache) on data that needs no
download, and reports exact-match accuracy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..models import create_model

PAD, BOS, EOS, FIRST = 0, 1, 2, 3


@dataclass
class ReverseResult:
    steps: int
    train_seconds: float
    final_loss: float
    greedy_accuracy: float
    beam_accuracy: float
    examples: list[tuple[list[int], list[int]]]


def make_batch(batch: int, vocab: int, min_len: int, max_len: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random strings (right-padded) and their reversals followed by EOS."""
    lengths = torch.randint(min_len, max_len + 1, (batch,), generator=gen)
    src = torch.full((batch, max_len), PAD, dtype=torch.long)
    tgt = torch.full((batch, max_len + 1), PAD, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        s = torch.randint(FIRST, vocab, (n,), generator=gen)
        src[i, :n] = s
        tgt[i, :n] = s.flip(0)
        tgt[i, n] = EOS
    return src, tgt


def exact_match(pred: torch.Tensor, tgt: torch.Tensor) -> float:
    width = max(pred.shape[1], tgt.shape[1])
    pred = F.pad(pred, (0, width - pred.shape[1]), value=PAD)
    tgt = F.pad(tgt, (0, width - tgt.shape[1]), value=PAD)
    return (pred == tgt).all(dim=1).float().mean().item()


def run(steps: int = 600, batch: int = 64, vocab: int = 20, max_len: int = 12, seed: int = 0,
        device: str = "cpu", log_every: int = 100, log=print) -> ReverseResult:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = create_model("transformer_tiny", src_vocab_size=vocab, tgt_vocab_size=vocab, dropout=0.0,
                         max_len=64).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=steps, pct_start=0.1)
    start = time.perf_counter()
    loss = torch.tensor(0.0)
    model.train()
    for step in range(1, steps + 1):
        src, tgt = (t.to(device) for t in make_batch(batch, vocab, 2, max_len, gen))
        dec_in = F.pad(tgt[:, :-1], (1, 0), value=BOS)
        logits = model(src, dec_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log_every and step % log_every == 0:
            log(f"step {step:5d}  loss {loss.item():.4f}  {time.perf_counter() - start:6.1f}s")
    train_seconds = time.perf_counter() - start
    model.eval()
    src, tgt = (t.to(device) for t in make_batch(256, vocab, 2, max_len, torch.Generator().manual_seed(seed + 1)))
    greedy = model.generate(src, max_new_tokens=max_len + 1)
    beam = model.generate(src, max_new_tokens=max_len + 1, num_beams=4)
    examples = [(src[i][src[i] != PAD].tolist(), beam[i][beam[i] > EOS].tolist()) for i in range(3)]
    return ReverseResult(steps, train_seconds, loss.item(), exact_match(greedy, tgt), exact_match(beam, tgt), examples)
