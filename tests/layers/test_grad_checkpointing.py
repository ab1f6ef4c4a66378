"""Gradient checkpointing changes nothing a model learns: the same gradients, and BatchNorm
running statistics updated once per forward though each checkpointed block runs twice."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab import create_model

VOCAB = 50


def _vit():
    return create_model("vit_digits_patch2", depth=2, embed_dim=32, num_heads=2, norm="batchnorm"), \
        (torch.randint(0, 256, (4, 1, 8, 8)).float() / 255,)


def _transformer():
    model = create_model("transformer_tiny", src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, norm="batchnorm")
    return model, (torch.randint(4, VOCAB, (3, 7)), torch.randint(4, VOCAB, (3, 5)))


def _text():
    model = create_model("sentiment_transformer_tiny", vocab_size=VOCAB, norm="batchnorm")
    ids = torch.randint(4, VOCAB, (3, 9))
    return model, (ids, (ids > 0).long())


def _resnet():
    return create_model("resnet18_cifar"), (torch.randn(4, 3, 32, 32),)


@pytest.mark.parametrize("build", [_vit, _transformer, _text, _resnet], ids=["vit", "transformer", "text", "resnet"])
def test_grad_checkpointing_keeps_gradients_and_running_statistics(build):
    torch.manual_seed(0)
    plain, inputs = build()
    plain.train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.set_grad_checkpointing(True)
    for model in (plain, checkpointed):
        torch.manual_seed(1)  # the same dropout masks
        model(*inputs).float().logsumexp(-1).sum().backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
    counts = {k: int(v) for k, v in checkpointed.state_dict().items() if k.endswith("num_batches_tracked")}
    assert counts and set(counts.values()) == {1}, counts  # one forward: counted once
    for (name, a), b in zip(plain.state_dict().items(), checkpointed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    plain.eval(), checkpointed.eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(*inputs), checkpointed(*inputs))


def test_a_decoder_recomputes_its_blocks_and_keeps_its_gradients(monkeypatch):
    """GPT (no BatchNorm): each block runs again in backward, and the gradients are the same."""
    torch.manual_seed(0)
    plain = create_model("llama_tiny", vocab_size=VOCAB, depth=2).train()
    recomputed = copy.deepcopy(plain)
    recomputed.set_grad_checkpointing(True)
    ids = torch.randint(0, VOCAB, (2, 11))
    block_class = type(plain.blocks[0])
    forward, calls = block_class.forward, []

    def counted(self, *args, **kwargs):
        calls.append(1)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(block_class, "forward", counted)
    for model in (plain, recomputed):
        model(ids).logsumexp(-1).sum().backward()
        calls.append("|")
    assert "".join(map(str, calls)) == "11|1111|"  # 2 blocks: once each, then twice each (again in backward)
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
