"""Linear attention (Katharopoulos et al., 2020) against an explicit O(n²) evaluation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnlab.attention.variants.linear  # noqa: F401  (registers "linear")
from attnlab.attention.registry import build_attention
from attnlab.attention.variants.linear import LinearAttention, elu_feature_map, elu_linear_attention, kernel_attention


def explicit(q, k, v, key_padding_mask=None, is_causal=False, eps=1e-6):
    """A_ij = phi(q_i)·phi(k_j), masked, rows normalised (+ eps), times v."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    a = phi_q @ phi_k.transpose(-2, -1)  # (B, H, L, L)
    n = q.shape[-2]
    if key_padding_mask is not None:
        a = a.masked_fill(key_padding_mask[:, None, None, :], 0.0)
    if is_causal:
        a = a.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), 0.0)
    return (a @ v) / (a.sum(-1, keepdim=True) + eps)


def _qkv(b=2, h=3, n=21, d=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) for _ in range(3)]


def _pad(b=2, n=21):
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[0, -5:] = True
    mask[1, :3] = True  # padding at the start too
    return mask


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("chunk", [4, 8, 64])  # 21 is no multiple of 4 or 8; 64 > L
def test_matches_explicit(is_causal, padded, chunk):
    q, k, v = _qkv()
    mask = _pad() if padded else None
    got = kernel_attention(elu_feature_map(q), elu_feature_map(k), v, mask, is_causal, 1e-6, chunk)
    want = explicit(q, k, v, mask, is_causal)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_float32_matches_explicit():
    q, k, v = _qkv(dtype=torch.float32)
    mask = _pad()
    for causal in (False, True):
        got = kernel_attention(elu_feature_map(q), elu_feature_map(k), v, mask, causal, 1e-6, 8)
        torch.testing.assert_close(got, explicit(q, k, v, mask, causal), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_match_explicit(is_causal):
    q, k, v = _qkv(n=19)
    mask = _pad(n=19)
    w = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(3))
    grads = []
    for fn in (lambda a, b, c: kernel_attention(elu_feature_map(a), elu_feature_map(b), c, mask, is_causal,
                                                1e-6, 8),
               lambda a, b, c: explicit(a, b, c, mask, is_causal)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        (fn(*leaves) * w).sum().backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # padded keys get no gradient
    assert (grads[0][1][0, :, -5:] == 0).all() and (grads[0][2][1, :, :3] == 0).all()


def test_causal_position_ignores_later_tokens():
    torch.manual_seed(0)
    attn = LinearAttention(32, 4).double()
    attn.chunk_size = 8
    x = torch.randn(2, 30, 32, dtype=torch.float64)
    y = x.clone()
    y[:, 13:] = torch.randn(2, 17, 32, dtype=torch.float64)
    out_x, _ = attn(x, is_causal=True)
    out_y, _ = attn(y, is_causal=True)
    torch.testing.assert_close(out_x[:, :13], out_y[:, :13], atol=1e-12, rtol=0)
    assert not torch.allclose(out_x[:, 13:], out_y[:, 13:])


def test_padded_values_ignored_and_fully_padded_is_zero():
    torch.manual_seed(0)
    attn = build_attention("linear", 32, 4)
    x = torch.randn(2, 10, 32)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, 6:] = True
    mask[1] = True  # fully padded sequence
    y = x.clone()
    y[0, 6:] = 100 * torch.randn(4, 32)
    for causal in (False, True):
        out_x, _ = attn(x, key_padding_mask=mask, is_causal=causal)
        out_y, _ = attn(y, key_padding_mask=mask, is_causal=causal)
        assert torch.isfinite(out_x).all()
        torch.testing.assert_close(out_x[0, :6], out_y[0, :6])
        # all keys padded: attention output 0, so the module returns out_proj's bias (zero-initialised)
        torch.testing.assert_close(out_x[1], torch.zeros_like(out_x[1]))


def test_build_and_module_call():
    attn = build_attention("linear", 32, 4, dropout=0.1)
    assert isinstance(attn, LinearAttention) and attn.kind == "linear"
    assert attn.dropout == 0.1  # accepted, unused
    x = torch.randn(3, 17, 32, requires_grad=True)
    out, weights = attn(x)
    assert out.shape == (3, 17, 32) and weights is None
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    # train and eval agree: there are no weights to drop
    attn.eval()
    torch.testing.assert_close(attn(x)[0], out)


def test_half_input_computed_in_float32():
    q, k, v = _qkv(dtype=torch.float32, n=200)
    got = kernel_attention(elu_feature_map(q.half()), elu_feature_map(k.half()), v.half(), None, True, 1e-6, 64)
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), explicit(q, k, v, None, True), atol=2e-2, rtol=2e-2)


def test_rejects_need_weights_and_attn_mask():
    attn = build_attention("linear", 32, 4)
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match="linear"):
        attn(x, need_weights=True)
    with pytest.raises(ValueError, match="linear"):
        attn(x, attn_mask=torch.zeros(5, 5, dtype=torch.bool))


def test_bad_eps():
    with pytest.raises(ValueError, match="eps"):
        LinearAttention(32, 4, eps=0.0)


def test_fast_path_matches_kernel_attention_and_its_gradients():
    # The hand-written backward of the unmasked, non-causal path against autograd through
    # kernel_attention, and against finite differences; inputs straddle 0, where elu bends.
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 11, 5, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = elu_linear_attention(q, k, v)
    ref = kernel_attention(elu_feature_map(q), elu_feature_map(k), v)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(elu_linear_attention, (q, k, v))


def test_module_takes_the_fast_path_only_without_mask_or_causality(monkeypatch):
    import attnlab.attention.variants.linear as lin

    calls = []
    monkeypatch.setattr(lin, "elu_linear_attention", lambda *a, **kw: calls.append(1) or kernel_attention(
        elu_feature_map(a[0]), elu_feature_map(a[1]), a[2]))
    m = LinearAttention(16, 2)
    x = torch.randn(2, 7, 16)
    m(x)
    assert calls == [1]
    m(x, is_causal=True)
    m(x, key_padding_mask=torch.tensor([[False] * 6 + [True]] * 2))
    assert calls == [1]
