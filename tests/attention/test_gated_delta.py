"""The gated delta rule (the ``gated_delta`` kind): its chunked form against the recurrent one,
Qwen3.5's linear-attention layer, its state as a cache, and the 3:1 hybrid of whole Qwen3.5 text
models through ``from_hf``. Tiny random configurations built with ``transformers``, eager
attention, float32."""

import pytest
import torch

from attnlab.attention import build_attention
from attnlab.errors import InputError
from attnlab.formats import from_hf
from attnlab.models.gpt import GPT

from transformers_parity import VOCAB, greedy_equals_theirs, logits_equal_theirs

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")


# --------------------------------------------------------------------------- the gated delta rule
def _delta_inputs(b=2, h=3, n=37, dk=8, dv=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, h, n, dk, generator=gen), dim=-1) * dk ** -0.5
    k = torch.nn.functional.normalize(torch.randn(b, h, n, dk, generator=gen), dim=-1)
    v = torch.randn(b, h, n, dv, generator=gen)
    g, beta = -torch.rand(b, h, n, generator=gen) * 2, torch.rand(b, h, n, generator=gen)
    return q, k, v, g, beta, torch.randn(b, h, dk, dv, generator=gen)


@pytest.mark.parametrize("n,chunk", [(37, 8), (37, 64), (64, 16), (1, 4), (0, 8)])
def test_the_chunked_gated_delta_rule_equals_the_recurrent_one(n, chunk):
    from attnlab.attention.gated_delta import chunked, recurrent

    q, k, v, g, beta, s0 = _delta_inputs(n=n)
    out, state = recurrent(q, k, v, g, beta, s0)
    out_c, state_c = chunked(q, k, v, g, beta, s0, chunk_size=chunk)
    assert out_c.shape == out.shape
    torch.testing.assert_close(out_c, out, atol=1e-5, rtol=0)
    torch.testing.assert_close(state_c, state, atol=1e-5, rtol=0)


def test_the_chunked_gated_delta_rules_gradients_are_the_recurrent_ones():
    from attnlab.attention.gated_delta import chunked, recurrent

    inputs = [t.double().requires_grad_() for t in _delta_inputs(n=37)]
    grads = []
    for form in (lambda *a: recurrent(*a), lambda *a: chunked(*a, chunk_size=8)):
        out, state = form(*inputs)
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        grads.append(torch.autograd.grad((out * weights).sum() + state.square().sum(), inputs))
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)  # both compute in float32


@pytest.mark.parametrize("frozen", [False, True])
def test_a_gated_delta_layer_trained_at_length_in_segments_equals_the_whole(frozen):
    """Past SEGMENT_FROM positions a training forward runs in segments whose steps the backward
    recomputes (the state and the convolution's inputs carried across): the output and every
    gradient equal the whole layer's (float32 inside, 1e-5 of each gradient's largest entry), with
    a length that is no multiple of the segment and some weights frozen."""
    torch.manual_seed(0)
    layer = build_attention("gated_delta", 32, 4, num_key_heads=2, chunk_size=8).train()
    if frozen:
        layer.in_proj_z.weight.requires_grad_(False)
    x = torch.randn(2, 100, 32, requires_grad=True)
    weights = torch.randn(2, 100, 32)
    results = []
    for segment_from in (1000, 30):  # whole, then in segments of 24
        layer.SEGMENT, layer.SEGMENT_FROM = 24, segment_from
        out, _ = layer(x, is_causal=True)
        trained = [x, *(p for p in layer.parameters() if p.requires_grad)]
        results.append((out, torch.autograd.grad((out * weights).sum(), trained)))
    (whole, whole_grads), (parts, part_grads) = results
    torch.testing.assert_close(parts, whole, atol=1e-5, rtol=1e-5)
    for a, b in zip(part_grads, whole_grads):
        assert (a - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item())


def test_the_delta_rule_overwrites_a_key_it_already_holds():
    """Written twice under one key with beta = 1 and no decay, the state gives the second value
    (plain linear attention would give their sum)."""
    from attnlab.attention.gated_delta import recurrent

    k = torch.nn.functional.normalize(torch.randn(1, 1, 1, 8), dim=-1).expand(1, 1, 2, 8)
    v = torch.randn(1, 1, 2, 4)
    _, state = recurrent(k, k, v, torch.zeros(1, 1, 2), torch.ones(1, 1, 2))
    torch.testing.assert_close(state[0, 0].T @ k[0, 0, 0], v[0, 0, 1], atol=1e-5, rtol=0)


def _qwen35_linear_layer():
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    from attnlab.attention import GatedDeltaNet

    config = transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4)
    torch.manual_seed(6)
    theirs = Qwen3_5GatedDeltaNet(config, 0).eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.uniform_(-1, 1) if name == "A_log" else p.normal_(0, 0.3)
    ours = GatedDeltaNet(48, 4, num_key_heads=2, head_dim=8, v_head_dim=6, chunk_size=16).eval()
    state = dict(theirs.state_dict())
    state["norm_weight"] = state.pop("norm.weight")
    ours.load_state_dict(state)
    return theirs, ours


def test_gated_delta_layer_equals_qwen3_5s_linear_attention_to_1e_5():
    theirs, ours = _qwen35_linear_layer()
    x = torch.randn(2, 70, 48, generator=torch.Generator().manual_seed(7))  # several chunks and a part
    with torch.no_grad():
        expected = theirs(x)
        got, weights = ours(x, is_causal=True)
    assert weights is None
    assert (got - expected).abs().max().item() < 1e-5


def test_gated_delta_left_padding_leaves_the_state_untouched():
    _, ours = _qwen35_linear_layer()
    x = torch.randn(1, 20, 48, generator=torch.Generator().manual_seed(8))
    padded = torch.cat([torch.randn(1, 5, 48), x], dim=1)
    pad = torch.zeros(1, 25, dtype=torch.bool)
    pad[:, :5] = True
    with torch.no_grad():
        alone, _ = ours(x, is_causal=True)
        got, _ = ours(padded, is_causal=True, key_padding_mask=pad)
    torch.testing.assert_close(got[:, 5:], alone, atol=1e-5, rtol=0)


def test_gated_delta_cache_is_constant_in_size_and_continues_the_sequence():
    _, ours = _qwen35_linear_layer()
    x = torch.randn(2, 60, 48, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        whole, _ = ours(x, is_causal=True)
        cache = ours.new_cache(2, 60)
        first, _ = ours(x[:, :40], is_causal=True, cache=cache)
        size = cache.nbytes()
        steps = [ours(x[:, i:i + 1], is_causal=True, cache=cache)[0] for i in range(40, 60)]
    assert cache.nbytes() == size == ours.cache_bytes(2, 10 ** 6, torch.float32)
    torch.testing.assert_close(torch.cat([first, *steps], 1), whole, atol=1e-5, rtol=0)


@pytest.mark.parametrize("key_heads", [None, 2])
def test_gated_delta_decode_step_is_forwards_recurrent_form(key_heads):
    """The lean step (joined projections, the convolution as a sum, one state step) equals forward
    with the cache token by token, with value heads sharing key heads or not, and keeps the
    cache's size."""
    from attnlab.attention import GatedDeltaNet

    torch.manual_seed(0)
    layer = GatedDeltaNet(48, 4, num_key_heads=key_heads, head_dim=12, v_head_dim=8).eval()
    x = torch.randn(2, 30, 48)
    lean, plain = layer.new_cache(2, 30), layer.new_cache(2, 30)
    with torch.no_grad():
        for cache in (lean, plain):
            layer(x[:, :20], is_causal=True, cache=cache)
        for t in range(20, 30):
            step = layer.decode_step(x[:, t], lean)
            full = layer(x[:, t : t + 1], is_causal=True, cache=plain)[0][:, 0]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)
    assert lean.nbytes() == plain.nbytes() and lean.seq_len == plain.seq_len == 30


def test_a_decoder_of_gated_delta_layers_generates_with_its_state_and_trains():
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, pos_embed="none", norm="rmsnorm",
                mlp="swiglu", attention="gated_delta", attention_options={"chunk_size": 4}).eval()
    ids = torch.randint(0, 50, (2, 6))
    out = model.generate(ids, 12)
    assert torch.equal(out, model.generate(ids, 12, use_cache=False))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.randint(0, 50, (4, 16))
    losses = []
    for _ in range(15):
        logits = model(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.parametrize("call,message", [
    ({}, "causal only"),
    ({"is_causal": True, "attn_mask": torch.zeros(5, 5, dtype=torch.bool)}, "takes no attn_mask"),
    ({"is_causal": True, "need_weights": True}, "forms no attention weights"),
])
def test_gated_delta_refuses_what_a_state_cannot_do_in_one_line(call, message):
    layer = build_attention("gated_delta", 32, 4)
    with pytest.raises(InputError, match=message) as caught:
        layer(torch.randn(1, 5, 32), **call)
    assert len(str(caught.value).splitlines()) == 1


@pytest.mark.parametrize("options,message", [
    ({"num_key_heads": 3}, "num_key_heads must divide num_heads=4"),
    ({"conv_size": 0}, "conv_size must be an integer >= 1"),
    ({"chunk_size": 0}, "chunk_size must be an integer >= 1"),
])
def test_gated_delta_refuses_impossible_sizes_in_one_line(options, message):
    with pytest.raises(InputError, match=message):
        build_attention("gated_delta", 32, 4, **options)


# --------------------------------------------------------------------------- Qwen3.5: the 3:1 hybrid
@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4, max_position_embeddings=128, eos_token_id=None,
        bos_token_id=None, pad_token_id=None, attn_implementation="eager")
    model = transformers.Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():  # zero-centred norms: without noise, the +1 of the conversion would not be tested
        for name, p in model.named_parameters():
            if p.dim() == 1 and "A_log" not in name:
                p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path_factory.mktemp("qwen3_5")
    model.save_pretrained(folder)
    return model, folder


def test_qwen3_5_folder_loads_as_a_hybrid_of_gated_delta_and_gated_full_attention(qwen35):
    from attnlab.attention import GatedDeltaNet, GroupedQueryAttention

    _, folder = qwen35
    ours = from_hf(folder)
    assert [type(b.attn) for b in ours.blocks] == [GatedDeltaNet] * 3 + [GroupedQueryAttention]
    full = ours.blocks[3].attn
    assert full.output_gate and full.q_norm is not None and full.rotary.rotary_dim == 4  # a quarter of 16
    assert ours.blocks[0].attn.num_heads == 4 and ours.blocks[0].attn.num_key_heads == 2


def test_qwen3_5_logits_of_a_padded_batch_equal_transformers_to_1e_5(qwen35):
    logits_equal_theirs(*qwen35, length=90, pad_from=70)  # past a 64-token chunk


def test_qwen3_5_greedy_generation_gives_transformers_tokens(qwen35):
    greedy_equals_theirs(*qwen35, new=14)


def test_a_recipe_builds_the_3_to_1_hybrid_and_its_cache_has_both_kinds():
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=4, num_heads=4, num_kv_heads=2, pos_embed="rope",
                norm="rmsnorm", mlp="swiglu", layer_types=["linear"] * 3 + ["full"], attention_output_gate=True,
                linear_attention_options={"num_heads": 2, "chunk_size": 4}).eval()
    assert [b.attn.num_heads for b in model.blocks] == [2, 2, 2, 4]
    ids = torch.randint(0, 50, (2, 6))
    out = model.generate(ids, 10)
    assert torch.equal(out, model.generate(ids, 10, use_cache=False))
    cache = model.new_cache(2, 16)
    assert [type(c).__name__ for c in cache] == ["RecurrentCache"] * 3 + ["DecodingCache"]


@pytest.mark.parametrize("options,message", [
    ({"layer_types": ["linear", "full"], "linear_attention": "relpos2d"}, "linear_attention must be a 'tokens' kind"),
    ({"layer_types": ["linear", "full"], "linear_attention_options": {"dropout": 0.1}},
     "attention_options must not set 'dropout'"),
    ({"layer_types": ["linear", "lstm"]}, "layer_types must be a list of 'full' or 'sliding' or 'linear'"),
    ({"attention": "linear", "attention_output_gate": True}, "attention_output_gate is not an option of attention"),
])
def test_hybrid_settings_that_cannot_work_are_one_line(options, message):
    with pytest.raises(InputError, match=message) as caught:
        GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, pos_embed="none", **options)
    assert len(str(caught.value).splitlines()) == 1
