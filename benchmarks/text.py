"""Throughput of attnlab's text tasks: training tokens per second, and beam-search decoding with and without the cache.

What it measures
----------------
1. Training, sentiment: recipe ``sentiment-mr`` (model, tokenizer trained on the
   training part of the fixed MR split, batch 64, AdamW, fp32), trained by the engine's
   :class:`~attnlab.engine.trainer.Trainer` exactly as ``attnlab train`` does, on its own
   batches. ``--steps`` optimizer steps are timed after ``--warmup`` untimed ones (the
   recipe's step count and learning-rate warm-up are replaced; evaluation, checkpoints,
   logging are off). A step includes fetching the batch, forward, loss, backward,
   gradient clipping, the AdamW step and the schedule. Reported: sentences/s and real
   tokens/s (the attention mask's ones, ``[CLS]``/``[SEP]`` included, padding not), and
   the share of the computed positions that were padding.

2. Training, translation: recipe ``translate-multi30k`` (BPE per language trained on the
   training pairs, ``transformer_small`` with the recipe's options, batch 128 grouped by
   length, label smoothing 0.1), the same way. The peer, in the same process and on the
   same batches: a model of the same size on ``torch.nn.Transformer`` (``batch_first``,
   the same width, heads, layers, feed-forward width, dropout, activation and norm
   placement; its own source and target ``nn.Embedding`` scaled by sqrt(embed_dim), a learned
   ``nn.Embedding`` of positions, embedding dropout, an output ``nn.Linear`` tied to the
   target embedding as attnlab's is; causal mask from
   ``nn.Transformer.generate_square_subsequent_mask``, key padding masks), trained with
   the same step: ``build_optimizer`` (AdamW, same learning rate, weight decay and
   parameter groups), the same schedule, gradient clipping, and
   ``cross_entropy(ignore_index=-100, label_smoothing=...)``. The two step in turn (the
   order alternating), so that drift of the machine affects both alike. Reported: sentence
   pairs/s, target tokens/s (labels other than -100, i.e. target tokens plus EOS),
   source + target tokens/s, and the ratio attnlab / torch.nn (above 1: attnlab faster).
   ``torch.nn.Transformer`` always ends each stack with a LayerNorm, attnlab's post-norm
   model has none: two LayerNorms more for the peer, a negligible share of the work.

3. Decoding: the first ``--sentences`` (256) German sentences of ``test_2016_flickr``,
   tokenized as :func:`attnlab.tasks.translation.translate` does (source tokens + EOS),
   sorted by length and cut into batches of 64, translated by ``model.generate`` with beam
   4 and with greedy search, each with the key/value cache (``use_cache=True``) and
   without (the whole prefix re-decoded at every step). The model: ``--run-dir DIR``, a
   finished translation run (``attnlab.tasks.load_run``: averaged weights,
   else best, else last), or by default a freshly initialised model of the recipe. Every
   setting gets the same ``--max-new-tokens`` (40): a random model rarely produces EOS, so
   its sentences all run to that length; a trained one stops earlier. The four settings
   run in turn on each batch (rotating order); the cache must not change the result: the
   table says whether the tokens were identical, and the script exits with status 1 when
   they were not. Reported: sentences/s, output tokens/s (tokens up to and including EOS),
   and the cache's speed-up.

The header gives the CPU, torch version, threads and device, and warns when other
processes keep the cores busy (then the numbers are not representative).

Run (from the repository root; data under ``$ATTNLAB_DATA_DIR``, or ``--data-dir``)::

    ATTNLAB_DATA_DIR=/work/shared/data .venv/bin/python benchmarks/text.py              # ~5 min on 2 idle cores
    ATTNLAB_DATA_DIR=/work/shared/data .venv/bin/python benchmarks/text.py \\
        --run-dir runs/translate-multi30k --json runs/text.json                          # decode a trained model
    ATTNLAB_DATA_DIR=/work/shared/data .venv/bin/python benchmarks/text.py --steps 2 --sentences 64   # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common import busy_cores, cpu_model  # benchmarks/common.py, beside this script
from attnlab.data.readers.mr import load_mr, mr_split
from attnlab.data.readers.multi30k import load_multi30k
from attnlab.data.batches.texts import SentimentDataset
from attnlab.data.tokenizers.text import TextTokenizer
from attnlab.data.batches.translation import TranslationDataset
from attnlab.engine.device import autocast, select_device
from attnlab.engine.optim import build_optimizer, warmup_cosine
from attnlab.engine.trainer import IGNORE_INDEX, Trainer, TrainConfig
from attnlab.io import atomic_write_bytes
from attnlab.recipes import Recipe, load_recipe
from attnlab.tasks import get_task, load_run, translation
from attnlab.tasks.text import build_tokenizer
from attnlab.tasks.text_classification import TextInfo

SENTIMENT_RECIPE, TRANSLATION_RECIPE = "sentiment-mr", "translate-multi30k"


# --------------------------------------------------------------------------- helpers
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of ``fn``, the device's queued work included."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied parameters once


def bench_config(recipe: Recipe, steps: int, device: torch.device) -> TrainConfig:
    """The recipe's training settings, for ``steps`` steps with nothing but training switched on."""
    return dataclasses.replace(recipe.train, steps=steps, warmup_steps=0, accum_steps=1, compile=False,
                               device=str(device), progress=False, tensorboard=False, log_every=0, eval_every=0,
                               checkpoint_every=0)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


# --------------------------------------------------------------------------- sentiment
def bench_sentiment(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    recipe = load_recipe(SENTIMENT_RECIPE)
    texts, labels = load_mr(args.data_dir or recipe.data.data_dir)
    train_idx = mr_split(labels, seed=recipe.data.seed)[0]
    train_texts = [texts[i] for i in train_idx]
    tokenizer = build_tokenizer(recipe.text, train_texts)
    data = SentimentDataset(train_texts, [labels[i] for i in train_idx], tokenizer, recipe.text.max_length)
    torch.manual_seed(0)
    model = get_task(recipe.task).build_model(recipe, TextInfo(tokenizer, ["negative", "positive"]))
    cfg = bench_config(recipe, args.warmup + args.steps, device)
    trainer = Trainer(model, data, cfg, run_dir=None, log=lambda *_: None)
    order = trainer._batches()
    say(f"sentiment: {len(data)} training sentences, {n_params(model):,} parameters; "
        f"{args.warmup} + {args.steps} steps of batch {cfg.batch_size}")

    seconds, losses, used = [], [], []
    for step in range(args.warmup + args.steps):
        idx = next(order)
        holder: list[float] = []
        s = timed(lambda: holder.append(trainer.train_step(iter([idx]))), device)
        if step >= args.warmup:
            seconds.append(s)
            losses.append(holder[0])
            used.append(idx)
    lengths = [data.lengths[torch.tensor(idx)] for idx in used]
    real = sum(int(n.sum()) for n in lengths)
    positions = sum(len(n) * int(n.max()) for n in lengths)
    sentences = sum(len(idx) for idx in used)
    total = sum(seconds)
    return {"recipe": SENTIMENT_RECIPE, "model": recipe.model.name, "params": n_params(model),
            "batch_size": cfg.batch_size, "steps": args.steps, "warmup": args.warmup, "seconds": total,
            "step_seconds": seconds, "sentences": sentences, "tokens": real, "positions": positions,
            "sentences_per_s": sentences / total, "tokens_per_s": real / total,
            "padding_share": 1 - real / positions, "last_loss": losses[-1], "vocab_size": tokenizer.vocab_size}


# --------------------------------------------------------------------------- translation
class TorchSeq2Seq(nn.Module):
    """The peer: attnlab's ``Seq2SeqTransformer`` sizes on ``torch.nn.Transformer``."""

    def __init__(self, cfg: Any) -> None:  # a TransformerConfig
        super().__init__()
        d = cfg.embed_dim
        self.pad_id, self.scale = cfg.pad_id, math.sqrt(d)
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=cfg.pad_id)
        self.tgt_embed = (self.src_embed if cfg.share_embeddings
                          else nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=cfg.pad_id))
        self.src_pos = nn.Embedding(cfg.max_len, d)
        self.tgt_pos = nn.Embedding(cfg.max_len, d)
        self.drop = nn.Dropout(cfg.drop_rate)
        self.transformer = nn.Transformer(
            d, cfg.num_heads, cfg.encoder_depth, cfg.decoder_depth, cfg.mlp_hidden_dim, cfg.drop_rate,
            activation=cfg.activation, layer_norm_eps=cfg.norm_eps, batch_first=True, norm_first=cfg.norm_first)
        self.generator = nn.Linear(d, cfg.tgt_vocab_size, bias=not cfg.tie_output)
        for emb in {self.src_embed, self.tgt_embed}:  # as attnlab's: N(0, 1/d), padding row zero
            nn.init.normal_(emb.weight, std=d**-0.5)
            with torch.no_grad():
                emb.weight[cfg.pad_id].zero_()
        if cfg.tie_output:
            self.generator.weight = self.tgt_embed.weight

    def _embed(self, ids: Tensor, table: nn.Embedding, pos: nn.Embedding) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(table(ids) * self.scale + pos(positions))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        src_pad, tgt_pad = src == self.pad_id, tgt == self.pad_id
        # -inf above the diagonal; as booleans (True = masked), the padding masks' type, which torch asks for
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device).isneginf()
        h = self.transformer(self._embed(src, self.src_embed, self.src_pos), self._embed(tgt, self.tgt_embed, self.tgt_pos),
                             tgt_mask=causal, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                             memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return self.generator(h)


def peer_trainer(model: nn.Module, data: TranslationDataset, cfg: TrainConfig,
                 device: torch.device) -> Callable[[list[int]], float]:
    """One training step of ``model`` on a batch of indices, as ``Trainer.train_step`` does it."""
    optimizer = build_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay, momentum=cfg.momentum)
    scheduler = warmup_cosine(optimizer, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)

    def step(idx: list[int]) -> float:
        model.train()
        x, y = data.get_batch(idx)
        src, tgt, y = (t.to(device, non_blocking=True) for t in (x["src"], x["tgt"], y))
        with autocast(device, cfg.precision):
            out = model(src, tgt)
            loss = F.cross_entropy(out.flatten(0, -2), y.flatten(), ignore_index=IGNORE_INDEX,
                                   label_smoothing=cfg.label_smoothing)
        loss.backward()
        value = loss.item()
        if cfg.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        return value

    return step


def bench_translation(args: argparse.Namespace, device: torch.device, recipe: Recipe, src_tok: TextTokenizer,
                      tgt_tok: TextTokenizer, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    n = recipe.text.max_length
    data = TranslationDataset(pairs, src_tok, tgt_tok, n, n)
    cfg = bench_config(recipe, args.warmup + args.steps, device)
    torch.manual_seed(0)
    model = get_task(recipe.task).build_model(recipe, (src_tok, tgt_tok))
    trainer = Trainer(model, data, cfg, run_dir=None, log=lambda *_: None)
    torch.manual_seed(0)
    peer = TorchSeq2Seq(model.config).to(device)
    peer_step = peer_trainer(peer, data, cfg, device)
    order = trainer._batches()
    say(f"translation: {len(data)} training pairs, attnlab {n_params(model):,} parameters, torch.nn "
        f"{n_params(peer):,}; {args.warmup} + {args.steps} steps of batch {cfg.batch_size} each, in turn")

    impls: dict[str, Callable[[list[int]], float]] = {
        "attnlab": lambda idx: trainer.train_step(iter([idx])),
        "torch.nn": peer_step,
    }
    seconds: dict[str, list[float]] = {k: [] for k in impls}
    losses: dict[str, list[float]] = {k: [] for k in impls}
    used = []
    names = list(impls)
    for step in range(args.warmup + args.steps):
        idx = next(order)
        for name in names[step % 2:] + names[: step % 2]:
            holder: list[float] = []
            s = timed(lambda: holder.append(impls[name](idx)), device)
            if step >= args.warmup:
                seconds[name].append(s)
                losses[name].append(holder[0])
        if step >= args.warmup:
            used.append(idx)
    pairs_n = sum(len(idx) for idx in used)
    tgt_tokens = sum(len(data.tgt_ids[i]) + 1 for idx in used for i in idx)  # + EOS: the labels other than -100
    src_tokens = sum(len(data.src_ids[i]) + 1 for idx in used for i in idx)  # + EOS
    out: dict[str, Any] = {"recipe": TRANSLATION_RECIPE, "model": recipe.model.name, "batch_size": cfg.batch_size,
                           "steps": args.steps, "warmup": args.warmup, "pairs": pairs_n, "target_tokens": tgt_tokens,
                           "source_tokens": src_tokens, "src_vocab_size": src_tok.vocab_size,
                           "tgt_vocab_size": tgt_tok.vocab_size, "impls": {}}
    for name, module in (("attnlab", model), ("torch.nn", peer)):
        total = sum(seconds[name])
        out["impls"][name] = {"params": n_params(module), "seconds": total, "step_seconds": seconds[name],
                              "pairs_per_s": pairs_n / total, "target_tokens_per_s": tgt_tokens / total,
                              "tokens_per_s": (src_tokens + tgt_tokens) / total, "losses": losses[name]}
    out["ratio"] = out["impls"]["attnlab"]["target_tokens_per_s"] / out["impls"]["torch.nn"]["target_tokens_per_s"]
    return out


# --------------------------------------------------------------------------- decoding
def bench_decoding(args: argparse.Namespace, device: torch.device, model: nn.Module, src_tok: TextTokenizer,
                   max_source_length: int, texts: list[str]) -> list[dict[str, Any]]:
    cfg = model.config
    if not 0 < args.max_new_tokens <= cfg.max_len:
        raise SystemExit(f"--max-new-tokens must be in [1, {cfg.max_len}] (the model's max_len); "
                         f"got {args.max_new_tokens}")
    model.to(device).eval()
    ids = src_tok.tokenize(texts, add_cls=False)  # as translation.translate: tokens, cut, then EOS
    ids = [row[: max_source_length - 1] + [src_tok.eos_id] for row in ids]
    order = sorted(range(len(ids)), key=lambda j: -len(ids[j]))  # similar lengths share a batch
    batches = [src_tok.pad([ids[j] for j in order[s : s + args.decode_batch]])["input_ids"].to(device)
               for s in range(0, len(order), args.decode_batch)]
    settings = [(b, c) for b in (args.beams, 1) for c in (True, False)]
    say(f"decoding: {len(texts)} sentences in {len(batches)} batch(es) of {args.decode_batch}, "
        f"{args.max_new_tokens} new tokens at most; beam {args.beams} and greedy, with and without cache")

    def run(src: Tensor, beams: int, cache: bool, new: int) -> Tensor:
        return model.generate(src, num_beams=beams, max_new_tokens=new, use_cache=cache)

    for beams, cache in settings:  # warm-up: first-call allocations, thread pool start
        run(batches[0][:4], beams, cache, 2)
    seconds = {s: 0.0 for s in settings}
    outputs: dict[tuple[int, bool], list[Tensor]] = {s: [] for s in settings}
    for i, src in enumerate(batches):
        k = i % len(settings)
        for beams, cache in settings[k:] + settings[:k]:
            holder: list[Tensor] = []
            seconds[(beams, cache)] += timed(lambda: holder.append(run(src, beams, cache, args.max_new_tokens)), device)
            outputs[(beams, cache)].append(holder[0].cpu())
        say(f"  batch {i + 1}/{len(batches)}: " + ", ".join(
            f"{'beam' if b > 1 else 'greedy'} {'cache' if c else 'no cache'} {seconds[(b, c)]:.1f} s" for b, c in settings))
    records = []
    for beams, cache in settings:
        outs = outputs[(beams, cache)]
        same = all(torch.equal(a, b) for a, b in zip(outs, outputs[(beams, not cache)]))
        tokens = sum(int((o != cfg.pad_id).sum()) for o in outs)
        eos = sum(int((o == cfg.eos_id).any(1).sum()) for o in outs)
        total = seconds[(beams, cache)]
        records.append({"search": f"beam {beams}" if beams > 1 else "greedy", "num_beams": beams, "use_cache": cache,
                        "sentences": len(texts), "batch_size": args.decode_batch,
                        "max_new_tokens": args.max_new_tokens, "seconds": total, "sentences_per_s": len(texts) / total,
                        "output_tokens": tokens, "output_tokens_per_s": tokens / total,
                        "mean_output_length": tokens / len(texts), "ended_with_eos": eos, "same_tokens": same})
    for r in records:
        ref = next(q for q in records if q["num_beams"] == r["num_beams"] and not q["use_cache"])
        r["cache_speedup"] = r["sentences_per_s"] / ref["sentences_per_s"]
    return records


# --------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per task (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed training steps first (default 3)")
    parser.add_argument("--sentences", type=int, default=256, help="test sentences to translate (default 256)")
    parser.add_argument("--decode-batch", type=int, default=64, help="sentences per decoding batch (default 64)")
    parser.add_argument("--beams", type=int, default=4, help="beam size (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=40,
                        help="tokens generated per sentence at most, in every setting (default 40)")
    parser.add_argument("--run-dir", type=Path, help="a finished translation run to decode with "
                        "(default: a freshly initialised model of the recipe)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's, which follows "
                        "OMP_NUM_THREADS)")
    parser.add_argument("--data-dir", help="data directory (default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab)")
    parser.add_argument("--skip-train", action="store_true", help="no training measurements")
    parser.add_argument("--skip-decode", action="store_true", help="no decoding measurements")
    parser.add_argument("--json", metavar="FILE", help="also write every record to FILE")
    args = parser.parse_args()
    for name in ("steps", "sentences", "decode_batch", "beams"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0; got {args.warmup}")
    if args.beams == 1:
        parser.error("--beams must be above 1 (greedy search is measured anyway)")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = select_device(args.device)

    load = busy_cores() or 0.0  # measured before we add to it
    accel = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(f"machine: {cpu_model()} | torch {torch.__version__} | threads {torch.get_num_threads()}"
          f" | device {device}{accel} | cores busy before start: {load:.1f}")
    if load > 0.5:
        print("WARNING: other processes are using the CPUs; these timings are not representative.")
    print()

    results: dict[str, Any] = {"meta": {"cpu": cpu_model(), "torch": torch.__version__,
                                        "threads": torch.get_num_threads(), "device": str(device) + accel,
                                        "busy_cores_before": load, "args": {k: str(v) if isinstance(v, Path) else v
                                                                             for k, v in vars(args).items()}}}
    tr_recipe = load_recipe(TRANSLATION_RECIPE)
    tokenizers: list[tuple[TextTokenizer, TextTokenizer]] = []

    def shipped_tokenizers() -> tuple[TextTokenizer, TextTokenizer]:
        if not tokenizers:
            tokenizers.append(translation.build_tokenizers(tr_recipe, train_pairs()))
        return tokenizers[0]

    pairs_cache: list[list[tuple[str, str]]] = []

    def train_pairs() -> list[tuple[str, str]]:
        if not pairs_cache:
            d = tr_recipe.data
            pairs_cache.append(load_multi30k("train", args.data_dir or d.data_dir, d.source, d.target))
        return pairs_cache[0]

    if not args.skip_train:
        s = bench_sentiment(args, device)
        results["sentiment"] = s
        print(f"## Training, {SENTIMENT_RECIPE} ({s['model']}, fp32): {s['steps']} timed steps after "
              f"{s['warmup']} warm-up\n")
        print(markdown(["implementation", "params", "batch", "ms/step", "sentences/s", "real tokens/s",
                        "padding share"],
                       [["attnlab (engine Trainer)", f"{s['params'] / 1e6:.2f} M", str(s["batch_size"]),
                         f"{1e3 * s['seconds'] / s['steps']:.0f}", num(s["sentences_per_s"]), num(s["tokens_per_s"]),
                         f"{100 * s['padding_share']:.0f}%"]]))
        print(f"\nreal tokens: the attention mask's ones ([CLS] and [SEP] included); padding share: of the "
              f"{s['positions']:,} positions computed. Vocabulary {s['vocab_size']:,}.\n", flush=True)

        src_tok, tgt_tok = shipped_tokenizers()
        t = bench_translation(args, device, tr_recipe, src_tok, tgt_tok, train_pairs())
        results["translation"] = t
        print(f"## Training, {TRANSLATION_RECIPE} ({t['model']}, fp32, label smoothing "
              f"{tr_recipe.train.label_smoothing}): {t['steps']} timed steps after {t['warmup']} warm-up, "
              f"the same batches for both, in turn\n")
        rows = []
        for name, r in t["impls"].items():
            label = "attnlab (engine Trainer)" if name == "attnlab" else "torch.nn.Transformer (same sizes)"
            ratio = r["target_tokens_per_s"] / t["impls"]["torch.nn"]["target_tokens_per_s"]
            rows.append([label, f"{r['params'] / 1e6:.2f} M", str(t["batch_size"]),
                         f"{1e3 * r['seconds'] / t['steps']:.0f}", num(r["pairs_per_s"]),
                         num(r["target_tokens_per_s"]), num(r["tokens_per_s"]), f"{ratio:.2f}"])
        print(markdown(["implementation", "params", "batch", "ms/step", "pairs/s", "target tokens/s",
                        "src+tgt tokens/s", "vs torch.nn"], rows))
        a, b = t["impls"]["attnlab"], t["impls"]["torch.nn"]
        print(f"\nattnlab/torch.nn tokens per second: {t['ratio']:.2f} (above 1: attnlab faster). Target tokens: "
              f"labels other than -100 (tokens + EOS); vocabularies {t['src_vocab_size']:,} (de) / "
              f"{t['tgt_vocab_size']:,} (en). Loss at the last step: attnlab {a['losses'][-1]:.3f}, "
              f"torch.nn {b['losses'][-1]:.3f}. Parameters differ by torch.nn's learned positions "
              f"(attnlab's are sinusoidal) and its final LayerNorms.\n", flush=True)

    if not args.skip_decode:
        if args.run_dir is not None:
            run = load_run(args.run_dir)
            recipe, src_tok, tgt_tok, model = run.recipe, run.tokenizer, run.target_tokenizer, run.model
            which = f"run {args.run_dir}, {run.checkpoint.name} weights"
        else:
            recipe = tr_recipe
            src_tok, tgt_tok = shipped_tokenizers()
            torch.manual_seed(0)
            model = get_task(recipe.task).build_model(recipe, (src_tok, tgt_tok))
            which = f"random initialisation of recipe {TRANSLATION_RECIPE}"
        d = recipe.data
        test = load_multi30k("test", args.data_dir or d.data_dir, d.source, d.target)[: args.sentences]
        dec = bench_decoding(args, device, model, src_tok, recipe.text.max_length, [s for s, _ in test])
        results["decoding"] = {"model": which, "params": n_params(model), "records": dec}
        print(f"## Decoding, {recipe.model.name} ({which}): {len(test)} sentences of test_2016_flickr, "
              f"batches of {args.decode_batch} sorted by length, at most {args.max_new_tokens} new tokens\n")
        print(markdown(["search", "cache", "seconds", "sentences/s", "output tokens/s", "mean length",
                        "cache speed-up", "same tokens with/without cache"],
                       [[r["search"], "yes" if r["use_cache"] else "no", f"{r['seconds']:.1f}",
                         num(r["sentences_per_s"]), num(r["output_tokens_per_s"]), f"{r['mean_output_length']:.1f}",
                         f"{r['cache_speedup']:.2f}x", "yes" if r["same_tokens"] else "**NO**"] for r in dec]))
        ended = {r["search"]: r["ended_with_eos"] for r in dec if r["use_cache"]}
        print("\nsentences that ended with EOS (with cache): " + ", ".join(f"{k} {v}/{len(test)}"
                                                                           for k, v in ended.items()))

    if args.json:
        atomic_write_bytes(args.json, json.dumps(results, indent=1).encode())
        print(f"records written to {args.json}")
    bad = [r["search"] for r in results.get("decoding", {}).get("records", []) if not r["same_tokens"]]
    if bad:
        raise SystemExit(f"ERROR: the key/value cache changed the tokens of {', '.join(sorted(set(bad)))}")


if __name__ == "__main__":
    main()
