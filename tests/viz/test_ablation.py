"""Removing one head's output (attnlab.viz.ablation): the change in the next-token loss equals
the loss of the same model with that head's output weights zeroed by hand, a head whose output
weights are zero changes nothing, and the explorer's table carries the figures (``--ablate``)."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab.errors import InputError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.viz.ablation import head_ablation, next_token_loss, removable_heads


def _model(**options) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=32, embed_dim=32, depth=2, num_heads=4, max_len=64, pos_embed="rope", norm="rmsnorm",
                    mlp="swiglu", bias=False, **options)
    return GPT(cfg).eval()


def _by_hand(model: GPT, layer: int, head: int, ids: torch.Tensor) -> float:
    """The loss change with head ``head`` of block ``layer`` removed by zeroing its columns of o_proj."""
    edited = copy.deepcopy(model)
    o_proj = edited.blocks[layer].attn.o_proj
    size = o_proj.in_features // edited.blocks[layer].attn.num_heads
    with torch.no_grad():
        o_proj.weight[:, head * size:(head + 1) * size] = 0
        return float(next_token_loss(edited(ids), ids)[0] - next_token_loss(model(ids), ids)[0])


@pytest.mark.parametrize("options", [{}, {"num_kv_heads": 2}, {"attention": "latent", "attention_options": {
    "kv_rank": 16, "rope_dim": 4, "v_head_dim": 8}}])
def test_each_heads_change_equals_zeroing_its_output_weights_by_hand(options) -> None:
    model = _model(**options)
    ids = torch.randint(0, 32, (1, 24), generator=torch.Generator().manual_seed(1))
    names = ["blocks.0.attn", "blocks.1.attn"]
    changes = head_ablation(model, ids, names)
    assert [len(row) for row in changes] == [4, 4]
    for layer in range(2):
        for head in range(4):
            assert changes[layer][head] == pytest.approx(_by_hand(model, layer, head, ids), abs=2e-5)
    assert any(abs(v) > 1e-4 for row in changes for v in row)  # the random heads do change the loss


def test_a_head_that_writes_nothing_changes_nothing_and_the_model_is_left_as_it_was() -> None:
    model = _model()
    attn = model.blocks[1].attn
    size = attn.o_proj.in_features // attn.num_heads
    with torch.no_grad():
        attn.o_proj.weight[:, 2 * size:3 * size] = 0  # head 2 of layer 1: its output goes nowhere
    ids = torch.randint(0, 32, (1, 16), generator=torch.Generator().manual_seed(2))
    before = model(ids)
    model.train()
    changes = head_ablation(model, ids, ["blocks.1.attn"])
    assert changes[0][2] == 0.0 and all(v != 0.0 for h, v in enumerate(changes[0]) if h != 2)
    assert model.training  # its mode restored, and its weights (below)
    torch.testing.assert_close(model.eval()(ids), before, rtol=0, atol=0)


def test_modules_without_heads_to_remove_and_bad_ids() -> None:
    model = _model()
    assert removable_heads(model.blocks[0].attn) == 4 and removable_heads(model.blocks[0].mlp) is None
    assert head_ablation(model, torch.zeros(1, 4, dtype=torch.long), ["blocks.0.mlp"]) == [None]
    for ids in (torch.zeros(2, 4, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long)):
        with pytest.raises(InputError, match="ids must be one row of at least 2 tokens"):
            head_ablation(model, ids, ["blocks.0.attn"])
    with pytest.raises(InputError, match=r"start must be a position in \[1, 3\]; got 4"):
        head_ablation(model, torch.zeros(1, 4, dtype=torch.long), ["blocks.0.attn"], start=4)


def test_the_change_on_the_second_half_alone_counts_those_tokens_alone() -> None:
    model = _model()
    ids = torch.randint(0, 32, (1, 20), generator=torch.Generator().manual_seed(3))
    half = head_ablation(model, ids, ["blocks.0.attn"], start=10)[0]
    edited = copy.deepcopy(model)
    o_proj = edited.blocks[0].attn.o_proj
    with torch.no_grad():
        o_proj.weight[:, 0:8] = 0
        expected = float(next_token_loss(edited(ids), ids, 10)[0] - next_token_loss(model(ids), ids, 10)[0])
    assert half[0] == pytest.approx(expected, abs=2e-5)


def test_the_explorer_of_a_language_model_shows_each_heads_change(tmp_path, capsys) -> None:
    from attnlab.cli import main
    from attnlab.viz import explore

    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat and the dog sat on the log.\n" * 100)
    run = tmp_path / "run"
    assert main(["train", "lm-text", f"data.path={text}", "train.steps=2", "model.name=gpt_tiny", "text.context=16",
                 "text.tokenizer=char", "train.progress=false", "--run-dir", str(run)]) == 0
    page = explore(run, ["the cat sat"], new_tokens=4, ablate=True)
    stats = page.data["documents"][0]["groups"][0]["stats"]
    heads = [len(row) for row in stats["entropy"]]
    assert [len(row) for row in stats["ablation"]] == heads
    assert "ablation" not in explore(run, ["the cat sat"], new_tokens=4).data["documents"][0]["groups"][0]["stats"]
    capsys.readouterr()
    assert main(["explore", str(run), "the cat", "--ablate", "--new-tokens", "2", "--out", str(tmp_path / "p.html")]) == 0
    assert "Δ loss" in (tmp_path / "p.html").read_text(encoding="utf-8")
