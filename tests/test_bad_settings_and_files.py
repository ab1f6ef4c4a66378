"""No setting trains silently wrong, a diverging run stops, and bad files and inputs get
one clear message (exit 2 for the user's mistake, 1 for a full disk or divergence), never
a traceback."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from attnlab.cli import main
from attnlab.engine import TrainConfig, Trainer
from attnlab.engine import checkpoint as checkpoint_module
from attnlab.engine.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from attnlab.engine.trainer import NonFiniteLossError
from attnlab.io import read_state_dict
from attnlab.recipes import load_recipe

from conftest import train_digits  # the tiny digits run shared by tests of run directories



# ---------------------------------------------------------------------------- settings


@pytest.mark.parametrize("override, message", [
    ("train.grad_clip=-1", "train.grad_clip must be > 0.0; got -1.0"),
    ("train.grad_clip=0", "train.grad_clip must be > 0.0; got 0.0"),
    ("train.lr=inf", "train.lr must be a finite number; got inf"),
    ("train.lr=nan", "train.lr must be a finite number; got nan"),
    ("train.lr=-0.1", "train.lr must be > 0.0; got -0.1"),
    ("train.weight_decay=-inf", "train.weight_decay must be a finite number; got -inf"),
    ("train.ema_decay=1", "train.ema_decay must be < 1.0; got 1.0"),
    ("train.momentum=1", "train.momentum must be < 1.0; got 1.0"),
    ("train.label_smoothing=1", "train.label_smoothing must be < 1.0; got 1.0"),
    ("train.seed=-1", "train.seed must be >= 0; got -1"),
    ("train.progress_seconds=nan", "train.progress_seconds must be a finite number; got nan"),
    ("train.compile_mode=default", "train.compile_mode applies only with train.compile=true"),
    ("train.min_lr_ratio=inf", "train.min_lr_ratio must be a finite number; got inf"),
    ("text.max_length=64", "unknown key 'text'"),  # an image recipe has no text section
    ("model.options.drop_rate=nan", "model.options.drop_rate must be a finite number; got nan"),
    ("data.seed=-1", "data.seed must be >= 0; got -1"),
])
def test_a_setting_that_would_train_wrong_is_refused_before_anything_is_written(tmp_path, capsys, override, message):
    assert train_digits(tmp_path / "run", override) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_train_config_built_in_python_is_checked_too():
    with pytest.raises(ValueError, match="train.lr must be a finite number; got inf"):
        TrainConfig(lr=math.inf)
    with pytest.raises(ValueError, match="train.grad_clip must be > 0.0; got -1"):
        TrainConfig(grad_clip=-1.0)


def test_fp16_on_a_cpu_is_refused_before_the_run_directory_is_made(tmp_path, capsys):
    assert train_digits(tmp_path / "run", "train.precision=fp16", "train.device=cpu") == 2
    assert "'fp16' needs a CUDA device" in capsys.readouterr().err and not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- divergence


class _Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.w


class _Data:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        return torch.full((3,), float(i % 7)), 0


def _nan_at(steps: set[int]):
    """A loss that is NaN at the given (1-based) steps, else the mean output."""
    calls = {"n": 0}

    def loss_fn(out, y):
        calls["n"] += 1
        loss = out.mean()
        return loss * math.nan if calls["n"] in steps else loss

    return loss_fn


def test_a_non_finite_loss_stops_training_before_the_update_keeping_the_last_checkpoint(tmp_path):
    cfg = TrainConfig(steps=6, batch_size=8, lr=0.1, checkpoint_every=1, log_every=0, progress=False,
                      tensorboard=False, grad_clip=None, device="cpu")
    trainer = Trainer(_Scalar(), _Data(), cfg, run_dir=tmp_path, loss_fn=_nan_at({3}), log=lambda _: None)
    with pytest.raises(NonFiniteLossError, match="training diverged at step 3: loss nan; the weights were not "
                                                 "updated; checkpoint step 2"):
        trainer.fit()
    assert trainer.step == 2 and [p.name for p in list_checkpoints(tmp_path / "checkpoints")][-1] == "step_000000002"
    weights, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert torch.equal(trainer.model.w.detach(), weights["w"])  # the NaN step changed nothing
    assert torch.isfinite(trainer.model.w).all()


def test_skip_nonfinite_skips_that_many_steps_in_a_row_then_stops(tmp_path):
    cfg = TrainConfig(steps=6, batch_size=8, lr=0.1, log_every=0, progress=False, tensorboard=False,
                      skip_nonfinite=1, device="cpu")
    logged: list[str] = []
    trainer = Trainer(_Scalar(), _Data(), cfg, loss_fn=_nan_at({2}), log=logged.append)
    trainer.fit()  # one NaN step: skipped
    assert trainer.step == 6 and torch.isfinite(trainer.model.w).all()
    assert any("step 2: loss nan; skipped without an update (1 of at most 1 in a row)" in m for m in logged)
    trainer = Trainer(_Scalar(), _Data(), cfg, loss_fn=_nan_at({2, 3}), log=lambda _: None)
    with pytest.raises(NonFiniteLossError, match="at step 3: loss nan \\(2 such steps in a row\\)"):
        trainer.fit()


def test_a_diverging_run_exits_1_with_one_message_and_keeps_its_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_digits(run, "train.lr=1e30", "train.warmup_steps=0", "train.checkpoint_every=1") == 1
    err = capsys.readouterr().err
    assert err.startswith("attnlab train: error: training diverged at step 2: loss nan") and "Traceback" not in err
    assert latest_checkpoint(run / "checkpoints").name == "step_000000001" and not (run / "results.json").exists()


def test_an_infinite_gradient_stops_training_without_clipping_too(tmp_path):
    model = _Scalar()
    model.w.register_hook(lambda g: g * math.inf)  # a finite loss whose gradient overflows
    cfg = TrainConfig(steps=4, batch_size=8, lr=0.1, checkpoint_every=1, log_every=0, progress=False,
                      tensorboard=False, grad_clip=None, device="cpu")
    trainer = Trainer(model, _Data(), cfg, run_dir=tmp_path, log=lambda _: None, loss_fn=lambda out, y: out.mean())
    with pytest.raises(NonFiniteLossError, match="at step 1: gradient norm not finite; the weights were not updated"):
        trainer.fit()
    assert torch.equal(model.w.detach(), torch.ones(3)) and list_checkpoints(tmp_path / "checkpoints") == []


def test_weights_that_are_not_finite_are_never_written_as_a_checkpoint(tmp_path):
    cfg = TrainConfig(steps=2, batch_size=8, lr=0.1, log_every=0, progress=False, tensorboard=False, device="cpu")
    trainer = Trainer(_Scalar(), _Data(), cfg, run_dir=tmp_path, log=lambda _: None, loss_fn=lambda out, y: out.mean())
    trainer.fit()
    trainer.save()
    with torch.no_grad():
        trainer.model.w[1] = math.nan  # an update that overflowed
    trainer.step += 1
    with pytest.raises(NonFiniteLossError, match="1 of 1 weights tensors hold NaN or infinity \\(w\\); no checkpoint "
                                                 "was written; checkpoint step 2 .* holds the last good weights"):
        trainer.save()
    assert [p.name for p in list_checkpoints(tmp_path / "checkpoints")] == ["step_000000002"]
    with pytest.raises(NonFiniteLossError, match="no best checkpoint was written"):
        trainer.record_evaluation({"loss": math.nan, "accuracy": 0.5})
    assert not (tmp_path / "checkpoints" / "best").exists()


def test_a_diverging_run_without_clipping_leaves_only_finite_checkpoints(tmp_path, capsys):
    run = tmp_path / "run"
    assert train_digits(run, "train.grad_clip=null", "train.lr=1e6", "train.steps=20", "train.checkpoint_every=1",
                        "train.eval_every=0") == 1
    assert "training diverged" in capsys.readouterr().err
    for folder in list_checkpoints(run / "checkpoints"):
        weights, _ = load_checkpoint(folder)
        assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point()), folder.name
    code = main(["eval", str(run), "--checkpoint", "last"])  # never exit 0 with a NaN loss
    out, err = capsys.readouterr()
    assert (code == 0 and "nan" not in out) or (code == 1 and "test_loss not finite" in err), (code, out, err)


def test_eval_fails_when_finite_weights_give_a_loss_that_is_not(digits_run, capsys):
    weights, state = load_checkpoint(latest_checkpoint(digits_run / "checkpoints"))
    huge = {k: v * 1e30 if v.is_floating_point() else v for k, v in weights.items()}  # finite, but they overflow
    checkpoint_module.save_checkpoint(digits_run / "checkpoints", 5, huge, state)
    assert main(["eval", str(digits_run), "--checkpoint", "last"]) == 1
    out, err = capsys.readouterr()
    assert "test loss | nan" in out and "test_loss not finite" in err and "Traceback" not in err


def test_eval_and_predict_refuse_a_checkpoint_whose_weights_are_not_finite(digits_run, capsys):
    weights, state = load_checkpoint(latest_checkpoint(digits_run / "checkpoints"))
    weights = {k: v.clone() for k, v in weights.items()}
    first = next(k for k, v in weights.items() if v.is_floating_point())
    weights[first][...] = math.nan
    checkpoint_module.save_checkpoint(digits_run / "checkpoints", 5, weights, state)  # the engine would refuse
    for command in (["eval", str(digits_run), "--checkpoint", "last"],
                    ["predict", str(digits_run), "--checkpoint", "last", "x.png"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "are not finite (1 of" in err and first in err and "Traceback" not in err, err


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


# ---------------------------------------------------------------------------- a run's own files


@pytest.mark.parametrize("content, message", [
    ("", "config.yaml is empty"),
    ("   \n", "config.yaml is empty"),
    ("task: [unclosed", "config.yaml is not valid YAML"),
    ("- a list\n", "config.yaml must hold a YAML mapping of settings; got list"),
    ("train: {lr: fast}\n", "config.yaml is not a valid recipe: train.lr must be a number; got 'fast'"),
    (b"\xff\xfe", "config.yaml is not UTF-8 text"),
])
def test_a_bad_config_yaml_is_named_not_taken_for_the_default_recipe(digits_run, tmp_path, capsys, content, message):
    run = digits_run
    config = run / "config.yaml"
    config.write_bytes(content if isinstance(content, bytes) else content.encode())
    for argv in (["eval", str(run)], ["report", str(run)], ["train", "--run-dir", str(run), "--resume"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and str(config) in err and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize("content", ["", "[1, 2]", "{not json"])
def test_a_bad_results_json_does_not_stop_the_report(digits_run, tmp_path, capsys, content):
    run = digits_run
    (run / "results.json").write_text(content)
    assert main(["report", str(run)]) == 0
    assert "results.json could not be read" in (run / "report.html").read_text()


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


def test_weights_of_another_model_name_the_mismatched_keys(digits_run, tmp_path, capsys):
    other = tmp_path / "other"
    assert train_digits(other, "model.options.depth=2") == 0
    capsys.readouterr()
    assert main(["eval", str(digits_run), "--checkpoint", str(other / "checkpoints" / "best")]) == 2
    err = capsys.readouterr().err
    assert f"the weights in {other / 'checkpoints' / 'best'} do not fit this model" in err
    assert "unexpected blocks.1." in err and "Traceback" not in err


def test_a_pickled_weights_file_that_would_run_code_is_refused_without_suggesting_an_unsafe_load(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(2), "x": Payload()}, path)
    with pytest.raises(ValueError) as info:
        read_state_dict(path)
    message = str(info.value)
    assert message.startswith(f"{path} was refused: it holds an object of ") and "print" in message
    assert "weights_only" not in message and "False" not in message
    path.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match="is not a readable PyTorch file"):
        read_state_dict(path)


def test_translate_on_a_classifier_run_says_to_predict(digits_run, capsys):
    assert main(["translate", str(digits_run), "x"]) == 2
    err = capsys.readouterr().err
    assert "is a run of the image_classification task: its predictions are labels; 'attnlab predict" in err
    assert "Traceback" not in err


def test_a_translation_setting_out_of_range_is_refused():
    with pytest.raises(ValueError, match="translate.length_penalty must be a finite number; got inf"):
        load_recipe("translate-multi30k", ["translate.length_penalty=inf"])
