"""Sharded data parallelism (train.distributed=fsdp) under torchrun with gloo processes on the
CPU: the losses equal one process's at the same global batch; each process holds about 1/N of
the weights, gradients and optimizer state; a sharded checkpoint resumes at another number of
processes (2 -> 1, 1 -> 2, 2 -> 4) and after a process is killed mid-save; a sharded run loads
without torchrun; refusals in one line.

Run as a script (``python -m torch.distributed.run --nproc_per_node=N THIS_FILE OUT MODE``), this
file is the worker of those tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from attnlab.engine import distributed, sharding
from attnlab.engine.metrics import read_metrics
from attnlab.engine.trainer import TrainConfig, Trainer
from attnlab.models import create_model

if __name__ == "__main__":  # torchrun runs this file as a script: conftest.py lies in tests/, one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import tiny_story_recipe  # noqa: E402

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available on this platform")

STEPS, GLOBAL = 20, 8  # optimizer steps; samples a step, over every process


class Windows(torch.utils.data.Dataset):
    """Random token windows: ``(ids (L,), next ids (L,))``."""

    def __init__(self, n: int = 160, length: int = 16, vocab: int = 64) -> None:
        self.tokens = torch.randint(0, vocab, (n, length + 1), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int):
        return self.tokens[i, :-1], self.tokens[i, 1:]


def stack(items):
    xs, ys = zip(*items)
    return torch.stack(xs), torch.stack(ys)


def tiny_lm():
    torch.manual_seed(0)
    return create_model("gpt_tiny", vocab_size=64, max_len=16, depth=2, embed_dim=32, num_heads=2,
                        drop_rate=0.0, attn_drop_rate=0.0)


def config(world: int, mode: str = "fsdp") -> TrainConfig:
    return TrainConfig(steps=STEPS, batch_size=GLOBAL // world, lr=3e-3, warmup_steps=2, log_every=1,
                       checkpoint_every=5, keep_checkpoints=10, device="cpu", seed=1, precision="fp32",
                       distributed=mode, progress=False, tensorboard=False)


def lora_lm():
    """The tiny model with LoRA adapters on its attention, the rest frozen."""
    from attnlab.layers.lora import apply_lora, mark_only_lora_trainable

    model = tiny_lm()
    apply_lora(model, rank=4, targets=["attention"])
    torch.manual_seed(2)  # adapters that already change the output
    for name, p in model.named_parameters():
        if name.endswith("lora_B"):
            torch.nn.init.normal_(p, std=0.02)
    mark_only_lora_trainable(model)
    return model


def variant_trainer(world: int, run_dir: Path) -> Trainer:
    """LoRA, gradient checkpointing, bfloat16 and two micro-batches a step together."""
    cfg = config(world, mode="fsdp" if world > 1 or distributed.launched() else "auto")
    cfg.precision, cfg.grad_checkpointing, cfg.accum_steps, cfg.batch_size = "bf16", True, 2, cfg.batch_size // 2
    return Trainer(lora_lm(), Windows(), cfg, run_dir=run_dir, log=lambda _: None, collate=stack,
                   base={"source": "the tiny model's own initial weights"})


def worker(out: Path, mode: str) -> None:
    distributed.init_distributed("cpu")
    world, rank = distributed.world_size(), distributed.rank()
    run_dir = out / "run"
    if mode.startswith("variants"):
        trainer = variant_trainer(world, run_dir)
    else:
        trainer = Trainer(tiny_lm(), Windows(), config(world), run_dir=run_dir, log=lambda _: None, collate=stack)
    trainer.cfg.steps = int(os.environ.get("FSDP_STOP", STEPS))  # stop there, as if the job had ended
    if mode == "kill" and rank == world - 1:  # this process dies in the middle of the save of step 10
        save = sharding.save_sharded

        def dying(folder, *args, **kwargs):
            if trainer.step == 10:
                os.kill(os.getpid(), signal.SIGKILL)
            save(folder, *args, **kwargs)
        sharding.save_sharded = dying
        import attnlab.engine.trainer as trainer_module
        trainer_module.save_sharded = dying
    if mode.endswith("resume"):
        trainer.resume()
    trainer.fit()
    trainer.save()
    (out / f"held_{world}_{rank}.json").write_text(json.dumps(trainer.held))
    distributed.cleanup()


def launch(args: list[str], procs: int, cwd: Path, *, check: bool = True, **env_vars: str):
    """``torchrun --nproc_per_node procs ARGS`` on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", **env_vars)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={procs}",
           "--master_addr=127.0.0.1", f"--master_port={port}", *args]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def torchrun(out: Path, mode: str, procs: int, *, check: bool = True, stop: int = STEPS):
    return launch([str(Path(__file__).resolve()), str(out), mode], procs, out, check=check, FSDP_STOP=str(stop))


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if r.get("kind", "train") == "train"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    """One process, the whole global batch, uninterrupted."""
    run = tmp_path_factory.mktemp("one") / "run"
    Trainer(tiny_lm(), Windows(), config(1, mode="auto"), run_dir=run, log=lambda _: None, collate=stack).fit()
    return losses(run)


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two")
    torchrun(out, "fit", 2)
    return out


def test_two_sharded_processes_train_as_one_and_each_holds_half(reference, two) -> None:
    got = losses(two / "run")
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in got:
        assert got[step] == pytest.approx(reference[step], abs=1e-5), step
    model = tiny_lm()
    whole = sum(p.numel() * 4 for p in model.parameters())
    for rank in (0, 1):
        held = json.loads((two / f"held_2_{rank}.json").read_text())
        print(f"rank {rank} holds {held} of {whole} bytes of weights")
        assert 0.4 * whole <= held["weights"] <= 0.6 * whole
        assert 0.4 * whole <= held["gradients"] <= 0.6 * whole
        assert 0.8 * whole <= held["optimizer"] <= 1.2 * whole  # AdamW's two moments of its half
    assert json.loads((two / "run" / "checkpoints" / "step_000000020" / "manifest.json").read_text())["sharded"] == {
        "world": 2}


def _from_step_10(source: Path, dest: Path) -> Path:
    """A copy of ``source``'s run as it was at step 10 (its later checkpoints gone)."""
    import shutil

    shutil.copytree(source / "run", dest / "run")
    for folder in (dest / "run" / "checkpoints").glob("step_*"):
        if int(folder.name[5:]) > 10:
            shutil.rmtree(folder)
    return dest


@pytest.mark.long  # torchrun processes, several trainings: `make test-long` and CI
@pytest.mark.parametrize("procs", [1, 4])
def test_a_sharded_checkpoint_of_two_processes_resumes_at_another_number(reference, two, tmp_path, procs) -> None:
    out = _from_step_10(two, tmp_path)
    torchrun(out, "resume", procs)
    got, want = losses(out / "run"), losses(two / "run")
    for step in range(11, STEPS + 1):  # other reductions' order: equal to float32 rounding
        assert got[step] == pytest.approx(want[step], abs=1e-6), step


def test_a_damaged_sharded_checkpoint_is_refused_by_name_and_the_previous_one_is_used(two, tmp_path) -> None:
    import shutil
    import warnings

    from attnlab.engine.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint

    root = tmp_path / "checkpoints"
    shutil.copytree(two / "run" / "checkpoints", root)
    last = root / "step_000000020"
    shard = sorted(last.glob("*.distcp"))[-1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_checkpoint(last)
    with warnings.catch_warnings(record=True):
        assert latest_checkpoint(root) == root / "step_000000015"
    (root / "step_000000015" / ".metadata").unlink()  # the index of the shards gone
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(root / "step_000000015")
    for name in (".metadata", shard.name):  # an empty file where a shard was
        (root / "step_000000010" / name).write_bytes(b"")
        with pytest.raises(CheckpointError, match="corrupted or truncated"):
            load_checkpoint(root / "step_000000010")
        shutil.copy(two / "run" / "checkpoints" / "step_000000010" / name, root / "step_000000010" / name)
    assert load_checkpoint(root / "step_000000010")[0]  # put back: whole again


@pytest.mark.long  # torchrun processes, several trainings: `make test-long` and CI
def test_one_sharded_process_resumes_as_two(reference, tmp_path) -> None:
    torchrun(tmp_path, "fit", 1, stop=10)
    torchrun(tmp_path, "resume", 2)
    got = losses(tmp_path / "run")
    for step in range(1, STEPS + 1):
        assert got[step] == pytest.approx(reference[step], abs=1e-6), step


@pytest.mark.long  # torchrun processes, several trainings: `make test-long` and CI
def test_a_process_killed_mid_save_leaves_the_last_checkpoint_and_the_run_resumes(two, tmp_path) -> None:
    r = torchrun(tmp_path, "kill", 2, check=False)
    assert r.returncode != 0
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_000000005"]  # step 10 never became one
    torchrun(tmp_path, "resume", 2)
    got, want = losses(tmp_path / "run"), losses(two / "run")
    assert [got[s] for s in range(6, STEPS + 1)] == [want[s] for s in range(6, STEPS + 1)]  # same world: bitwise


@pytest.mark.long  # torchrun processes, several trainings: `make test-long` and CI
def test_lora_gradient_checkpointing_bfloat16_and_accumulation_shard_and_resume(tmp_path: Path) -> None:
    one = tmp_path / "one"
    variant_trainer(1, one / "run").fit()
    (tmp_path / "two").mkdir()
    torchrun(tmp_path / "two", "variants", 2)
    got, want = losses(tmp_path / "two" / "run"), losses(one / "run")
    for step in range(1, STEPS + 1):  # bfloat16 weights gathered (FSDP's policy) against autocast's casts
        assert got[step] == pytest.approx(want[step], abs=2e-2), step
    from attnlab.engine.checkpoint import load_checkpoint

    folder = tmp_path / "two" / "run" / "checkpoints" / "step_000000020"
    assert "base" in json.loads((folder / "manifest.json").read_text())
    saved, _ = load_checkpoint(folder)
    start = lora_lm().state_dict()
    assert saved and all("lora_" in k for k in saved)  # the adapters alone: the frozen weights are the base's
    assert all(not torch.equal(saved[k], start[k]) for k in saved)  # every adapter trained
    out = _from_step_10(tmp_path / "two", tmp_path / "again")
    torchrun(out, "variants-resume", 2)
    again = losses(out / "run")
    assert [again[s] for s in range(11, STEPS + 1)] == [got[s] for s in range(11, STEPS + 1)]


@pytest.mark.long  # torchrun processes, several trainings: `make test-long` and CI
def test_a_language_model_trains_sharded_under_torchrun_and_its_run_loads_without_it(tmp_path: Path) -> None:
    from attnlab.engine.checkpoint import load_checkpoint
    from attnlab.recipes import load_recipe
    from attnlab.tasks import load_run, train

    common = tiny_story_recipe(tmp_path, "model.options.depth=2", "train.eval_every=2")
    out = launch(["-m", "attnlab", "train", "lm-text", *common, "train.batch_size=4", "train.distributed=fsdp",
                  "--run-dir", str(tmp_path / "fsdp")], 2, tmp_path).stdout
    assert out.count("| test loss (nats/token) |") == 1 and "this process holds" in out, out
    train(load_recipe("lm-text", [*common, "train.batch_size=8"]), tmp_path / "one", log=lambda _: None)
    sharded = tmp_path / "fsdp" / "checkpoints" / "step_000000004"
    assert (sharded / ".metadata").is_file() and not (sharded / "model.safetensors").exists()
    ours, _ = load_checkpoint(sharded)  # read whole, in this process, without a process group
    theirs, _ = load_checkpoint(tmp_path / "one" / "checkpoints" / "step_000000004")
    assert max((ours[k] - theirs[k]).abs().max().item() for k in theirs) <= 1e-5
    results = [json.loads((tmp_path / run / "results.json").read_text()) for run in ("fsdp", "one")]
    assert results[0]["test_loss"] == pytest.approx(results[1]["test_loss"], abs=1e-5)
    run = load_run(tmp_path / "fsdp")  # its best checkpoint is sharded too
    assert len(run.predict(["the cat"], max_new_tokens=5)) == 1
    from attnlab.cli import main

    assert main(["eval", str(tmp_path / "fsdp"), "--checkpoint", "last"]) == 0


@pytest.mark.long  # torchrun processes, several trainings: `make test-long` and CI
def test_a_pretrained_decoder_fine_tuned_sharded_exports_as_one_folder(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="transformers writes the tiny pretrained model")
    from gguf_files import byte_level_vocab, write_gguf

    from attnlab.cli import main
    from attnlab.formats.hf.load import from_hf
    from attnlab.tasks import load_run

    torch.manual_seed(0)
    vocab = byte_level_vocab()
    config = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128)
    source = write_gguf(tmp_path / "source.gguf", "llama", transformers.AutoModelForCausalLM.from_config(config),
                        vocab)
    (tmp_path / "text.txt").write_text(("The cat sat on the mat. The dog sat on the log. " * 40 + "\n") * 30)
    run_dir = tmp_path / "run"
    launch(["-m", "attnlab", "train", "lm-text", f"model.checkpoint={source}", f"data.path={tmp_path / 'text.txt'}",
            "train.steps=3", "train.lr=0.01", "text.context=32", "train.batch_size=2", "train.distributed=fsdp",
            "train.progress=false", "train.device=cpu", "--run-dir", str(run_dir)], 2, tmp_path)
    run = load_run(run_dir)
    ids = torch.tensor([run.tokenizer.encode_prompt("The cat")])
    with torch.no_grad():
        expected = run.model.float().eval()(ids)
    assert main(["export", str(run_dir), "--format", "hf"]) == 0
    exported = run_dir / "export" / "hf"
    assert sorted(p.name for p in exported.glob("*.safetensors")) == ["model.safetensors"]  # one file, not shards
    with torch.no_grad():
        torch.testing.assert_close(from_hf(exported)(ids), expected, rtol=0, atol=1e-4)


def test_refusals_under_torchrun_are_one_line(tmp_path: Path) -> None:
    r = launch(["-m", "attnlab", "train", "attncnn-cifar10", "train.distributed=fsdp", "--run-dir", str(tmp_path / "r")],
               2, tmp_path, check=False)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("attnlab train: error")]
    assert errors and all("names no blocks" in line for line in errors), r.stderr[-2000:]


def test_fsdp_without_torchrun_and_a_model_without_blocks_are_refused(monkeypatch) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Exception, match="train.distributed=fsdp shards the model over the processes torchrun starts"):
        Trainer(tiny_lm(), Windows(), config(1), log=lambda _: None)
    with pytest.raises(Exception, match="names no blocks"):
        sharding.shard_blocks(torch.nn.Linear(2, 2))


if __name__ == "__main__":
    worker(Path(sys.argv[1]), sys.argv[2])
