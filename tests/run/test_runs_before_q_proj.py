"""Runs saved before exact attention became one module for every number of key/value heads
still load and give the same outputs. The fixture ``run_before_q_proj`` is a digits ViT that
the previous code trained (``attnlab train vit-digits`` with tests/conftest.py's TINY_DIGITS
and 4 steps, at commit 2d16484); its checkpoints pack the query, key and value projections
in ``blocks.0.attn.in_proj`` and name the output one ``out_proj``, and
``expected_logits.safetensors`` holds what that code's model gave for five random images."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from torch import nn

from attnlab.attention import GroupedQueryAttention, build_attention
from attnlab.attention.projections import upgrade_packed_projections
from attnlab.tasks import load_run

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_before_q_proj"


def test_a_run_of_the_packed_projections_loads_and_gives_the_same_logits():
    run = load_run(FIXTURE)
    attn = run.model.blocks[0].attn
    assert isinstance(attn, GroupedQueryAttention) and not hasattr(attn, "in_proj")
    expected = load_file(FIXTURE / "expected_logits.safetensors")
    with torch.no_grad():
        got = run.model.eval()(expected["inputs"])
    torch.testing.assert_close(got, expected["logits"], atol=1e-6, rtol=0)


def test_eval_of_such_a_run_gives_its_recorded_accuracy(tmp_path):
    import json

    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, run_dir)
    recorded = json.loads((run_dir / "results.json").read_text())
    metrics = load_run(run_dir).evaluate()
    assert metrics["test_samples"] == recorded["test_samples"] == 360
    # the run trained 4 steps: its logits are close to one another, and the bfloat16 it recorded rounds them
    # by the CPU's kernels, so a near tie may fall the other way on another CPU than the one that wrote it
    assert abs(metrics["test_accuracy"] - recorded["test_accuracy"]) <= 2 / 360


def test_its_training_cannot_resume_and_says_why_in_one_line(tmp_path, capsys):
    from attnlab.cli import main

    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, run_dir)
    assert main(["train", "--run-dir", str(run_dir), "--resume", "train.steps=8", "--allow-changes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "its optimizer state does not fit this model's parameters" in err[0]
    assert f"model.checkpoint={run_dir} to start a new run from them" in err[0]


def test_a_new_run_starts_from_its_weights(tmp_path):
    from attnlab.cli import main
    from conftest import TINY_DIGITS

    assert main(["train", "vit-digits", *TINY_DIGITS, f"model.checkpoint={FIXTURE}", "train.steps=1",
                 "--run-dir", str(tmp_path / "new")]) == 0


def test_the_upgrade_cuts_in_proj_into_query_key_value_and_lora_adapters_alike():
    state = {"a.in_proj.weight": torch.arange(12.0).view(6, 2), "a.in_proj.bias": torch.arange(6.0),
             "a.in_proj.lora_A": torch.zeros(3, 2), "a.in_proj.lora_B": torch.ones(6, 1),
             "a.out_proj.weight": torch.eye(2), "b.in_proj.weight": torch.zeros(6, 2)}
    upgrade_packed_projections(state, "a.")
    assert torch.equal(state["a.k_proj.weight"], torch.arange(4.0, 8.0).view(2, 2))
    assert torch.equal(state["a.v_proj.bias"], torch.tensor([4.0, 5.0]))
    assert state["a.q_proj.lora_A"].shape == (1, 2) and state["a.v_proj.lora_B"].shape == (2, 1)
    assert "a.o_proj.weight" in state and "a.out_proj.weight" not in state
    assert "b.in_proj.weight" in state  # another module's keys are its own business


def test_exact_attention_starts_from_the_weights_the_packed_module_drew_for_a_seed():
    """The same draws as before, so a seeded run trains as it did. The packed module of earlier
    versions made nn.Linear(E, 3E) and nn.Linear(E, E), then drew Xavier over the (3E, E) matrix and
    zeroed the biases: the same draws made here with torch's classes."""
    torch.manual_seed(0)
    torch.manual_seed(0)
    in_proj, out_proj = nn.Linear(32, 96), nn.Linear(32, 32)
    packed = nn.init.xavier_uniform_(torch.empty(96, 32))
    after = torch.randn(3)
    torch.manual_seed(0)
    new = build_attention("exact", 32, 4)
    joined = torch.cat([new.q_proj.weight, new.k_proj.weight, new.v_proj.weight])
    assert torch.equal(joined, packed) and torch.equal(new.o_proj.weight, out_proj.weight)
    assert torch.equal(torch.randn(3), after)  # and as many numbers drawn
    assert all(not p.any() for p in (new.q_proj.bias, new.k_proj.bias, new.v_proj.bias, new.o_proj.bias))
    x = torch.randn(2, 7, 32)
    old_state = {"in_proj.weight": packed, "in_proj.bias": torch.zeros(96), "out_proj.weight": out_proj.weight,
                 "out_proj.bias": torch.zeros(32)}
    again = build_attention("exact", 32, 4)
    again.load_state_dict(old_state)  # the packed names, upgraded on loading
    torch.testing.assert_close(again(x, is_causal=True)[0], new(x, is_causal=True)[0], atol=0, rtol=0)
