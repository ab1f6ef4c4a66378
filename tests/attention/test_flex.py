"""FlexAttention behind the exact kind (attnlab.attention.flex): the structure (causal, window,
documents, ALiBi, soft-cap, sinks, block-sparse, padding) given to flex_attention equals the
standard path with the dense masks, to 1e-5 in float32, on the CPU without autograd (the only
place torch 2.13 compiles it on the CPU). Each compiled case costs a few seconds (the first
about 13 s), so the sizes are tiny and the cases few."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnlab.attention import flex
from attnlab.attention.alibi import alibi_bias, alibi_slopes
from attnlab.attention.functional import combine_masks, scaled_dot_product_attention
from attnlab.attention.exact import GroupedQueryAttention, band_mask
from attnlab.attention.registry import build_attention
from attnlab.errors import InputError

B, H, HKV, L, D = 2, 4, 2, 256, 16
ATOL = 1e-5

compiled = pytest.mark.skipif(not flex.flex_runs("cpu", needs_grad=False)[0],
                              reason=f"flex_attention cannot compile here: {flex.flex_runs('cpu', False)[1]}")


def _qkv(heads_kv: int = H, lq: int = L, lk: int = L) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, lq, D, generator=g), torch.randn(B, heads_kv, lk, D, generator=g),
            torch.randn(B, heads_kv, lk, D, generator=g))


def _dense(q, k, v, *, causal=False, window=None, documents=None, slopes=None, softcap=None, sinks=None,
           block_sparse=None, key_padding_mask=None):
    """The standard path with the masks the exact module builds, its explicit (weights) form."""
    lq, lk = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    q_slots, k_slots = torch.arange(lk - lq, lk), torch.arange(lk)
    mask = None
    if causal or window is not None:
        mask = band_mask(q_slots, k_slots, causal=causal, window=window)
    if documents is not None:
        dq = documents[:, lk - lq:]
        mask = combine_masks(mask, ((dq[:, :, None] != documents[:, None, :]) | (dq[:, :, None] < 0))[:, None])
    if block_sparse is not None:
        blk = lq // block_sparse.shape[2]
        mask = combine_masks(mask, ~block_sparse.repeat_interleave(blk, 2).repeat_interleave(blk, 3))
    if slopes is not None:
        mask = combine_masks(mask, alibi_bias(slopes, q_slots, k_slots))
    return scaled_dot_product_attention(q, k, v, attn_mask=mask, key_padding_mask=key_padding_mask, softcap=softcap,
                                        sinks=sinks, need_weights=True)[0]


def _same(structure: dict, heads_kv: int = H) -> None:
    q, k, v = _qkv(heads_kv)
    with torch.no_grad():
        got = flex.flex_attention_forward(q, k, v, **structure)
    ref_args = {("slopes" if n == "alibi_slopes" else n): t for n, t in structure.items()}
    want = _dense(q, k, v, **ref_args)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@compiled
def test_causal_equals_the_dense_triangle():
    _same({"causal": True})


@compiled
def test_a_sliding_window_with_grouped_query_heads_equals_band_mask():
    _same({"causal": True, "window": 48}, heads_kv=HKV)


@compiled
def test_a_window_both_ways_equals_band_mask():
    _same({"causal": False, "window": 40})


@compiled
def test_documents_with_a_padded_tail_see_their_own_document_and_padding_gives_zeros():
    ids = torch.tensor([[0] * 100 + [1] * 100 + [-1] * 56, [3] * 130 + [4] * 126])
    q, k, v = _qkv()
    with torch.no_grad():
        got = flex.flex_attention_forward(q, k, v, causal=True, documents=ids)
    torch.testing.assert_close(got, _dense(q, k, v, causal=True, documents=ids), atol=ATOL, rtol=0)
    assert torch.equal(got[0, :, 200:], torch.zeros_like(got[0, :, 200:]))  # padding sees nothing


@compiled
def test_alibi_and_softcap_equal_the_bias_and_the_cap_of_the_standard_path():
    _same({"causal": True, "alibi_slopes": alibi_slopes(H), "softcap": 2.0})  # a cap of 2 bites on logits of ~4


@compiled
def test_sinks_with_causal_and_with_a_window_equal_the_sink_column():
    sinks = torch.tensor([-1.0, 0.0, 1.5, 3.0])
    _same({"causal": True, "sinks": sinks})
    _same({"causal": True, "window": 32, "sinks": sinks}, heads_kv=HKV)


@compiled
def test_block_sparse_selection_and_key_padding_equal_their_dense_masks():
    g = torch.Generator().manual_seed(1)
    select = torch.rand(B, H, L // 64, L // 64, generator=g) < 0.5
    select[:, :, 0, :] = False  # the first query block sees nothing: zeros
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[1, -30:] = True
    _same({"block_sparse": select, "key_padding_mask": pad})


def test_sinks_folded_in_from_the_logsumexp_equal_the_sink_column():
    """The CUDA route (torch's CPU kernel returns no logsumexp): checked through flex's eager form."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    q, k, v = _qkv(lq=128, lk=128)
    sinks = torch.tensor([-1.0, 0.0, 1.5, 3.0])
    mask = create_block_mask(lambda b, h, i, j: (j <= i) & (i >= 16), None, None, 128, 128, device="cpu")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex's notice that eager flex forms the whole score matrix
        out, lse = flex_attention(q, k, v, block_mask=mask, return_lse=True)
    got = flex.sink_from_lse(out, lse, sinks)
    blocked = torch.ones(128, 128, dtype=torch.bool).triu(1)
    blocked[:16] = True  # rows that see no key: zeros in both
    want = scaled_dot_product_attention(q, k, v, attn_mask=blocked, sinks=sinks, need_weights=True)[0]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def _pair(**options):
    torch.manual_seed(0)
    standard = build_attention("exact", 64, H, kernel="standard", **options).eval()
    flexed = build_attention("exact", 64, H, kernel="flex", **options).eval()
    flexed.load_state_dict(standard.state_dict())
    if standard.sinks is not None:
        with torch.no_grad():
            standard.sinks.copy_(torch.linspace(-1, 2, H))
            flexed.sinks.copy_(standard.sinks)
    return standard, flexed


@compiled
def test_the_exact_kind_with_kernel_flex_equals_kernel_standard(monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return flex.flex_attention_forward(*args, **kwargs)

    monkeypatch.setattr("attnlab.attention.exact.flex_attention_forward", counted)
    standard, flexed = _pair(num_kv_heads=HKV, sliding_window=40, alibi=True, softcap=5.0, sinks=True)
    x = torch.randn(B, L, 64)
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[0, -20:] = True
    with torch.no_grad():
        want = standard(x, is_causal=True, key_padding_mask=pad)[0]
        got = flexed(x, is_causal=True, key_padding_mask=pad)[0]
    assert len(calls) == 1 and calls[0]["window"] == 40 and calls[0]["key_padding_mask"] is pad
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_cpu_training_with_kernel_flex_falls_back_warns_once_and_equals_standard(monkeypatch):
    monkeypatch.setattr(flex, "_WARNED", set())
    standard, flexed = _pair(num_kv_heads=HKV, sliding_window=8, softcap=5.0, sinks=True)
    x = torch.randn(B, 32, 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = flexed(x, is_causal=True)[0]
        flexed(x, is_causal=True)
    notices = [w for w in caught if "kernel='flex' falls back" in str(w.message)]
    assert len(notices) == 1 and "backward" in str(notices[0].message)
    want = standard(x, is_causal=True)[0]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    got.square().sum().backward()
    want.square().sum().backward()
    for (name, a), b in zip(flexed.named_parameters(), standard.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=ATOL, rtol=0, msg=name)


def test_kernel_auto_stays_standard_on_the_cpu(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("flex_attention_forward called")

    monkeypatch.setattr("attnlab.attention.exact.flex_attention_forward", refuse)
    module = build_attention("exact", 64, H, sliding_window=8, alibi=True).eval()
    with torch.no_grad():
        module(torch.randn(1, 16, 64), is_causal=True)


def test_an_unknown_kernel_is_refused_in_one_line_naming_it():
    with pytest.raises(InputError, match=r"^kernel must be one of 'auto', 'flex', 'standard' \(an option of "
                                         r"attention 'exact'\); got 'flash'$"):
        build_attention("exact", 64, H, kernel="flash")
    with pytest.raises(InputError, match=r"^kernel must be one of 'auto', 'flex', 'standard'; got 'flash'"):
        GroupedQueryAttention(64, H, kernel="flash")
    with pytest.raises(InputError, match="unknown option 'kernel' of attention 'differential'"):
        build_attention("differential", 64, H, kernel="flex")


def test_bad_structure_is_refused_in_one_line_naming_the_argument():
    q, k, v = _qkv(lq=64, lk=64)
    with pytest.raises(InputError, match=r"^documents must be \(B, Lk\) = \(2, 64\) integer ids; got \(2, 63\)"):
        flex.flex_attention_forward(q, k, v, documents=torch.zeros(B, 63, dtype=torch.long))
    with pytest.raises(InputError, match=r"^block_sparse must be a torch.bool"):
        flex.flex_attention_forward(q, k, v, block_sparse=torch.ones(B, 1, 3, 3, dtype=torch.bool))
    with pytest.raises(InputError, match=r"^sinks must have shape \(H,\) = \(4,\); got \(3\)"):
        flex.flex_attention_forward(q, k, v, sinks=torch.zeros(3))
    with pytest.raises(InputError, match=r"^window must be a positive number of positions; got 0"):
        flex.flex_attention_forward(q, k, v, window=0)


def test_flex_runs_says_why_not_in_one_line():
    runs, reason = flex.flex_runs("cpu", needs_grad=True)
    assert not runs and "backward" in reason and "\n" not in reason
    assert flex.flex_runs("meta", needs_grad=False) == (
        False, "flex_attention runs on CUDA and the CPU; the tensors are on meta")
