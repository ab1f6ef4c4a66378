"""MultiHeadAttention equals torch.nn.MultiheadAttention, and its cache equals recomputation."""

import pytest
import torch
from torch import nn

from attnlab.attention import CrossAttention, DecodingCache, MultiHeadAttention, SelfAttention

E, H, B = 16, 4, 3


def pair(kdim=None, vdim=None, bias=True, dropout=0.0):
    ref = nn.MultiheadAttention(E, H, batch_first=True, kdim=kdim, vdim=vdim, bias=bias, dropout=dropout)
    with torch.no_grad():  # non-zero biases so that a mis-mapped bias shows
        for name, p in ref.named_parameters():
            if "bias" in name:
                p.normal_()
    return ref, MultiHeadAttention.from_torch(ref)


def grads(*ts):
    out = [t.grad.clone() for t in ts]
    for t in ts:
        t.grad = None
    return out


def assert_parity(ref, ours, query, key, value, ours_kwargs=None, **kwargs):
    """Outputs, per-head and averaged weights, and input gradients within 1e-5."""
    ours_kwargs = kwargs if ours_kwargs is None else ours_kwargs
    leaves = [t for t in {id(t): t for t in (query, key, value)}.values()]
    for average in (True, False):
        r_out, r_w = ref(query, key, value, need_weights=True, average_attn_weights=average, **kwargs)
        o_out, o_w = ours(query, key, value, need_weights=True, average_attn_weights=average, **ours_kwargs)
        torch.testing.assert_close(o_out, r_out, atol=1e-5, rtol=0)
        torch.testing.assert_close(o_w, r_w, atol=1e-5, rtol=0)
        (r_out * torch.linspace(-1, 1, r_out.numel()).view_as(r_out)).sum().backward()
        r_g = grads(*leaves)
        (o_out * torch.linspace(-1, 1, o_out.numel()).view_as(o_out)).sum().backward()
        o_g = grads(*leaves)
        for a, b in zip(o_g, r_g):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # The fused path (no weights) gives the same output.
    fast, none = ours(query, key, value, **ours_kwargs)
    assert none is None
    torch.testing.assert_close(fast, r_out.detach(), atol=1e-5, rtol=0)


def rand(*s):
    return torch.randn(*s, requires_grad=True)


def test_self_attention_parity():
    ref, ours = pair()
    x = rand(B, 7, E)
    assert_parity(ref, ours, x, x, x)


def test_cross_attention_parity():
    ref, ours = pair()
    x, mem = rand(B, 5, E), rand(B, 9, E)
    assert_parity(ref, ours, x, mem, mem)


def test_distinct_key_and_value_parity():
    ref, ours = pair()
    assert_parity(ref, ours, rand(B, 5, E), rand(B, 9, E), rand(B, 9, E))


def test_kdim_vdim_differ_from_embed_dim():
    ref, ours = pair(kdim=6, vdim=10)
    assert ours.k_proj.in_features == 6 and ours.v_proj.in_features == 10
    assert_parity(ref, ours, rand(B, 5, E), rand(B, 9, 6), rand(B, 9, 10))


def test_without_bias():
    ref, ours = pair(bias=False)
    assert all(getattr(ours, f"{n}_proj").bias is None for n in "qkvo")
    x = rand(B, 7, E)
    assert_parity(ref, ours, x, x, x)


def test_key_padding_mask_parity():
    ref, ours = pair()
    x, mem = rand(B, 5, E), rand(B, 9, E)
    pad = torch.zeros(B, 9, dtype=torch.bool)
    pad[0, 6:] = True
    pad[2, 1:] = True
    assert_parity(ref, ours, x, mem, mem, key_padding_mask=pad)


def test_causal_mask_parity():
    ref, ours = pair()
    x = rand(B, 7, E)
    causal = nn.Transformer.generate_square_subsequent_mask(7)  # float, -inf above the diagonal
    assert_parity(ref, ours, x, x, x, ours_kwargs={"is_causal": True}, attn_mask=causal)
    bool_causal = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert_parity(ref, ours, x, x, x, attn_mask=bool_causal)


def test_additive_mask_parity_2d_and_per_head_3d():
    ref, ours = pair()
    x = rand(B, 6, E)
    assert_parity(ref, ours, x, x, x, attn_mask=torch.randn(6, 6))
    assert_parity(ref, ours, x, x, x, attn_mask=torch.randn(B * H, 6, 6))


def test_padding_and_causal_together_parity():
    ref, ours = pair()
    x = rand(B, 6, E)
    pad = torch.zeros(B, 6, dtype=torch.bool)
    pad[1, 4:] = True
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert_parity(ref, ours, x, x, x, ours_kwargs={"key_padding_mask": pad, "is_causal": True},
                  key_padding_mask=pad, attn_mask=causal)


def test_attention_dropout_is_active_in_training_only():
    _, ours = pair(dropout=0.5)
    x = torch.randn(B, 7, E)
    ours.eval()
    torch.testing.assert_close(ours(x)[0], ours(x)[0])
    ours.train()
    assert not torch.allclose(ours(x)[0], ours.eval()(x)[0])


def test_from_torch_keeps_mode_and_rejects_bias_kv():
    ref = nn.MultiheadAttention(E, H, batch_first=True).eval()
    assert not MultiHeadAttention.from_torch(ref).training
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(E, H, add_bias_kv=True))


def test_named_specializations():
    mha = MultiHeadAttention(E, H)
    sa, ca = SelfAttention(E, H), CrossAttention(E, H, kdim=6, vdim=6)
    sa.load_state_dict(mha.state_dict())
    x, ctx = torch.randn(B, 5, E), torch.randn(B, 8, 6)
    torch.testing.assert_close(sa(x, is_causal=True)[0], mha(x, is_causal=True)[0])
    out, w = ca(x, ctx, need_weights=True, average_attn_weights=False)
    assert out.shape == (B, 5, E) and w.shape == (B, H, 5, 8)


@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 2, 1], [7]])
def test_self_attention_cache_equals_recomputation(chunks):
    mha = MultiHeadAttention(E, H).eval()
    x = torch.randn(B, sum(chunks), E)
    full, _ = mha(x, is_causal=True)
    cache, outs, start = DecodingCache(), [], 0
    with torch.no_grad():
        for n in chunks:
            outs.append(mha(x[:, start : start + n], is_causal=True, cache=cache)[0])
            start += n
    assert cache.seq_len == sum(chunks)
    torch.testing.assert_close(torch.cat(outs, dim=1), full.detach(), atol=1e-5, rtol=0)


def test_cache_works_while_autograd_records():
    mha = MultiHeadAttention(E, H)
    x = torch.randn(B, 4, E, requires_grad=True)
    cache = DecodingCache()
    outs = [mha(x[:, i : i + 1], is_causal=True, cache=cache)[0] for i in range(4)]
    torch.stack(outs).sum().backward()
    full_x = x.detach().clone().requires_grad_()
    mha(full_x, is_causal=True)[0].sum().backward()
    torch.testing.assert_close(x.grad, full_x.grad, atol=1e-5, rtol=0)


def test_static_cache_projects_memory_once():
    ca = CrossAttention(E, H)
    x, mem = torch.randn(B, 1, E), torch.randn(B, 9, E)
    pad = torch.zeros(B, 9, dtype=torch.bool)
    pad[0, 5:] = True
    cache = DecodingCache(static=True)
    first = ca(x, mem, key_padding_mask=pad, cache=cache)[0]
    again = ca(x, None, key_padding_mask=pad, cache=cache)[0]  # memory not needed any more
    torch.testing.assert_close(again, first)
    # A filled static cache is what is attended to: other memory is not projected again.
    torch.testing.assert_close(ca(x, torch.randn_like(mem), key_padding_mask=pad, cache=cache)[0], first)
    torch.testing.assert_close(first, ca(x, mem, key_padding_mask=pad)[0])


def test_cache_reorder_selects_rows():
    mha = MultiHeadAttention(E, H).eval()
    x = torch.randn(B, 5, E)
    cache = DecodingCache()
    with torch.no_grad():
        mha(x[:, :4], is_causal=True, cache=cache)
        cache.reorder(torch.tensor([2, 0]))
        step = mha(x[[2, 0], 4:], is_causal=True, cache=cache)[0]
        full = mha(x[[2, 0]], is_causal=True)[0][:, 4:]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=0)


def test_kv_cache_is_the_older_name_of_the_one_cache_and_says_so():
    """Code written against KVCache keeps working: the same cache, its update returning
    (keys, values) as it did, with a deprecation warning naming the new class."""
    from attnlab.attention import KVCache

    with pytest.warns(DeprecationWarning, match="KVCache is DecodingCache now"):
        cache = KVCache()
    assert isinstance(cache, DecodingCache)
    mha = MultiHeadAttention(E, H).eval()
    x = torch.randn(B, 5, E)
    with torch.no_grad():
        mha(x[:, :4], is_causal=True, cache=cache)
        step = mha(x[:, 4:], is_causal=True, cache=cache)[0]
        full = mha(x, is_causal=True)[0][:, 4:]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=0)
    k, v = cache.update(torch.zeros(B, H, 1, E // H), torch.zeros(B, H, 1, E // H))
    assert k.shape == (B, H, 6, E // H) and cache.seq_len == 6
    with pytest.warns(DeprecationWarning):
        assert KVCache(static=True).static


def test_training_through_a_cache_keeps_the_gradient_of_every_step():
    """While autograd records, the cache joins new tensors instead of writing into its buffers,
    so the backward pass of an earlier step is intact."""
    mha = MultiHeadAttention(E, H)
    x = torch.randn(B, 5, E, requires_grad=True)
    cache = DecodingCache()
    out = torch.cat([mha(x[:, :3], is_causal=True, cache=cache)[0], mha(x[:, 3:], is_causal=True, cache=cache)[0]], 1)
    out.sum().backward()
    expected = x.detach().clone().requires_grad_(True)
    mha(expected, is_causal=True)[0].sum().backward()
    torch.testing.assert_close(x.grad, expected.grad, atol=1e-5, rtol=0)
