"""scaled_dot_product_attention: masks, both paths, fully-masked rows, gradients."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention import causal_mask, scaled_dot_product_attention as sdpa
from attnlab.attention import functional, kernels
from conftest import reference_attention


def qkv(b=2, h=3, lq=5, lk=7, d=8, dv=None, dtype=torch.float32, grad=False):
    t = lambda *s: torch.randn(*s, dtype=dtype, requires_grad=grad)
    return t(b, h, lq, d), t(b, h, lk, d), t(b, h, lk, dv or d)


@pytest.mark.parametrize("need_weights", [False, True])
def test_matches_reference_without_mask(need_weights):
    q, k, v = qkv()
    out, w = sdpa(q, k, v, need_weights=need_weights)
    ref, ref_w = reference_attention(q, k, v)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert w.shape == (2, 3, 5, 7)
        torch.testing.assert_close(w.double(), ref_w, atol=1e-6, rtol=1e-5)
    else:
        assert w is None


def test_value_dim_may_differ_and_3d_inputs_are_one_head():
    q, k, v = qkv(dv=4)
    assert sdpa(q, k, v)[0].shape == (2, 3, 5, 4)
    q3, k3, v3 = q[:, 0], k[:, 0], v[:, 0]
    out, w = sdpa(q3, k3, v3, need_weights=True)
    assert out.shape == (2, 5, 4) and w.shape == (2, 5, 7)
    torch.testing.assert_close(out, sdpa(q, k, v)[0][:, 0])


@pytest.mark.parametrize("d, dv", [(8, 16), (16, 8)])
@pytest.mark.parametrize("masked", [False, True])
def test_a_value_size_of_its_own_stays_on_the_fused_kernel(d, dv, masked):
    # torch's CPU flash kernel wants one head size for q, k and v and falls back to its math path, which
    # forms the weights, when given two; attnlab pads the shorter side with zeros instead
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Calls.names.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = qkv(d=d, dv=dv, dtype=torch.float64, grad=True)
    pad = torch.tensor([[False] * 5 + [True] * 2, [False] * 7]) if masked else None
    with Calls():
        out, _ = sdpa(q, k, v, key_padding_mask=pad, is_causal=not masked, scale=0.3)
    assert any("flash_attention" in n for n in Calls.names), Calls.names
    assert not any("softmax" in n for n in Calls.names)
    ref, _ = sdpa(q, k, v, key_padding_mask=pad, is_causal=not masked, scale=0.3, need_weights=True)
    assert out.shape == (2, 3, 5, dv)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    for g, r in zip(grads, torch.autograd.grad(ref.sum(), (q, k, v))):
        torch.testing.assert_close(g, r, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("case", ["causal", "cached step", "window", "padding", "a row all padding", "not causal",
                                  "additive", "values of their own size"])
def test_sinks_take_the_fused_kernel_with_one_key_more_and_equal_the_explicit_path(case):
    # the sink (a learned logit per head, no value) as one more key: the weights never exist, and the
    # output and every gradient (the sinks' too) equal the explicit path's, which forms them
    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Calls.names.append(str(func))
            return func(*args, **(kwargs or {}))

    lq = 2 if case == "cached step" else 7
    q, k, v = qkv(lq=lq, lk=7, d=8, dv=16 if case == "values of their own size" else 8, dtype=torch.float64,
                  grad=True)
    sinks = torch.randn(3, dtype=torch.float64, requires_grad=True)
    options = {"is_causal": case not in ("not causal", "additive", "window"), "scale": 0.4}
    if case == "window":
        i = torch.arange(7)
        options["attn_mask"] = (i[None, :] > i[:, None]) | (i[:, None] - i[None, :] >= 3)
    if case == "additive":
        options["attn_mask"] = torch.randn(7, 7, dtype=torch.float64)
    if case in ("padding", "a row all padding"):
        options["key_padding_mask"] = torch.tensor([[False] * 5 + [True] * 2, [case == "a row all padding"] * 7])
        options["is_causal"] = case == "padding"
    with Calls():
        out, _ = sdpa(q, k, v, sinks=sinks, **options)
    assert any("flash_attention" in n for n in Calls.names) and not any("softmax" in n for n in Calls.names)
    ref, w = sdpa(q, k, v, sinks=sinks, need_weights=True, **options)
    assert (w.sum(-1) < 1).all()  # the explicit path: the sink took a share of each row
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad((out * g).sum(), (q, k, v, sinks)),
                    torch.autograd.grad((ref * g).sum(), (q, k, v, sinks))):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_custom_scale():
    q, k, v = qkv()
    ref, _ = reference_attention(q, k, v, scale=0.3)
    for nw in (False, True):
        torch.testing.assert_close(sdpa(q, k, v, scale=0.3, need_weights=nw)[0].double(), ref, atol=1e-5, rtol=1e-5)


def test_bool_mask_true_means_blocked_and_float_mask_is_added():
    q, k, v = qkv()
    blocked = torch.rand(5, 7) < 0.4
    blocked[:, 0] = False
    additive = torch.randn(2, 1, 5, 7)
    for nw in (False, True):
        out, _ = sdpa(q, k, v, attn_mask=blocked, need_weights=nw)
        torch.testing.assert_close(out.double(), reference_attention(q, k, v, blocked=blocked)[0], atol=1e-5, rtol=1e-5)
        out, _ = sdpa(q, k, v, attn_mask=additive, need_weights=nw)
        torch.testing.assert_close(out.double(), reference_attention(q, k, v, additive=additive)[0], atol=1e-5, rtol=1e-5)


def test_key_padding_bool_and_float_agree():
    q, k, v = qkv()
    pad = torch.tensor([[False] * 5 + [True] * 2, [False] * 7])
    fpad = torch.zeros(2, 7).masked_fill(pad, -math.inf)
    ref, _ = reference_attention(q, k, v, blocked=pad[:, None, None, :])
    for nw in (False, True):
        torch.testing.assert_close(sdpa(q, k, v, key_padding_mask=pad, need_weights=nw)[0].double(), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sdpa(q, k, v, key_padding_mask=fpad, need_weights=nw)[0].double(), ref, atol=1e-5, rtol=1e-5)


def test_causal_is_bottom_right_aligned():
    assert causal_mask(3, 3).tolist() == [[False, True, True], [False, False, True], [False, False, False]]
    # With a cached prefix of 2, the 3 new queries see the prefix plus their past.
    assert causal_mask(3, 5).tolist() == [
        [False, False, False, True, True],
        [False, False, False, False, True],
        [False, False, False, False, False],
    ]
    q, k, v = qkv(lq=3, lk=5)
    ref, _ = reference_attention(q, k, v, blocked=causal_mask(3, 5))
    for nw in (False, True):
        torch.testing.assert_close(sdpa(q, k, v, is_causal=True, need_weights=nw)[0].double(), ref, atol=1e-5, rtol=1e-5)


def test_causal_square_uses_same_result_on_both_paths():
    q, k, v = qkv(lq=6, lk=6)
    fused, _ = sdpa(q, k, v, is_causal=True)
    explicit, w = sdpa(q, k, v, is_causal=True, need_weights=True)
    torch.testing.assert_close(fused, explicit, atol=1e-6, rtol=1e-5)
    assert torch.all(w.triu(1) == 0)


def test_masks_combine():
    q, k, v = qkv(lq=7, lk=7)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 5:] = True
    additive = torch.randn(7, 7)
    blocked = causal_mask(7, 7) | pad[:, None, None, :]
    ref, _ = reference_attention(q, k, v, blocked=blocked, additive=additive)
    for nw in (False, True):
        out, _ = sdpa(q, k, v, attn_mask=additive, key_padding_mask=pad, is_causal=True, need_weights=nw)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("kind", ["bool", "float", "padding", "causal_taller"])
def test_fully_masked_rows_give_zeros_and_zero_grad(need_weights, kind):
    q, k, v = qkv(lq=4, lk=4, grad=True)
    kw = {}
    dead_rows = torch.zeros(2, 1, 4, dtype=torch.bool)
    if kind == "bool":
        m = torch.zeros(4, 4, dtype=torch.bool)
        m[1] = True
        kw["attn_mask"], dead_rows[:, :, 1] = m, True
    elif kind == "float":
        m = torch.zeros(4, 4)
        m[2] = -math.inf
        kw["attn_mask"], dead_rows[:, :, 2] = m, True
    elif kind == "padding":
        pad = torch.zeros(2, 4, dtype=torch.bool)
        pad[1] = True  # the whole second sequence is padding
        kw["key_padding_mask"], dead_rows[1] = pad, True
    else:  # more queries than keys: the first rows see no key at all
        q = torch.randn(2, 3, 6, 8, requires_grad=True)
        kw["is_causal"] = True
        dead_rows = torch.zeros(2, 1, 6, dtype=torch.bool)
        dead_rows[:, :, :2] = True
    out, w = sdpa(q, k, v, need_weights=need_weights, **kw)
    assert torch.isfinite(out).all()
    dead = dead_rows.expand(2, 3, -1)
    assert (out[dead] == 0).all()
    assert (out[~dead] != 0).any()
    if need_weights:
        assert torch.isfinite(w).all() and (w[dead] == 0).all()
        torch.testing.assert_close(w[~dead].sum(-1), torch.ones((~dead).sum().item()))
    (out.sum() + (0 if w is None else w.sum())).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[dead] == 0).all()


def test_dropout_only_when_asked_and_weights_are_pre_dropout():
    q, k, v = qkv()
    torch.testing.assert_close(sdpa(q, k, v, dropout_p=0.0)[0], sdpa(q, k, v)[0])
    torch.manual_seed(1)
    dropped, w = sdpa(q, k, v, dropout_p=0.5, need_weights=True)
    assert not torch.allclose(dropped, sdpa(q, k, v)[0])
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))


@pytest.mark.parametrize("need_weights", [False, True])
def test_gradcheck_float64(need_weights):
    q, k, v = qkv(b=1, h=2, lq=3, lk=4, d=3, dtype=torch.float64, grad=True)
    pad = torch.tensor([[False, False, True, False]])

    def f(q, k, v):
        out, w = sdpa(q, k, v, key_padding_mask=pad, is_causal=False, need_weights=need_weights)
        return out if w is None else (out, w)

    assert torch.autograd.gradcheck(f, (q, k, v))
    causal = lambda q, k, v: sdpa(q, k, v, is_causal=True, need_weights=need_weights)[0]
    assert torch.autograd.gradcheck(causal, (q, k, v))


def test_half_precision_weights_are_normalized():
    q, k, v = qkv(dtype=torch.bfloat16)
    out, w = sdpa(q, k, v, need_weights=True)
    assert out.dtype == torch.bfloat16 and w.dtype == torch.bfloat16
    torch.testing.assert_close(w.float().sum(-1), torch.ones(2, 3, 5), atol=1e-2, rtol=0)


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3), h=st.integers(1, 3), lq=st.integers(1, 6), lk=st.integers(1, 6),
    mask_kind=st.sampled_from(["none", "bool2d", "bool4d", "float2d", "float4d"]),
    use_pad=st.booleans(), causal=st.booleans(), seed=st.integers(0, 2**16),
)
def test_fuzzed_masks_match_reference_on_both_paths(b, h, lq, lk, mask_kind, use_pad, causal, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, 4, generator=g) for n in (lq, lk, lk))
    attn_mask = None
    blocked = torch.zeros(b, h, lq, lk, dtype=torch.bool)
    additive = torch.zeros(b, h, lq, lk)
    shape = (lq, lk) if mask_kind.endswith("2d") else (b, 1, lq, lk)
    if mask_kind.startswith("bool"):
        attn_mask = torch.rand(*shape, generator=g) < 0.3
        blocked = blocked | attn_mask
    elif mask_kind.startswith("float"):
        attn_mask = torch.randn(*shape, generator=g)
        attn_mask = attn_mask.masked_fill(torch.rand(*shape, generator=g) < 0.3, -math.inf)
        additive = additive + attn_mask
    pad = None
    if use_pad:
        pad = torch.rand(b, lk, generator=g) < 0.3
        blocked = blocked | pad[:, None, None, :]
    if causal:
        blocked = blocked | causal_mask(lq, lk)
    ref, ref_w = reference_attention(q, k, v, blocked=blocked, additive=additive)
    for nw in (False, True):
        out, w = sdpa(q, k, v, attn_mask=attn_mask, key_padding_mask=pad, is_causal=causal, need_weights=nw)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-4)
        if nw:
            torch.testing.assert_close(w.double(), ref_w, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("lk", [16, 200])
def test_bf16_on_cpu_short_rows_take_the_explicit_path_and_agree(lk, native, monkeypatch):
    # Short rows in bfloat16 on a CPU with native bfloat16 go through the explicit path (torch's
    # flash kernel is slow there); long rows, and every row on a CPU without it (where the
    # explicit path is the slow one), through the kernel. Both must agree with a float32 reference.
    monkeypatch.setattr(kernels, "native_bf16_cpu", lambda: native)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 16) for n in (10, lk, lk))
    pad = torch.zeros(2, lk, dtype=torch.bool)
    pad[1, lk // 2:] = True
    ref, _ = sdpa(q, k, v, key_padding_mask=pad)
    assert kernels._short_half_on_cpu(q.bfloat16(), lk) == (native and lk < kernels.SHORT_HALF_KEYS_CPU)
    assert not kernels._short_half_on_cpu(q, lk)  # float32 keeps the kernel
    qb, kb, vb = (t.bfloat16().requires_grad_() for t in (q, k, v))
    out, _ = sdpa(qb, kb, vb, key_padding_mask=pad)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
    out.float().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad.float()).all() for t in (qb, kb, vb))


# ---------------------------------------------------------------------------- ranks and sizes


def test_functional_rank_and_size_errors():
    q = torch.randn(2, 4, 5, 8)
    with pytest.raises(ValueError, match=r"q must be \(B, Lq, D\) or \(B, H, Lq, D\); got shape \(5, 8\)"):
        sdpa(torch.randn(5, 8), torch.randn(5, 8), torch.randn(5, 8))
    with pytest.raises(ValueError, match=r"k must have the rank of q \(4\); got shape \(2, 7, 8\)"):
        sdpa(q, torch.randn(2, 7, 8), torch.randn(2, 7, 8))
    with pytest.raises(ValueError, match=r"k must share the batch/head sizes \(2, 4\) of q; got shape \(3, 4, 7, 8\)"):
        sdpa(q, torch.randn(3, 4, 7, 8), torch.randn(3, 4, 7, 8))
    with pytest.raises(ValueError, match=r"k must have q's feature size 8; got shape \(2, 4, 7, 6\)"):
        sdpa(q, torch.randn(2, 4, 7, 6), torch.randn(2, 4, 7, 8))
    with pytest.raises(ValueError, match=r"v must have k's length 7; got shape \(2, 4, 6, 8\)"):
        sdpa(q, torch.randn(2, 4, 7, 8), torch.randn(2, 4, 6, 8))
    with pytest.raises(ValueError, match=r"attn_mask must have shape .* broadcastable to \(2, 4, 5, 7\); got \(3, 1, 5, 7\)"):
        sdpa(q, torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8), attn_mask=torch.zeros(3, 1, 5, 7))
