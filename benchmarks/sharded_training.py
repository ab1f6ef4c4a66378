"""What sharding buys: data-parallel (``train.distributed=ddp``) against sharded (``fsdp``)
training under ``torchrun`` with gloo processes on the CPU.

1. The character language-model recipe's model (``lm-shakespeare-char``: its width, depth,
   context and batch a process) for a few steps on random tokens with 1 and 2 processes:
   tokens a second and each process's peak resident memory (``VmHWM``).
2. Decoders of growing width (depth 8, 8,192 tokens of vocabulary, context 256, batch 2 a
   process, AdamW in float32) with 2 processes, ``ddp`` against ``fsdp``: each process's peak
   memory and what the engine says it holds of weights, gradients and optimizer state; the
   largest that stays within a limit per process follows from those peaks. The peak is given
   twice: over building the model (whole, in every process, before it is sharded), sharding
   it and the first step; and over the training steps after (the high-water mark reset).
3. ``--limit-gib L``: each width trained again with every process alone in a memory cgroup of
   ``L`` GiB (cgroup v1, where the machine lets one be written): whether it trains or the
   kernel kills it.

Two processes on two cores share the cores: the tokens a second of 2 processes measure the
cost of the collectives and of splitting 2 cores in two, not the speed-up of 2 devices.

    python benchmarks/sharded_training.py --out /tmp/sharded.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

WIDTHS = (256, 512, 768, 1024, 1280)


def _reset_peak() -> None:
    """Start the kernel's high-water mark of this process's resident memory again (``VmHWM``)."""
    Path("/proc/self/clear_refs").write_text("5")


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


CGROUP = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory controller, where this machine has one to write


def _limit_memory(gib: float) -> None:
    """Put this process alone in a memory cgroup of ``gib`` GiB: past it, the kernel kills it."""
    group = CGROUP / f"attnlab-bench-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "memory.limit_in_bytes").write_text(str(int(gib * 2**30)))
    (group / "cgroup.procs").write_text(str(os.getpid()))


def worker(out: Path, mode: str, model_json: str, steps: int, batch: int, context: int) -> None:
    """One process: ``steps`` optimizer steps (after one not timed), then its figures as JSON."""
    if os.environ.get("BENCH_LIMIT_GIB"):
        _limit_memory(float(os.environ["BENCH_LIMIT_GIB"]))
    import torch

    from attnlab.engine import distributed
    from attnlab.engine.trainer import TrainConfig, Trainer
    from attnlab.models import create_model

    distributed.init_distributed("cpu")
    options = json.loads(model_json)
    torch.manual_seed(0)
    model = create_model(options.pop("name"), **options)
    vocab = model.config.vocab_size
    data = torch.randint(0, vocab, (batch * distributed.world_size() * (steps + 2), context + 1))

    class Windows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(data)

        def __getitem__(self, i: int):
            return data[i, :-1], data[i, 1:]

    def stack(items):
        xs, ys = zip(*items)
        return torch.stack(xs), torch.stack(ys)

    cfg = TrainConfig(steps=steps + 1, batch_size=batch, lr=1e-4, device="cpu", precision="fp32", log_every=0,
                      progress=False, tensorboard=False, distributed=mode)
    trainer = Trainer(model, Windows(), cfg, log=lambda _: None, collate=stack)
    batches = trainer._batches()
    trainer.train_step(batches)  # the first step: allocations, the optimizer's state
    first = _peak_mib()  # building the whole model, sharding it, the first step
    _reset_peak()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(batches)
    seconds = time.perf_counter() - start
    figures = {"rank": distributed.rank(), "world": distributed.world_size(), "mode": trainer.mode,
               "params": sum(p.numel() for p in model.parameters()),
               "tokens_per_s": steps * batch * context * distributed.world_size() / seconds,
               "peak_mib": max(first, _peak_mib()), "build_and_first_step_peak_mib": first,
               "training_peak_mib": _peak_mib(), "held": trainer.held}
    (out / f"{trainer.mode}_{distributed.world_size()}_{distributed.rank()}.json").write_text(json.dumps(figures))
    distributed.cleanup()


def _launch(out: Path, procs: int, mode: str, model: dict, steps: int, batch: int, context: int,
            limit_gib: float | None = None) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for f in out.glob("*.json"):
        f.unlink()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // procs))
    if limit_gib is not None:
        env["BENCH_LIMIT_GIB"] = str(limit_gib)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={procs}",
           "--master_addr=127.0.0.1", f"--master_port={port}", __file__, "--worker", str(out), mode,
           json.dumps(model), str(steps), str(batch), str(context)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for group in CGROUP.glob("attnlab-bench-*"):  # empty once its process is gone
        try:
            group.rmdir()
        except OSError:
            pass
    if r.returncode:
        killed = "Signal 9" in r.stderr or "SIGKILL" in r.stderr or "-9" in r.stderr
        return [{"error": "killed: past the memory limit" if killed and limit_gib else (r.stderr or r.stdout)[-600:]}]
    return [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--widths", type=int, nargs="*", default=list(WIDTHS), help="the decoders' widths")
    parser.add_argument("--modes", nargs="*", default=["ddp", "fsdp"])
    parser.add_argument("--no-recipe", action="store_true", help="leave the recipe's model out")
    parser.add_argument("--limits-only", action="store_true", help="with --limit-gib: the limited runs alone")
    parser.add_argument("--limit-gib", type=float, nargs="*", default=[],
                        help="also train each width in a memory cgroup of this many GiB a process (cgroup v1)")
    args = parser.parse_args()
    from attnlab.recipes import load_recipe

    work = args.out.with_suffix(".work")
    work.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe("lm-shakespeare-char", [])
    char = {"name": recipe.model.name, "vocab_size": 65, "max_len": recipe.text.context, **recipe.model.options}
    rows: dict = {"recipe": [], "widths": []}
    for procs, mode in () if args.no_recipe or args.limits_only else ((1, "auto"), (2, "ddp"), (2, "fsdp")):
        got = _launch(work, procs, mode, char, args.steps, recipe.train.batch_size, recipe.text.context)
        rows["recipe"].append({"processes": procs, "mode": mode, "ranks": got})
        print(json.dumps(rows["recipe"][-1]), flush=True)
    for width in [] if args.limits_only else args.widths:
        model = {"name": "gpt_tiny", "vocab_size": 8192, "max_len": 256, "depth": 8, "embed_dim": width,
                 "num_heads": width // 64, "drop_rate": 0.0}
        for mode in args.modes:
            got = _launch(work, 2, mode, model, args.steps, 2, 256)
            rows["widths"].append({"width": width, "mode": mode, "ranks": got})
            print(json.dumps(rows["widths"][-1]), flush=True)
    rows["limits"] = []
    for limit in args.limit_gib:
        if not os.access(CGROUP, os.W_OK):
            print(f"no writable memory cgroup at {CGROUP}: the limits are left out", flush=True)
            break
        for width in args.widths:
            model = {"name": "gpt_tiny", "vocab_size": 8192, "max_len": 256, "depth": 8, "embed_dim": width,
                     "num_heads": width // 64, "drop_rate": 0.0}
            for mode in args.modes:
                got = _launch(work, 2, mode, model, 1, 2, 256, limit_gib=limit)
                trained = all("error" not in r for r in got)
                rows["limits"].append({"limit_gib": limit, "width": width, "mode": mode, "trained": trained,
                                       "ranks": got})
                print(json.dumps(rows["limits"][-1])[:300], flush=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        out, mode, model, steps, batch, context = sys.argv[2:8]
        worker(Path(out), mode, model, int(steps), int(batch), int(context))
    else:
        main()
