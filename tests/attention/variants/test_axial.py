import pytest
import torch

import attnlab.attention.variants.axial  # noqa: F401  (registers "axial")
from attnlab.attention import build_attention, scaled_dot_product_attention
from attnlab.attention.variants.axial import AxialAttention2d, AxialWeights


def _dense_step(x, qkv, out_proj, num_heads, blocked):
    """One attention step over all H*W tokens of ``x`` (B, C, H, W) under ``blocked``."""
    b, c, h, w = x.shape
    d = c // num_heads
    q, k, v = qkv(x).reshape(b, 3, num_heads, d, h * w).transpose(-1, -2).unbind(1)
    out, weights = scaled_dot_product_attention(q, k, v, attn_mask=blocked, need_weights=True)
    out = out.transpose(-1, -2).reshape(b, c, h, w)
    return out_proj(out), weights


def _masks(h, w):
    ys = torch.arange(h).repeat_interleave(w)  # row of token i = y * W + x
    xs = torch.arange(w).repeat(h)
    same_row = ys[:, None] == ys[None, :]
    same_col = xs[:, None] == xs[None, :]
    return ~same_row, ~same_col  # True = blocked


@pytest.mark.parametrize("bias", [True, False])
def test_axial_equals_two_masked_dense_attentions(bias):
    h, w, dim, heads = 5, 7, 32, 4
    m = AxialAttention2d(dim, heads, size=(h, w), bias=bias).eval()
    x = torch.randn(2, dim, h, w)
    out, weights = m(x, need_weights=True)
    assert isinstance(weights, AxialWeights)
    row_w, col_w = weights.rows, weights.cols
    assert out.shape == x.shape
    assert row_w.shape == (2, heads, h, w, w) and col_w.shape == (2, heads, w, h, h)
    row_block, col_block = _masks(h, w)
    with torch.no_grad():
        y, dense_row = _dense_step(x, m.qkv_row, m.out_row, heads, row_block)
        ref, dense_col = _dense_step(y, m.qkv_col, m.out_col, heads, col_block)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    fused, none = m(x)  # the fused path: the same pair, no weights
    assert none is None
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=1e-5)
    # Weights: row_w[b, n, y, xq, xk] is the dense weight of (y, xq) -> (y, xk).
    dense_row = dense_row.reshape(2, heads, h, w, h, w)
    dense_col = dense_col.reshape(2, heads, h, w, h, w)
    yy = torch.arange(h)
    xx = torch.arange(w)
    torch.testing.assert_close(row_w, dense_row[:, :, yy, :, yy, :].permute(1, 2, 0, 3, 4), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(col_w, dense_col[:, :, :, xx, :, xx].permute(1, 2, 0, 3, 4), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(row_w.sum(-1), torch.ones_like(row_w.sum(-1)))
    torch.testing.assert_close(col_w.sum(-1), torch.ones_like(col_w.sum(-1)))


def test_axial_any_size_without_size():
    m = AxialAttention2d(16, 2).eval()
    for h, w in [(1, 1), (3, 8), (6, 2)]:
        x = torch.randn(1, 16, h, w)
        out, (rw, cw) = m(x, need_weights=True)
        assert out.shape == x.shape and rw.shape == (1, 2, h, w, w) and cw.shape == (1, 2, w, h, h)


def test_build_attention_axial():
    m = build_attention("axial", 32, 4, size=(5, 7))
    assert isinstance(m, AxialAttention2d)
    assert "size=(5, 7)" in repr(m)
    assert m(torch.randn(2, 32, 5, 7))[0].shape == (2, 32, 5, 7)


def test_axial_gradients_flow():
    m = AxialAttention2d(16, 4, size=(3, 5))
    x = torch.randn(2, 16, 3, 5, requires_grad=True)
    m(x)[0].square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_axial_dropout_in_training_only():
    m = AxialAttention2d(16, 2, dropout=0.5)
    x = torch.randn(1, 16, 4, 4)
    m.eval()
    torch.testing.assert_close(m(x)[0], m(x)[0])
    m.train()
    assert not torch.allclose(m(x)[0], m.eval()(x)[0])


@pytest.mark.parametrize("shape", [(2, 32, 5, 6), (2, 16, 5, 7), (32, 5, 7), (2, 32, 7, 5)])
def test_axial_wrong_input_shape(shape):
    m = AxialAttention2d(32, 4, size=(5, 7))
    with pytest.raises(ValueError, match="x must have shape"):
        m(torch.randn(*shape))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(embed_dim=30, num_heads=4),
        dict(embed_dim=32, num_heads=0),
        dict(embed_dim=32, num_heads=4, dropout=1.0),
        dict(embed_dim=32, num_heads=4, size=(5, 0)),
        dict(embed_dim=32, num_heads=4, size=(1, 2, 3)),
    ],
)
def test_axial_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        AxialAttention2d(**kwargs)
