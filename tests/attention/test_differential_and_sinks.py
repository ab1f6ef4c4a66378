"""Differential attention (DiffLlama, whole models through ``from_hf``) and learned attention
sinks (gpt-oss's attention module; gpt-oss needs a mixture of experts that attnlab does not
implement, so the comparison is the module's) against their references, and both kinds in a
decoder: the registry, cached decoding, training, refusals. Tiny random configurations built with
``transformers``, eager attention, float32."""

import math

import pytest
import torch

from attnlab.attention import DifferentialAttention, SinkAttention, build_attention, capture_attention
from attnlab.attention.registry import attention_entry
from attnlab.errors import InputError
from attnlab.formats import from_hf
from attnlab.models.gpt import GPT

from transformers_parity import VOCAB, greedy_equals_theirs, logits_equal_theirs

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")


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
    logits_equal_theirs(*diffllama)


def test_diffllama_greedy_generation_gives_transformers_tokens(diffllama):
    greedy_equals_theirs(*diffllama)


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
    assert attention_entry(kind).capabilities.cache and attention_entry(kind).capabilities.weights


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
