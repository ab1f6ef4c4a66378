"""Performer (FAVOR+) attention: kernel estimate, random features, causal and padding."""

from __future__ import annotations

import math

import pytest
import torch

import attnlab.attention.variants.performer  # noqa: F401  (registers "performer")
from attnlab.attention.functional import scaled_dot_product_attention
from attnlab.attention.registry import build_attention
from attnlab.attention.variants.linear import kernel_attention
from attnlab.attention.variants.performer import (PerformerAttention, favor_causal, favor_features,
                                                  favor_key_exponent, orthogonal_gaussian_projection)


def _qkv(b=2, h=4, n=48, d=16, seed=0, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(b, h, n, d, generator=g, dtype=dtype) for _ in range(3)]


def _favor(q, k, v, w, mask=None, causal=False):
    phi_q = favor_features(q, w, is_query=True)
    if causal:
        return favor_causal(phi_q, favor_key_exponent(k, w, mask), v, PerformerAttention.eps, 8)
    return kernel_attention(phi_q, favor_features(k, w, is_query=False, key_padding_mask=mask), v, mask,
                            False, PerformerAttention.eps, 8)


def test_estimate_approaches_softmax_attention():
    q, k, v = _qkv(scale=0.5)
    want, _ = scaled_dot_product_attention(q, k, v)
    errs = {}
    for m in (16, 256):
        e = []
        for seed in range(6):
            w = orthogonal_gaussian_projection(m, 16, torch.Generator().manual_seed(seed))
            e.append((_favor(q, k, v, w) - want).abs().mean().item())
        errs[m] = sum(e) / len(e)
    assert errs[256] < 0.6 * errs[16]
    assert errs[256] < 0.1 * v.abs().mean().item()


def test_matches_explicit_unstabilised_kernel():
    """Stabilisers cancel: causal / padded outputs equal an O(n²) evaluation of exp(Wx - |x|²/2)."""
    q, k, v = _qkv(n=21, dtype=torch.float64)
    w = orthogonal_gaussian_projection(32, 16, torch.Generator().manual_seed(1)).double()
    mask = torch.zeros(2, 21, dtype=torch.bool)
    mask[0, -5:] = True
    mask[1, :3] = True

    def feats(x):
        x = x * 16 ** -0.25
        return torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2)

    a = feats(q) @ feats(k).transpose(-2, -1)
    a = a.masked_fill(mask[:, None, None, :], 0.0)
    for causal in (False, True):
        ac = a.masked_fill(torch.ones(21, 21, dtype=torch.bool).triu(1), 0.0) if causal else a
        want = (ac @ v) / ac.sum(-1, keepdim=True).clamp_min(1e-300)  # all keys padded: 0
        torch.testing.assert_close(_favor(q, k, v, w, mask, causal), want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_explicit(causal):
    q, k, v = _qkv(n=19, dtype=torch.float64)
    w = orthogonal_gaussian_projection(24, 16, torch.Generator().manual_seed(2)).double()
    mask = torch.zeros(2, 19, dtype=torch.bool)
    mask[0, -4:] = True

    def explicit(q, k, v):
        def feats(x):
            x = x * 16 ** -0.25
            return torch.exp(x @ w.T - (x * x).sum(-1, keepdim=True) / 2)
        a = (feats(q) @ feats(k).transpose(-2, -1)).masked_fill(mask[:, None, None, :], 0.0)
        if causal:
            a = a.masked_fill(torch.ones(19, 19, dtype=torch.bool).triu(1), 0.0)
        return (a @ v) / a.sum(-1, keepdim=True)

    g = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(5))
    grads = []
    for fn in (lambda a, b, c: _favor(a, b, c, w, mask, causal), explicit):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        (fn(*leaves) * g).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=1e-8, rtol=1e-8)


def test_projection_blocks_orthogonal():
    attn = PerformerAttention(64, 4, num_features=40)  # head_dim 16: blocks 16, 16, 8 rows
    w = attn.projection.double()
    assert w.shape == (40, 16)
    for block in (w[:16], w[16:32], w[32:]):
        gram = block @ block.T
        off = gram - torch.diag(torch.diagonal(gram))
        assert off.abs().max() < 1e-4 * gram.diagonal().max()
    assert not torch.allclose(w.norm(dim=1), w.norm(dim=1)[0].expand(40))  # chi norms, not all equal


def test_default_num_features():
    assert PerformerAttention(64, 4).num_features == round(16 * math.log(16))
    assert PerformerAttention(8, 4).num_features == 2  # head_dim 2: 2 ln 2 < 2 -> at least head_dim


def test_seed_and_redraw():
    a, b, c = PerformerAttention(32, 4, seed=3), PerformerAttention(32, 4, seed=3), PerformerAttention(32, 4, seed=4)
    assert torch.equal(a.projection, b.projection)
    assert not torch.equal(a.projection, c.projection)
    assert "projection" in a.state_dict()

    r = PerformerAttention(32, 4, redraw=True, seed=3)
    x = torch.randn(2, 6, 32)
    r.eval()
    before = r.projection.clone()
    r(x)
    assert torch.equal(r.projection, before)  # eval: kept
    r.train()
    r(x)
    after = r.projection.clone()
    assert not torch.equal(after, before)  # train: redrawn
    r(x)
    assert not torch.equal(r.projection, after)

    fixed = PerformerAttention(32, 4, seed=3).train()
    fixed(x)
    assert torch.equal(fixed.projection, before)  # redraw=False: never redrawn

    loaded = PerformerAttention(32, 4, seed=99)
    loaded.load_state_dict(r.state_dict())
    assert torch.equal(loaded.projection, r.projection)


def test_causal_position_ignores_later_tokens():
    torch.manual_seed(0)
    attn = PerformerAttention(32, 4)
    attn.chunk_size = 8
    x = torch.randn(2, 30, 32)
    y = x.clone()
    y[:, 13:] = 10 * torch.randn(2, 17, 32)  # large: would move a global key stabiliser
    out_x, _ = attn(x, is_causal=True)
    out_y, _ = attn(y, is_causal=True)
    torch.testing.assert_close(out_x[:, :13], out_y[:, :13], atol=1e-6, rtol=0)
    assert not torch.allclose(out_x[:, 13:], out_y[:, 13:])


@pytest.mark.parametrize("is_causal", [False, True])
def test_padded_keys_ignored(is_causal):
    torch.manual_seed(0)
    attn = build_attention("performer", 32, 4)
    attn.chunk_size = 4
    x = torch.randn(2, 10, 32)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, 6:] = True
    mask[1, :2] = True
    y = x.clone()
    y[0, 6:] = 10 * torch.randn(4, 32)
    y[1, :2] = 10 * torch.randn(2, 32)
    xr = x.clone().requires_grad_()
    out_x, _ = attn(xr, key_padding_mask=mask, is_causal=is_causal)
    out_y, _ = attn(y, key_padding_mask=mask, is_causal=is_causal)
    torch.testing.assert_close(out_x[0, :6], out_y[0, :6], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out_x[1, 2:], out_y[1, 2:], atol=1e-6, rtol=1e-5)
    out_x.sum().backward()
    assert torch.isfinite(xr.grad).all()


@pytest.mark.parametrize("is_causal", [False, True])
def test_fully_padded_is_finite(is_causal):
    attn = build_attention("performer", 32, 4)
    x = torch.randn(1, 5, 32, requires_grad=True)
    out, _ = attn(x, key_padding_mask=torch.ones(1, 5, dtype=torch.bool), is_causal=is_causal)
    torch.testing.assert_close(out, torch.zeros_like(out))  # out_proj bias is zero-initialised
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_build_and_call():
    attn = build_attention("performer", 32, 4, dropout=0.1, num_features=24)
    assert isinstance(attn, PerformerAttention) and attn.kind == "performer" and attn.projection.shape == (24, 8)
    x = torch.randn(2, 9, 32)
    out, weights = attn(x)
    assert out.shape == (2, 9, 32) and weights is None
    with pytest.raises(ValueError, match="performer"):
        attn(x, need_weights=True)
    with pytest.raises(ValueError, match="performer"):
        attn(x, attn_mask=torch.zeros(9, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="num_features"):
        PerformerAttention(32, 4, num_features=0)


def test_half_inputs():
    q, k, v = _qkv(n=40)
    w = orthogonal_gaussian_projection(32, 16, torch.Generator().manual_seed(0))
    for causal in (False, True):
        want = _favor(q, k, v, w, causal=causal)
        got = _favor(q.half(), k.half(), v.half(), w, causal=causal)
        assert got.dtype == torch.float16
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
