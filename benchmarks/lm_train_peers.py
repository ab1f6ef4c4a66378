"""Language-model training against nanoGPT and x-transformers, on this machine.

    # training speed: one process, the same shape, float32 and bfloat16
    .venv-peers/bin/python benchmarks/lm_train_peers.py speed --nanogpt PATH/TO/nanoGPT
    # quality at equal wall-clock: nanoGPT's own train.py, then lm-shakespeare-char for as long
    .venv-peers/bin/python benchmarks/lm_train_peers.py quality --nanogpt PATH/TO/nanoGPT --out /tmp/lm-peers

``--nanogpt`` is a checkout of https://github.com/karpathy/nanoGPT (its ``model.py`` is
imported, its ``train.py`` run as its README says for a CPU); x-transformers comes from the
peers' environment (``make bench-peers`` builds ``.venv-peers``, which holds it). Neither is
an attnlab dependency. Time it alone on the machine.

``speed``: tokens per second of a training step (forward, cross-entropy, backward, AdamW)
of nanoGPT's ``GPT``, x-transformers' ``TransformerWrapper(Decoder)`` and attnlab's ``GPT``
at nanoGPT's documented CPU shape for ``shakespeare_char`` (4 layers, 4 heads, width 128,
context 64, batch 12, vocabulary 65, no dropout, no biases), and attnlab's Llama-style block
at that shape; rounds interleaved, the best round of each.

``quality``: nanoGPT's CPU command line (2,000 iterations), its wall-clock and its final
validation estimate; then ``attnlab train lm-shakespeare-char`` with as many steps as fit in
the same wall-clock (measured from a calibration of 20 steps). Both models are then scored
on the same text, the last 10% of Tiny Shakespeare (nanoGPT's validation part; attnlab's
validation and test parts together), each at its own context, every token but the first of
each window predicted once. The loss against minutes of both goes to ``OUT/loss_vs_minutes.png``
(``--plot`` copies it elsewhere too): nanoGPT's own validation estimates (20 batches) at the
wall-clock its log lines came out, and attnlab's checkpoints, saved 8 times during its run,
scored on the last 10% at the training time their step was reached.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def _shakespeare() -> Path:
    data_dir = Path(os.environ.get("ATTNLAB_DATA_DIR", ROOT.parent / "shared" / "data"))
    path = data_dir / "tinyshakespeare" / "input.txt"
    if not path.is_file():
        raise SystemExit(f"Tiny Shakespeare not found at {path}: set ATTNLAB_DATA_DIR")
    return path


def _import_nanogpt(folder: Path):
    if not (folder / "model.py").is_file():
        raise SystemExit(f"--nanogpt must be a checkout of nanoGPT (with model.py); {folder} has none")
    sys.path.insert(0, str(folder))
    import model as nanogpt  # nanoGPT's own model.py

    sys.path.pop(0)
    return nanogpt


# ----------------------------------------------------------------------------- speed
def _models(args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    from attnlab.models.gpt import GPT

    shape = dict(vocab_size=65, max_len=args.context, embed_dim=args.width, depth=args.depth, num_heads=args.heads)
    torch.manual_seed(0)
    models: dict[str, torch.nn.Module] = {}
    if args.nanogpt:
        nanogpt = _import_nanogpt(Path(args.nanogpt))
        models["nanoGPT model.py"] = nanogpt.GPT(nanogpt.GPTConfig(
            block_size=args.context, vocab_size=65, n_layer=args.depth, n_head=args.heads, n_embd=args.width,
            dropout=0.0, bias=False))
    try:
        from x_transformers import Decoder, TransformerWrapper

        models["x-transformers"] = TransformerWrapper(num_tokens=65, max_seq_len=args.context, attn_layers=Decoder(
            dim=args.width, depth=args.depth, heads=args.heads, attn_dim_head=args.width // args.heads))
    except ImportError:
        print("x-transformers is not installed here: its row is left out (make bench-peers builds .venv-peers)")
    models["attnlab GPT (GPT-2 block)"] = GPT(**shape, bias=False, norm_bias=False, pos_embed="learned",
                                             norm="layernorm", mlp="gelu")
    models["attnlab GPT (Llama block)"] = GPT(**shape, bias=False, pos_embed="rope", norm="rmsnorm", mlp="swiglu",
                                             mlp_hidden_dim=round(8 * args.width / 3))
    return models


def _logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out[0] if isinstance(out, tuple) else out  # nanoGPT returns (logits, loss)


def _time_steps(model, opt, batches, precision: str) -> float:
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    start = time.perf_counter()
    for x, y in batches:
        with ctx:
            if type(model).__module__ == "model":  # nanoGPT computes its loss itself, given targets
                _, loss = model(x, y)
            else:
                logits = _logits(model, x)
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def cmd_speed(args: argparse.Namespace) -> None:
    from attnlab.bench.machine import machine_info, machine_label

    torch.set_num_threads(args.threads)
    models = _models(args)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 65, (args.batch, args.context), generator=gen),
                torch.randint(0, 65, (args.batch, args.context), generator=gen)) for _ in range(args.steps)]
    tokens = args.steps * args.batch * args.context
    print(f"machine: {machine_label(machine_info())}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"shape: {args.depth} layers, {args.heads} heads, width {args.width}, context {args.context}, "
          f"batch {args.batch}; {args.steps} steps per round, best of {args.rounds} interleaved rounds\n")
    best: dict[tuple[str, str], float] = {}
    for precision in args.precisions:
        opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
                for name, m in models.items()}
        for name, m in models.items():  # warm-up
            m.train()
            _time_steps(m, opts[name], batches[:3], precision)
        for _ in range(args.rounds):
            for name, m in models.items():
                seconds = _time_steps(m, opts[name], batches, precision)
                best[name, precision] = max(best.get((name, precision), 0.0), tokens / seconds)
    head = " | ".join(f"{p} tokens/s | vs nanoGPT" for p in args.precisions)
    print(f"| model | parameters | {head} |")
    print("| --- | ---: |" + " ---: | ---: |" * len(args.precisions))
    for name, m in models.items():
        params = sum(p.numel() for p in m.parameters())
        cells = []
        for p in args.precisions:
            ref = best.get(("nanoGPT model.py", p))
            cells.append(f"{best[name, p]:,.0f} | {best[name, p] / ref:.2f}x" if ref else f"{best[name, p]:,.0f} | -")
        print(f"| {name} | {params / 1e6:.2f} M | " + " | ".join(cells) + " |")


# ----------------------------------------------------------------------------- quality
def _score_nanogpt(folder: Path, work: Path, text: str) -> tuple[float, int]:
    """Mean loss (nats per character) over ``text`` of the checkpoint nanoGPT's run in ``work``
    saved, in windows of its context."""
    nanogpt = _import_nanogpt(folder)
    ckpt = torch.load(work / "out-shakespeare-char" / "ckpt.pt", map_location="cpu", weights_only=False)
    model = nanogpt.GPT(nanogpt.GPTConfig(**ckpt["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    model.eval()
    with open(work / "data" / "shakespeare_char" / "meta.pkl", "rb") as f:
        stoi = pickle.load(f)["stoi"]
    ids = torch.tensor([stoi[c] for c in text])
    block = ckpt["model_args"]["block_size"]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, block):
            window = ids[start : start + block + 1]
            if len(window) < 2:
                break
            logits, _ = model(window[None, :-1], window[None, 1:])
            loss = F.cross_entropy(logits[0], window[1:], reduction="sum")
            total, count = total + float(loss), count + len(window) - 1
    return total / count, count


def cmd_quality(args: argparse.Namespace) -> None:
    from attnlab.bench.machine import machine_info, machine_label
    from attnlab.recipes import load_recipe
    from attnlab.tasks import train

    source = Path(args.nanogpt).resolve()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    text = _shakespeare().read_text(encoding="utf-8")
    tail = text[int(0.9 * len(text)):]  # nanoGPT's validation part; attnlab's validation and test parts
    print(f"machine: {machine_label(machine_info())}; torch {torch.__version__}")

    # nanoGPT, its own code, as its README runs it on a CPU
    work = out / "nanoGPT"
    if not (work / "out-shakespeare-char" / "ckpt.pt").is_file():
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(source, work, ignore=shutil.ignore_patterns(".git"))
        data = work / "data" / "shakespeare_char"
        shutil.copy(_shakespeare(), data / "input.txt")  # so its prepare.py downloads nothing
        subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
        cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
               "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4",
               "--n_head=4", "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
        start = time.perf_counter()
        lines = []  # each stdout line with the seconds since the start at which it came out
        with subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.append(f"{time.perf_counter() - start:.3f}\t{line.rstrip()}")
            errors = proc.stderr.read()  # type: ignore[union-attr]
        seconds = time.perf_counter() - start
        if proc.returncode:
            raise SystemExit(f"nanoGPT's train.py failed:\n{errors[-3000:]}")
        (work / "train.log").write_text("\n".join(lines) + "\n")
        (work / "seconds.json").write_text(json.dumps({"seconds": seconds}))
    seconds = json.loads((work / "seconds.json").read_text())["seconds"]
    evals = re.findall(r"([\d.]+)\tstep (\d+): train loss ([\d.]+), val loss ([\d.]+)",
                       (work / "train.log").read_text())
    _, step, _, their_val = evals[-1]
    their_loss, their_n = _score_nanogpt(source, work, tail)

    # attnlab's recipe for the same wall-clock: steps from a calibration of 20 steps
    run_dir = out / "attnlab"
    if not (run_dir / "results.json").is_file():
        shutil.rmtree(out / "calibrate", ignore_errors=True)
        quiet = ["train.progress=false", "train.tensorboard=false"]
        calib = load_recipe("lm-shakespeare-char", [*quiet, "train.steps=25", "train.log_every=5",
                                                    "train.eval_every=0", "train.checkpoint_every=0",
                                                    "generate.max_new_tokens=1"])
        train(calib, out / "calibrate", log=lambda line: None)
        logged = [json.loads(line) for line in (out / "calibrate" / "metrics.jsonl").read_text().splitlines()]
        logged = [r for r in logged if r.get("kind") == "train" and "elapsed_s" in r]
        per_step = (logged[-1]["elapsed_s"] - logged[0]["elapsed_s"]) / (logged[-1]["step"] - logged[0]["step"])
        steps = max(50, int(seconds / per_step))
        every = max(1, steps // 8)  # checkpoints for the curve, scored afterwards (not in the timed run)
        recipe = load_recipe("lm-shakespeare-char", [*quiet, f"train.steps={steps}", f"train.eval_every={steps}",
                                                     f"train.checkpoint_every={every}", f"train.log_every={every}",
                                                     "train.keep_checkpoints=10",
                                                     f"train.warmup_steps={min(100, steps // 10)}"])
        start = time.perf_counter()
        train(recipe, run_dir, log=print)
        (run_dir / "bench_seconds.json").write_text(json.dumps({"seconds": time.perf_counter() - start,
                                                                "steps": steps}))
    ours = json.loads((run_dir / "results.json").read_text())
    ours_time = json.loads((run_dir / "bench_seconds.json").read_text())
    n_val, n_test = ours["val_tokens"] - 1, ours["test_tokens"] - 1
    our_loss = (ours["val_loss"] * n_val + ours["test_loss"] * n_test) / (n_val + n_test)

    print(f"\nnanoGPT: {seconds:.0f} s for {step} iterations, its own validation estimate {float(their_val):.4f}")
    print(f"attnlab: {ours_time['seconds']:.0f} s (training, testing and samples) for {ours_time['steps']} steps\n")
    print("| | wall-clock | steps | loss on the last 10% of the text (nats/char) | tokens scored |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(f"| nanoGPT (its CPU configuration) | {seconds:.0f} s | {step} | {their_loss:.4f} | {their_n:,} |")
    print(f"| attnlab lm-shakespeare-char | {ours_time['seconds']:.0f} s | {ours_time['steps']} | {our_loss:.4f} | "
          f"{n_val + n_test:,} |")
    print(f"\nattnlab's own split: validation {ours['val_loss']:.4f}, test {ours['test_loss']:.4f} "
          f"({math.log2(math.e) * ours['test_loss']:.3f} bits per character on the test part)")

    theirs_curve = [(float(t), int(n), float(v)) for t, n, _, v in evals]
    ours_curve = _attnlab_curve(run_dir, tail)
    print("\nLoss against minutes (nanoGPT: its own 20-batch validation estimate; attnlab: its checkpoints on the "
          "last 10%):\n")
    print("| | " + " | ".join(f"{t / 60:.1f} min" for t, _, _ in theirs_curve) + " |")
    print("| --- |" + " ---: |" * len(theirs_curve))
    print("| nanoGPT | " + " | ".join(f"{v:.3f}" for _, _, v in theirs_curve) + " |")
    print("\n| | " + " | ".join(f"{t / 60:.1f} min" for t, _, _ in ours_curve) + " |")
    print("| --- |" + " ---: |" * len(ours_curve))
    print("| attnlab | " + " | ".join(f"{v:.3f}" for _, _, v in ours_curve) + " |")
    picture = _plot(theirs_curve, ours_curve, their_loss, seconds, out / "loss_vs_minutes.png")
    if args.plot:
        shutil.copy(picture, args.plot)
    print(f"\nwrote {picture}" + (f" and {args.plot}" if args.plot else ""))


def _attnlab_curve(run_dir: Path, text: str) -> list[tuple[float, int, float]]:
    """``(training seconds, step, loss on text)`` of every checkpoint of ``run_dir``."""
    from attnlab import load_run
    from attnlab.data.batches.lm import LMDataset
    from attnlab.engine.trainer import evaluate_model

    logged = {r["step"]: r["elapsed_s"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if r.get("kind") == "train"}
    curve = []
    for folder in sorted((run_dir / "checkpoints").glob("step_*")):
        step = int(folder.name.removeprefix("step_"))
        run = load_run(run_dir, checkpoint=str(folder))
        data = LMDataset([text], run.tokenizer, run.recipe.text.context)
        loss = evaluate_model(run.model, data, batch_size=64, device="cpu", precision="fp32")["loss"]
        curve.append((logged[step], step, loss))
    return curve


def _plot(theirs: list[tuple[float, int, float]], ours: list[tuple[float, int, float]], their_final: float,
          their_seconds: float, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.plot([t / 60 for t, _, _ in theirs], [v for _, _, v in theirs], "o-", label="nanoGPT, its CPU configuration "
            "(its 20-batch validation estimate)")
    ax.plot([their_seconds / 60], [their_final], "s", color="C0", label="nanoGPT's final checkpoint, last 10%")
    ax.plot([t / 60 for t, _, _ in ours], [v for _, _, v in ours], "o-", label="attnlab lm-shakespeare-char, last 10%")
    ax.set_xlabel("minutes of training (wall-clock)")
    ax.set_ylabel("validation loss (nats per character)")
    ax.set_ylim(top=min(3.0, ax.get_ylim()[1]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("speed", help="tokens per second of a training step against nanoGPT and x-transformers")
    p.add_argument("--nanogpt", help="a checkout of nanoGPT (its model.py is imported)")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--steps", type=int, default=30, help="training steps per round (default 30)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.set_defaults(func=cmd_speed)
    p = sub.add_parser("quality", help="nanoGPT's CPU run against lm-shakespeare-char at the same wall-clock")
    p.add_argument("--nanogpt", required=True, help="a checkout of nanoGPT (its train.py is run)")
    p.add_argument("--out", required=True, help="a folder for both runs (kept: a second call reuses them)")
    p.add_argument("--plot", default=None, help="also copy the loss-against-minutes picture here")
    p.set_defaults(func=cmd_quality)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
