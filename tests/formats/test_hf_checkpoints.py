"""Hugging Face checkpoint folders load as attnlab models: with the same random weights,
attnlab's logits equal transformers' GPT2LMHeadModel, LlamaForCausalLM (grouped-query
attention, rotary positions) and MistralForCausalLM (sliding window) to 1e-5 in float32,
and greedy generation gives transformers' tokens exactly."""

import json

import pytest
import torch

from attnlab.errors import InputError
from attnlab.formats import from_hf

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

VOCAB = 97


def configs():
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    return {
        "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, eos_token_id=None,
            bos_token_id=None)),
        "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig(
            **small, num_key_value_heads=2, rope_theta=500000.0)),
        "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig(
            **small, num_key_value_heads=1, sliding_window=4)),  # shorter than the 12-token inputs
    }


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for name, (cls, config) in configs().items():
        torch.manual_seed(0)
        model = cls(config).eval()
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        out[name] = (model, folder)
    return out


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral"])
def test_logits_equal_transformers_to_1e_5(folders, family):
    theirs, folder = folders[family]
    ours = from_hf(folder)
    assert not ours.training
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(ids).logits
        got = ours(ids)
    assert got.shape == (2, 12, VOCAB)
    assert (got - expected).abs().max().item() < 1e-5


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral"])
def test_greedy_generation_gives_transformers_tokens(folders, family):
    theirs, folder = folders[family]
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    expected = theirs.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert torch.equal(from_hf(folder).generate(ids, 16), expected)


def test_the_grouped_query_cache_holds_the_key_value_heads_only(folders):
    model = from_hf(folders["llama"][1])
    cache = model.new_cache(1, 20)
    model(torch.zeros(1, 20, dtype=torch.long), cache=cache)
    assert cache[0]._k.shape == (1, 2, 20, 8)  # 2 key/value heads of 8, not 4 query heads


def test_a_folder_that_cannot_be_read_says_why(tmp_path, folders):
    with pytest.raises(InputError, match="config.json"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(InputError, match="model_type 't5' is not supported; from_hf reads gpt2, llama, mistral, ministral, qwen2, "
                                         "qwen3, smollm3, gemma2, gemma3_text, phi3, diffllama, qwen3_5_text, deepseek_v3, deepseek_v32, bert, roberta, distilbert"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text((folders["llama"][1] / "config.json").read_text())
    with pytest.raises(InputError, match="must hold model.safetensors"):
        from_hf(tmp_path)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folders["llama"][1] / "model.safetensors"))
    weights.pop("model.layers.1.mlp.up_proj.weight")
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(InputError, match=r"lacks model.layers.1.mlp.up_proj.weight \(blocks.1.mlp.up_proj.weight\)"):
        from_hf(tmp_path)
