"""A run directory is never overwritten by another run: resume with another recipe,
a new run over a finished one, two trainings at once, pruning next to damaged
checkpoints, damaged manifests."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from attnlab.cli import main
from attnlab.engine.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from attnlab.engine.rundir import RunDirError, RunLock
from attnlab.tasks import load_run, read_recipe

from conftest import TINY_DIGITS, train_digits  # the tiny digits run shared by tests of run directories


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------- resume with another recipe


def test_resume_with_another_model_is_refused_before_anything_is_written(digits_run, tmp_path, capsys):
    run = digits_run
    before = _snapshot(run)
    assert train_digits(run, "model.options.depth=2", "--resume") == 2
    err = capsys.readouterr().err
    assert "model.options.depth (1 -> 2)" in err and "cannot continue" in err and "Traceback" not in err
    assert _snapshot(run) == before  # config.yaml, checkpoints, results: all untouched
    assert load_run(run).evaluate()["test_samples"] == 360  # and the run can still be evaluated


@pytest.mark.parametrize("override, key", [("data.name=cifar10", "data.name"), ("train.optimizer=sgd", "train.optimizer"),
                                           ("model.name=vit_cifar_patch4", "model.name")])
def test_resume_with_another_task_data_or_optimizer_is_refused(digits_run, tmp_path, capsys, monkeypatch, override,
                                                              key):
    run = digits_run
    monkeypatch.setenv("ATTNLAB_DATA_DIR", str(tmp_path / "no data"))  # refused before any data is looked for
    assert train_digits(run, override, "--resume", "--allow-changes") == 2  # not even when asked: the run cannot continue
    err = capsys.readouterr().err
    assert key in err and "--resume: the recipe differs" in err and "not found" not in err
    assert not (run / "config.changes.yaml").exists()


def test_resume_with_more_steps_needs_allow_changes_and_records_the_change(digits_run, tmp_path, capsys):
    run = digits_run
    config = (run / "config.yaml").read_text()
    assert train_digits(run, "train.steps=6", "--resume") == 2
    err = capsys.readouterr().err
    assert "train.steps (4 -> 6)" in err and "--allow-changes" in err
    assert (run / "config.yaml").read_text() == config and not (run / "config.changes.yaml").exists()

    assert train_digits(run, "train.steps=6", "train.lr=0.0005", "--resume", "--allow-changes") == 0
    assert json.loads((run / "results.json").read_text())["steps"] == 6
    assert (run / "config.yaml").read_text() == config  # the original config is kept
    [change] = yaml.safe_load((run / "config.changes.yaml").read_text())
    assert change["step"] == 4
    assert change["changed"] == {"train.lr": {"from": 0.004, "to": 0.0005}, "train.steps": {"from": 4, "to": 6}}
    assert read_recipe(run).train.steps == 6  # what eval and report read: the run as it was trained
    # Resuming again with the same recipe is no change; the run's own recipe is the changed one.
    assert main(["train", "--run-dir", str(run), "--resume"]) == 0
    assert len(yaml.safe_load((run / "config.changes.yaml").read_text())) == 1


def test_settings_that_do_not_change_the_result_may_differ_on_resume(digits_run, tmp_path):
    run = digits_run
    assert main(["train", "--run-dir", str(run), "--resume", "train.device=cpu", "train.progress_seconds=5"]) == 0


def test_allow_changes_without_resume_is_a_usage_error(tmp_path, capsys):
    assert train_digits(tmp_path / "new", "--allow-changes") == 2
    assert "--allow-changes applies to --resume" in capsys.readouterr().err


# ---------------------------------------------------------------------------- a new run over an old one


def test_new_run_into_a_finished_run_without_step_checkpoints_is_refused(digits_run, tmp_path, capsys):
    run = digits_run
    for folder in list_checkpoints(run / "checkpoints", valid_only=False):
        shutil.rmtree(folder)  # pruned by hand: results.json, best/ and metrics.jsonl remain
    before = _snapshot(run)
    assert train_digits(run) == 2
    err = capsys.readouterr().err
    assert "already holds a run (config.yaml, results.json, metrics.jsonl" in err and "checkpoints/best" in err
    assert _snapshot(run) == before


def _damage_every_step_checkpoint(run: Path) -> None:
    for folder in list_checkpoints(run / "checkpoints"):
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])


def test_new_run_into_a_run_whose_checkpoints_are_all_damaged_is_refused(digits_run, tmp_path, capsys):
    run = digits_run
    _damage_every_step_checkpoint(run)
    before = _snapshot(run)
    assert train_digits(run) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert _snapshot(run) == before


def test_resume_when_every_checkpoint_is_damaged_is_refused_saying_what_was_found(digits_run, tmp_path, capsys):
    run = digits_run
    _damage_every_step_checkpoint(run)
    before = _snapshot(run)
    assert train_digits(run, "--resume") == 2
    err = capsys.readouterr().err
    assert "no valid checkpoint to continue from" in err and "damaged checkpoints step_000000004" in err
    assert "model.safetensors is corrupted or truncated" in err
    assert _snapshot(run) == before  # not restarted from step 0 over the old files


def test_resume_skips_a_damaged_newest_checkpoint_with_a_one_line_warning(digits_run, tmp_path, capsys):
    run = digits_run
    newest = list_checkpoints(run / "checkpoints")[-1]
    (newest / "state.pt").write_bytes(b"garbage")
    assert train_digits(run, "--resume") == 0
    out = capsys.readouterr().out
    assert f"warning: skipping damaged checkpoint {newest.name}: state.pt is corrupted or truncated" in out
    assert "resuming from step 2, and the resumed run will replace it when it saves step 4" in out
    assert "step 4/4" in out and "step 2/4" not in out  # resumed from step 2
    assert load_checkpoint(latest_checkpoint(run / "checkpoints"))[1]["step"] == 4  # step 4 written anew, whole


def test_a_new_run_that_fails_before_its_first_checkpoint_leaves_no_run_behind(tmp_path, capsys):
    run, empty = tmp_path / "run", tmp_path / "no-data"
    empty.mkdir()
    argv = ["train", "vit-cifar10", f"data.data_dir={empty}", "train.steps=2", "--run-dir", str(run)]
    assert main(argv) == 2  # the data is missing: found once the run directory was claimed
    assert "cifar10" in capsys.readouterr().err
    assert not run.exists()  # so the mended command can use the same folder
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    assert main(argv) == 2
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]  # the user's own file stays
    # A run that diverges before its first checkpoint leaves nothing to continue: it is removed too.
    assert train_digits(run, "train.lr=1e30", "train.warmup_steps=0", "train.checkpoint_every=0") == 1
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    assert train_digits(run) == 0


def test_a_folder_left_by_a_run_killed_before_its_first_checkpoint_is_taken_by_a_new_run(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: image_classification\n")  # as a SIGKILL leaves it: no cleanup ran
    (run / "metrics.jsonl").write_text('{"step": 1, "kind": "train", "loss": 2.3}\n')
    assert train_digits(run) == 0
    assert "holds a run that never saved a checkpoint (config.yaml, metrics.jsonl); starting over in it" in \
        capsys.readouterr().out
    assert read_recipe(run).model.options["depth"] == 1  # its own config now


# ---------------------------------------------------------------------------- two trainings at once


def test_a_second_training_on_a_locked_run_dir_is_refused_naming_the_holder(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    with RunLock(run):
        assert train_digits(run) == 2
        err = capsys.readouterr().err
        assert f"--run-dir {run} is in use by another training (pid {os.getpid()} on " in err
    assert not (run / "config.yaml").exists()
    assert train_digits(run) == 0  # once the holder is gone, the folder is free
    assert not (run / ".lock").exists()


def test_a_resume_while_the_run_writes_its_report_is_refused_by_its_lock(tmp_path, capsys, monkeypatch):
    """The report is written after the last step and the test set: the lock is still held then."""
    import attnlab.report as report

    run = tmp_path / "run"
    tried = []

    def report_and_resume(run_dir, log):  # a second `attnlab train --resume` while the report is written
        tried.append(train_digits(run, "--resume"))
        tried.append(capsys.readouterr().err)

    monkeypatch.setattr(report, "write_run_report_safely", report_and_resume)
    assert train_digits(run) == 0
    assert tried[0] == 2 and f"--run-dir {run} is in use by another training (pid {os.getpid()} on " in tried[1]
    assert not (run / ".lock").exists()


def test_two_trainings_started_together_one_wins_and_nothing_is_lost(tmp_path):
    """Two real processes on one folder: exactly one trains, the other exits 2 naming it."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "attnlab", "train", "vit-digits", *TINY_DIGITS, "train.steps=30", "--run-dir", str(run)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = next(err for (_, err), p in zip(outs, procs) if p.returncode == 2)
    # Started together, the loser usually finds the lock held; on a fast machine the winner can
    # finish its 30 steps before the loser has imported torch, and the loser then finds a
    # finished run: refused either way, nothing lost.
    assert ("is in use by another training (pid" in loser or "pass --resume to continue it" in loser), loser
    assert "Traceback" not in loser
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 30 and latest_checkpoint(run / "checkpoints").name == "step_000000030"


def test_a_stale_lock_left_by_a_dead_process_is_taken_over(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {"pid": int(dead.stdout), "host": "h", "started": "2026-01-01 00:00:00", "command": "attnlab train x"}
    (run / ".lock").write_text(json.dumps(record))  # as a SIGKILLed training leaves it
    assert train_digits(run) == 0
    assert f"was left by a training that has ended (pid {record['pid']}" in capsys.readouterr().out


def test_lock_refusal_names_holder_from_another_process(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom attnlab.engine.rundir import RunLock\n"
                               "with RunLock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n",
                               str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match=f"in use by another training \\(pid {holder.pid} on "):
            RunLock(run).acquire()
    finally:
        holder.kill()
        holder.wait()
    with RunLock(run) as lock:  # killed: the kernel released its lock; the file it left is stale
        assert lock.took_over and f"pid {holder.pid}" in lock.took_over


# ---------------------------------------------------------------------------- pruning and manifests


def _weights(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4,), value)}


def test_pruning_never_deletes_the_checkpoint_just_written_next_to_damaged_newer_ones(tmp_path):
    for step in (1, 2, 7, 8):
        save_checkpoint(tmp_path, step, _weights(step), {"step": step}, keep=4)
    for step in (7, 8):  # damaged higher-numbered folders, e.g. from a crashed later attempt
        (tmp_path / f"step_{step:09d}" / "model.safetensors").write_bytes(b"garbage")
    save_checkpoint(tmp_path, 3, _weights(3), {"step": 3}, keep=1)
    assert load_checkpoint(tmp_path / "step_000000003")[1]["step"] == 3  # what was just written survives
    names = [p.name for p in list_checkpoints(tmp_path, valid_only=False)]
    assert names == ["step_000000003", "step_000000007", "step_000000008"]  # damaged ones are left alone
    with pytest.warns(UserWarning, match="skipping damaged checkpoint"):
        assert latest_checkpoint(tmp_path).name == "step_000000003"


def test_pruning_keeps_valid_older_checkpoints_instead_of_damaged_ones(tmp_path):
    for step in (1, 2):
        save_checkpoint(tmp_path, step, _weights(step), {"step": step}, keep=3)
    (tmp_path / "step_000000002" / "state.pt").write_bytes(b"garbage")
    save_checkpoint(tmp_path, 3, _weights(3), {"step": 3}, keep=2)
    assert (tmp_path / "step_000000001").is_dir()  # the one valid older checkpoint is kept
    save_checkpoint(tmp_path, 4, _weights(4), {"step": 4}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000000002", "step_000000003", "step_000000004"]


@pytest.mark.parametrize("manifest", [
    {"step": 1, "files": {}},
    {"step": 1, "files": []},
    [],
    "step 1",
    {"step": 1},
    {"files": {"model.safetensors": "0" * 64, "state.pt": "0" * 64}},
    {"step": 1, "files": {"model.safetensors": "0" * 64}},
    {"step": 1, "files": {"model.safetensors": "0" * 64, "state.pt": "0" * 64, "../../x": "0" * 64}},
])
def test_a_manifest_that_checks_nothing_is_a_damaged_checkpoint(tmp_path, manifest):
    folder = save_checkpoint(tmp_path, 1, _weights(1), {"step": 1})
    (folder / "model.safetensors").write_bytes(b"garbage weights")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="manifest.json is (damaged|unreadable)"):
        load_checkpoint(folder)
    with pytest.warns(UserWarning, match="skipping damaged checkpoint"):
        assert latest_checkpoint(tmp_path) is None


def test_resave_of_a_step_replaces_it_whole(tmp_path):
    save_checkpoint(tmp_path, 1, _weights(1), {"step": 1})
    save_checkpoint(tmp_path, 1, _weights(5), {"step": 1, "again": True})
    weights, state = load_checkpoint(tmp_path / "step_000000001")
    assert torch.equal(weights["w"], _weights(5)["w"]) and state["again"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000001"]  # no .new / .old left


def test_a_folder_of_a_pretrained_model_is_never_a_run_dir(tmp_path, capsys):
    """Its tokenizer.json has a run's name, and a run that never saved a checkpoint is started over by
    removing such files: a folder without config.yaml is refused instead, its files kept."""
    folder = tmp_path / "SmolLM2-135M-Instruct"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (folder / name).write_text(f"the user's {name}")
    assert train_digits(folder) == 2
    err = capsys.readouterr().err
    assert "no config.yaml: it is not a run of attnlab's" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                       "tokenizer_config.json"]
    assert (folder / "tokenizer.json").read_text() == "the user's tokenizer.json"


# ---------------------------------------------------------------------------- resume


def test_a_resume_to_fewer_steps_than_done_is_refused(digits_run, capsys):
    assert train_digits(digits_run, "train.steps=3", "--resume", "--allow-changes") == 2
    err = capsys.readouterr().err
    assert "train.steps=3 is fewer than the 4 steps" in err and "give train.steps=4 or more" in err
    assert not (digits_run / "config.changes.yaml").exists()


def test_a_damaged_checkpoint_warning_says_the_resume_will_replace_it(digits_run, capsys):
    (digits_run / "checkpoints" / "step_000000004" / "model.safetensors").write_bytes(b"broken")
    (digits_run / "results.json").unlink()
    assert train_digits(digits_run, "--resume") == 0
    out = capsys.readouterr().out
    assert ("warning: skipping damaged checkpoint step_000000004: " in out and "resuming from step 2, and the "
            "resumed run will replace it when it saves step 4 (move it away first to keep it)" in out)
    load_checkpoint(digits_run / "checkpoints" / "step_000000004")  # replaced, whole


# ---------------------------------------------------------------------------- the run directory's path


def test_a_run_dir_that_is_a_file_is_refused(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    assert train_digits(path) == 2
    assert f"--run-dir {path} is a file; expected a folder" in capsys.readouterr().err
    assert path.read_text() == "mine"


def test_a_run_dir_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert train_digits(tmp_path / "notes.txt" / "run") == 2
    assert f"lies under {tmp_path / 'notes.txt'}, which is a file" in capsys.readouterr().err


def _read_only(monkeypatch, inside: Path) -> None:
    """Every file or folder created under ``inside`` fails as on a read-only file system
    (tests run as root, for whom permissions do not stop a write)."""
    real_open, real_mkdir = os.open, os.mkdir

    def refuse(path, *args, **kwargs):
        if str(path).startswith(str(inside)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(os, "open", lambda path, *a, **k: refuse(path) or real_open(path, *a, **k))
    monkeypatch.setattr(os, "mkdir", lambda path, *a, **k: refuse(path) or real_mkdir(path, *a, **k))


def test_a_run_dir_on_a_read_only_file_system_is_refused(tmp_path, monkeypatch, capsys):
    existing = tmp_path / "ro"
    existing.mkdir()
    _read_only(monkeypatch, tmp_path)
    assert train_digits(existing) == 2
    assert f"--run-dir {existing} is not writable: Read-only file system" in capsys.readouterr().err
    assert train_digits(tmp_path / "ro" / "new") == 2
    assert "cannot be created: Read-only file system" in capsys.readouterr().err
