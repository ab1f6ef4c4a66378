"""LSH attention ("lsh", the Reformer's): exact where one chunk covers the sequence, and
honest about masks and about what a query sees when it does not."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import build_attention
from attnlab.attention.variants.lsh import LSHAttention, lsh_attention, lsh_buckets
from attnlab.errors import InputError


def _reference(qk, v, pad=None, causal=False):
    """Exact attention with shared, normalised keys; a query's own key only when no other is visible."""
    n = qk.shape[-2]
    scores = (qk.double() @ F.normalize(qk.double(), dim=-1).transpose(-2, -1)) / qk.shape[-1] ** 0.5
    blocked = torch.zeros(n, n, dtype=torch.bool)
    if causal:
        blocked = blocked | torch.ones(n, n, dtype=torch.bool).triu(1)
    if pad is not None:
        blocked = blocked | pad[:, None, None, :]
    scores = scores.masked_fill(torch.eye(n, dtype=torch.bool), -1e4).masked_fill(blocked, float("-inf"))
    dead = torch.isinf(scores).all(-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return weights @ v.double()


def _qkv(b=2, h=2, n=10, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, n, d, generator=g), torch.randn(b, h, n, d, generator=g)


@pytest.mark.parametrize("causal", [False, True])
def test_one_chunk_is_exact_attention_with_shared_keys(causal):
    qk, v = _qkv()
    pad = torch.zeros(2, 10, dtype=torch.bool)
    pad[1, 7:] = True
    rotations = torch.randn(8, 4)
    out = lsh_attention(qk, v, rotations, bucket_size=16, key_padding_mask=pad, is_causal=causal)
    torch.testing.assert_close(out.double(), _reference(qk, v, pad, causal), atol=1e-6, rtol=1e-6)


def test_chunks_keep_each_query_within_its_bucket_neighbourhood_and_the_causal_past():
    qk, v = _qkv(b=1, h=1, n=64, d=16, seed=1)
    rotations = torch.randn(16, 4, generator=torch.Generator().manual_seed(2))
    out = lsh_attention(qk, v, rotations, bucket_size=8, is_causal=True)
    assert out.shape == (1, 1, 64, 16) and torch.isfinite(out).all()
    changed = v.clone()
    changed[..., 40:, :] += 10.0  # the future of query 39 and before
    torch.testing.assert_close(lsh_attention(qk, changed, rotations, bucket_size=8, is_causal=True)[..., :40, :],
                               out[..., :40, :])
    buckets = lsh_buckets(qk, rotations)
    assert buckets.min() >= 0 and buckets.max() < 8


def test_padding_and_gradients_stay_finite():
    qk, v = _qkv(b=2, h=1, n=13, d=8)
    qk.requires_grad_(True)
    pad = torch.zeros(2, 13, dtype=torch.bool)
    pad[1, 3:] = True
    out = lsh_attention(qk, v, torch.randn(8, 2), bucket_size=4, key_padding_mask=pad)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(qk.grad).all()


def test_the_kind_builds_from_the_registry_and_checks_its_options():
    attn = build_attention("lsh", 16, 2, bucket_size=4, n_buckets=4)
    assert isinstance(attn, LSHAttention) and "rotations" in attn.state_dict()
    out, weights = attn(torch.randn(2, 9, 16), is_causal=True)
    assert out.shape == (2, 9, 16) and weights is None
    with pytest.raises(InputError, match="n_buckets must be an even int >= 2; got n_buckets=3"):
        build_attention("lsh", 16, 2, n_buckets=3)


def test_trailing_padding_changes_nothing_even_across_chunks():
    qk, v = _qkv(b=1, h=2, n=30, d=8, seed=3)
    rotations = torch.randn(8, 4, generator=torch.Generator().manual_seed(4))
    alone = lsh_attention(qk, v, rotations, bucket_size=8)
    padded_qk = torch.cat([qk, torch.randn(1, 2, 10, 8)], dim=2)
    padded_v = torch.cat([v, torch.randn(1, 2, 10, 8)], dim=2)
    pad = torch.arange(40).unsqueeze(0) >= 30
    padded = lsh_attention(padded_qk, padded_v, rotations, bucket_size=8, key_padding_mask=pad)
    torch.testing.assert_close(padded[:, :, :30], alone)
