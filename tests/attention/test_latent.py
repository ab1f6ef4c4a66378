"""Multi-head latent attention (the ``latent`` kind) against DeepSeek-V3 with dense layers (whole
models through ``from_hf``): logits and greedy tokens, cached decoding, a cache of the latent and
the rotary key alone, training, refusals. Tiny random configurations built with ``transformers``,
eager attention, float32."""

import pytest
import torch

from attnlab.attention import LatentAttention, build_attention, capture_attention
from attnlab.errors import InputError
from attnlab.formats import from_hf
from attnlab.models.gpt import GPT

from transformers_parity import VOCAB, greedy_equals_theirs, logits_equal_theirs

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")


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
    ours = logits_equal_theirs(*deepseek[variant], length=24, pad_from=17)  # past the original 16 positions
    assert ours.config.attention == "latent"


@pytest.mark.parametrize("variant", list(DEEPSEEK))
def test_deepseek_v3_greedy_generation_gives_transformers_tokens(deepseek, variant):
    greedy_equals_theirs(*deepseek[variant], new=14)


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
