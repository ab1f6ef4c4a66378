"""Every registered attention kind plugs into the models that take one, trains a step
with gradient checkpointing, and keeps the model's checkpoint keys of exact attention."""

import pytest
import torch

from attnlab.attention import list_attention
from attnlab.models import create_model

TOKEN_OPTIONS = {"exact": {}, "local": {"window": 8}, "sparse": {"block": 8}, "linear": {}, "performer": {},
                 "linformer": {"seq_len": 64, "k": 16}, "nystrom": {"num_landmarks": 8}, "lsa": {}}
GRID_OPTIONS = {"relpos2d": {}, "axial": {}, "standalone2d": {"kernel_size": 3}}


def test_the_option_tables_cover_the_registry():
    assert sorted(TOKEN_OPTIONS) == list_attention("tokens") and sorted(GRID_OPTIONS) == list_attention("grid")


@pytest.mark.parametrize("kind", sorted(TOKEN_OPTIONS))
@pytest.mark.parametrize("checkpointing", [False, True])
def test_text_classifier_with_each_kind(kind, checkpointing):
    torch.manual_seed(0)
    m = create_model("sentiment_transformer_tiny", vocab_size=100, attention=kind,
                     attention_options=TOKEN_OPTIONS[kind])
    m.set_grad_checkpointing(checkpointing)
    ids = torch.randint(6, 100, (3, 40))
    mask = torch.ones(3, 40, dtype=torch.long)
    mask[1, 30:] = 0
    out = m(ids, mask)
    out.sum().backward()
    assert out.shape == (3, 2) and torch.isfinite(out).all()
    assert all(p.grad is not None for n, p in m.named_parameters() if "self_attn.in_proj" in n)
    if kind == "nystrom":
        return  # its landmarks are segment means over the padded length: invariant to padded values, not to length
    # padding never changes a real sentence's logits
    m.eval()
    longer = torch.cat([ids[1:2, :30], torch.zeros(1, 10, dtype=torch.long)], 1)
    torch.testing.assert_close(m(ids[1:2, :30], mask[1:2, :30]), m(longer, mask[1:2]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", [k for k in sorted(TOKEN_OPTIONS) if k not in ("linformer", "nystrom")])
def test_vit_with_each_kind(kind):
    m = create_model("vit_digits_patch2", attention=kind, attention_options=TOKEN_OPTIONS[kind])
    m.set_grad_checkpointing(True)
    m.train()
    out = m(torch.randn(2, 1, 8, 8))
    out.sum().backward()
    assert out.shape[0] == 2 and torch.isfinite(out).all()


@pytest.mark.parametrize("kind", sorted(GRID_OPTIONS))
def test_botnet_with_each_grid_kind(kind):
    m = create_model("botnet_cifar", attention=kind, attention_options=GRID_OPTIONS[kind])
    m.set_grad_checkpointing(True)
    out = m(torch.randn(2, 3, 32, 32))
    out.sum().backward()
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_a_kind_that_cannot_be_causal_says_so():
    m = create_model("sentiment_transformer_tiny", vocab_size=100, attention="linformer",
                     attention_options={"seq_len": 64})
    with pytest.raises(ValueError, match="linformer attention cannot be causal"):
        m.encoder.layers[0].self_attn(torch.randn(1, 5, 64), is_causal=True)


@pytest.mark.parametrize("kind", sorted(TOKEN_OPTIONS))
def test_translator_encoder_with_each_kind(kind):
    torch.manual_seed(0)
    m = create_model("transformer_tiny", src_vocab_size=50, tgt_vocab_size=50, attention=kind,
                     attention_options=TOKEN_OPTIONS[kind])
    exact = create_model("transformer_tiny", src_vocab_size=50, tgt_vocab_size=50)
    assert set(exact.state_dict()) <= set(m.state_dict())  # a kind may add its own (Linformer's E, F, ...)
    src = torch.randint(3, 50, (2, 12))
    src[1, 9:] = 0  # padding
    tgt = torch.randint(3, 50, (2, 7))
    m.set_grad_checkpointing(True)
    out = m(src, tgt)
    out.sum().backward()
    assert out.shape == (2, 7, 50) and torch.isfinite(out).all()
    assert m.eval().generate(src, max_new_tokens=5, num_beams=2).shape[0] == 2


def test_translator_rejects_a_grid_kind():
    with pytest.raises(ValueError, match="attention must be a 'tokens' kind; 'axial' is a grid kind"):
        create_model("transformer_tiny", attention="axial")
