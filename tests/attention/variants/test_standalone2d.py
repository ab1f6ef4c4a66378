import pytest
import torch

import attnlab.attention.variants.standalone2d  # noqa: F401  (registers "standalone2d")
from attnlab.attention import build_attention, scaled_dot_product_attention
from attnlab.attention.variants.standalone2d import StandAloneSelfAttention2d


def _dense(m, x, blocked=None):
    """Dense attention over all H*W tokens with ``m``'s projections (no position terms)."""
    b, c, h, w = x.shape
    n, d = m.num_heads, m.head_dim
    q, k, v = m.qkv(x).reshape(b, 3, n, d, h * w).transpose(-1, -2).unbind(1)
    out, weights = scaled_dot_product_attention(q, k, v, attn_mask=blocked, need_weights=True)
    return out.transpose(-1, -2).reshape(b, c, h, w), weights


def _window_blocked(h, w, k):
    ys = torch.arange(h).repeat_interleave(w)
    xs = torch.arange(w).repeat(h)
    r = k // 2
    near = ((ys[:, None] - ys[None, :]).abs() <= r) & ((xs[:, None] - xs[None, :]).abs() <= r)
    return ~near


def _zero_embeddings(m):
    with torch.no_grad():
        m.rel_rows.zero_()
        m.rel_cols.zero_()
    return m


@pytest.mark.parametrize("h,w", [(4, 5), (3, 3), (1, 6)])
def test_full_window_equals_dense_attention(h, w):
    k = 2 * max(h, w) - 1
    m = _zero_embeddings(StandAloneSelfAttention2d(16, 4, size=(h, w), kernel_size=k)).eval()
    x = torch.randn(2, 16, h, w)
    with torch.no_grad():
        ref, _ = _dense(m, x)
        out, weights = m(x, need_weights=True)
        fused, none = m(x)
        assert none is None  # every attention kind returns (output, weights or None)
    assert weights.shape == (2, 4, h * w, k * k)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_small_window_equals_masked_dense_attention(k):
    h, w = 5, 7
    m = _zero_embeddings(StandAloneSelfAttention2d(16, 2, kernel_size=k)).eval()
    x = torch.randn(2, 16, h, w)
    with torch.no_grad():
        ref, ref_weights = _dense(m, x, _window_blocked(h, w, k))
        out, weights = m(x, need_weights=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m(x)[0], ref, atol=1e-5, rtol=1e-5)
    # Scatter the window weights back to dense (query, key) positions and compare.
    r = k // 2
    dense = torch.zeros_like(ref_weights)
    for i in range(h * w):
        y, xq = divmod(i, w)
        for p in range(k * k):
            dy, dx = divmod(p, k)
            ky, kx = y + dy - r, xq + dx - r
            if 0 <= ky < h and 0 <= kx < w:
                dense[:, :, i, ky * w + kx] = weights[:, :, i, p]
    torch.testing.assert_close(dense, ref_weights, atol=1e-6, rtol=1e-5)


def test_borders_never_attend_to_padding():
    h, w, k = 4, 6, 5
    m = StandAloneSelfAttention2d(8, 2, kernel_size=k).eval()  # random embeddings
    _, weights = m(torch.randn(3, 8, h, w), need_weights=True)
    r = k // 2
    ys = torch.arange(h).repeat_interleave(w)[:, None] + torch.arange(k).repeat_interleave(k)[None, :] - r
    xs = torch.arange(w).repeat(h)[:, None] + torch.arange(k).repeat(k)[None, :] - r
    outside = (ys < 0) | (ys >= h) | (xs < 0) | (xs >= w)  # (HW, k*k)
    assert outside.any()
    assert (weights[..., outside] == 0).all()
    assert (weights[..., ~outside] > 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, h * w))


def test_relative_embeddings_change_the_result():
    m = StandAloneSelfAttention2d(16, 2, kernel_size=3).eval()
    x = torch.randn(1, 16, 5, 5)
    with torch.no_grad():
        with_pos, _ = m(x)
        without, _ = _zero_embeddings(m)(x)
    assert not torch.allclose(with_pos, without, atol=1e-4)


def test_relative_embedding_layout():
    """Row offset embeddings act on a head's first D//2 channels, column ones on the rest."""
    h, w, k = 3, 3, 3
    m = _zero_embeddings(StandAloneSelfAttention2d(4, 1, kernel_size=k, bias=False)).eval()
    with torch.no_grad():
        m.qkv.weight.zero_()
        m.qkv.weight[:4, :, 0, 0] = torch.eye(4)  # q = x, k = v = 0
        m.rel_rows[0, 2, 0] = 10.0  # row offset +1, channel 0
        x = torch.zeros(1, 4, h, w)
        x[0, 0] = 1.0  # q = (1, 0, 0, 0) everywhere
        _, weights = m(x, need_weights=True)
    centre = weights[0, 0, 1 * w + 1].reshape(k, k)
    # Logit 10/sqrt(D) for the three positions one row below, 0 elsewhere.
    hi, lo = torch.tensor(5.0).exp(), torch.tensor(1.0)
    expect = torch.tensor([[lo, lo, lo], [lo, lo, lo], [hi, hi, hi]])
    torch.testing.assert_close(centre, expect / expect.sum())


def test_build_attention_standalone2d():
    m = build_attention("standalone2d", 32, 4, size=(5, 7), kernel_size=3)
    assert isinstance(m, StandAloneSelfAttention2d)
    assert "kernel_size=3" in repr(m)
    x = torch.randn(2, 32, 5, 7, requires_grad=True)
    m(x)[0].sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("k", [0, -3, 4, 2.0, True, "7", None])
def test_bad_kernel_size(k):
    with pytest.raises(ValueError, match="kernel_size"):
        StandAloneSelfAttention2d(16, 2, kernel_size=k)


@pytest.mark.parametrize("shape", [(2, 16, 5, 6), (2, 8, 5, 7), (16, 5, 7)])
def test_wrong_input_shape(shape):
    m = StandAloneSelfAttention2d(16, 2, size=(5, 7), kernel_size=3)
    with pytest.raises(ValueError, match="x must have shape"):
        m(torch.randn(*shape))
