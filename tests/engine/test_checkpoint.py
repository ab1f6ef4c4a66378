"""Training checkpoints: exact round trip, atomic writes, damage detected, no code loaded."""

import errno
import json
import os
import random

import numpy as np
import pytest
import torch

from attnlab import create_model
from attnlab.cli import main
from attnlab.engine import (
    CheckpointError,
    capture_rng_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from attnlab.io import atomic_write, sha256_file

from conftest import train_digits
from refusals import BUG, capped_cli


def trained_model():
    m = create_model("transformer_tiny", drop_rate=0.0)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randint(3, 100, (2, 5)), torch.randint(3, 100, (2, 4))).square().mean().backward()
    opt.step()
    return m, opt


def test_round_trip_is_bitwise_with_optimizer_and_rng(tmp_path):
    m, opt = trained_model()
    folder = save_checkpoint(tmp_path, 7, m.state_dict(),
                             {"optimizer": opt.state_dict(), "rng": capture_rng_state(), "epoch": 2, "batch": 5})
    expected = torch.rand(4), random.random(), np.random.rand()
    weights, state = load_checkpoint(folder)
    restore_rng_state(state["rng"])
    assert torch.equal(torch.rand(4), expected[0]) and random.random() == expected[1] and np.random.rand() == expected[2]
    assert state["epoch"] == 2 and state["batch"] == 5
    for name, t in m.state_dict().items():
        assert torch.equal(weights[name], t), name
    opt2 = torch.optim.AdamW(create_model("transformer_tiny").parameters(), lr=1e-3)
    opt2.load_state_dict(state["optimizer"])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_tied_weights_are_stored_once_and_retied(tmp_path):
    from safetensors import safe_open

    m, _ = trained_model()  # generator.weight is tgt_embed.weight is src_embed.weight
    folder = save_checkpoint(tmp_path, 1, m.state_dict(), {})
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        stored = set(f.keys())
    assert "generator.weight" not in stored and "src_embed.weight" in stored
    weights, _ = load_checkpoint(folder)
    fresh = create_model("transformer_tiny")
    fresh.load_state_dict(weights)  # strict: every key present
    assert torch.equal(fresh.generator.weight, m.generator.weight)


def test_keeps_only_the_newest(tmp_path):
    m, _ = trained_model()
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, m.state_dict(), {"step": step}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000000003", "step_000000004"]


def test_truncated_checkpoint_is_a_clear_error_and_the_previous_one_loads(tmp_path):
    m, _ = trained_model()
    save_checkpoint(tmp_path, 1, m.state_dict(), {"step": 1})
    newest = save_checkpoint(tmp_path, 2, m.state_dict(), {"step": 2})
    data = (newest / "model.safetensors").read_bytes()
    (newest / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors is corrupted or truncated"):
        load_checkpoint(newest)
    with pytest.warns(UserWarning, match="skipping damaged checkpoint"):
        good = latest_checkpoint(tmp_path)
    assert good.name == "step_000000001" and load_checkpoint(good)[1]["step"] == 1


def test_interrupted_save_without_manifest_is_ignored(tmp_path):
    m, _ = trained_model()
    save_checkpoint(tmp_path, 1, m.state_dict(), {"step": 1})
    partial = save_checkpoint(tmp_path, 2, m.state_dict(), {"step": 2})
    (partial / "manifest.json").unlink()
    assert latest_checkpoint(tmp_path).name == "step_000000001"
    with pytest.raises(CheckpointError, match="no manifest.json: the save was interrupted"):
        load_checkpoint(partial)


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_state_with_a_code_running_pickle_is_refused_even_with_a_valid_manifest(tmp_path):
    m, _ = trained_model()
    folder = save_checkpoint(tmp_path, 1, m.state_dict(), {"step": 1})
    marker = tmp_path / "pwned"
    torch.save({"evil": _Payload(marker)}, folder / "state.pt")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["state.pt"] = sha256_file(folder / "state.pt")  # an attacker can forge it
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="could not be loaded safely"):
        load_checkpoint(folder)
    assert not marker.exists()
    torch.load(folder / "state.pt", weights_only=False)  # control: the payload is real
    assert marker.exists()


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as f:
            f.write(b"half of the new")
            raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]  # no temporary file left


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep must be >= 1; got 0"):
        save_checkpoint(tmp_path, 1, {}, {}, keep=0)


def test_atomic_write_gives_the_mode_of_a_plain_open(tmp_path):
    # mkstemp creates 0600 files; a report or results file should be readable as open() makes it
    import os
    import stat

    from attnlab.io import atomic_write_bytes

    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"x")
    atomic_write_bytes(tmp_path / "atomic.txt", b"y")
    assert stat.S_IMODE(os.stat(tmp_path / "atomic.txt").st_mode) == stat.S_IMODE(os.stat(plain).st_mode)


# ---------------------------------------------------------------------------- a full disk


def test_a_full_disk_during_a_checkpoint_names_the_file_and_its_size_and_keeps_the_last_one(digits_run):
    state = latest_checkpoint(digits_run / "checkpoints") / "state.pt"
    weights = state.with_name("model.safetensors")
    cap = (weights.stat().st_size + state.stat().st_size) // 2  # room for the weights, not for the state
    assert weights.stat().st_size < cap < state.stat().st_size
    before = [p.name for p in list_checkpoints(digits_run / "checkpoints")]
    done = capped_cli("train", "--run-dir", str(digits_run), "--resume", "--allow-changes", "train.steps=6", fsize=cap)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("attnlab train: error: could not write ") and "state.pt (" in last and "KB)" in last
    assert "File too large" in last and "continue with --resume" in last
    assert "Traceback" not in done.stderr and BUG not in done.stderr
    assert [p.name for p in list_checkpoints(digits_run / "checkpoints")] == before  # the last one kept, valid
    load_checkpoint(latest_checkpoint(digits_run / "checkpoints"))
    assert not [p for p in (digits_run / "checkpoints").iterdir() if p.name.startswith(".")]  # no half-written save


def test_a_full_disk_during_a_save_names_the_file_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    real_fdopen = os.fdopen

    class Full:  # a file whose disk fills up after a few bytes
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[:17])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        return Full(f) if ".step_000000004.new/.state.pt" in os.readlink(f"/proc/self/fd/{fd}") else f

    monkeypatch.setattr("attnlab.io.os.fdopen", fdopen)
    assert train_digits(run) == 1
    err = capsys.readouterr().err
    assert f"could not write {run / 'checkpoints' / '.step_000000004.new' / 'state.pt'} (" in err
    assert "KB): No space left on device (" in err and "free there)" in err
    assert "free space, then continue with --resume" in err and "Traceback" not in err
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_000000002"]
    load_checkpoint(run / "checkpoints" / "step_000000002")  # still valid
    monkeypatch.undo()
    assert train_digits(run, "--resume") == 0  # space freed: the run continues and finishes
    assert json.loads((run / "results.json").read_text())["steps"] == 4


# ---------------------------------------------------------------------------- a damaged manifest


def test_a_bad_manifest_is_named_by_eval(digits_run, tmp_path, capsys):
    run = digits_run
    folder = list_checkpoints(run / "checkpoints")[-1]
    (folder / "manifest.json").write_text("{not json")
    assert main(["eval", str(run), "--checkpoint", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'manifest.json'} is unreadable" in err and "Traceback" not in err
    assert main(["eval", str(run), "--checkpoint", "last"]) == 0  # the damaged newest one is skipped
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "warning" in line] == [
        f"attnlab eval: warning: skipping damaged checkpoint: {folder / 'manifest.json'} is unreadable: not valid "
        f"JSON (line 1, column 2: Expecting property name enclosed in double quotes); an older one is used instead, and the "
        f"damaged folder is left in place (delete it once you no longer need it)"]
