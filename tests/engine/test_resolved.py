"""A run's precision is decided once, when it starts, and kept: a resume, eval, predict
and report use the recorded one (``resolved.json``), never a new measurement."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from attnlab.engine import device as device_module
from attnlab.engine import resolved as resolved_module
from attnlab.engine.checkpoint import latest_checkpoint, load_checkpoint
from attnlab.engine.resolved import read_resolutions
from attnlab.tasks import load_run

from conftest import train_digits


@pytest.fixture
def machine(monkeypatch):
    """Set what ``precision: auto`` finds: the CPU's bfloat16 flags and the bf16/fp32 matmul speed-up."""
    def set_machine(flags: list[str], speedup: float = 1.8) -> None:
        monkeypatch.setattr(device_module, "_CHOSEN", {})  # a new process: nothing measured yet
        monkeypatch.setattr(device_module, "cpu_bf16_flags", lambda: list(flags))
        monkeypatch.setattr(resolved_module, "cpu_bf16_flags", lambda: list(flags))
        monkeypatch.setattr(device_module, "_matmul_speedup", lambda device: speedup)

    return set_machine


AUTO = ("train.precision=auto", "train.device=cpu", "train.checkpoint_every=2", "train.eval_every=0")


def test_a_resume_keeps_the_precision_the_run_began_in_when_the_measurement_changes(tmp_path, machine, capsys):
    machine(["avx512_bf16"], speedup=1.8)  # fast bf16: auto picks bf16
    assert train_digits(tmp_path / "whole", *AUTO) == 0
    split = shutil.copytree(tmp_path / "whole", tmp_path / "split")
    shutil.rmtree(split / "checkpoints" / "step_000000004")  # as if killed after the checkpoint of step 2
    (split / "results.json").unlink()
    machine(["avx512_bf16"], speedup=1.4)  # a busy machine: measured again, auto would pick fp32
    capsys.readouterr()
    assert train_digits(split, *AUTO, "--resume") == 0
    assert "precision auto: bf16, as the run resolved it" in capsys.readouterr().out
    assert [(r.step, r.precision) for r in read_resolutions(split)] == [(0, "bf16")]
    assert json.loads((split / "results.json").read_text())["precision"] == "bf16"
    whole, _ = load_checkpoint(latest_checkpoint(tmp_path / "whole" / "checkpoints"))
    resumed, _ = load_checkpoint(latest_checkpoint(split / "checkpoints"))
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)  # as if never interrupted


def test_a_resume_on_a_cpu_without_native_bf16_is_refused_unless_allowed_and_then_recorded(tmp_path, machine, capsys):
    run = tmp_path / "run"
    machine(["avx512_bf16"])
    assert train_digits(run, *AUTO, "train.steps=2") == 0
    before = (run / "resolved.json").read_bytes()
    machine([])  # another machine: no native bfloat16
    capsys.readouterr()
    assert train_digits(run, *AUTO, "train.steps=2", "--resume") == 2
    err = capsys.readouterr().err
    assert "trains in bf16 (precision auto chose it on" in err and "no native bfloat16" in err
    assert "--allow-changes" in err and "Traceback" not in err
    assert (run / "resolved.json").read_bytes() == before and not (run / "config.changes.yaml").exists()
    assert train_digits(run, *AUTO, "train.steps=4", "--resume", "--allow-changes") == 0
    assert "continuing in fp32 from step 2" in capsys.readouterr().out
    assert [(r.step, r.precision) for r in read_resolutions(run)] == [(0, "bf16"), (2, "fp32")]
    assert json.loads((run / "results.json").read_text())["precision"] == "fp32"  # what the test figures used


def test_eval_uses_the_recorded_precision_not_the_machines(tmp_path, machine):
    run = tmp_path / "run"
    machine(["avx512_bf16"])
    assert train_digits(run, *AUTO) == 0
    results = json.loads((run / "results.json").read_text())
    del results["precision"]  # only resolved.json says it now
    (run / "results.json").write_text(json.dumps(results))
    machine([])  # eval on a machine where auto would pick fp32
    trained = load_run(run)
    assert trained.precision == "bf16"
    assert trained.evaluate()["test_loss"] == results["test_loss"]  # the figures of results.json, to the last digit


def test_a_run_without_resolved_json_falls_back_to_results(digits_run):
    (digits_run / "resolved.json").unlink()
    assert load_run(digits_run).precision == json.loads((digits_run / "results.json").read_text())["precision"]


def test_a_damaged_resolved_json_is_named(digits_run, capsys):
    from attnlab.cli import main

    (digits_run / "resolved.json").write_text('{"resolutions": 3}')
    assert main(["eval", str(digits_run)]) == 2
    err = capsys.readouterr().err
    assert "resolved.json is damaged" in err and "Traceback" not in err
