"""attnlab's LoRA against peft's on the same transformers model: with the same base weights,
rank, alpha, targets and adapter values, the logits and the adapters' gradients are equal
(float32, padding included). peft and transformers are test-only dependencies (the dev
extra); the training-step speed comparison is a benchmark (benchmarks/lora_peft.py)."""

import pytest
import torch

from attnlab.layers.lora import apply_lora, lora_layers
from attnlab.formats import from_hf

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")
peft = pytest.importorskip("peft", reason="peft is a test-only dependency (the dev extra)")

# peft's target_modules for each attnlab role, on BERT's module names
PEFT_TARGETS = {"attention": r".*encoder\.layer\.\d+\.attention\.(self\.(query|key|value)|output\.dense)",
                "mlp": r".*encoder\.layer\.\d+\.(intermediate\.dense|output\.dense)"}
# BERT's layer i -> attnlab's: (theirs, ours, which part of a packed projection or None: none is packed now)
LAYERS = [("attention.self.query", "self_attn.q_proj", None), ("attention.self.key", "self_attn.k_proj", None),
          ("attention.self.value", "self_attn.v_proj", None), ("attention.output.dense", "self_attn.o_proj", None),
          ("intermediate.dense", "ff.fc1", None), ("output.dense", "ff.fc2", None)]


def _pairs(peft_model, ours, depth, roles):
    """(their LoRA layer, our LoRALinear, part) for every adapted layer."""
    mine = dict(lora_layers(ours))
    for i in range(depth):
        for theirs, name, part in LAYERS:
            role = "attention" if theirs.startswith("attention") else "mlp"
            if role in roles:
                yield (peft_model.get_submodule(f"base_model.model.bert.encoder.layer.{i}.{theirs}"),
                       mine[f"encoder.layers.{i}.{name}"], part)


@pytest.mark.parametrize("roles", [("attention",), ("attention", "mlp")])
def test_lora_forward_and_gradients_equal_peft(tmp_path, roles):
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=72, max_position_embeddings=40, num_labels=3,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(tmp_path)
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    pattern = "|".join(f"(?:{PEFT_TARGETS[r]})" for r in roles)
    theirs = peft.get_peft_model(theirs, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=pattern))
    ours = from_hf(tmp_path)
    apply_lora(ours, rank=4, alpha=8, targets=list(roles))
    pairs = list(_pairs(theirs, ours, 2, roles))
    assert len(pairs) == (6 if "mlp" in roles else 4) * 2 and len(lora_layers(ours)) == len(pairs)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # B left zero by both would hide the update: random B, copied over
        for layer, mine, part in pairs:
            a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=gen) * 0.2)
            rows = slice(None) if part is None else slice(part * 32, (part + 1) * 32)
            mine.lora_B[rows] = b
            mine.lora_A[slice(None) if part is None else slice(part * 4, (part + 1) * 4)] = a
    ids = torch.randint(3, 99, (3, 9), generator=gen)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:], mask[2, 2:] = 0, 0
    ids[mask == 0] = 0
    theirs.eval(), ours.eval()
    expected = theirs(input_ids=ids, attention_mask=mask).logits
    logits = ours(ids, mask)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    expected.square().sum().backward()
    logits.square().sum().backward()
    for layer, mine, part in pairs:
        rows_b = slice(None) if part is None else slice(part * 32, (part + 1) * 32)
        rows_a = slice(None) if part is None else slice(part * 4, (part + 1) * 4)
        torch.testing.assert_close(mine.lora_B.grad[rows_b], layer.lora_B["default"].weight.grad, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mine.lora_A.grad[rows_a], layer.lora_A["default"].weight.grad, atol=1e-5, rtol=1e-4)
