"""The attention of 2024-2026 against its references: differential attention (DiffLlama, whole
models through ``from_hf``), learned attention sinks (gpt-oss's attention module; gpt-oss needs
a mixture of experts that attnlab does not implement, so the comparison is the module's) and
multi-head latent attention (DeepSeek-V3 with dense layers, whole models) and the gated delta
rule with its 3:1 hybrid (Qwen3.5's linear-attention layer, and whole Qwen3.5 text models). Tiny
random configurations built with ``transformers``, eager attention, float32."""

import math

import pytest
import torch

from attnlab.attention import DifferentialAttention, LatentAttention, SinkAttention, build_attention, capture_attention
from attnlab.attention.registry import attention_forms_weights, attention_keeps_cache
from attnlab.errors import InputError
from attnlab.formats import from_hf
from attnlab.models.gpt import GPT

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

VOCAB = 97


def _logits_equal_theirs(theirs, folder, length=20, pad_from=13):
    """attnlab's logits of a batch whose second row is right-padded equal transformers' to 1e-5."""
    ours = from_hf(folder)
    ids = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, pad_from:] = 0
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        got = ours(ids, padding_mask=mask == 0)
    real = mask.bool()
    assert (got[real] - expected[real]).abs().max().item() < 1e-5
    return ours


def _greedy_equals_theirs(theirs, folder, new=12):
    """Greedy generation over a left-padded prompt gives transformers' tokens."""
    ours = from_hf(folder)
    ids = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :3] = 0
    ids = ids.masked_fill(mask == 0, 0)
    expected = theirs.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, new, padding_mask=mask == 0), expected)


# --------------------------------------------------------------------------- DiffLlama
@pytest.fixture(scope="module")
def diffllama(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.DiffLlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, eos_token_id=None, bos_token_id=None,
        pad_token_id=None, attn_implementation="eager", lambda_std_dev=0.3)
    model = transformers.DiffLlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "lambda" not in name:
                p.add_(torch.randn_like(p) * 0.1)
    folder = tmp_path_factory.mktemp("diffllama")
    model.save_pretrained(folder)
    return model, folder


def test_diffllama_folder_loads_as_differential_attention(diffllama):
    _, folder = diffllama
    ours = from_hf(folder)
    assert ours.config.attention == "differential"
    inits = [block.attn.lambda_init for block in ours.blocks]
    assert inits == pytest.approx([0.8 - 0.6 * math.exp(-0.3 * i) for i in range(3)])


def test_diffllama_logits_of_a_padded_batch_equal_transformers_to_1e_5(diffllama):
    _logits_equal_theirs(*diffllama)


def test_diffllama_greedy_generation_gives_transformers_tokens(diffllama):
    _greedy_equals_theirs(*diffllama)


# --------------------------------------------------------------------------- gpt-oss's sinks
def _gpt_oss_attention(window: int | None):
    config = transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=window or 4, max_position_embeddings=64,
        num_local_experts=2, num_experts_per_tok=1, attn_implementation="eager",
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 16, "rope_theta": 150000.0})
    layer = 0 if window else 1  # gpt-oss alternates sliding (even layers) and full attention
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding

    torch.manual_seed(3)
    theirs = GptOssAttention(config, layer).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
    ours = SinkAttention(48, 4, num_kv_heads=2, head_dim=16, rope=True, rope_theta=150000.0, max_len=64,
                         rope_scaling=config.rope_parameters, sliding_window=window).eval()
    state = {k: v for k, v in theirs.state_dict().items()}
    ours.load_state_dict(state)
    return theirs, GptOssRotaryEmbedding(config), ours


def _additive_mask(pad: torch.Tensor, window: int | None) -> torch.Tensor:
    n = pad.shape[1]
    i = torch.arange(n)
    blocked = (i[None, :] > i[:, None])[None] | pad[:, None, :]
    if window is not None:
        blocked = blocked | (i[:, None] - i[None, :] >= window)[None]
    return torch.zeros(blocked.shape).masked_fill(blocked, torch.finfo(torch.float32).min)[:, None]


@pytest.mark.parametrize("window", [None, 4])
def test_sink_attention_equals_gpt_oss_attention_to_1e_5(window):
    theirs, rotary, ours = _gpt_oss_attention(window)
    x = torch.randn(2, 12, 48, generator=torch.Generator().manual_seed(4))
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[1, 9:] = True
    positions = torch.arange(12)[None].expand(2, -1)
    with torch.no_grad():
        expected, _ = theirs(x, rotary(x, positions), _additive_mask(pad, window))
        got, _ = ours(x, key_padding_mask=pad, is_causal=True)
    real = ~pad
    assert (got[real] - expected[real]).abs().max().item() < 1e-5


@pytest.mark.parametrize("window", [None, 4])
def test_sink_attention_weights_equal_gpt_oss_weights(window):
    theirs, rotary, ours = _gpt_oss_attention(window)
    x = torch.randn(1, 10, 48, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, expected = theirs(x, rotary(x, torch.arange(10)[None]), _additive_mask(torch.zeros(1, 10, dtype=torch.bool),
                                                                                  window))
        _, got = ours(x, is_causal=True, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert (got.sum(-1) < 1).all()  # the sink took a share of every row


# --------------------------------------------------------------------------- both kinds in the decoder
KINDS = ["differential", "sinks"]


@pytest.mark.parametrize("kind", KINDS + ["latent"])
def test_the_registry_says_what_each_kind_does(kind):
    assert attention_keeps_cache(kind) and attention_forms_weights(kind)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("window", [None, 5])
def test_cached_decoding_equals_recomputation(kind, window):
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, num_kv_heads=2, pos_embed="rope",
                norm="rmsnorm", mlp="swiglu", attention=kind, sliding_window=window).eval()
    for p in model.parameters():  # sinks start at zero: give them a value
        if p.dim() == 1:
            torch.nn.init.normal_(p, 0.0, 0.5)
    ids = torch.randint(0, 50, (2, 6))
    out = model.generate(ids, 12)
    assert torch.equal(out, model.generate(ids, 12, use_cache=False))
    with torch.no_grad():
        cache = model.new_cache(2, 18)
        model(out[:, :6], cache=cache)
        steps = [model.decode_step(out[:, i:i + 1], cache) for i in range(6, 17)]
        full = model(out[:, :17])[:, 6:]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_trains_and_its_own_parameters_learn(kind):
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=32, embed_dim=32, depth=2, num_heads=4, pos_embed="rope", norm="rmsnorm",
                mlp="swiglu", attention=kind)
    own = [p for n, p in model.named_parameters() if "lambda" in n or n.endswith("attn.sinks")]
    assert own
    before = [p.detach().clone() for p in own]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 50, (4, 16))
    losses = []
    for _ in range(15):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5
    assert all(not torch.equal(a, b) for a, b in zip(before, own))


def test_differential_weights_are_the_difference_of_two_maps():
    torch.manual_seed(0)
    attn = DifferentialAttention(32, 4, num_kv_heads=2, layer_index=2, lambda_std=0.5).eval()
    x = torch.randn(1, 7, 32)
    with torch.no_grad(), capture_attention(attn) as captured:
        attn(x, is_causal=True)
    ((weights,),) = captured.values()
    assert weights.shape == (1, 2, 7, 7)  # one map per pair of heads
    lam = attn.lambda_full().item()
    torch.testing.assert_close(weights.sum(-1), torch.full((1, 2, 7), 1 - lam), atol=1e-5, rtol=0)


@pytest.mark.parametrize("options,message", [
    ({"num_heads": 3, "num_kv_heads": 3}, "num_heads and num_kv_heads must be even"),
    ({"num_heads": 4, "num_kv_heads": 1}, "num_heads and num_kv_heads must be even"),
    ({"num_heads": 4, "layer_index": -1}, "layer_index must be"),
    ({"num_heads": 4, "lambda_init": float("nan")}, "lambda_init must be a finite number"),
    ({"num_heads": 4, "lambda_std": -1.0}, "lambda_std must be a finite number >= 0"),
])
def test_differential_refuses_what_it_cannot_do_in_one_line(options, message):
    heads = options.pop("num_heads")
    with pytest.raises(InputError, match=message) as caught:
        build_attention("differential", 24 if heads == 3 else 32, heads, **options)
    assert len(str(caught.value).splitlines()) == 1


def test_sinks_must_have_one_logit_per_head():
    from attnlab.attention.functional import scaled_dot_product_attention

    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(InputError, match=r"sinks must have shape \(H,\) = \(4,\)"):
        scaled_dot_product_attention(q, q, q, sinks=torch.zeros(3))


# --------------------------------------------------------------------------- DeepSeek-V3's latent attention
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
        "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 10000.0}
DEEPSEEK = {"compressed queries, DeepSeek's rotary layout": {},
            "plain queries and rotary layout": {"q_lora_rank": None, "rope_interleave": False},
            "yarn with mscale": {"rope_parameters": YARN}}


def _deepseek_config(**overrides):
    options = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, moe_intermediate_size=16,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                   n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=16,
                   q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10, first_k_dense_replace=2,
                   max_position_embeddings=64, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                   attn_implementation="eager")
    return transformers.DeepseekV3Config(**{**options, **overrides})


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    out = {}
    for name, overrides in DEEPSEEK.items():
        torch.manual_seed(0)
        model = transformers.DeepseekV3ForCausalLM(_deepseek_config(**overrides)).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        folder = tmp_path_factory.mktemp("deepseek")
        model.save_pretrained(folder)
        out[name] = (model, folder)
    return out


@pytest.mark.parametrize("variant", list(DEEPSEEK))
def test_deepseek_v3_logits_of_a_padded_batch_equal_transformers_to_1e_5(deepseek, variant):
    ours = _logits_equal_theirs(*deepseek[variant], length=24, pad_from=17)  # past the original 16 positions
    assert ours.config.attention == "latent"


@pytest.mark.parametrize("variant", list(DEEPSEEK))
def test_deepseek_v3_greedy_generation_gives_transformers_tokens(deepseek, variant):
    _greedy_equals_theirs(*deepseek[variant], new=14)


@pytest.mark.parametrize("overrides,message", [
    ({"first_k_dense_replace": 1}, "first_k_dense_replace 1 is below num_hidden_layers 2: layers from 1 on have a "
                                   "mixture-of-experts MLP"),
    ({"num_key_value_heads": 2}, "num_key_value_heads 2 differs from num_attention_heads 4"),
])
def test_deepseek_v3_folders_attnlab_cannot_compute_are_refused_in_one_line(tmp_path, overrides, message):
    model = transformers.DeepseekV3ForCausalLM(_deepseek_config(**{"first_k_dense_replace": 2, **overrides}))
    model.save_pretrained(tmp_path)
    with pytest.raises(InputError, match=message) as caught:
        from_hf(tmp_path)
    assert len(str(caught.value).splitlines()) == 1


LATENT = {"kv_rank": 16, "rope_dim": 4, "v_head_dim": 6}


@pytest.mark.parametrize("q_rank", [None, 24])
def test_latent_cached_decoding_equals_recomputation(q_rank):
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, pos_embed="rope", norm="rmsnorm",
                mlp="swiglu", attention="latent", attention_options={**LATENT, "q_rank": q_rank}).eval()
    ids = torch.randint(0, 50, (2, 6))
    out = model.generate(ids, 12)
    assert torch.equal(out, model.generate(ids, 12, use_cache=False))
    with torch.no_grad():
        cache = model.new_cache(2, 18)
        model(out[:, :6], cache=cache)
        steps = [model.decode_step(out[:, i:i + 1], cache) for i in range(6, 17)]  # the latent-space step
        full = model(out[:, :17])[:, 6:]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=0)


def test_latent_cache_holds_the_latent_and_the_rotary_key_only():
    attn = LatentAttention(256, 8, kv_rank=64, rope_dim=16, rope=True)
    assert attn.cache_bytes(2, 1000, torch.float32) == 2 * (64 + 16) * 1000 * 4
    grouped = build_attention("exact", 256, 8, num_kv_heads=2)
    assert grouped.cache_bytes(2, 1000, torch.float32) == 2 * 2 * 2 * 32 * 1000 * 4  # 1.6x the latent's
    cache = attn.new_cache(1, 40)
    with torch.no_grad():
        attn.eval()(torch.randn(1, 40, 256), cache=cache, is_causal=True)
    assert cache.nbytes() == attn.cache_bytes(1, 40, torch.float32)


def test_latent_attention_trains_and_its_weights_are_captured():
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=32, embed_dim=32, depth=2, num_heads=4, pos_embed="rope", norm="rmsnorm",
                mlp="swiglu", attention="latent", attention_options=LATENT)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 50, (4, 16))
    losses = []
    for _ in range(15):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5
    with torch.no_grad(), capture_attention(model) as captured:
        model.eval()(ids[:1])
    assert len(captured) == 2 and all(w[0].shape == (1, 4, 16, 16) for w in captured.values())


@pytest.mark.parametrize("options,message", [
    ({"kv_rank": 0}, "kv_rank must be an integer >= 1"),
    ({"rope": True, "rope_dim": 3}, "rope_dim must be an even number"),
    ({"rope_dim": 4}, "rope_dim=4 is the rotary part of each head, and rope is off"),
    ({"q_rank": -2}, "q_rank must be an integer >= 1"),
    ({"v_head_dim": 0}, "v_head_dim must be an integer >= 1"),
])
def test_latent_refuses_impossible_sizes_in_one_line(options, message):
    with pytest.raises(InputError, match=message) as caught:
        build_attention("latent", 32, 4, **options)
    assert len(str(caught.value).splitlines()) == 1


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
    _logits_equal_theirs(*qwen35, length=90, pad_from=70)  # past a 64-token chunk


def test_qwen3_5_greedy_generation_gives_transformers_tokens(qwen35):
    _greedy_equals_theirs(*qwen35, new=14)


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


# --------------------------------------------------------------------------- DeepSeek-V3.2's sparse attention
def _deepseek_v32(topk, index_heads=16, layers=2):
    """A tiny random DeepSeek-V3.2 of transformers'. With few index heads a key often scores exactly
    0 (every head's ReLU at 0: with 4 heads one key in 16), and equal scores at the k-th place are
    broken by torch.topk over every key of the call, which attnlab follows."""
    torch.manual_seed(0)
    config = transformers.DeepseekV32Config(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=12,
        v_head_dim=10, first_k_dense_replace=layers, max_position_embeddings=64, index_topk=topk, index_head_dim=16,
        index_n_heads=index_heads, eos_token_id=None, bos_token_id=None, pad_token_id=None, attn_implementation="eager")
    model = transformers.DeepseekV32ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module")
def deepseek_v32(tmp_path_factory):
    model = _deepseek_v32(topk=5)  # each query keeps 5 of up to 24 keys
    folder = tmp_path_factory.mktemp("deepseek_v32")
    model.save_pretrained(folder)
    return model, folder


def test_deepseek_v32_logits_of_a_padded_batch_equal_transformers_to_1e_5(deepseek_v32):
    ours = _logits_equal_theirs(*deepseek_v32, length=24, pad_from=17)  # 5 keys kept of up to 24
    assert ours.config.attention == "dsa" and ours.blocks[0].attn.index_topk == 5


def test_deepseek_v32_greedy_generation_gives_transformers_tokens(deepseek_v32):
    _greedy_equals_theirs(*deepseek_v32, new=14)


@pytest.fixture(scope="module")
def deepseek_v32_ties(tmp_path_factory):
    model = _deepseek_v32(topk=8, index_heads=4, layers=6)  # equal index scores at the 8th place are common
    folder = tmp_path_factory.mktemp("deepseek_v32_ties")
    model.save_pretrained(folder)
    return model, folder


def test_deepseek_v32_with_equal_index_scores_breaks_them_as_transformers(deepseek_v32_ties):
    theirs, folder = deepseek_v32_ties
    ours = from_hf(folder)
    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # rows 0-7 see fewer keys than index_topk; the rest pick 8 of up to 20
        got, expected = ours(ids), theirs(ids).logits
        with capture_attention(ours):  # the form that forms the weights picks the same keys
            captured = ours(ids)
    assert (got - expected).abs().max().item() < 1e-5
    assert (captured - expected).abs().max().item() < 1e-5
    _logits_equal_theirs(theirs, folder, length=20, pad_from=13)
    _greedy_equals_theirs(theirs, folder, new=14)


def test_the_selection_matters_and_keeping_every_key_is_latent_attention():
    from attnlab.attention import IndexedSparseAttention

    torch.manual_seed(0)
    options = dict(kv_rank=16, q_rank=24, rope_dim=4, rope=True, index_heads=2)
    sparse = IndexedSparseAttention(32, 4, index_topk=3, **options).eval()
    every = IndexedSparseAttention(32, 4, index_topk=64, **options).eval()
    every.load_state_dict(sparse.state_dict())
    latent = LatentAttention(32, 4, **{k: v for k, v in options.items() if k != "index_heads"}).eval()
    latent.load_state_dict({k: v for k, v in sparse.state_dict().items() if not k.startswith("indexer.")})
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        dense, _ = latent(x, is_causal=True)
        kept, _ = every(x, is_causal=True)
        few, weights = sparse(x, is_causal=True, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(kept, dense, atol=1e-6, rtol=0)
    assert (few - dense).abs().max() > 1e-3
    assert ((weights > 0).sum(-1) <= 3).all() and ((weights > 0).sum(-1)[..., 3:] == 3).all()


def test_dsa_cached_decoding_equals_recomputation():
    torch.manual_seed(0)
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, pos_embed="rope", norm="rmsnorm",
                mlp="swiglu", attention="dsa",
                attention_options={"kv_rank": 16, "q_rank": 24, "rope_dim": 4, "index_topk": 4}).eval()
    ids = torch.randint(0, 50, (2, 6))
    out = model.generate(ids, 12)
    assert torch.equal(out, model.generate(ids, 12, use_cache=False))
    assert model.blocks[0].attn.cache_bytes(1, 10, torch.float32) == (16 + 4 + 8) * 10 * 4


@pytest.mark.parametrize("padded", [0, 8])
def test_dsa_decode_step_attends_to_the_gathered_best_latents_as_forward_does(padded):
    """The lean step gathers the index_topk best latents instead of masking the rest: equal to
    forward with the cache, on a row left-padded so far that fewer real keys than index_topk remain."""
    from attnlab.attention import IndexedSparseAttention

    torch.manual_seed(0)
    attn = IndexedSparseAttention(32, 4, kv_rank=16, q_rank=24, rope_dim=4, rope=True, index_topk=3).eval()
    x = torch.randn(2, 12, 32)
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[1, :padded] = True
    lean, plain = attn.new_cache(2, 12), attn.new_cache(2, 12)
    with torch.no_grad():
        for cache in (lean, plain):
            attn(x[:, :9], is_causal=True, key_padding_mask=pad[:, :9], cache=cache)
        for t in range(9, 12):
            step = attn.decode_step(x[:, t], lean, key_padding_mask=pad[:, : t + 1])
            full = attn(x[:, t : t + 1], is_causal=True, key_padding_mask=pad[:, : t + 1], cache=plain)[0][:, 0]
            torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def _index_kl_by_hand(attn, x):
    """DeepSeek-V3.2's indexer loss written out for one unbatched causal sequence: for each query,
    the heads' attention over its selected keys summed and renormalised, and the KL divergence
    from it to the softmax of the indexer's scores over the same keys."""
    q, stored, positions, c = attn._stored(x, None, None)
    n = x.shape[1]
    blocked = torch.ones(n, n, dtype=torch.bool).triu(1)[None, None]
    r = attn.kv_rank + attn.rope_dim
    mask, index = attn._selected(x, positions, stored[..., r:], blocked)
    k, _ = attn._keys_values(c, stored[..., attn.kv_rank: r])
    total = 0.0
    for t in range(n):
        keep = ~mask[0, 0, t]
        logits = (q[0, :, t, None] @ k[0, :, keep].transpose(-1, -2))[:, 0] * attn.scale  # (H, kept)
        p = logits.softmax(-1).sum(0)
        p = p / p.sum()
        log_q = index[0, t, keep].log_softmax(-1)
        total = total + (p * (p.log() - log_q)).sum()
    return total / n


def test_dsa_indexer_loss_is_deepseeks_kl_and_trains_the_indexer_alone():
    """The loss kept for the trainer equals the KL written out by hand; the forward's output does
    not depend on it; its gradient reaches the indexer's weights and nothing else (the indexer
    reads detached inputs), so the other weights' gradients are those of the task's loss alone;
    index_loss=0 keeps none, and evaluation keeps none."""
    from attnlab.attention import IndexedSparseAttention

    torch.manual_seed(0)
    options = dict(kv_rank=16, q_rank=24, rope_dim=4, rope=True, index_heads=2, index_topk=4)
    attn = IndexedSparseAttention(32, 4, **options, index_loss=0.5).train()
    plain = IndexedSparseAttention(32, 4, **options, index_loss=0.0).train()
    plain.load_state_dict(attn.state_dict())
    x = torch.randn(1, 10, 32)
    out, _ = attn(x, is_causal=True)
    aux = attn.take_aux_loss()
    assert attn.take_aux_loss() is None  # taken once
    torch.testing.assert_close(aux, 0.5 * _index_kl_by_hand(attn, x), atol=1e-6, rtol=1e-5)
    (out.square().sum() + aux).backward()
    out_plain, _ = plain(x, is_causal=True)
    assert plain.take_aux_loss() is None
    torch.testing.assert_close(out, out_plain, atol=0, rtol=0)
    out_plain.square().sum().backward()
    for (name, p), q in zip(attn.named_parameters(), plain.parameters()):
        if name.startswith("indexer."):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
            assert q.grad is None or not q.grad.any(), name  # (zeros: the cache's slice beside the latent)
        else:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)
    attn.eval()
    with torch.no_grad():
        attn(x, is_causal=True)
    assert attn.take_aux_loss() is None


def test_dsa_indexer_learns_the_attentions_choice_through_the_trainer():
    """A decoder with sparse attention trained by the engine: the trainer adds the indexer's loss,
    the indexer's weights move (with index_loss=0 they stay as drawn), and the indexer's KL on a
    fixed batch ends well below that of an indexer left as drawn beside the same kind of training."""
    from attnlab.engine.trainer import TrainConfig, Trainer

    class Windows:
        def __init__(self, ids):
            self.ids = ids

        def __len__(self):
            return len(self.ids)

        def get_batch(self, idx):
            rows = self.ids[torch.as_tensor(idx)]
            return rows[:, :-1], rows[:, 1:]

    torch.manual_seed(0)
    pattern = torch.arange(40) % 7  # text that repeats: attention has something to find
    ids = torch.stack([(pattern + i) % 7 for i in range(16)])

    def trained(weight):
        torch.manual_seed(0)
        model = GPT(vocab_size=8, max_len=64, embed_dim=32, depth=1, num_heads=4, pos_embed="rope", norm="rmsnorm",
                    mlp="swiglu", attention="dsa", attention_options={"kv_rank": 16, "q_rank": 24, "rope_dim": 4,
                                                                      "index_topk": 6, "index_loss": weight})
        start = {k: v.clone() for k, v in model.state_dict().items() if ".indexer." in k}
        attn = model.blocks[0].attn

        Trainer(model, Windows(ids), TrainConfig(steps=60, batch_size=8, lr=3e-3, weight_decay=0.0, warmup_steps=0, progress=False,
                                                 tensorboard=False, log_every=1000), log=lambda line: None).fit()
        moved = max((model.state_dict()[k] - v).abs().max().item() for k, v in start.items())
        attn.index_loss = 1.0  # to read the KL of the indexer as it ended
        model(ids[:4, :-1])
        return moved, attn.take_aux_loss().item()

    moved, kl = trained(1.0)
    moved_untrained, kl_untrained = trained(0.0)
    assert moved > 1e-3 and moved_untrained == 0.0
    assert kl < 0.5 * kl_untrained, (kl, kl_untrained)


@pytest.mark.parametrize("value", [-1.0, float("nan"), "much"])
def test_dsa_index_loss_refuses_what_is_not_a_weight(value):
    with pytest.raises(InputError, match="index_loss must be a finite number >= 0"):
        build_attention("dsa", 32, 4, index_loss=value)


@pytest.mark.parametrize("options,message", [
    ({"rope": True, "rope_dim": 8, "index_head_dim": 4}, "index_head_dim .4. must hold the rotary part"),
    ({"index_topk": 0}, "index_topk must be an integer >= 1"),
])
def test_dsa_refuses_impossible_sizes_in_one_line(options, message):
    with pytest.raises(InputError, match=message):
        build_attention("dsa", 32, 4, **options)


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
