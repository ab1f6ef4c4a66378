"""Top-k and hard attention ("topk"): exact where the result is known in closed form."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import build_attention
from attnlab.attention.variants.topk import TopKAttention, topk_attention
from attnlab.errors import InputError
from conftest import reference_attention


def _qkv(b=2, h=3, n=9, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
def test_k_at_least_the_length_is_exact_attention_masks_included(causal):
    q, k, v = _qkv()
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True
    pad_blocked = pad[:, None, None, :]
    blocked = pad_blocked | torch.ones(9, 9, dtype=torch.bool).triu(1) if causal else pad_blocked
    expected, _ = reference_attention(q, k, v, blocked=blocked.expand(2, 3, 9, 9))
    for top_k in (9, 50):
        out = topk_attention(q, k, v, top_k, key_padding_mask=pad, is_causal=causal)
        torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=1e-6)


def test_hard_attention_takes_the_value_of_the_argmax_key():
    q, k, v = _qkv()
    out = topk_attention(q, k, v, 1)
    best = (q @ k.transpose(-2, -1)).argmax(-1)  # (B, H, L)
    torch.testing.assert_close(out, torch.gather(v, 2, best.unsqueeze(-1).expand_as(v)))


def test_top_k_is_softmax_over_the_k_best_scores_and_differentiable_through_them():
    q, k, v = _qkv(b=1, h=1, n=7)
    k.requires_grad_(True)
    out = topk_attention(q, k, v, 3)
    scores = (q @ k.transpose(-2, -1)) / 8 ** 0.5
    keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, scores.topk(3).indices, True)
    expected, _ = reference_attention(q, k.detach(), v, blocked=~keep)
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=1e-6)
    out.sum().backward()
    assert k.grad.abs().sum() > 0  # through the kept scores
    never = ~keep[0, 0].any(0)  # keys no query kept: no gradient reaches them
    assert never.any() and torch.all(k.grad[0, 0, never] == 0)


def test_causal_padding_and_dead_rows():
    q, k, v = _qkv(b=2, h=1, n=5)
    pad = torch.tensor([[False] * 5, [True] * 5])  # the second row is all padding
    out = topk_attention(q, k, v, 2, key_padding_mask=pad, is_causal=True)
    assert torch.all(out[1] == 0) and torch.isfinite(out).all()
    torch.testing.assert_close(out[0, :, 0], v[0, :, 0])  # the first query sees itself alone


def test_the_kind_builds_from_the_registry_and_checks_its_option():
    attn = build_attention("topk", 16, 2, top_k=1)
    assert isinstance(attn, TopKAttention) and "top_k=1" in repr(attn)
    x = torch.randn(2, 6, 16)
    out, weights = attn(x, is_causal=True)
    assert out.shape == (2, 6, 16) and weights is None
    with pytest.raises(InputError, match=r"top_k must be an integer >= 1 \(an option of attention 'topk'\); got 0"):
        build_attention("topk", 16, 2, top_k=0)
