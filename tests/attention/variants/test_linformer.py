"""Linformer attention: exact with identity projections, length rules, padding, registry."""

import pytest
import torch

import attnlab.attention.variants.linformer  # noqa: F401  (registers "linformer")
from attnlab.attention.multihead import SelfAttention
from attnlab.attention.registry import build_attention
from attnlab.attention.variants.linformer import LinformerAttention

E, H, B = 32, 4, 2


def nonzero_biases(mod):
    with torch.no_grad():
        for name, p in mod.named_parameters():
            if "bias" in name:
                p.normal_()


def test_identity_projections_equal_exact_attention():
    n = 24
    exact = SelfAttention(E, H)
    nonzero_biases(exact)
    lin = LinformerAttention(E, H, seq_len=n, k=n)
    missing, unexpected = lin.load_state_dict(exact.state_dict(), strict=False)
    assert set(missing) == {"E", "F"} and not unexpected
    with torch.no_grad():
        lin.E.copy_(torch.eye(n))
        lin.F.copy_(torch.eye(n))
    x = torch.randn(B, n, E)
    torch.testing.assert_close(lin(x)[0], exact(x)[0], atol=1e-5, rtol=1e-5)


def test_share_kv_identity_equals_exact_attention():
    n = 16
    exact = SelfAttention(E, H)
    lin = LinformerAttention(E, H, seq_len=n, k=n, share_kv=True)
    assert lin.F is None
    lin.load_state_dict(exact.state_dict(), strict=False)
    with torch.no_grad():
        lin.E.copy_(torch.eye(n))
    x = torch.randn(B, n, E)
    torch.testing.assert_close(lin(x)[0], exact(x)[0], atol=1e-5, rtol=1e-5)


def test_shorter_input_uses_first_columns():
    lin = LinformerAttention(E, H, seq_len=64, k=8)
    x = torch.randn(B, 40, E)
    out, w = lin(x)
    assert out.shape == (B, 40, E) and w is None
    # Same as a module built for exactly 40 positions with the first 40 columns.
    short = LinformerAttention(E, H, seq_len=40, k=8)
    state = lin.state_dict()
    state["E"], state["F"] = state["E"][:, :40], state["F"][:, :40]
    short.load_state_dict(state)
    torch.testing.assert_close(short(x)[0], out)


def test_longer_input_raises_naming_seq_len():
    lin = LinformerAttention(E, H, seq_len=16, k=8)
    with pytest.raises(ValueError, match="seq_len"):
        lin(torch.randn(B, 17, E))


def test_causal_raises():
    lin = LinformerAttention(E, H, seq_len=16, k=8)
    with pytest.raises(ValueError, match="causal"):
        lin(torch.randn(B, 16, E), is_causal=True)


def test_padding_invariance():
    lin = LinformerAttention(E, H, seq_len=32, k=8)
    nonzero_biases(lin)
    lin.eval()
    n = 20
    x = torch.randn(B, n, E)
    pad = torch.zeros(B, n, dtype=torch.bool)
    pad[0, 15:] = True
    pad[1, 5:] = True
    y = x.clone()
    y[pad] = torch.randn(int(pad.sum()), E) * 10
    a, _ = lin(x, key_padding_mask=pad)
    b, _ = lin(y, key_padding_mask=pad)
    torch.testing.assert_close(a[~pad], b[~pad], atol=1e-5, rtol=1e-5)
    # Without the mask the padded values do change the real outputs.
    assert not torch.allclose(lin(x)[0][~pad], lin(y)[0][~pad], atol=1e-3)


def test_gradients_reach_projections():
    lin = LinformerAttention(E, H, seq_len=16, k=4)
    lin(torch.randn(B, 12, E))[0].sum().backward()
    assert lin.E.grad is not None and lin.E.grad[:, 12:].abs().sum() == 0
    assert lin.F.grad is not None and lin.F.grad[:, :12].abs().sum() > 0


def test_build_attention():
    mod = build_attention("linformer", 32, 4, seq_len=64, k=16)
    assert isinstance(mod, LinformerAttention)
    assert mod.E.shape == (16, 64) and mod.F.shape == (16, 64)
    out, _ = mod(torch.randn(2, 50, 32))
    assert out.shape == (2, 50, 32) and torch.isfinite(out).all()
