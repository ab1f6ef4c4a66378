"""StreamingLLM's sink tokens: a streaming cache keeps the first positions beside its window
(``cache_window``, ``sink_tokens``) at its slots' rotary positions, a streaming generation's
memory stays flat past the model's length, and settings that cannot work are refused in one line."""

import pytest
import torch

from attnlab.errors import InputError
from attnlab.models.gpt import GPT


# --------------------------------------------------------------------------- StreamingLLM's sink tokens
def _streamed_by_hand(attn, x, window, sinks):
    """Each token's output when it sees the first ``sinks`` positions and the last ``window``, its
    rotary positions those of its cache slots (the sinks just before the window)."""
    b, n, e = x.shape
    h, kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(b, n, h, d).transpose(1, 2)
    k = attn.k_proj(x).view(b, n, kv, d).transpose(1, 2)
    v = attn.v_proj(x).view(b, n, kv, d).transpose(1, 2)
    out = []
    for t in range(n):
        keep = sorted(set(range(min(sinks, t + 1))) | set(range(max(0, t - window + 1), t + 1)))
        slots = torch.arange(len(keep))
        qt = attn.rotary(q[:, :, t:t + 1], q[:, :, t:t + 1], slots[-1:])[0]
        kt = attn.rotary(k[:, :, keep], k[:, :, keep], slots)[0]
        heads = torch.softmax(qt @ kt.repeat_interleave(h // kv, 1).transpose(-1, -2) / d ** 0.5, -1) \
            @ v[:, :, keep].repeat_interleave(h // kv, 1)
        out.append(attn.o_proj(heads.transpose(1, 2).reshape(b, 1, e)))
    return torch.cat(out, 1)


def test_sink_tokens_keep_the_first_positions_beside_the_window_at_cache_slots():
    from attnlab.attention import GroupedQueryAttention

    torch.manual_seed(0)
    attn = GroupedQueryAttention(32, 4, num_kv_heads=2, rope=True).eval()
    x = torch.randn(1, 30, 32)
    with torch.no_grad():
        expected = _streamed_by_hand(attn, x, window=8, sinks=2)
        cache = attn.new_cache(1, 30, cache_window=8, sink_tokens=2)  # a prompt of 5, then one token at a time
        steps = [attn(x[:, :5], is_causal=True, cache=cache)[0]]
        steps += [attn.decode_step(x[:, t], cache)[:, None] for t in range(5, 30)]
        long_prompt, _ = attn(x, is_causal=True, cache=attn.new_cache(1, 30, cache_window=8, sink_tokens=2))
        window_alone = [attn(x[:, :5], is_causal=True, cache=(c := attn.new_cache(1, 30, cache_window=8)))[0]]
        window_alone += [attn.decode_step(x[:, t], c)[:, None] for t in range(5, 30)]
    torch.testing.assert_close(torch.cat(steps, 1), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(long_prompt, expected, atol=1e-5, rtol=0)
    assert (torch.cat(window_alone, 1) - expected).abs().max() > 1e-2  # the sinks change what the window gives


def test_a_streaming_generation_keeps_flat_memory_and_equals_plain_while_everything_fits():
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, num_kv_heads=2, pos_embed="rope",
                norm="rmsnorm", mlp="swiglu").eval()
    ids = torch.randint(0, 50, (1, 6))
    assert torch.equal(model.generate(ids, 20, cache_window=100, sink_tokens=4), model.generate(ids, 20))
    sizes = []
    with torch.no_grad():
        for n in (150, 300):
            cache = model.new_cache(1, 6 + n, cache_window=16, sink_tokens=4)
            token = model(ids, cache=cache)[:, -1:].argmax(-1)
            for _ in range(n):
                token = model.decode_step(token, cache).argmax(-1, keepdim=True)
            sizes.append(cache.nbytes())
    assert sizes[0] == sizes[1]  # past the model's 64 positions, memory flat
    assert model.generate(ids, 100, cache_window=16, sink_tokens=4).shape == (1, 106)


@pytest.mark.parametrize("build,call,message", [
    ({"pos_embed": "alibi"}, {"cache_window": 8, "sink_tokens": 2}, "ALiBi layers are not supported"),
    ({}, {"sink_tokens": 2}, "cache_window must be a positive number of positions when streaming"),
    ({"layer_types": ["linear", "linear"], "pos_embed": "none"}, {"cache_window": 8, "sink_tokens": 2}, "keeps no keys"),
])
def test_streaming_settings_that_cannot_work_are_one_line(build, call, message):
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, **build).eval()
    with pytest.raises(InputError, match=message) as caught:
        model.generate(torch.randint(0, 50, (1, 4)), 4, **call)
    assert len(str(caught.value).splitlines()) == 1


def test_sink_tokens_refuse_padded_prompts():
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, pos_embed="rope").eval()
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[0, 0] = True
    with pytest.raises(InputError, match="padded rows are not supported"):
        model.generate(torch.randint(0, 50, (2, 4)), 4, cache_window=8, sink_tokens=2, padding_mask=pad)
