"""LoRA adapters (attnlab.layers.lora): the update they add, packed projections, roles,
merging, and the decoding paths that join weights."""

import copy

import pytest
import torch
from torch import nn

from attnlab.cli import main
from attnlab.errors import InputError
from attnlab.layers.lora import LoRALinear, apply_lora, is_adapter_key, lora_layers, mark_only_lora_trainable, merge_lora
from attnlab.models import create_model

from hf_folders import VOCAB, llama_folder, text_file


def _nonzero(model: nn.Module, seed: int = 0) -> None:
    """B starts at zero (the update too): give it values, so that tests see the update."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=gen) * 0.1)


def test_update_is_scaled_low_rank_product_and_starts_at_zero():
    torch.manual_seed(0)
    base = nn.Linear(6, 4)
    layer = LoRALinear(base, rank=2, alpha=8.0)
    x = torch.randn(3, 6)
    assert torch.equal(layer(x), base(x))  # B = 0: the adapted model starts as the model
    assert layer.weight is base.weight
    _nonzero(nn.Sequential(layer))
    expected = base(x) + 4.0 * (x @ layer.lora_A.T @ layer.lora_B.T)
    torch.testing.assert_close(layer(x), expected)


def test_packed_layer_has_one_adapter_per_part_and_rows_match():
    torch.manual_seed(0)
    base = nn.Linear(8, 12)
    layer = LoRALinear(base, rank=2, alpha=2.0, parts=3)
    _nonzero(nn.Sequential(layer))
    x = torch.randn(5, 8)
    a, b = layer.lora_A, layer.lora_B
    parts = [base(x)[:, 4 * p:4 * p + 4] + x @ a[2 * p:2 * p + 2].T @ b[4 * p:4 * p + 4].T for p in range(3)]
    torch.testing.assert_close(layer(x), torch.cat(parts, dim=-1))
    torch.testing.assert_close(layer.forward_rows(x, 4, 12), layer(x)[:, 4:])
    torch.testing.assert_close(layer.merged()(x), layer(x))
    with pytest.raises(InputError, match="whole blocks"):
        layer.forward_rows(x, 2, 6)


def test_roles_select_attention_and_mlp_layers():
    model = create_model("vit_digits_patch2", num_classes=3)
    attn = apply_lora(copy.deepcopy(model), rank=2, targets=["attention"])
    assert attn and all(n.endswith(tuple(f"attn.{p}_proj" for p in "qkvo")) for n in attn)
    mlp = apply_lora(copy.deepcopy(model), rank=2, targets=["mlp"])
    assert mlp and all(n.endswith(("mlp.fc1", "mlp.fc2")) for n in mlp)
    named = apply_lora(copy.deepcopy(model), rank=2, targets=["blocks.0.*"])
    assert named == [*(f"blocks.0.attn.{p}_proj" for p in "qkvo"), "blocks.0.mlp.fc1", "blocks.0.mlp.fc2"]
    assert apply_lora(copy.deepcopy(model), rank=2, targets=["o_proj"]) == [n for n in attn if "o_proj" in n]
    with pytest.raises(InputError, match="did you mean attention"):
        apply_lora(copy.deepcopy(model), rank=2, targets=["atention"])
    with pytest.raises(InputError, match="rank"):
        apply_lora(copy.deepcopy(model), rank=0)


@pytest.mark.parametrize("name,options,inputs", [
    ("vit_digits_patch2", {"num_classes": 3}, lambda: (torch.randn(2, 1, 8, 8),)),
    ("bert_tiny", {"num_classes": 2, "vocab_size": 50},
     lambda: (torch.randint(1, 50, (2, 7)), torch.tensor([[1] * 7, [1] * 4 + [0] * 3]))),
])
def test_merged_model_equals_adapted_model(name, options, inputs):
    torch.manual_seed(0)
    model = create_model(name, **options)
    apply_lora(model, rank=4, alpha=8, targets=["attention", "mlp"], dropout=0.1)
    _nonzero(model)
    model.eval()
    args = inputs()
    with torch.no_grad():
        adapted = model(*args)
        merged_model = merge_lora(copy.deepcopy(model))
        assert not lora_layers(merged_model)
        merged = merged_model(*args)
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=1e-5)


def test_only_adapters_and_head_train():
    model = create_model("bert_tiny", num_classes=2, vocab_size=50)
    total = sum(p.numel() for p in model.parameters())
    apply_lora(model, rank=2, targets=["attention"])
    trainable = mark_only_lora_trainable(model, keep=["head"])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(is_adapter_key(n) or n.startswith("head.") for n in names)
    assert trainable == sum(p.numel() for p in model.parameters() if p.requires_grad) < total // 10
    out = model(torch.randint(1, 50, (2, 5)))
    out.sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)


def test_language_model_decoding_uses_the_adapters():
    """GPT's decoding joins its projections' weights: a LoRA layer's join is its merged weight."""
    torch.manual_seed(0)
    model = create_model("gpt_tiny", vocab_size=40, max_len=32)
    apply_lora(model, rank=2, targets=["attention", "mlp"])
    _nonzero(model)
    model.eval()
    prompt = torch.randint(0, 40, (1, 5))
    cached = model.generate(prompt, max_new_tokens=6, temperature=0.0)
    uncached = model.generate(prompt, max_new_tokens=6, temperature=0.0, use_cache=False)
    plain = merge_lora(copy.deepcopy(model)).generate(prompt, max_new_tokens=6, temperature=0.0)
    assert torch.equal(cached, uncached) and torch.equal(cached, plain)


def test_the_recipe_checks_model_lora(tmp_path):
    from attnlab.engine.config import ConfigError
    from attnlab.recipes import load_recipe

    (tmp_path / "r.csv").write_text("text,label\na,b\n", encoding="utf-8")
    data = f"data.train={tmp_path / 'r.csv'}"
    (tmp_path / "w.safetensors").write_bytes(b"")  # checked to exist; not read while a recipe loads
    start = f"model.checkpoint={tmp_path / 'w.safetensors'}"
    recipe = load_recipe("text-classification", [data, start, "model.lora.rank=4"])
    assert recipe.model.lora.rank == 4 and recipe.model.lora.alpha == 16 and recipe.model.lora.targets == ["attention"]
    with pytest.raises(ConfigError, match="model.lora needs model.checkpoint"):
        load_recipe("text-classification", [data, "model.lora.rank=4"])
    with pytest.raises(ConfigError, match="model.lora.rank must be"):
        load_recipe("text-classification", [data, start, "model.lora.rank=0"])
    with pytest.raises(ConfigError, match="leave model.freeze_backbone"):
        load_recipe("text-classification", [data, start, "model.lora.rank=4",
                                            "model.freeze_backbone=true"])
    with pytest.raises(ConfigError, match="model.lora: targets \\['atention'\\] select no linear layer.*did you mean attention"):
        load_recipe("text-classification", [data, start, "model.lora.targets=[atention]"])


# ---------------------------------------------------------------------------- ranks


def test_a_lora_rank_above_the_smaller_side_of_a_layer_is_refused_naming_it():
    model = create_model("sentiment_transformer_tiny", vocab_size=100, embed_dim=32, num_heads=2)
    with pytest.raises(InputError, match=r"^rank must be at most 32, the smaller side of layer "
                                         r"encoder.layers.0.self_attn.q_proj \(32 inputs, 32 outputs\); got 100000$"):
        apply_lora(model, rank=100000, targets=["q_proj"])
    cross = create_model("transformer_tiny", embed_dim=32, num_heads=2)  # cross-attention is the exact kind too
    with pytest.raises(InputError, match=r"^rank must be at most 32, the smaller side of layer "
                                         r"transformer.decoder.layers.0.cross_attn.q_proj \(32 inputs, 32 outputs\); "
                                         r"got 100000$"):
        apply_lora(cross, rank=100000, targets=["transformer.decoder.layers.*.cross_attn.q_proj"])
    assert apply_lora(model, rank=32, targets=["attention"])  # full rank is the limit, and allowed


def test_the_recipe_names_model_lora_rank(tmp_path, capsys):
    from tokenizers import Tokenizer, models

    folder, txt = llama_folder(tmp_path / "f"), text_file(tmp_path)
    words = {f"w{i}": i for i in range(VOCAB - 2)} | {"[UNK]": VOCAB - 2, "</s>": VOCAB - 1}
    Tokenizer(models.WordLevel(words, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))  # lm-text reads it
    assert main(["recipes", "lm-text", f"data.path={txt}", "model.name=", f"model.checkpoint={folder}",
                 "text.context=32", "model.lora.rank=100000"]) == 2  # the folder holds 64 positions
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert ("model.lora.rank must be at most 32, the smaller side of layer blocks.0.attn.q_proj (32 inputs, "
            "32 outputs); got 100000") in err
