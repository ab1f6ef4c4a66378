"""Hugging Face folders of today's decoder families load through the same ``from_hf``: with the
same random weights, attnlab's logits equal transformers' (eager attention, float32) to 1e-5 on
a padded batch, and greedy generation gives transformers' tokens exactly, over a left-padded
prompt and a continuation that cross the sliding window (4 positions) and, where the rotary
positions are scaled, the original context (16 positions).

Each family's knob is in its tiny configuration: Qwen2.5's query/key/value biases and sliding
layers above ``max_window_layers``; Qwen3's QK-norm and a head size apart from the width; Llama
3.x's ``llama3`` and ``yarn`` rope scaling; Gemma 2's soft-capping, ``query_pre_attn_scalar``,
alternating sliding and full layers, four norms a block, scaled embeddings and GeGLU; Gemma 3's
5:1 pattern with a rope base per layer type and linear scaling on the full layers; Phi-3's packed
projections, ``longrope`` and partial rotary; SmolLM3's layers without positions; SmolLM2 (a
Llama with tied embeddings)."""

import json

import pytest
import torch

from attnlab.errors import InputError
from attnlab.formats import from_hf

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

VOCAB = 97
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, eos_token_id=None, bos_token_id=None,
             pad_token_id=None, attn_implementation="eager")
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16, "rope_theta": 500000.0}


def family_configs():
    t = transformers
    return {
        "qwen2": (t.Qwen2ForCausalLM, t.Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=4,
                                                    max_window_layers=2)),
        "qwen3": (t.Qwen3ForCausalLM, t.Qwen3Config(**SMALL, head_dim=16)),
        "llama3": (t.LlamaForCausalLM, t.LlamaConfig(**SMALL, rope_parameters=LLAMA3)),
        "llama-yarn": (t.LlamaForCausalLM, t.LlamaConfig(**SMALL, rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0})),
        "gemma2": (t.Gemma2ForCausalLM, t.Gemma2Config(**SMALL, head_dim=16, sliding_window=4,
                                                       query_pre_attn_scalar=24)),
        "gemma3_text": (t.Gemma3ForCausalLM, t.Gemma3TextConfig(
            **{**SMALL, "num_hidden_layers": 6}, head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})),
        "phi3": (t.Phi3ForCausalLM, t.Phi3Config(
            **SMALL, partial_rotary_factor=0.5, original_max_position_embeddings=16,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                             "short_factor": [1.0, 1.1], "long_factor": [2.0, 3.5]})),
        "smollm3": (t.SmolLM3ForCausalLM, t.SmolLM3Config(**SMALL, no_rope_layer_interval=2)),
        "smollm2": (t.LlamaForCausalLM, t.LlamaConfig(**SMALL, tie_word_embeddings=True)),
        "ministral": (t.MinistralForCausalLM, t.MinistralConfig(**SMALL, sliding_window=4, head_dim=8,
                                                                layer_types=["sliding_attention", "full_attention"] * 2)),
    }


FAMILIES = list(family_configs())


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for name, (cls, config) in family_configs().items():
        torch.manual_seed(0)
        model = cls(config).eval()
        with torch.no_grad():  # random norms and biases: the +1 of Gemma's norms and the biases must matter
            for key, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        out[name] = (model, folder)
    return out


def test_each_family_has_what_makes_it_itself(folders):
    cfgs = {name: from_hf(folder).config for name, (_, folder) in folders.items()}
    assert cfgs["qwen2"].attention_bias and cfgs["qwen2"].attention_out_bias is False
    # each family's per-layer knobs (layer_types, sliding patterns, layers without positions) become one list
    assert cfgs["qwen2"].layer_types is None and cfgs["qwen2"].layer_kinds() == ["full", "full", "sliding", "sliding"]
    assert cfgs["qwen3"].qk_norm and cfgs["qwen3"].head_dim == 16
    assert cfgs["llama3"].rope_scaling["rope_type"] == "llama3" and cfgs["llama-yarn"].rope_scaling["rope_type"] == "yarn"
    g2 = cfgs["gemma2"]
    assert (g2.attn_softcap, g2.logit_softcap, g2.query_pre_attn_scalar, g2.post_norms, g2.mlp) == \
        (50.0, 30.0, 24.0, True, "geglu")
    assert g2.layers == [{"sliding": True}, {"sliding": False}] and g2.embed_scale == pytest.approx(32 ** 0.5)
    g3 = cfgs["gemma3_text"]
    assert g3.layer_kinds() == ["sliding"] * 5 + ["full"] and g3.rope_local_theta == 10000.0
    assert g3.rope_theta == 1e6 and g3.rope_scaling["rope_type"] == "linear" and g3.qk_norm
    assert cfgs["phi3"].partial_rotary == 0.5 and cfgs["phi3"].rope_scaling["rope_type"] == "longrope"
    assert [p.positions for p in cfgs["smollm3"].layer_plan()] == [True, False, True, False]
    assert cfgs["smollm2"].tie_embeddings


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_of_a_padded_batch_equal_transformers_to_1e_5(folders, family):
    theirs, folder = folders[family]
    ours = from_hf(folder)
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))  # past the window and 16
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, 17:] = 0  # the second row is right-padded
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        got = ours(ids, padding_mask=mask == 0)
    real = mask.bool()
    assert (got[real] - expected[real]).abs().max().item() < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_gives_transformers_tokens_across_the_window(folders, family):
    theirs, folder = folders[family]
    ours = from_hf(folder)
    ids = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :3] = 0  # left padding: the first row's prompt is 7 tokens
    ids = ids.masked_fill(mask == 0, 0)
    expected = theirs.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False, pad_token_id=0)
    got = ours.generate(ids, 14, padding_mask=mask == 0)
    assert torch.equal(got, expected)
    assert torch.equal(ours.generate(ids[1:], 14), theirs.generate(ids[1:], max_new_tokens=14, do_sample=False,
                                                                   pad_token_id=0))


def _edited(folder, tmp_path, **changes):
    import shutil

    out = tmp_path / "edited"
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("family, changes, message", [
    ("qwen2", {"layer_types": ["chunked_attention"] * 4}, r"config.json: layer_types 'chunked_attention' is not "
                                                          r"supported; attnlab's layers are full_attention and "
                                                          r"sliding_attention"),
    ("llama3", {"rope_parameters": {"rope_type": "mrope", "rope_theta": 10000.0}},
     r"config.json: rope_parameters.rope_type"),
    ("llama3", {"quantization_config": {"quant_method": "gptq"}}, r"config.json: quantization_config .* is not "
                                                                  r"supported \(quantized weights"),
    ("qwen3", {"num_experts": 8}, r"config.json: num_experts 8 is not supported \(a mixture-of-experts MLP"),
    ("gemma2", {"hidden_activation": "relu"}, r"config.json: hidden_activation 'relu' is not supported"),
    ("gemma3_text", {"use_bidirectional_attention": True}, r"config.json: use_bidirectional_attention True is "
                                                            r"not supported"),
    ("gemma3_text", {"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0,
                                                               "rope_theta": 1.0},
                                         "full_attention": {"rope_type": "default", "rope_theta": 1.0}}},
     r"config.json: rope_parameters.sliding_attention.rope_type 'linear' is not supported"),
    ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                  "short_factor": [1.0], "long_factor": [2.0, 3.5]}},
     r"config.json: rope_parameters.short_factor"),
])
def test_an_option_attnlab_does_not_implement_is_refused_by_name(folders, tmp_path, family, changes, message):
    folder = _edited(folders[family][1], tmp_path, **changes)
    with pytest.raises(InputError, match=message) as caught:
        from_hf(folder)
    said = str(caught.value)
    assert len(said.splitlines()) == 1 and said.startswith(f"{folder}/config.json: ") and "wrong type" not in said


OLD_KEYS = {  # how folders written by transformers 4.x say the same, without layer_types and rope_parameters
    "gemma3_text": dict(layer_types=None, rope_parameters=None, sliding_window_pattern=6, rope_theta=1e6,
                        rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0}),
    "gemma2": dict(layer_types=None, rope_parameters=None, rope_theta=10000.0),
    "qwen2": dict(layer_types=None, rope_parameters=None, rope_theta=10000.0),
    "smollm3": dict(layer_types=None, rope_parameters=None, rope_theta=2000000.0),
}


@pytest.mark.parametrize("family", list(OLD_KEYS))
def test_a_folder_in_the_older_keys_loads_as_transformers_reads_it(folders, tmp_path, family):
    folder = _edited(folders[family][1], tmp_path, **OLD_KEYS[family])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ours = from_hf(folder)
    assert ours.config.layer_kinds() == [t.removesuffix("_attention") for t in theirs.config.layer_types]
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (ours(ids) - theirs(ids).logits).abs().max().item() < 1e-5


def test_weights_of_the_wrong_shape_name_the_key_and_both_shapes(folders, tmp_path):
    folder = _edited(folders["qwen3"][1], tmp_path, head_dim=8)
    with pytest.raises(InputError, match=r"config.json: hidden_size 32 disagrees with the weights: "
                                         r"model.layers.0.self_attn.q_proj.weight is \(64, 32\) \(blocks.0.attn.q_proj"
                                         r".weight has shape \(64, 32\) in the checkpoint but \(32, 32\) in its "
                                         r"config\)"):
        from_hf(folder)
