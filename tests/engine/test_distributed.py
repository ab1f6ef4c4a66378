"""Data-parallel training under torchrun: 2 gloo processes on CPU train exactly what 1
process does with twice the batch; rank 0 alone writes; resume works; the CLI runs.

Run as a script (``python -m torch.distributed.run --nproc_per_node=2 THIS_FILE OUT``),
this file is also the worker of the first test.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from attnlab.engine import distributed
from attnlab.engine.metrics import read_metrics
from attnlab.engine.trainer import TrainConfig, Trainer
from attnlab.models import create_model
from attnlab.recipes import load_recipe
from attnlab.data.source import source_of

if __name__ == "__main__":  # torchrun runs this file as a script: conftest.py lies in tests/, one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import DIGITS_WITH_VALIDATION, tiny_story_recipe  # noqa: E402

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available on this platform")

K, B = 5, 16  # K steps, then K more after a resume; B samples per rank and step


def build_data(recipe):
    """``(train, validation, test)`` of the recipe's data source."""
    splits = source_of(recipe.data).load(recipe.data)
    return splits.train, splits.val, splits.test


def tiny_model(seed=0):
    # No BatchNorm (per-rank statistics) and no dropout (per-rank masks). No qkv bias: the
    # key bias's true gradient is 0 (softmax ignores it), AdamW turns the rounding noise
    # into lr-sized steps whose sign differs between 1 and 2 processes.
    torch.manual_seed(seed)
    return create_model("vit_digits_patch2", depth=1, embed_dim=32, num_heads=2, qkv_bias=False)


def config(batch_size):
    return TrainConfig(steps=2 * K, batch_size=batch_size, lr=3e-3, warmup_steps=2, log_every=1,
                       checkpoint_every=K, device="cpu", seed=1)


def digits():
    train, _, test = build_data(load_recipe("vit-digits", ["data.val_size=0", "data.augment=false"]))  # all 1,437 training images
    return train, test


def worker(out: Path) -> None:
    """One rank: K steps with a checkpoint at K, stop; a fresh Trainer resumes to 2K."""
    distributed.init_distributed("cpu")
    rank = distributed.rank()
    train, test = digits()
    # Each rank is given its own run_dir: rank 1's must stay untouched (rank 0 alone
    # writes), and its resume must load the checkpoint rank 0 found.
    run_dir = out / f"run{rank}"
    first = Trainer(tiny_model(), train, config(B), eval_data=test, run_dir=run_dir)
    first.cfg.steps = K  # stop after step K, as if the job had been killed
    first.fit()
    torch.save(first.model.state_dict(), out / f"step{K}_rank{rank}.pt")
    resumed = Trainer(tiny_model(seed=123), train, config(B), eval_data=test, run_dir=run_dir)
    resumed.resume()
    resumed.fit()
    torch.save(resumed.model.state_dict(), out / f"step{2 * K}_rank{rank}.pt")
    (out / f"eval_rank{rank}.json").write_text(json.dumps(resumed.evaluate()))
    distributed.cleanup()


def torchrun(*args, cwd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={port}", *args]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def test_a_plain_run_is_one_process_of_one(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not distributed.launched()
    assert distributed.init_distributed("cpu") == torch.device("cpu") and not distributed.initialized()
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
    t = torch.arange(3.0)
    assert distributed.all_reduce_sum(t) is t and torch.equal(t, torch.arange(3.0))
    assert distributed.broadcast_object("runs/x") == "runs/x"
    distributed.barrier()
    distributed.cleanup()


def test_two_processes_equal_one_with_twice_the_batch_and_resume(tmp_path):
    torchrun(str(Path(__file__).resolve()), str(tmp_path), cwd=tmp_path)

    # The reference: one process, batch 2B, uninterrupted.
    train, test = digits()
    ref = Trainer(tiny_model(), train, config(2 * B), eval_data=test, run_dir=tmp_path / "ref", log=lambda _: None)
    ref.cfg.steps = K
    ref.fit()
    at_k = {k: v.clone() for k, v in ref.model.state_dict().items()}
    ref.cfg.steps = 2 * K
    ref.fit()

    for step, want in ((K, at_k), (2 * K, ref.model.state_dict())):
        ranks = [torch.load(tmp_path / f"step{step}_rank{r}.pt") for r in (0, 1)]
        assert max_diff(ranks[0], ranks[1]) == 0.0  # DDP keeps the replicas identical
        diff = max_diff(ranks[0], want)
        print(f"step {step}: max |2 processes x {B} - 1 process x {2 * B}| = {diff:.3g}")
        assert diff <= 1e-5

    evals = [json.loads((tmp_path / f"eval_rank{r}.json").read_text()) for r in (0, 1)]
    assert evals[0] == evals[1]
    expected = ref.evaluate()
    assert evals[0]["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-9)
    assert evals[0]["loss"] == pytest.approx(expected["loss"], abs=1e-5)

    # Rank 0 alone wrote: checkpoints at K and 2K, one metrics record per step with the
    # global batch's loss and throughput; rank 1 created nothing.
    assert not (tmp_path / "run1").exists()
    steps = sorted(p.name for p in (tmp_path / "run0" / "checkpoints").glob("step_*"))
    assert steps == [f"step_{K:09d}", f"step_{2 * K:09d}"]
    got, want = read_metrics(tmp_path / "run0" / "metrics.jsonl"), read_metrics(tmp_path / "ref" / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, 2 * K + 1))
    for g, w in zip(got, want):
        assert g["loss"] == pytest.approx(w["loss"], abs=1e-5) and g["lr"] == w["lr"] and g["samples_per_s"] > 0


@pytest.mark.long  # torchrun processes: `make test-long` and CI
def test_cli_under_torchrun(tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "attnlab", "train", "vit-digits", *DIGITS_WITH_VALIDATION, "train.steps=3", "model.options.depth=1",
            "model.options.drop_path_rate=0", "train.batch_size=16", "train.accum_steps=2", "train.warmup_steps=0",
            "train.eval_every=0", "train.log_every=1", "train.checkpoint_every=2", "train.device=cpu",
            "--run-dir", str(run_dir)]
    out = torchrun(*args, cwd=tmp_path).stdout
    assert out.count("attnlab train vit-digits") == 1 and out.count("| test accuracy |") == 1, out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == 3 and 0 <= results["test_accuracy"] <= 1
    assert [(r["step"], r["kind"]) for r in read_metrics(run_dir / "metrics.jsonl")] == [
        (1, "train"), (2, "train"), (3, "train"), (3, "eval")]  # one record each: rank 0's
    steps = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert steps == ["step_000000002", "step_000000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing else written, e.g. no runs/


@pytest.mark.long  # torchrun processes: `make test-long` and CI
def test_a_language_model_trains_under_torchrun_as_one_process_with_twice_the_batch(tmp_path):
    from safetensors.torch import load_file

    from attnlab.tasks import train

    common = tiny_story_recipe(tmp_path)
    out = torchrun("-m", "attnlab", "train", "lm-text", *common, "train.batch_size=4", "--run-dir",
                   str(tmp_path / "ddp"), cwd=tmp_path).stdout
    assert out.count("| test loss (nats/token) |") == 1, out  # rank 0 alone reports
    train(load_recipe("lm-text", [*common, "train.batch_size=8"]), tmp_path / "one", log=lambda _: None)
    weights = [load_file(tmp_path / run / "checkpoints" / "step_000000004" / "model.safetensors")
               for run in ("ddp", "one")]
    assert max_diff(*weights) <= 1e-5
    results = [json.loads((tmp_path / run / "results.json").read_text()) for run in ("ddp", "one")]
    assert results[0]["test_loss"] == pytest.approx(results[1]["test_loss"], abs=1e-5)
    assert (tmp_path / "ddp" / "tokenizer.json").read_bytes() == (tmp_path / "one" / "tokenizer.json").read_bytes()


if __name__ == "__main__":
    worker(Path(sys.argv[1]))


@pytest.mark.long  # torchrun processes: `make test-long` and CI
def test_a_killed_process_stops_the_others_in_one_line_and_the_run_resumes(tmp_path):
    """SIGKILL to rank 1 mid-training: rank 0's collective loses its peer; it stops saying which process
    ended and how to resume (no traceback labelled a bug), and the run resumes from its last checkpoint."""
    import signal
    import time

    common = tiny_story_recipe(tmp_path, "train.steps=100000", "train.checkpoint_every=5")
    run_dir = tmp_path / "run"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
                                 "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "attnlab", "train",
                                 "lm-text", *common, "--run-dir", str(run_dir)], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "checkpoints" / "step_000000010").is_dir():
            assert launcher.poll() is None and time.monotonic() < deadline, "the run did not reach step 10"
            time.sleep(0.2)
        ranks = {}
        for pid in subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split():
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ranks[next(int(v[5:]) for v in environ if v.startswith(b"RANK="))] = int(pid)
        os.kill(ranks[1], signal.SIGKILL)
        _, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode != 0
    said = [line for line in err.splitlines() if line.startswith("attnlab train: error")]
    assert len(said) == 1 and f"rank 1 (pid {ranks[1]}) of the run has ended" in said[0], err[-3000:]
    assert f"--run-dir {run_dir} --resume" in said[0] and "bug in attnlab" not in err
    last = max(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*"))
    out = torchrun("-m", "attnlab", "train", "--run-dir", str(run_dir), "--resume", "--allow-changes",
                   f"train.steps={last + 2}", cwd=tmp_path).stdout
    assert json.loads((run_dir / "results.json").read_text())["steps"] == last + 2, out
