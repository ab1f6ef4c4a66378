"""Device selection, precision contexts and seeding."""

import random

import numpy as np
import pytest
import torch

from attnlab.engine.device import autocast, make_grad_scaler, seed_everything, select_device


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
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16; got 'int8'"):
        autocast(cpu, "int8")
    assert not make_grad_scaler(cpu, "bf16").is_enabled()


def test_seed_everything_repeats():
    seed_everything(3)
    a = (random.random(), np.random.rand(), torch.rand(2))
    seed_everything(3)
    b = (random.random(), np.random.rand(), torch.rand(2))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])
