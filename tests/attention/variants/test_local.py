"""Tests of sliding-window attention ("local")."""

from __future__ import annotations

import pytest
import torch

import attnlab.attention.variants.local  # noqa: F401  (registers "local")
from attnlab.attention import build_attention, scaled_dot_product_attention
from attnlab.attention.multihead import SelfAttention
from attnlab.attention.variants.local import LocalAttention


def _pad_mask(b: int, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, n + 1, (b,), generator=g)
    lengths[0] = n  # one row without padding
    mask = torch.arange(n).unsqueeze(0) >= lengths.unsqueeze(1)
    if b > 2:
        mask[2] = True  # a fully padded row: every query is dead
    return mask


def _band_mask(n: int, window: int, causal: bool) -> torch.Tensor:
    i = torch.arange(n).view(n, 1)
    j = torch.arange(n).view(1, n)
    rel = i - j
    allowed = ((rel >= 0) & (rel < window)) if causal else rel.abs() < window
    return ~allowed  # True = blocked


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("n,window", [(10, 10), (10, 128), (7, 9)])
def test_full_window_equals_exact_attention(causal: bool, padded: bool, n: int, window: int) -> None:
    torch.manual_seed(0)
    b, dim, heads = 3, 32, 4
    exact = SelfAttention(dim, heads).eval()
    local = LocalAttention(dim, heads, sliding_window=window).eval()
    local.load_state_dict(exact.state_dict())
    mask = _pad_mask(b, n) if padded else None
    x = torch.randn(b, n, dim)
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    out1, _ = exact(x1, key_padding_mask=mask, is_causal=causal)
    out2, w = local(x2, key_padding_mask=mask, is_causal=causal)
    assert w is None
    torch.testing.assert_close(out2, out1, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out1)
    out1.backward(grad)
    out2.backward(grad)
    torch.testing.assert_close(x2.grad, x1.grad, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(x2.grad).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("n,window", [(37, 8), (37, 5), (16, 8), (33, 1), (9, 2), (20, 19), (1, 4)])
def test_attend_equals_dense_band(causal: bool, padded: bool, n: int, window: int) -> None:
    torch.manual_seed(1)
    b, h, d = 3, 2, 8
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    mask = _pad_mask(b, n, seed=n + window) if padded else None
    module = LocalAttention(h * d, h, sliding_window=window).eval()
    out = module.attend(q, k, v, key_padding_mask=mask, is_causal=causal)
    band = _band_mask(n, window, causal).view(1, 1, n, n)
    full = band if mask is None else band | mask.view(b, 1, 1, n)
    qr, kr, vr = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    ref, _ = scaled_dot_product_attention(qr, kr, vr, attn_mask=full)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(ref)
    ins = torch.autograd.grad(out, (q, k, v), grad)
    refs = torch.autograd.grad(ref, (qr, kr, vr), grad)
    for a, r in zip(ins, refs):
        torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-5)


def test_dead_queries_output_zero() -> None:
    torch.manual_seed(2)
    b, h, n, d = 1, 2, 12, 4
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[:, :6] = True  # with window 3 (causal), queries 0..5 see only padding
    module = LocalAttention(h * d, h, sliding_window=3)
    out = module.attend(q, k, v, key_padding_mask=mask, is_causal=True)
    assert torch.isfinite(out).all()
    assert (out[:, :, :6] == 0).all()
    assert (out[:, :, 6:] != 0).any()


def test_causal_ignores_future_tokens() -> None:
    torch.manual_seed(3)
    n, dim, window = 23, 16, 4
    module = LocalAttention(dim, 2, sliding_window=window).eval()
    x = torch.randn(2, n, dim)
    out, _ = module(x, is_causal=True)
    for i in (0, 5, 11, 22):
        y = x.clone()
        y[:, i + 1 :] = torch.randn_like(y[:, i + 1 :])
        out2, _ = module(y, is_causal=True)
        torch.testing.assert_close(out2[:, : i + 1], out[:, : i + 1], atol=1e-6, rtol=1e-6)
    # and the window is local: changing a token far in the past changes nothing either
    y = x.clone()
    y[:, 0] = torch.randn(dim)
    out3, _ = module(y, is_causal=True)
    torch.testing.assert_close(out3[:, window:], out[:, window:], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(out3[:, :window], out[:, :window])


def test_half_precision_softmax_is_float32() -> None:
    torch.manual_seed(4)
    b, h, n, d = 2, 2, 19, 8
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    module = LocalAttention(h * d, h, sliding_window=4)
    ref = module.attend(q, k, v, key_padding_mask=None, is_causal=False)
    out = module.attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), key_padding_mask=None, is_causal=False)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=5e-2, rtol=5e-2)


def test_dropout_in_training_only() -> None:
    torch.manual_seed(5)
    module = LocalAttention(16, 2, sliding_window=4, dropout=0.5)
    x = torch.randn(2, 13, 16)
    module.train()
    a, _ = module(x)
    b, _ = module(x)
    assert not torch.allclose(a, b)
    module.eval()
    c, _ = module(x)
    d, _ = module(x)
    torch.testing.assert_close(c, d)


@pytest.mark.parametrize("window", [0, -3, 2.5, "8", True, None])
def test_bad_window(window) -> None:
    with pytest.raises(ValueError, match="window"):
        LocalAttention(32, 4, sliding_window=window)


def test_rejects_attn_mask_and_need_weights() -> None:
    module = LocalAttention(32, 4, sliding_window=8)
    x = torch.randn(1, 5, 32)
    with pytest.raises(ValueError, match="attn_mask"):
        module(x, attn_mask=torch.zeros(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="need_weights"):
        module(x, need_weights=True)


def test_build_from_registry() -> None:
    module = build_attention("local", 32, 4, sliding_window=8)
    assert isinstance(module, LocalAttention)
    assert module.sliding_window == 8 and module.kind == "local"
    assert "window=8" in repr(module)
    out, w = module(torch.randn(2, 21, 32), key_padding_mask=torch.zeros(2, 21, dtype=torch.bool))
    assert out.shape == (2, 21, 32) and w is None
