"""The training loop refuses what would train wrong and stops what diverges: a setting out of
its range is refused before anything is written (in Python too); a loss or a gradient that is
not finite stops training before the update, keeping the last checkpoint, and weights that are
not finite are never written (exit 1 from the command line, one message, never a traceback)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.cli import main
from attnlab.engine import TrainConfig, Trainer
from attnlab.engine.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from attnlab.engine.trainer import NonFiniteLossError

from conftest import train_digits


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
