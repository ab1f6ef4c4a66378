"""Nyström attention: exact fallback, the iterative pseudo-inverse, approximation quality, padding."""

import math

import pytest
import torch

import attnlab.attention.variants.nystrom  # noqa: F401  (registers "nystrom")
from attnlab.attention.functional import scaled_dot_product_attention
from attnlab.attention.multihead import SelfAttention
from attnlab.attention.registry import build_attention
from attnlab.attention.variants.nystrom import NystromAttention, iterative_pinv

E, H, B = 32, 4, 2


def nonzero_biases(mod):
    with torch.no_grad():
        for name, p in mod.named_parameters():
            if "bias" in name:
                p.normal_()


@pytest.mark.parametrize("n", [8, 16])
def test_short_input_equals_exact_attention(n):
    exact = SelfAttention(E, H)
    nonzero_biases(exact)
    nys = NystromAttention(E, H, num_landmarks=16)
    nys.load_state_dict(exact.state_dict())
    x = torch.randn(B, n, E)
    torch.testing.assert_close(nys(x)[0], exact(x)[0], atol=1e-5, rtol=1e-5)
    # With padding: real positions as exact attention with the same mask, padded ones 0.
    pad = torch.zeros(B, n, dtype=torch.bool)
    pad[1, n // 2:] = True
    a, ref = nys(x, key_padding_mask=pad)[0], exact(x, key_padding_mask=pad)[0]
    torch.testing.assert_close(a[~pad], ref[~pad], atol=1e-5, rtol=1e-5)


def test_iterative_pinv_approaches_pinv():
    m = 16
    a = torch.softmax(torch.randn(4, m, m) + 4 * torch.eye(m), -1).double()  # well conditioned
    ref = torch.linalg.pinv(a)
    errs = [((iterative_pinv(a, it) - ref).norm() / ref.norm()).item() for it in (2, 4, 6, 8, 12)]
    assert all(e2 < e1 for e1, e2 in zip(errs, errs[1:])), errs
    assert errs[2] < 0.2 and errs[-1] < 1e-8, errs


def _smooth_qkv(n=256, d=16):
    """q, k of rank 6, smooth along the sequence; random v."""
    t = torch.linspace(0, 1, n)
    basis = torch.stack([torch.sin(2 * math.pi * f * t + ph) for f in (0.5, 1.0, 1.5) for ph in (0.0, 1.3)], -1)
    q = basis @ torch.randn(B, H, 6, d)
    k = basis @ torch.randn(B, H, 6, d)
    return q, k, torch.randn(B, H, n, d)


def test_smooth_inputs_close_to_exact():
    # Measured (seed 0): relative error 0.83 / 0.15 / 0.034 / 0.021 for 4 / 8 / 16 / 32 landmarks.
    q, k, v = _smooth_qkv()
    exact, _ = scaled_dot_product_attention(q, k, v)
    errs = {}
    for m in (4, 16, 32):
        out = NystromAttention(H * 16, H, num_landmarks=m).attend(q, k, v, key_padding_mask=None, is_causal=False)
        errs[m] = ((out - exact).norm() / exact.norm()).item()
    assert errs[16] < 0.1 and errs[32] < 0.1, errs
    assert errs[32] <= errs[16] < errs[4], errs


@pytest.mark.parametrize("conv_kernel", [None, 5])
def test_padding_invariance(conv_kernel):
    nys = NystromAttention(E, H, num_landmarks=8, conv_kernel=conv_kernel)
    nonzero_biases(nys)
    nys.eval()
    n = 50  # not a multiple of 8: exercises the zero padding to 56
    x = torch.randn(B, n, E)
    pad = torch.zeros(B, n, dtype=torch.bool)
    pad[0, 37:] = True
    pad[1, 6:] = True  # whole segments empty: empty landmarks
    y = x.clone()
    y[pad] = torch.randn(int(pad.sum()), E) * 10
    a, _ = nys(x, key_padding_mask=pad)
    b, _ = nys(y, key_padding_mask=pad)
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a[~pad], b[~pad], atol=1e-5, rtol=1e-5)
    assert (a[pad] == nys.o_proj.bias).all()  # padded queries: zero before out_proj


def test_empty_landmarks_contribute_nothing():
    # Padding that empties whole segments gives the same outputs as the unpadded prefix
    # when the prefix covers whole segments: empty landmarks are masked out.
    nys = NystromAttention(E, H, num_landmarks=4, pinv_iters=30)
    nys.eval()
    x = torch.randn(1, 40, E)
    pad = torch.zeros(1, 40, dtype=torch.bool)
    pad[0, 20:] = True  # segments of 10: the last two landmarks are empty
    ref = NystromAttention(E, H, num_landmarks=2, pinv_iters=30)
    ref.load_state_dict(nys.state_dict())
    ref.eval()
    out = nys(x, key_padding_mask=pad)[0][:, :20]
    torch.testing.assert_close(out, ref(x[:, :20])[0], atol=1e-4, rtol=1e-4)


def test_causal_raises():
    nys = NystromAttention(E, H, num_landmarks=8)
    with pytest.raises(ValueError, match="causal"):
        nys(torch.randn(B, 32, E), is_causal=True)


def test_conv_residual_and_training_dropout():
    nys = build_attention("nystrom", E, H, num_landmarks=8, conv_kernel=33, dropout=0.1)
    assert isinstance(nys, NystromAttention) and nys.conv is not None
    x = torch.randn(B, 70, E, requires_grad=True)
    out, _ = nys(x)
    out.sum().backward()
    assert out.shape == (B, 70, E) and torch.isfinite(x.grad).all()
    assert nys.conv.weight.grad is not None
    with pytest.raises(ValueError, match="conv_kernel"):
        NystromAttention(E, H, conv_kernel=4)
