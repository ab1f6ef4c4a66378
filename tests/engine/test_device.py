"""Device selection, precision contexts and seeding."""

import json
import random

import numpy as np
import pytest
import torch

from attnlab.engine.device import autocast, make_grad_scaler, seed_everything, select_device
from attnlab.tasks import load_run

from conftest import train_digits


def test_auto_and_cpu():
    assert select_device("cpu") == torch.device("cpu")
    assert select_device("auto").type in ("cpu", "cuda", "mps")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA; the error path needs none")
def test_missing_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="device 'cuda': CUDA is not available"):
        select_device("cuda")


def test_bad_device_name():
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda, cuda:N or mps; got 'gpu'"):
        select_device("gpu")


def test_bf16_autocast_on_cpu_and_fp16_needs_cuda():
    cpu = torch.device("cpu")
    lin = torch.nn.Linear(4, 4)
    with autocast(cpu, "bf16"):
        assert lin(torch.randn(2, 4)).dtype == torch.bfloat16
    with autocast(cpu, "fp32"):
        assert lin(torch.randn(2, 4)).dtype == torch.float32
    with pytest.raises(ValueError, match="precision 'fp16' needs a CUDA device"):
        autocast(cpu, "fp16")
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, bf16, fp16; got 'int8'"):
        autocast(cpu, "int8")
    assert not make_grad_scaler(cpu, "bf16").is_enabled()


def test_seed_everything_repeats():
    seed_everything(3)
    a = (random.random(), np.random.rand(), torch.rand(2))
    seed_everything(3)
    b = (random.random(), np.random.rand(), torch.rand(2))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_precision_auto_picks_bf16_only_where_the_cpu_has_it(monkeypatch):
    from attnlab.engine import device as dev

    cpu = torch.device("cpu")
    assert dev.resolve_precision("bf16", cpu) == ("bf16", "as asked")
    monkeypatch.setattr(dev, "_CHOSEN", {})
    monkeypatch.setattr(dev, "cpu_bf16_flags", lambda: [])
    assert dev.resolve_precision("auto", cpu) == ("fp32", "the CPU has no native bfloat16 (no avx512_bf16 or amx_bf16)")
    for speedup, chosen in ((3.9, "bf16"), (1.1, "fp32")):  # flags, then the measurement decides
        monkeypatch.setattr(dev, "_CHOSEN", {})
        monkeypatch.setattr(dev, "cpu_bf16_flags", lambda: ["avx512_bf16"])
        monkeypatch.setattr(dev, "_matmul_speedup", lambda device, s=speedup: s)
        precision, why = dev.resolve_precision("auto", cpu)
        assert precision == chosen and f"{speedup:.1f}x" in why and "avx512_bf16" in why


def test_precision_auto_on_this_machine_is_said_and_kept_for_eval(tmp_path, capsys):
    import json

    from attnlab.engine.device import cpu_bf16_flags, resolve_precision
    from attnlab.tasks import load_run

    from conftest import train_digits

    assert train_digits(tmp_path / "r", "train.precision=auto") == 0
    chosen, why = resolve_precision("auto", torch.device("cpu"))
    assert f"precision auto: {chosen} ({why}; recorded in {tmp_path / 'r' / 'resolved.json'})" in capsys.readouterr().out
    assert chosen == "fp32" or cpu_bf16_flags()  # bf16 only with native instructions
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["precision"] == chosen
    run = load_run(tmp_path / "r")
    assert run.precision == chosen and run.evaluate()["test_accuracy"] == results["test_accuracy"]


def test_a_float16_gpu_run_read_on_a_cpu_predicts_in_float32(digits_run):
    # A run trained with fp16 on CUDA, loaded on a machine without one: float16 autocast
    # needs CUDA, so evaluation and prediction run in float32 instead of failing.
    results = json.loads((digits_run / "results.json").read_text())
    results["precision"] = "fp16"
    (digits_run / "results.json").write_text(json.dumps(results))
    config = (digits_run / "config.yaml").read_text()
    (digits_run / "config.yaml").write_text(config.replace("precision: fp32", "precision: auto"))
    resolved = json.loads((digits_run / "resolved.json").read_text())
    resolved["resolutions"][-1]["precision"] = "fp16"
    (digits_run / "resolved.json").write_text(json.dumps(resolved))
    run = load_run(digits_run)
    assert run.recipe.train.precision == "auto" and run.precision == "fp32"
    assert len(run.predict([torch.zeros(1, 8, 8, dtype=torch.uint8)])) == 1


# ---------------------------------------------------------------------------- fp16 on a CPU


def test_fp16_on_a_cpu_is_refused_before_the_run_directory_is_made(tmp_path, capsys):
    assert train_digits(tmp_path / "run", "train.precision=fp16", "train.device=cpu") == 2
    assert "'fp16' needs a CUDA device" in capsys.readouterr().err and not (tmp_path / "run").exists()
