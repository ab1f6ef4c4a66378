import pytest
import torch

import attnlab.attention.variants.sparse  # noqa: F401  (registers "sparse")
from attnlab.attention.functional import scaled_dot_product_attention
from attnlab.attention.registry import build_attention
from attnlab.attention.variants.sparse import SparseAttention

PATTERNS = ["fixed", "strided", "bigbird"]


def dense_blocked(mod, n, causal):
    """The equivalent (n, n) token mask (True = blocked) from the block layout."""
    bs = mod.block
    nb = -(-n // bs)
    layout = mod.block_layout(nb, causal)
    tokens = layout.repeat_interleave(bs, 0).repeat_interleave(bs, 1)[:n, :n]
    return ~tokens


def make_inputs(b, h, n, d, dtype, padding):
    q, k, v = (torch.randn(b, h, n, d, dtype=dtype, requires_grad=True) for _ in range(3))
    kpm = None
    if padding:
        kpm = torch.zeros(b, n, dtype=torch.bool)
        kpm[0, n - 13:] = True
        kpm[1, :5] = True
    return q, k, v, kpm


def module(pattern, **kw):
    opts = dict(pattern=pattern, block=8, stride_blocks=3, window_blocks=3, global_blocks=1, random_blocks=2, seed=7)
    opts.update(kw)
    return SparseAttention(32, 4, **opts)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_matches_dense_reference(pattern, causal, padding, dtype, tol):
    n = 70  # not a multiple of block=8
    mod = module(pattern)
    q, k, v, kpm = make_inputs(2, 3, n, 16, dtype, padding)
    out = mod.attend(q, k, v, key_padding_mask=kpm, is_causal=causal)
    mask = dense_blocked(mod, n, causal)
    ref, _ = scaled_dot_product_attention(q, k, v, attn_mask=mask, key_padding_mask=kpm, is_causal=causal)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    for a, r in zip(grads, ref_grads):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, r, atol=tol, rtol=tol)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_layout_is_sparse_and_causal_layout_lower(pattern):
    mod = module(pattern, global_blocks=1, random_blocks=1)
    full = mod.block_layout(16, False)
    causal = mod.block_layout(16, True)
    assert full.dtype == torch.bool and full.shape == (16, 16)
    assert full.diagonal().all() and causal.diagonal().all()
    assert not full.all()
    assert not causal.triu(1).any()


def test_fixed_and_strided_layouts():
    fixed = module("fixed", stride_blocks=3).block_layout(7, False)
    # block 4 (segment 1) sees segment 1 (blocks 3..5) and summary block 2 of segment 0
    assert fixed[4].nonzero().flatten().tolist() == [2, 3, 4, 5]
    assert fixed[6].nonzero().flatten().tolist() == [2, 5, 6]
    strided = module("strided", stride_blocks=3).block_layout(10, True)
    # block 7: local 5, 6, 7 and the stride column 1, 4, 7
    assert strided[7].nonzero().flatten().tolist() == [1, 4, 5, 6, 7]


def test_bigbird_global_rows_and_columns_full():
    mod = module("bigbird", global_blocks=2, window_blocks=3, random_blocks=2)
    layout = mod.block_layout(12, False)
    assert layout[:2].all() and layout[:, :2].all()
    # sparse rows: global + window + random, no more
    counts = layout[2:].sum(1)
    assert (counts <= 2 + 3 + 2).all()
    assert (counts >= 2 + 2).all()
    causal = mod.block_layout(12, True)
    assert causal[:, :2].tril().equal(torch.ones(12, 2, dtype=torch.bool).tril())


def test_bigbird_random_blocks_reproducible_from_seed():
    a = module("bigbird", seed=3, random_blocks=2)
    b = module("bigbird", seed=3, random_blocks=2)
    c = module("bigbird", seed=4, random_blocks=2)
    assert a.block_layout(40, False).equal(b.block_layout(40, False))
    assert a.block_layout(40, True).equal(b.block_layout(40, True))
    assert not a.block_layout(40, False).equal(c.block_layout(40, False))
    assert "random_u" in dict(a.named_buffers())
    # fixed per layer: repeated calls and a longer table give the same layout
    before = a.block_layout(40, False)
    a.block_layout(1000, False)  # grows the table
    assert a.block_layout(40, False).equal(before)
    big = module("bigbird", seed=3, random_blocks=2)
    assert big.block_layout(1000, False).equal(a.block_layout(1000, False))
    # random blocks are extra keys: without them the layout is smaller
    none = module("bigbird", seed=3, random_blocks=0)
    assert none.block_layout(40, False).sum() < before.sum()


def test_build_and_forward():
    mod = build_attention("sparse", 32, 4, pattern="strided", block=8)
    assert isinstance(mod, SparseAttention) and mod.kind == "sparse"
    x = torch.randn(2, 37, 32)
    kpm = torch.zeros(2, 37, dtype=torch.bool)
    kpm[1, 30:] = True
    out, w = mod(x, key_padding_mask=kpm, is_causal=True)
    assert out.shape == x.shape and w is None
    out.sum().backward()
    assert all(p.weight.grad is not None for p in (mod.q_proj, mod.k_proj, mod.v_proj, mod.o_proj))


def test_fully_padded_row_is_zero():
    mod = module("strided")
    q, k, v, _ = make_inputs(2, 2, 20, 8, torch.float64, False)
    kpm = torch.ones(2, 20, dtype=torch.bool)
    out = mod.attend(q, k, v, key_padding_mask=kpm, is_causal=False)
    assert (out == 0).all()
    out.sum().backward()
    assert (q.grad == 0).all() and torch.isfinite(k.grad).all()


def test_dropout_in_training_only():
    mod = module("bigbird", dropout=0.5)
    q, k, v, _ = make_inputs(1, 2, 40, 8, torch.float32, False)
    mod.eval()
    a = mod.attend(q, k, v, key_padding_mask=None, is_causal=False)
    b = mod.attend(q, k, v, key_padding_mask=None, is_causal=False)
    assert a.equal(b)
    mod.train()
    c = mod.attend(q, k, v, key_padding_mask=None, is_causal=False)
    assert not c.equal(a)


@pytest.mark.parametrize("bad,name", [
    (dict(pattern="dense"), "pattern"),
    (dict(block=0), "block"),
    (dict(window_blocks=0), "window_blocks"),
    (dict(global_blocks=-1), "global_blocks"),
    (dict(random_blocks=-1), "random_blocks"),
    (dict(stride_blocks=0), "stride_blocks"),
])
def test_bad_arguments(bad, name):
    with pytest.raises(ValueError, match=name):
        SparseAttention(32, 4, **bad)
    with pytest.raises(ValueError, match="dense"):
        build_attention("sparse", 32, 4, pattern="dense")


def test_gathers_a_bounded_number_of_key_blocks():
    mod = module("bigbird", global_blocks=1, window_blocks=3, random_blocks=2)
    sparse, idx, valid, diag, dense, order = mod._plan(64, False, torch.device("cpu"))
    assert idx.shape == (63, 1 + 3 + 2) and dense.tolist() == [0]
    q, k, v, _ = make_inputs(1, 1, 64 * 8, 4, torch.float32, False)
    assert mod.attend(q, k, v, key_padding_mask=None, is_causal=False).shape == q.shape
