"""No weight decay on norms, biases, embeddings and tokens; warm-up then cosine."""

import math

import pytest
import torch

from attnlab import create_model
from attnlab.engine.optim import build_optimizer, param_groups, warmup_cosine


def names_in(model, params):
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_vit_decays_only_weight_matrices():
    m = create_model("vit_cifar_patch4", depth=1, pos_embed="relative")
    decay, no_decay = param_groups(m, 0.05)
    d, nd = names_in(m, decay["params"]), names_in(m, no_decay["params"])
    assert {"blocks.0.attn.q_proj.weight", "blocks.0.mlp.fc1.weight", "head.weight", "patch_embed.proj.weight"} <= d
    assert {"cls_token", "blocks.0.norm1.weight", "blocks.0.attn.q_proj.bias", "blocks.0.rel_pos.table"} <= nd
    assert not d & nd and len(d) + len(nd) == len(list(m.parameters()))
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    learned = create_model("vit_cifar_patch4", depth=1)
    assert "pos_embed" in names_in(learned, param_groups(learned, 0.05)[1]["params"])


def test_tied_embedding_counted_once_and_not_decayed():
    m = create_model("transformer_tiny")
    decay, no_decay = param_groups(m, 0.1)
    all_params = decay["params"] + no_decay["params"]
    assert len(all_params) == len({id(p) for p in all_params}) == len(list(m.parameters()))
    assert any(p is m.src_embed.weight for p in no_decay["params"])


def test_build_optimizer():
    m = create_model("vit_cifar_patch4", depth=1)
    assert isinstance(build_optimizer(m, "adamw"), torch.optim.AdamW)
    sgd = build_optimizer(m, "sgd", lr=0.1, momentum=0.9)
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["nesterov"]
    with pytest.raises(ValueError, match="optimizer must be 'adamw' or 'sgd'; got 'adam'"):
        build_optimizer(m, "adam")


def test_warmup_then_cosine():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_cosine(opt, total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    lrs = []
    for _ in range(110):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0) and lrs[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] > 0.1
    with pytest.raises(ValueError, match="warmup_steps=20, total_steps=10"):
        warmup_cosine(opt, total_steps=10, warmup_steps=20)
