"""Native sparse attention (the ``nsa`` kind): each branch against a by-hand reference, the
exact attention it becomes when it keeps every block, causality, the cache, training, refusals."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.attention import (GroupedQueryAttention, NativeSparseAttention, build_attention, capture_attention,
                               list_attention, attention_entry)
from attnlab.errors import InputError
from attnlab.models.gpt import GPT

OPTIONS = dict(num_kv_heads=2, block=4, num_selected=2, branch_window=6, rope=True, bias=False)


def _module(**overrides):
    torch.manual_seed(0)
    attn = NativeSparseAttention(32, 4, **{**OPTIONS, **overrides}).eval()
    with torch.no_grad():  # gates, positions and compression away from their starting values
        attn.gate.normal_(0, 0.5)
        attn.gate_bias.normal_(0, 0.5)
        attn.block_pos.normal_(0, 0.5)
        attn.compress_k.weight.add_(torch.randn_like(attn.compress_k.weight) * 0.1)
        attn.compress_v.weight.add_(torch.randn_like(attn.compress_v.weight) * 0.1)
    return attn


def _by_hand(attn, x):
    """NSA written out query by query, head by head: the heads' queries, keys and values from the
    module's projections and rotary positions, then the three branches and the gates."""
    batch, n, _ = x.shape
    h, hkv, d, b = attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.block
    group = h // hkv
    q = attn.q_proj(x).view(batch, n, h, d).transpose(1, 2)
    k = attn.k_proj(x).view(batch, n, hkv, d).transpose(1, 2)
    v = attn.v_proj(x).view(batch, n, hkv, d).transpose(1, 2)
    q, k = attn.rotary(q, k, torch.arange(n))
    scale = d ** -0.5
    out = torch.zeros(batch, h, n, d)
    for i in range(batch):
        for head in range(h):
            kv = head // group
            keys, values = k[i, kv], v[i, kv]
            nb = n // b
            ck = torch.stack([attn.compress_k((keys[m * b:(m + 1) * b] + attn.block_pos).flatten()) for m in range(nb)])
            cv = torch.stack([attn.compress_v((values[m * b:(m + 1) * b] + attn.block_pos).flatten()) for m in range(nb)])
            for t in range(n):
                query = q[i, head, t]
                seen = [m for m in range(nb) if (m + 1) * b - 1 <= t]
                o_cmp = torch.zeros(d)
                if seen:
                    w = torch.softmax(ck[seen] @ query * scale, -1)
                    o_cmp = w @ cv[seen]
                # the group's scores of the seen blocks: the compressed attention of every head of the group summed
                score = torch.zeros(len(seen))
                for other in range(kv * group, (kv + 1) * group):
                    if seen:
                        score += torch.softmax(ck[seen] @ q[i, other, t] * scale, -1)
                best = [seen[j] for j in score.topk(min(attn.num_selected, len(seen))).indices.tolist()] if seen else []
                blocks = set(best) | {t // b}
                picked = [j for j in range(t + 1) if j // b in blocks]
                o_slc = torch.softmax(keys[picked] @ query * scale, -1) @ values[picked]
                recent = list(range(max(0, t - attn.branch_window + 1), t + 1))
                o_win = torch.softmax(keys[recent] @ query * scale, -1) @ values[recent]
                g = torch.sigmoid(query @ attn.gate[head] + attn.gate_bias[head])
                out[i, head, t] = g[0] * o_cmp + g[1] * o_slc + g[2] * o_win
    return attn.o_proj(out.transpose(1, 2).reshape(batch, n, h * d))


@torch.no_grad()
def test_nsa_equals_the_three_branches_written_out_by_hand():
    attn = _module()
    x = torch.randn(2, 23, 32)  # 5 complete blocks of 4 and a partial one; 2 selected of up to 5
    ours, weights = attn(x, is_causal=True)
    assert weights is None
    torch.testing.assert_close(ours, _by_hand(attn, x), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_selection_matters():
    attn = _module()
    x = torch.randn(1, 31, 32)
    every = NativeSparseAttention(32, 4, **{**OPTIONS, "num_selected": 8}).eval()
    every.load_state_dict(attn.state_dict())
    assert (attn(x, is_causal=True)[0] - every(x, is_causal=True)[0]).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("branch, exact_window", [("selected", None), ("window", 6)])
def test_keeping_every_block_or_only_the_window_is_exact_attention(branch, exact_window):
    """Gates at (0, 1, 0) with every block selectable: exact causal attention; at (0, 0, 1):
    the exact kind's sliding window."""
    attn = _module(num_selected=64)
    with torch.no_grad():
        attn.gate.zero_()
        attn.gate_bias.copy_(torch.tensor([-50.0, 50.0, -50.0] if branch == "selected" else [-50.0, -50.0, 50.0]))
    exact = GroupedQueryAttention(32, 4, num_kv_heads=2, rope=True, bias=False, sliding_window=exact_window).eval()
    exact.load_state_dict({k: v for k, v in attn.state_dict().items() if k.split(".")[0] in
                           ("q_proj", "k_proj", "v_proj", "o_proj")})
    x = torch.randn(2, 29, 32)
    torch.testing.assert_close(attn(x, is_causal=True)[0], exact(x, is_causal=True)[0], atol=1e-6, rtol=1e-5)


@torch.no_grad()
def test_nsa_is_causal():
    attn = _module()
    x = torch.randn(1, 26, 32)
    later = x.clone()
    later[:, 13:] = torch.randn(1, 13, 32)
    torch.testing.assert_close(attn(x, is_causal=True)[0][:, :13], attn(later, is_causal=True)[0][:, :13],
                               atol=1e-6, rtol=0)


def _decoder():
    torch.manual_seed(0)
    model = GPT(vocab_size=40, max_len=96, embed_dim=32, depth=2, num_heads=4, num_kv_heads=2, pos_embed="rope",
                norm="rmsnorm", mlp="swiglu", attention="nsa",
                attention_options={"block": 4, "num_selected": 2, "branch_window": 6})
    with torch.no_grad():
        for block in model.blocks:
            block.attn.gate.normal_(0, 0.5)
    assert model.blocks[0].attn.branch_window == 6
    return model


@torch.no_grad()
def test_cached_decoding_equals_recomputation():
    model = _decoder().eval()
    ids = torch.randint(0, 40, (2, 7))
    out = model.generate(ids, 30)  # 37 positions: blocks complete and selections change while decoding
    assert torch.equal(out, model.generate(ids, 30, use_cache=False))
    cache = model.new_cache(2, 40)
    logits = model(ids, cache=cache)[:, -1]
    step = model.decode_step(logits.argmax(-1)[:, None], cache)
    full = model(torch.cat([ids, logits.argmax(-1)[:, None]], 1))[:, -1]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)
    assert model.blocks[0].attn.cache_bytes(1, 10, torch.float32) == 2 * 2 * 8 * 10 * 4


@torch.no_grad()
def test_a_row_padded_on_the_left_is_computed_as_alone():
    """Blocks count from a row's first real position: a left-padded batch gives each row's logits
    alone (rotary positions from the padding, as the decoder gives them), and generation from
    prompts of different lengths gives each prompt's own tokens, past several blocks."""
    model = _decoder().eval()
    a, b = torch.randint(0, 40, (1, 13)), torch.randint(0, 40, (1, 7))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 6, dtype=torch.long), b], 1)])
    pad = torch.zeros(2, 13, dtype=torch.bool)
    pad[1, :6] = True
    positions = torch.stack([torch.arange(13), (torch.arange(13) - 6).clamp(min=0)])
    logits = model(batch, padding_mask=pad, positions=positions)
    torch.testing.assert_close(logits[0], model(a)[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1, 6:], model(b)[0], atol=1e-5, rtol=1e-5)
    out = model.generate(batch, 20, padding_mask=pad)
    assert torch.equal(out[0, 13:], model.generate(a, 20)[0, 13:])
    assert torch.equal(out[1, 13:], model.generate(b, 20)[0, 7:])


def test_a_decoder_with_nsa_trains_every_part_of_it():
    model = _decoder().train()
    ids = torch.randint(0, 40, (2, 33))
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    attn = model.blocks[1].attn
    for name in ("gate", "gate_bias", "block_pos", "compress_k.weight", "compress_v.weight", "q_proj.weight"):
        grad = attn.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
    assert math.isfinite(loss.item())


@pytest.mark.parametrize("options, message", [
    ({"block": 0}, "block must be an integer >= 1"),
    ({"num_selected": -1}, "num_selected must be an integer >= 1"),
    ({"branch_window": 0}, "branch_window must be an integer >= 1"),
])
def test_nsa_refuses_sizes_that_are_not_positive(options, message):
    with pytest.raises(InputError, match=message):
        build_attention("nsa", 32, 4, **options)


def test_nsa_refuses_what_it_cannot_do_in_one_line():
    attn = _module()
    x = torch.randn(2, 9, 32)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, -2:] = True
    cases = [(lambda: attn(x), "causal only"),
             (lambda: attn(x, is_causal=True, key_padding_mask=pad), "padding on the left of a row only"),
             (lambda: attn(x, is_causal=True, need_weights=True), "forms no weight matrix"),
             (lambda: attn.new_cache(1, 10, cache_window=4), "streaming cache"),
             (lambda: attn(x, is_causal=True, attn_mask=torch.zeros(9, 9, dtype=torch.bool)), "takes no attn_mask")]
    for call, message in cases:
        with pytest.raises(InputError, match=message) as caught:
            call()
        assert len(str(caught.value).splitlines()) == 1
    with pytest.raises(InputError):
        with capture_attention(_decoder()) as _:
            pass


def test_the_registry_says_which_kinds_are_causal_only_and_they_refuse_both_ways():
    causal_only = sorted(k for k in list_attention() if attention_entry(k).capabilities.causal_only)
    assert causal_only == ["gated_delta", "nsa"]
    for kind in causal_only:
        with pytest.raises(InputError, match="causal only"):
            build_attention(kind, 32, 4)(torch.randn(1, 8, 32))
