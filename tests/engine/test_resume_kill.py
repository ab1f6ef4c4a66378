"""A real crash: ``attnlab train`` killed with SIGKILL at a random step, then run again
with ``--resume``, ends bit for bit where an uninterrupted run ends.

Every run is a real subprocess with one thread, so the three runs do the same float
operations in the same order. The victim is killed at a step drawn from a seeded RNG
(``ATTNLAB_KILL_SEED`` picks another), a random few milliseconds after it logs that
step, so the kill lands during training or during a checkpoint write. On top of that
the test leaves a half-written checkpoint newer than any complete one, as a kill in the
middle of a save would. The later tests cover the ends of a run: a kill after the
last checkpoint but before ``results.json``, and a kill during the last checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnlab.engine.checkpoint import latest_checkpoint, list_checkpoints
from attnlab.engine.metrics import read_metrics
from conftest import DIGITS_WITH_VALIDATION

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")

STEPS = 40
OVERRIDES = [
    *DIGITS_WITH_VALIDATION, "model.options.depth=1", "model.options.embed_dim=32", "model.options.num_heads=2",  # drop_path 0.1 stays: RNG in use
    f"train.steps={STEPS}", "train.warmup_steps=4", "train.batch_size=32", "train.checkpoint_every=1",
    "train.keep_checkpoints=2", "train.deterministic=true", "train.eval_every=10", "train.log_every=1",
    "train.device=cpu", "train.progress=false", "train.tensorboard=false",  # plain step lines; no TensorBoard import
]


def _command(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "attnlab", "train", "vit-digits", *OVERRIDES, "--run-dir", str(run_dir), *extra]


def _env(tmp_path: Path) -> dict[str, str]:
    # One thread everywhere: the same reductions in the same order in every process.
    return {**os.environ, "ATTNLAB_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _start(run_dir: Path, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen, Path]:
    log = run_dir.with_suffix(".log")
    with open(log, "w") as out:  # a file, not a pipe: a full pipe would stall the child
        proc = subprocess.Popen(_command(run_dir, *extra), stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, log


def _finish(proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    rc = proc.wait(timeout=timeout)
    assert rc == 0, f"{' '.join(map(str, proc.args))} exited {rc}:\n{log.read_text()[-3000:]}"


def _weights(run_dir: Path) -> tuple[int, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    folder = latest_checkpoint(run_dir / "checkpoints")
    assert folder is not None, f"no valid checkpoint in {run_dir}"
    return int(folder.name.split("_")[1]), load_file(str(folder / "model.safetensors"))


def _assert_same_weights(a: Path, b: Path) -> None:
    (step_a, wa), (step_b, wb) = _weights(a), _weights(b)
    assert step_a == step_b == STEPS
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), f"{name} differs after resume"


def _train_records(run_dir: Path, kind: str = "train") -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == kind]


def _assert_same_history(a: Path, b: Path) -> None:
    """Every step logged once, in order, with the uninterrupted run's loss, bit for bit."""
    for kind, expected in (("train", list(range(1, STEPS + 1))), ("eval", list(range(10, STEPS + 1, 10)))):
        ra, rb = _train_records(a, kind), _train_records(b, kind)
        assert [r["step"] for r in ra] == expected
        assert [r["step"] for r in rb] == expected, f"{kind} steps duplicated or missing after resume"
        assert [r["loss"] for r in rb] == [r["loss"] for r in ra]


def _assert_same_results(a: Path, b: Path) -> None:
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (a, b))
    for key in ("steps", "test_accuracy", "test_loss", "params"):
        assert ra[key] == rb[key], key


def _wait_for_step(proc: subprocess.Popen, run_dir: Path, log: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before step {step}:\n{log.read_text()[-3000:]}")
        records = _train_records(run_dir)
        if records and records[-1]["step"] >= step:
            return
        time.sleep(0.005)
    proc.kill()
    pytest.fail(f"step {step} not reached in {timeout} s")


class _Reference:
    """The uninterrupted run, started once and shared: the first test runs its victim
    alongside it; the others copy its finished run directory."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.dir = run_dir
        self.proc, self.log = _start(run_dir, env)

    def finished(self) -> Path:
        _finish(self.proc, self.log)
        return self.dir


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    ref = _Reference(tmp_path_factory.mktemp("straight") / "run", _env(tmp_path_factory.mktemp("data")))
    yield ref
    if ref.proc.poll() is None:
        ref.proc.kill()
        ref.proc.wait()


@pytest.mark.long  # a training killed and resumed at a random step: `make test-long` and CI
def test_sigkill_at_a_random_step_then_resume_is_bitwise_equal(tmp_path, straight):
    env = _env(tmp_path)
    rng = random.Random(int(os.environ.get("ATTNLAB_KILL_SEED", "0")))
    kill_step, delay = rng.randrange(3, STEPS // 2), rng.uniform(0.0, 0.05)

    victim_dir = tmp_path / "victim"
    victim, victim_log = _start(victim_dir, env)
    try:
        _wait_for_step(victim, victim_dir, victim_log, kill_step)
        time.sleep(delay)
        assert victim.poll() is None, "the victim finished before it could be killed"
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(timeout=60) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
    assert not (victim_dir / "results.json").exists()

    survivor = latest_checkpoint(victim_dir / "checkpoints")
    assert survivor is not None
    resume_from = int(survivor.name.split("_")[1])
    assert kill_step - 1 <= resume_from < STEPS
    # As if the kill had landed in the middle of the next save: a folder without a
    # manifest, holding a truncated weights file and an atomic write's temporary file.
    partial = victim_dir / "checkpoints" / f"step_{resume_from + 1:09d}"
    print(f"killed after step {kill_step} (+{delay * 1000:.0f} ms): newest checkpoint step {resume_from}, "
          + ("a partial one after it" if partial.exists() else "none being written"))
    partial.mkdir(exist_ok=True)
    if not (partial / "manifest.json").exists():
        data = (survivor / "model.safetensors").read_bytes()
        (partial / "model.safetensors").write_bytes(data[: len(data) // 2])
        (partial / ".state.pt.x1y2z3.tmp").write_bytes(b"\x80\x02half")

    resumed, resumed_log = _start(victim_dir, env, "--resume")
    _finish(resumed, resumed_log)
    straight = straight.finished()

    _assert_same_weights(straight, victim_dir)
    _assert_same_history(straight, victim_dir)
    _assert_same_results(straight, victim_dir)
    assert f"step {resume_from + 1}/{STEPS}" in resumed_log.read_text()  # it did resume, not restart
    assert f"step {resume_from}/{STEPS}" not in resumed_log.read_text()


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_kill_after_the_last_step_before_results_resumes_to_results(tmp_path, straight):
    """Killed between the last checkpoint and results.json: resume only evaluates and writes results."""
    straight = straight.finished()
    run = _copy_run(straight, tmp_path / "run")
    (run / "results.json").unlink()
    before = {str(p.relative_to(run)): p.stat().st_mtime_ns for p in (run / "checkpoints").glob("step_*/*")}

    proc, log = _start(run, _env(tmp_path), "--resume")
    _finish(proc, log)
    _assert_same_results(straight, run)
    _assert_same_weights(straight, run)
    _assert_same_history(straight, run)
    assert not any(l.startswith("step ") for l in log.read_text().splitlines()), "no training step may run again"
    after = {str(p.relative_to(run)): p.stat().st_mtime_ns for p in (run / "checkpoints").glob("step_*/*")}
    assert after == before, "the complete last checkpoint was rewritten (a kill then could lose it)"


def test_kill_during_the_last_checkpoint_write_resumes_from_the_one_before(tmp_path, straight):
    """Killed while writing the last checkpoint: that folder has no manifest, the run
    resumes from the checkpoint before, trains the last step again and ends the same."""
    straight = straight.finished()
    run = _copy_run(straight, tmp_path / "run")
    (run / "results.json").unlink()
    last = run / "checkpoints" / f"step_{STEPS:09d}"
    (last / "manifest.json").unlink()
    (last / "state.pt").unlink()
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == [f"step_{STEPS - 1:09d}"]

    proc, log = _start(run, _env(tmp_path), "--resume")
    _finish(proc, log)
    assert [l.split()[1] for l in log.read_text().splitlines() if l.startswith("step ")][:1] == [f"{STEPS}/{STEPS}"]
    _assert_same_weights(straight, run)
    _assert_same_history(straight, run)
    _assert_same_results(straight, run)
