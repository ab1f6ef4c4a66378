"""Decoder-only language models and the attention they use: rotary positions, ALiBi,
grouped-query heads, sliding windows, a preallocated cache, packing and sampling."""

import math

import pytest
import torch

from attnlab.attention import DecodingCache, RotaryEmbedding, alibi_slopes, build_attention
from attnlab.errors import InputError
from attnlab.models import create_model
from attnlab.models.gpt import document_positions

OPTIONS = [{}, {"num_kv_heads": 2, "rope": True}, {"num_kv_heads": 1}, {"alibi": True},
           {"sliding_window": 3, "rope": True, "num_kv_heads": 2}, {"qk_norm": True, "rope": True}]


def greedy_without_cache(model, ids, new):
    for _ in range(new):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def test_rotary_scores_depend_on_the_distance_alone():
    rope = RotaryEmbedding(16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    def score(m, n):
        qm, _ = rope(q, q, torch.tensor([m]))
        _, kn = rope(k, k, torch.tensor([n]))
        return float((qm * kn).sum())
    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 5), abs=1e-3)
    assert score(0, 0) == pytest.approx(float((q * k).sum()), abs=1e-6)  # position 0: no rotation


def test_alibi_slopes_are_the_papers_geometric_sequence():
    assert alibi_slopes(8).tolist() == pytest.approx([2 ** -(i + 1) for i in range(8)])
    six = alibi_slopes(6).tolist()  # 4 of the power of two below, then every other one of 8
    assert six == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_cached_steps_equal_the_whole_sequence(options):
    torch.manual_seed(0)
    attn = build_attention("gqa", 32, 4, dropout=0.0, bias=False, **options).eval()
    x = torch.randn(2, 9, 32)
    whole, _ = attn(x, is_causal=True)
    cache = DecodingCache(16, window=options.get("window"))
    steps = [attn(x[:, :4], is_causal=True, cache=cache)[0]]
    steps += [attn(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(4, 9)]
    assert torch.allclose(torch.cat(steps, dim=1), whole, atol=1e-6)


@torch.no_grad()  # as a generation runs (with autograd recording, the cache makes new tensors)
def test_the_cache_stores_the_key_value_heads_alone_and_a_window_bounds_it():
    attn = build_attention("gqa", 64, 8, dropout=0.0, bias=False, num_kv_heads=2).eval()
    cache = DecodingCache(40)
    attn(torch.randn(1, 30, 64), is_causal=True, cache=cache)
    assert cache.nbytes() == 2 * 1 * 2 * 40 * 8 * 4  # k and v, batch 1, 2 heads, 40 slots, head size 8, float32
    windowed = build_attention("gqa", 64, 8, dropout=0.0, bias=False, num_kv_heads=2, sliding_window=5).eval()
    cache = DecodingCache(10_000, window=5)
    windowed(torch.randn(1, 30, 64), is_causal=True, cache=cache)  # a prompt longer than the window
    for _ in range(200):
        windowed(torch.randn(1, 1, 64), is_causal=True, cache=cache)
    assert (cache.seq_len, cache.stored) == (230, 4)
    # its own buffers (no view of a projection kept alive), of window - 1 + slide_room positions
    assert cache.nbytes() == 2 * 1 * 2 * (4 + DecodingCache.slide_room) * 8 * 4


def test_a_sliding_window_sees_the_last_window_tokens_only():
    torch.manual_seed(0)
    attn = build_attention("gqa", 16, 2, dropout=0.0, bias=False, sliding_window=3).eval()
    x = torch.randn(1, 8, 16)
    _, weights = attn(x, is_causal=True, need_weights=True)
    visible = weights[0] > 0
    assert visible.sum(-1).tolist() == [1, 2, 3, 3, 3, 3, 3, 3]
    assert not visible[7, :5].any() and visible[7, 5:].all()


@pytest.mark.parametrize("name, options", [
    ("gpt_tiny", {}), ("gpt_tiny", {"pos_embed": "alibi"}), ("gpt_tiny", {"pos_embed": "sinusoidal"}),
    ("llama_tiny", {}), ("llama_tiny", {"sliding_window": 4}), ("llama_tiny", {"num_kv_heads": 1, "qk_norm": True}),
    ("gpt_tiny", {"attention": "linear"}),  # a kind without a cache decodes by recomputing
])
def test_cached_greedy_generation_equals_recomputing_every_step(name, options):
    torch.manual_seed(0)
    model = create_model(name, **options).eval()
    ids = torch.randint(0, 256, (2, 5))
    out = model.generate(ids, 8)
    assert out.shape == (2, 13) and torch.equal(out[:, :5], ids)
    assert torch.equal(out, greedy_without_cache(model, ids, 8))
    model.new_cache = None  # use_cache=False builds no cache (a call of this would fail)
    assert torch.equal(out, model.generate(ids, 8, use_cache=False))


@pytest.mark.parametrize("name, options", [
    ("gpt_tiny", {}), ("gpt_tiny", {"pos_embed": "sinusoidal"}), ("gpt_tiny", {"mlp": "gelu_tanh", "bias": True}),
    ("llama_tiny", {}), ("llama_tiny", {"sliding_window": 3}), ("llama_tiny", {"num_kv_heads": 1, "qk_norm": True}),
    ("llama_tiny", {"num_kv_heads": 8}),
    # the families' knobs, as a recipe sets them (model.options.*): Gemma-, Qwen3-, Phi- and SmolLM3-like blocks
    ("llama_tiny", {"head_dim": 48, "qk_norm": True, "sliding_window": 3, "window_pattern": 2, "rope_local_theta": 1e4,
                    "rope_theta": 1e6, "attn_softcap": 20.0, "logit_softcap": 15.0, "query_pre_attn_scalar": 40,
                    "post_norms": True, "embed_scale": 16.0, "mlp": "geglu"}),
    ("llama_tiny", {"layer_types": ["full", "sliding", "sliding", "full"], "sliding_window": 4, "nope_layers": [3],
                    "partial_rotary": 0.5, "attention_bias": True, "attention_out_bias": False,
                    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}}),
    ("llama_tiny", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [3.0] * 8,
                                     "original_max_position_embeddings": 8}, "partial_rotary": 0.5}),
])
@pytest.mark.parametrize("padded", [False, True])
def test_the_decoding_step_gives_the_logits_of_the_forward_pass(name, options, padded):
    # GPT.decode_step (what generate runs after the prompt) against forward with the same cache
    torch.manual_seed(0)
    model = create_model(name, **options).eval()
    ids = torch.randint(0, 256, (2, 6))
    pad = torch.tensor([[True, True] + [False] * 4, [False] * 6]) if padded else None
    positions = None if pad is None else (~pad).long().cumsum(1).sub(1).clamp(min=0)
    with torch.no_grad():
        ours, theirs = model.new_cache(2, 12), model.new_cache(2, 12)
        model(ids, padding_mask=pad, positions=positions, cache=ours)
        model(ids, padding_mask=pad, positions=positions, cache=theirs)
        for step in range(5):
            nxt = torch.randint(0, 256, (2, 1))
            if pad is not None:
                pad = torch.cat([pad, torch.zeros(2, 1, dtype=torch.bool)], 1)
                positions = positions[:, -1:] + 1
            fast = model.decode_step(nxt, ours, positions=positions, padding_mask=pad)
            slow = model(nxt, padding_mask=pad, positions=positions, cache=theirs)[:, -1]
            assert torch.allclose(fast, slow, atol=1e-5), (step, (fast - slow).abs().max())


def test_packed_documents_compute_what_each_would_alone():
    torch.manual_seed(0)
    model = create_model("llama_tiny", depth=2).eval()
    a, b = torch.randint(0, 256, (1, 5)), torch.randint(0, 256, (1, 7))
    packed = model(torch.cat([a, b], 1), doc_ids=torch.tensor([[0] * 5 + [1] * 7]))
    assert torch.allclose(packed, torch.cat([model(a), model(b)], 1), atol=1e-5)
    assert document_positions(torch.tensor([[3, 3, 4, 4, 4, 9]])).tolist() == [[0, 1, 0, 1, 2, 0]]


def test_left_padded_prompts_generate_what_they_would_alone():
    torch.manual_seed(0)
    model = create_model("llama_tiny", depth=2).eval()
    short, long = torch.randint(0, 256, (1, 3)), torch.randint(0, 256, (1, 6))
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])
    pad = torch.tensor([[True] * 3 + [False] * 3, [False] * 6])
    out = model.generate(batch, 6, padding_mask=pad)
    assert torch.equal(out[0, 3:], model.generate(short, 6)[0])
    assert torch.equal(out[1], model.generate(long, 6)[0])


def test_sampling_is_reproducible_with_a_seed_and_top_k_1_is_greedy():
    torch.manual_seed(0)
    model = create_model("gpt_tiny", depth=1).eval()
    ids = torch.randint(0, 256, (3, 4))
    a = model.generate(ids, 12, temperature=1.0, top_k=50, top_p=0.9, seed=7)
    assert torch.equal(a, model.generate(ids, 12, temperature=1.0, top_k=50, top_p=0.9, seed=7))
    assert not torch.equal(a, model.generate(ids, 12, temperature=1.0, top_k=50, top_p=0.9, seed=8))
    assert torch.equal(model.generate(ids, 6, temperature=0.7, top_k=1, seed=1), model.generate(ids, 6))


def test_top_p_keeps_the_smallest_set_that_reaches_p():
    from attnlab.generation.sampling import choose_next

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    picks = {int(choose_next(logits, temperature=1.0, top_p=0.7, generator=torch.Generator().manual_seed(s)))
             for s in range(200)}
    assert picks == {0, 1}  # 0.5 + 0.3 reaches 0.7; 0.15 and 0.05 are never drawn


@pytest.mark.parametrize("options, message", [
    ({"num_kv_heads": 3}, "num_kv_heads must be a positive divisor of num_heads=4"),
    ({"rope": True, "alibi": True}, "choose one"),
    ({"sliding_window": 0}, "sliding_window must be an integer >= 1, or None"),
])
def test_attention_options_that_cannot_work_are_one_clear_error(options, message):
    with pytest.raises(InputError, match=message):
        build_attention("gqa", 32, 4, dropout=0.0, bias=True, **options)


def test_model_options_that_cannot_work_are_one_clear_error():
    with pytest.raises(InputError, match="pos_embed must be one of"):
        create_model("gpt_tiny", pos_embed="rotary")
    with pytest.raises(InputError, match="num_kv_heads is not an option of attention 'linear'; kinds that take it: "
                                         "differential, exact, nsa, sinks"):
        create_model("gpt_tiny", attention="linear", num_kv_heads=2)
    with pytest.raises(InputError, match="max_len=256"):
        create_model("gpt_tiny").generate(torch.zeros(1, 250, dtype=torch.long), 10)


def test_the_sliding_window_has_one_name_for_the_gqa_and_the_local_kinds():
    """GPT's window reaches the local kind (whose window means the same: a query sees itself
    and the window - 1 keys before it), as attention_options could not set it."""
    torch.manual_seed(0)
    for kind in ("gqa", "local"):
        model = create_model("gpt_tiny", vocab_size=50, depth=2, attention=kind, sliding_window=3).eval()
        assert model.blocks[0].attn.sliding_window == 3
        ids = torch.randint(0, 50, (1, 12))
        changed = ids.clone()
        changed[0, 0] = (ids[0, 0] + 1) % 50
        with torch.no_grad():
            a, b = model(ids), model(changed)
        # two layers of windows of 3 reach 4 positions back: positions 5.. never see position 0
        assert torch.equal(a[0, 5:], b[0, 5:]) and not torch.allclose(a[0, :5], b[0, :5])
    with pytest.raises(InputError, match="the model sets it from sliding_window"):
        create_model("gpt_tiny", attention="local", attention_options={"sliding_window": 3})
    with pytest.raises(InputError, match="sliding_window is not an option of attention 'linear'; kinds that take it: "
                                         "differential, exact, local, sinks"):
        create_model("gpt_tiny", attention="linear", sliding_window=3)


def test_every_token_model_can_use_grouped_query_attention_with_rope():
    model = create_model("sentiment_transformer_tiny", vocab_size=100, num_classes=2, attention="gqa",
                         pos_embed="rope", attention_options={"num_kv_heads": 1}).eval()
    ids = torch.randint(0, 100, (2, 10))
    with torch.no_grad():
        logits = model(ids, torch.ones(2, 10, dtype=torch.long))
    assert logits.shape == (2, 2) and math.isfinite(float(logits.sum()))


@pytest.mark.slow  # torch.compile spends about half a minute compiling the step: opt-in with -m slow
def test_a_compiled_decoding_step_generates_the_same_tokens():
    torch.manual_seed(0)
    model = create_model("llama_tiny", depth=2).eval()
    ids = torch.randint(0, 256, (2, 5))
    assert torch.equal(model.generate(ids, 12, compile=True), model.generate(ids, 12))


def test_the_families_knobs_reach_each_layer():
    model = create_model("llama_tiny", head_dim=48, sliding_window=3, window_pattern=2, rope_local_theta=1e4, rope_theta=1e6,
                         nope_layers=[3], attention_bias=True, attention_out_bias=False, mlp_bias=True,
                         post_norms=True, mlp="geglu")
    attn = [b.attn for b in model.blocks]
    assert [a.sliding_window for a in attn] == [3, None, 3, None]  # every second layer full
    assert [a.rotary.theta if a.rotary else None for a in attn] == [1e4, 1e6, 1e4, None]
    assert attn[0].q_proj.weight.shape == (8 * 48, 256) and attn[0].q_proj.bias is not None
    assert attn[0].o_proj.bias is None and model.blocks[0].mlp.up_proj.bias is not None
    assert model.blocks[0].post_attn_norm is not None and model.blocks[0].mlp.act == "gelu_tanh"
    loss = model(torch.randint(0, 256, (2, 9))).logsumexp(-1).mean()
    loss.backward()  # trains: every knob has a gradient path
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("options, message", [
    ({"layer_types": ["full", "sliding"]}, "layer_types must name one type per layer, 4; got 2"),
    ({"layer_types": ["full", "local", "full", "full"]}, "layer_types must be a list of 'full' or 'sliding'"),
    ({"layer_types": ["full", "sliding", "full", "full"]}, "sliding layers, which need sliding_window"),
    ({"sliding_window": 4, "window_pattern": 0}, "window_pattern must be a positive integer"),
    ({"nope_layers": [4]}, r"nope_layers must be a list of layer indices in \[0, 4\)"),
    ({"rope_local_theta": 1e4}, "rope_local_theta is the rotary base of sliding layers"),
    ({"attn_softcap": -1.0}, "attn_softcap must be a positive number; got -1.0"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 0}}, r"rope_scaling.factor must be"),
    ({"rope_scaling": {"rope_type": "ntk"}}, r"rope_scaling.rope_type"),
    ({"partial_rotary": 0.3}, "partial_rotary"),
    ({"embed_dim": 250}, "embed_dim must be divisible by num_heads unless head_dim is given"),
])
def test_a_knob_set_wrong_is_one_line_naming_it(options, message):
    with pytest.raises(InputError, match=message) as caught:
        create_model("llama_tiny", **options)
    assert len(str(caught.value).splitlines()) == 1


def test_weights_joined_for_evaluation_follow_a_fused_optimizer_step():
    """torch's fused AdamW writes the weights without moving their version counters: the joined
    weights that eval mode keeps must not outlive a training step (they did: the digits ViT
    evaluated at 10% after learning)."""
    torch.manual_seed(0)
    model = create_model("llama_tiny", depth=1)
    ids = torch.randint(0, 256, (2, 7))
    model.eval()
    with torch.no_grad():
        before = model(ids)
    model.train()
    model(ids).logsumexp(-1).mean().backward()
    torch.optim.AdamW(model.parameters(), lr=0.05, fused=True).step()
    model.eval()
    with torch.no_grad():
        after = model(ids)
    with torch.enable_grad():
        plain = model(ids)  # every layer's own product, no joined weight
    assert not torch.allclose(before, after, atol=1e-3)
    torch.testing.assert_close(after, plain.detach(), atol=1e-5, rtol=0)


def test_joined_weights_survive_eval_in_eval_mode_and_follow_every_optimizer_step():
    """generate() sets eval mode at every call: a model already in eval mode keeps the weights it
    joined (joining them again cost 3% of a 256-token generation), and an optimizer step taken
    in eval mode, fused or not, still makes them joined again."""
    torch.manual_seed(0)
    model = create_model("llama_tiny", depth=1).eval()
    ids = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        model(ids)
    kept = model.blocks[0].attn.__dict__["_fused_qkv"]
    model.eval()
    assert model.blocks[0].attn.__dict__["_fused_qkv"] is kept
    for fused in (True, False):
        with torch.no_grad():
            before = model(ids)
        with torch.enable_grad():
            model(ids).logsumexp(-1).mean().backward()
        torch.optim.AdamW(model.parameters(), lr=0.05, fused=fused).step()
        model.zero_grad()
        with torch.no_grad():
            after = model(ids)
        with torch.enable_grad():
            plain = model(ids)
        assert not torch.allclose(before, after, atol=1e-3)
        torch.testing.assert_close(after, plain.detach(), atol=1e-5, rtol=0)


def test_norm_bias_false_leaves_the_layernorm_biases_out_as_nanogpt_does():
    from attnlab.models.gpt import GPT
    kept = GPT(vocab_size=32, max_len=16, embed_dim=16, depth=2, num_heads=2, norm="layernorm", bias=False)
    plain = GPT(vocab_size=32, max_len=16, embed_dim=16, depth=2, num_heads=2, norm="layernorm", bias=False,
                norm_bias=False)
    assert {n for n, _ in kept.named_parameters() if "norm" in n and n.endswith(".bias")}  # the default keeps them
    assert not [n for n, _ in plain.named_parameters() if n.endswith(".bias")]
    assert plain(torch.randint(0, 32, (2, 5))).shape == (2, 5, 32)
