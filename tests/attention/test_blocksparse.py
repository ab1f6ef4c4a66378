"""Native sparse attention and DeepSeek's sparse attention in their blocked forms, against the
dense implementations they replaced (``tests/sparse_reference.py`` for nsa; dsa's own path that
forms the weights, taken when they are asked for): outputs and every gradient to 1e-5 (a
gradient's relative to its largest entry), the
indexer's loss too; the two kernels under them against gradcheck (dropout included); and, in a
child process under a memory limit that one n x n float matrix would pass, a forward and a
backward at a length where the dense forms fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from attnlab.attention import IndexedSparseAttention, NativeSparseAttention, build_attention
from attnlab.attention.blocksparse import picked_key_attention, selected_block_attention, window_attention
from attnlab.errors import InputError

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, where sparse_reference.py lies
from sparse_reference import nsa_dense  # noqa: E402


def _nsa(hkv, **options):
    torch.manual_seed(0)
    attn = NativeSparseAttention(32, 4, num_kv_heads=hkv, rope=True, bias=False,
                                 **{"block": 4, "num_selected": 2, "branch_window": 6, **options})
    with torch.no_grad():  # gates, positions and compression away from their starting values
        attn.gate.normal_(0, 0.5)
        attn.gate_bias.normal_(0, 0.5)
        attn.block_pos.normal_(0, 0.5)
        attn.compress_k.weight.add_(torch.randn_like(attn.compress_k.weight) * 0.1)
    return attn


def _grads(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True)


def _assert_all_close(ours, theirs, tol):
    """Each gradient within ``tol`` of the reference's, relative to its largest entry (at least 1):
    a gradient summed over 300 positions reaches 85, and float32 rounds it at 5e-5."""
    for a, b in zip(ours, theirs):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("hkv, keys, queries, padded, options", [
    (2, 23, 23, False, {}),  # grouped heads, a partial last block, queries past the gathered form's 16
    (4, 40, 40, True, {}),  # a row padded on the left
    (2, 40, 3, False, {}),  # three queries after a cache of 37 (the gathered form)
    (1, 40, 1, True, {}),  # one step of decoding, padded
    (2, 301, 120, True, {"block": 8, "num_selected": 4, "branch_window": 20}),  # a prompt after a cache
    (2, 300, 300, False, {"block": 16, "num_selected": 30, "branch_window": 64}),  # every block selectable
])
def test_nsa_blocked_equals_the_dense_form_with_every_gradient(hkv, keys, queries, padded, options):
    attn = _nsa(hkv, **options)
    batch, d = 2, 8
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(batch, 4, queries, d, generator=gen, requires_grad=True)
    k = torch.randn(batch, hkv, keys, d, generator=gen, requires_grad=True)
    v = torch.randn(batch, hkv, keys, d, generator=gen, requires_grad=True)
    pad = None
    if padded:
        pad = torch.zeros(batch, keys, dtype=torch.bool)
        pad[1, :5] = True
    group = 4 // hkv
    inputs = [q, k, v, *attn.parameters()]
    ours = attn._branches(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), pad)
    theirs = nsa_dense(attn, q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), pad)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    weight = torch.randn(ours.shape, generator=gen)
    _assert_all_close(_grads((ours * weight).sum(), inputs), _grads((theirs * weight).sum(), inputs), 1e-5)


def test_nsa_in_a_decoder_equals_the_dense_form_in_training():
    """A whole decoder's loss and gradients with the blocked nsa equal those with the dense one."""
    from attnlab.models.gpt import GPT

    torch.manual_seed(0)
    model = GPT(vocab_size=40, max_len=96, embed_dim=32, depth=2, num_heads=4, num_kv_heads=2, pos_embed="rope",
                norm="rmsnorm", mlp="swiglu", attention="nsa",
                attention_options={"block": 4, "num_selected": 2, "branch_window": 6}).train()
    ids = torch.randint(0, 40, (2, 41))

    def loss():
        logits = model(ids[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

    ours = loss()
    grads = _grads(ours, list(model.parameters()))
    for block in model.blocks:
        block.attn._branches = nsa_dense.__get__(block.attn)
    theirs = loss()
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    _assert_all_close(grads, _grads(theirs, list(model.parameters())), 1e-5)


def _dsa(**options):
    torch.manual_seed(0)
    return IndexedSparseAttention(32, 4, kv_rank=16, q_rank=24, index_heads=3, **options).train()


@pytest.mark.parametrize("options, length, causal, padded", [
    ({"index_topk": 5}, 23, True, False),
    ({"index_topk": 5, "rope": True, "rope_dim": 4}, 23, True, True),
    ({"index_topk": 7, "rope": True, "rope_dim": 4, "rope_heads": 2}, 40, True, False),  # a rotary key per group
    ({"index_topk": 7, "rope": True, "rope_dim": 4}, 40, False, True),  # both ways
    ({"index_topk": 64, "rope": True, "rope_dim": 4}, 40, True, False),  # more picks than keys
    ({"index_topk": 20, "rope": True, "rope_dim": 4, "v_head_dim": 6}, 300, True, True),
    ({"index_topk": 4}, 300, True, True),  # rows of 96 keys or more: the top-k narrowed by groups first
])
def test_dsa_blocked_equals_the_form_with_weights_with_every_gradient_and_the_indexers_loss(options, length, causal,
                                                                                           padded):
    attn = _dsa(**options)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, length, 32, generator=gen, requires_grad=True)
    pad = None
    if padded:
        pad = torch.zeros(2, length, dtype=torch.bool)
        pad[1, :5] = True
    inputs = [x, *attn.parameters()]
    results = []
    for need_weights in (False, True):
        out, weights = attn(x, is_causal=causal, key_padding_mask=pad, need_weights=need_weights)
        assert (weights is None) != need_weights
        aux = attn.take_aux_loss()
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        results.append((out, aux, _grads((out * weight).sum() + aux, inputs)))
    (ours, aux, grads), (theirs, their_aux, their_grads) = results
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aux, their_aux, atol=1e-5, rtol=1e-5)
    _assert_all_close(grads, their_grads, 1e-5)


def test_dsa_scores_no_key_for_queries_that_pick_every_key_they_see(monkeypatch):
    attn = _dsa(index_topk=16).eval()
    x = torch.randn(2, 40, 32)
    pad = torch.zeros(2, 40, dtype=torch.bool)
    pad[1, :3] = True
    scored = []
    original = attn._index_of
    monkeypatch.setattr(attn, "_index_of", lambda q, *a: scored.append(q.shape[2]) or original(q, *a))
    out, _ = attn(x[:, :16], is_causal=True, key_padding_mask=pad[:, :16])
    assert scored == []  # 16 keys at most, 16 picks
    theirs, _ = attn(x[:, :16], is_causal=True, key_padding_mask=pad[:, :16], need_weights=True)
    torch.testing.assert_close(out, theirs, atol=1e-5, rtol=1e-5)
    scored.clear()
    attn(x, is_causal=True)
    assert sum(scored) == 40  # one chunk of every query, which some see more than 16 keys


def test_dsa_blocked_prompt_after_a_cache_equals_the_whole_prompt():
    """A prompt given in two parts through the cache (the second part's queries after 30 cached
    keys) gives the outputs of the whole prompt at once. 16 index heads: a key scores exactly 0 with
    probability 2^-16; where equal scores straddle the k-th place, each call breaks them over its
    own keys, as DeepSeek's reference and transformers do (the parity tests)."""
    torch.manual_seed(0)
    attn = IndexedSparseAttention(32, 4, kv_rank=16, q_rank=24, index_heads=16, index_topk=6, rope=True,
                                  rope_dim=4).eval()
    x = torch.randn(2, 50, 32)
    with torch.no_grad():
        whole, _ = attn(x, is_causal=True)
        cache = attn.new_cache(2, 50)
        first, _ = attn(x[:, :30], is_causal=True, cache=cache)
        second, _ = attn(x[:, 30:], is_causal=True, cache=cache)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, atol=1e-5, rtol=1e-5)


def _seeded(fn):
    """``fn`` drawing the same dropout on every call (gradcheck calls it many times)."""
    def call(*args):
        torch.manual_seed(7)
        return fn(*args)
    return call


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_block_kernel_passes_gradcheck(dropout):
    gen = torch.Generator().manual_seed(4)
    z, n, g, d, block = 2, 20, 2, 3, 3  # more queries than the gathered form takes
    q = torch.randn(z, n, g, d, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(z, 19, d, dtype=torch.float64, generator=gen, requires_grad=True)  # a partial last block
    v = torch.randn(z, 19, d + 1, dtype=torch.float64, generator=gen, requires_grad=True)
    t = (torch.arange(n) - 2).expand(z, n).contiguous()  # two padded queries first
    own = (t // block).clamp(min=0)
    sel = torch.randint(0, 6, (z, n, 3), generator=gen)
    sel = sel.masked_fill((sel + 1) * block - 1 > t[..., None], -1).masked_fill(sel == own[..., None], -1)
    sel[:, :, 1] = sel[:, :, 1].masked_fill(sel[:, :, 1] == sel[:, :, 0], -1)
    sel[:, :, 2] = sel[:, :, 2].masked_fill((sel[:, :, 2] == sel[:, :, 0]) | (sel[:, :, 2] == sel[:, :, 1]), -1)
    fn = _seeded(lambda q, k, v: selected_block_attention(q, k, v, t, sel, block=block, scale=0.4, dropout_p=dropout))
    assert torch.autograd.gradcheck(fn, (q, k, v))
    out = fn(q, k, v)
    assert out[:, :2].abs().max() == 0  # the padded queries see nothing
    if not dropout:  # the few-queries form (one gather) gives the same
        few = selected_block_attention(q[:, -5:], k, v, t[:, -5:], sel[:, -5:], block=block, scale=0.4)
        torch.testing.assert_close(few, out[:, -5:])


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_picked_key_kernel_passes_gradcheck(dropout):
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 9, 3, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    kv = torch.randn(2, 11, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    idx = torch.stack([torch.stack([torch.randperm(11, generator=gen)[:4] for _ in range(9)]) for _ in range(2)])
    valid = torch.rand(2, 9, 4, generator=gen) > 0.3
    valid[0, 0] = False  # a query that sees nothing: zeros
    fn = _seeded(lambda q, kv: picked_key_attention(q, kv, idx, valid, width=4, dropout_p=dropout)[0])
    assert torch.autograd.gradcheck(fn, (q, kv))
    assert fn(q, kv)[0, 0].abs().max() == 0


CHILD = textwrap.dedent("""
    import json, resource, sys, torch
    from attnlab.attention import build_attention
    sys.path.insert(0, {tests!r})
    from sparse_reference import nsa_dense
    kind, form, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(0)
    options = dict(nsa=dict(block=64, num_selected=4, branch_window=64), exact=dict(sliding_window=64),
                   dsa=dict(kv_rank=16, q_rank=16, index_heads=2, index_topk=64))[kind]
    attn = build_attention(kind, 16, 1, **options).train()
    if form == "dense" and kind == "nsa":
        attn._branches = nsa_dense.__get__(attn)
    x = torch.randn(1, n, 16, requires_grad=True)
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
    limit = size + {headroom}
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        out, _ = attn(x, is_causal=True, need_weights=form == "dense" and kind != "nsa")
        out.sum().backward()
        print(json.dumps({{"ok": bool(torch.isfinite(x.grad).all())}}))
    except (MemoryError, RuntimeError) as error:
        print(json.dumps({{"ok": False, "error": str(error)[:100]}}))
""")

# One head at 16,384 positions: one n x n float32 matrix is 1 GiB; the child may add 768 MiB.
LONG, HEADROOM = 16384, 768 << 20


@pytest.mark.parametrize("kind", ["nsa", "dsa", "exact"])  # exact: with a sliding window
def test_no_n_by_n_tensor_forward_or_backward_under_a_memory_limit(kind, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), headroom=HEADROOM))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(form):
        proc = subprocess.run([sys.executable, str(script), kind, form, str(LONG)], capture_output=True, text=True,
                              timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert run("blocked") == {"ok": True}
    assert run("dense")["ok"] is False  # the limit bites: the dense form needs n x n


@pytest.mark.parametrize("hkv, n, window, causal, padded", [
    (4, 50, 1, True, False),  # each query itself alone
    (2, 97, 5, True, True),  # grouped heads, a partial last chunk, rows padded on the left
    (1, 300, 64, True, False),  # multi-query, the window of a chunk
    (2, 300, 100, False, False),  # both ways, a window wider than a chunk
    (4, 130, 129, True, True),  # a window one short of the length
    (2, 150, 7, False, True),  # both ways, padded: the first queries see no real key
])
def test_the_exact_kinds_sliding_window_as_a_band_equals_its_dense_mask_with_every_gradient(hkv, n, window, causal,
                                                                                           padded, monkeypatch):
    import attnlab.attention.exact as grouped

    calls = []
    monkeypatch.setattr(grouped, "window_attention", lambda *a, **k: calls.append(1) or window_attention(*a, **k))
    torch.manual_seed(0)
    attn = build_attention("exact", 32, 4, num_kv_heads=hkv, rope=True, qk_norm=True, sliding_window=window).train()
    x = torch.randn(2, n, 32, requires_grad=True)
    pad = torch.zeros(2, n, dtype=torch.bool)
    if padded:
        pad[0, : 3 * window] = True
    mask = pad if padded else None
    tensors = [x, *attn.parameters()]
    out, _ = attn(x, is_causal=causal, key_padding_mask=mask)
    assert calls == [1]  # the band
    ref, weights = attn(x, is_causal=causal, key_padding_mask=mask, need_weights=True)  # the dense mask's path
    assert calls == [1] and weights.shape == (2, n, n)
    assert (weights.tril(-window) == 0).all() and (weights.triu(1 if causal else window) == 0).all()
    assert (weights[0][:, pad[0]] == 0).all()
    assert (out - ref).abs().max().item() <= 1e-5
    g = torch.randn_like(out)
    _assert_all_close(_grads((out * g).sum(), tensors), _grads((ref * g).sum(), tensors), 1e-5)


@pytest.mark.parametrize("layer_window, cache_window, padded", [
    (8, None, False),  # a sliding-window layer's own cache
    (8, None, True),  # rows padded on the left
    (None, 8, False),  # full attention read through a window at generation (StreamingLLM without sinks)
])
def test_a_prompt_in_parts_after_a_cache_takes_the_band_and_equals_the_whole_prompt(layer_window, cache_window,
                                                                                      padded, monkeypatch):
    import attnlab.attention.exact as grouped

    calls = []
    monkeypatch.setattr(grouped, "window_attention", lambda *a, **k: calls.append(k["first"]) or
                        window_attention(*a, **k))
    torch.manual_seed(0)
    attn = build_attention("exact", 32, 4, num_kv_heads=2, rope=True, sliding_window=layer_window).eval()
    x = torch.randn(2, 60, 32)
    pad = torch.zeros(2, 60, dtype=torch.bool)
    if padded:
        pad[0, :11] = True
    mask = pad if padded else None
    cache = attn.new_cache(2, 64, cache_window=cache_window)
    parts = [attn(x[:, a:b], is_causal=True, cache=cache, key_padding_mask=None if mask is None else mask[:, :b])[0]
             for a, b in ((0, 20), (20, 45), (45, 46), (46, 60))]
    assert len(calls) == 3  # each part but the single token: the band, after the cache from the second on
    assert [int(first[0, 0]) for first in calls[1:]] == [7, 7]  # the window's 8 - 1 keys kept before the part
    reference = build_attention("exact", 32, 4, num_kv_heads=2, rope=True, sliding_window=8).eval()
    reference.load_state_dict(attn.state_dict())
    whole, _ = reference(x, is_causal=True, key_padding_mask=mask, need_weights=True)  # the dense mask
    torch.testing.assert_close(torch.cat(parts, 1)[~pad], whole[~pad], atol=1e-5, rtol=1e-5)


def test_the_band_is_taken_only_where_it_is_the_same_attention():
    """A single token after a cache, additive padding, weights asked for, ALiBi, soft-capping,
    sinks, a window as long as the input, and a kind with its own step (differential) keep the
    dense mask's path; and with dropout the band trains."""
    import attnlab.attention.exact as grouped

    x = torch.randn(2, 40, 32)
    pad = torch.zeros(2, 40)
    pad[0, :3] = float("-inf")  # an additive padding mask
    cases = [dict(cache=True), dict(key_padding_mask=pad), dict(need_weights=True), dict(alibi=True),
             dict(softcap=30.0), dict(sinks=True), dict(window=40), dict(kind="differential")]
    for case in cases:
        options = {"alibi": case.get("alibi", False)} if "alibi" in case else {}
        options.update({k: case[k] for k in ("softcap", "sinks") if k in case})
        torch.manual_seed(0)
        attn = build_attention(case.get("kind", "exact"), 32, 4, sliding_window=case.get("window", 8),
                               **options).eval()
        calls = []
        original = grouped.window_attention
        grouped.window_attention = lambda *a, **k: calls.append(1) or original(*a, **k)
        try:
            kwargs = {k: case[k] for k in ("key_padding_mask", "need_weights") if k in case}
            if case.get("cache"):  # one token after 39 cached (the band is for a prompt, in one part or several)
                kwargs["cache"] = attn.new_cache(2, 64)
                attn(x[:, :39], is_causal=True, cache=kwargs["cache"])
                calls.clear()
                attn(x[:, 39:], is_causal=True, **kwargs)
            else:
                attn(x, is_causal=True, **kwargs)
        finally:
            grouped.window_attention = original
        assert calls == [], case
    torch.manual_seed(0)
    attn = build_attention("exact", 32, 4, sliding_window=8).eval()
    cached = attn(x, is_causal=True, cache=attn.new_cache(2, 64))[0]  # a prompt into an empty cache: the band
    assert (cached - attn(x, is_causal=True, need_weights=True)[0]).abs().max().item() <= 1e-5
    attn = build_attention("exact", 32, 4, sliding_window=8, dropout=0.5).train()
    a, b = attn(x, is_causal=True)[0], attn(x, is_causal=True)[0]
    assert torch.isfinite(a).all() and not torch.equal(a, b)  # dropped at random
    attn.eval()
    assert torch.equal(attn(x, is_causal=True)[0], attn(x, is_causal=True)[0])


def _picked(best):
    """The set of keys a top-k picked, those with a finite score (among masked keys the choice is moot)."""
    return [sorted(i for i, v in zip(idx.tolist(), val.tolist()) if v > float("-inf"))
            for idx, val in zip(best.indices.reshape(-1, best.indices.shape[-1]),
                                best.values.reshape(-1, best.values.shape[-1]))]


def test_the_indexers_ties_are_broken_as_torch_topk_over_the_whole_row_however_it_is_cut():
    from attnlab.attention.dsa import top_keys

    scores = torch.randn(16, 200, generator=torch.Generator().manual_seed(6)).clamp_min(0)  # half of them 0
    for cut in (150, 199):  # a row cut after the keys a causal chunk sees, or kept whole with the rest masked
        masked = scores.masked_fill(torch.arange(200) >= cut, float("-inf"))
        reference = masked.topk(120)  # DeepSeek's and transformers' rule: torch.topk over every key
        assert _picked(top_keys(scores[:, :cut], 120, width=200)) == _picked(reference)
        assert _picked(top_keys(masked, 120)) == _picked(reference)
    # without the whole row's width, a cut row breaks its ties as torch.topk over the cut row
    assert _picked(top_keys(scores[:, :150], 120)) == _picked(scores[:, :150].topk(120))


def test_the_top_k_narrowed_by_groups_picks_the_keys_of_torch_topk_over_the_whole_row():
    from attnlab.attention.dsa import top_keys

    gen = torch.Generator().manual_seed(7)
    for trial in range(200):
        width = int(torch.randint(200, 1500, (1,), generator=gen))
        k = int(torch.randint(1, width // 24 + 1, (1,), generator=gen))
        index = (torch.randn(2, 3, width, generator=gen) * 2).round().clamp_min(0)  # many equal scores
        index[torch.rand(index.shape, generator=gen) < 0.2] = float("-inf")
        if trial % 4 == 0:  # a row with fewer keys it may see than picks
            index[0, 1, : width - k // 2] = float("-inf")
        ours, whole = top_keys(index, k), index.topk(k)
        assert _picked(ours) == _picked(whole), (width, k)
        assert torch.equal(ours.values.sort(-1).values, whole.values.sort(-1).values)


def test_nsa_takes_no_kernel_choice_and_dsa_no_mask():
    with pytest.raises(InputError, match="unknown option 'kernel' of attention 'nsa'"):
        build_attention("nsa", 32, 4, kernel="flex")
    attn = _dsa(index_topk=4)
    with pytest.raises(InputError, match="dsa attention takes no attn_mask"):
        attn(torch.randn(1, 5, 32), attn_mask=torch.zeros(5, 5, dtype=torch.bool))
