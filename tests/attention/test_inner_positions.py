"""Positions given inside the attention (rotary embeddings, ALiBi) in every token model:
exact multi-head attention, the text classifier and the encoder-decoder Transformer, with
the name every model uses (``pos_embed``)."""

import math

import pytest
import torch

from attnlab.attention import DecodingCache, SelfAttention, alibi_slopes, build_attention
from attnlab.attention.multihead import CrossAttention
from attnlab.errors import InputError
from attnlab.models import create_model
from attnlab.models.registry import upgrade_options


def rotate_by_hand(x, positions, theta=10000.0):
    """Rotary embedding written out with complex numbers: feature pair ``(x_i, x_{i+D/2})``
    turned by ``position * theta^(-2i/D)`` (the halves layout)."""
    d = x.shape[-1]
    angles = positions[:, None].double() * theta ** (-torch.arange(0, d, 2).double() / d)  # (L, D/2)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double()) * torch.polar(torch.ones_like(angles),
                                                                                          angles)
    return torch.cat([z.real, z.imag], dim=-1).float()


def heads(module, x):
    """``(q, k, v)`` ``(B, H, L, D)`` of exact attention, by hand."""
    b, n, e = x.shape
    q, k, v = (x @ getattr(module, f"{name}_proj").weight.T + getattr(module, f"{name}_proj").bias for name in "qkv")
    split = lambda t: t.view(b, n, module.num_heads, e // module.num_heads).transpose(1, 2)
    return split(q), split(k), split(v)


def test_exact_attention_with_rope_equals_the_rotation_written_by_hand():
    torch.manual_seed(0)
    attn = SelfAttention(32, 4, rope=True).eval()
    x = torch.randn(2, 7, 32)
    q, k, v = heads(attn, x)
    pos = torch.arange(7)
    logits = rotate_by_hand(q, pos) @ rotate_by_hand(k, pos).transpose(-1, -2) / math.sqrt(8)
    logits = logits.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    expected = (logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, 32) @ attn.o_proj.weight.T + attn.o_proj.bias
    out, _ = attn(x, is_causal=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_exact_attention_with_alibi_penalises_distance_on_both_sides_without_a_causal_mask():
    torch.manual_seed(0)
    attn = SelfAttention(32, 4, alibi=True).eval()
    x = torch.randn(1, 6, 32)
    q, k, _ = heads(attn, x)
    i = torch.arange(6)
    bias = -alibi_slopes(4)[:, None, None] * (i[:, None] - i[None, :]).abs()
    expected = (q @ k.transpose(-1, -2) / math.sqrt(8) + bias).softmax(-1)
    _, weights = attn(x, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("options", [{"rope": True}, {"alibi": True}, {"rope": True, "rope_theta": 500.0}],
                         ids=["rope", "alibi", "rope-theta"])
def test_exact_attention_decodes_with_a_cache_as_in_one_call(options):
    torch.manual_seed(0)
    attn = build_attention("exact", 32, 4, dropout=0.0, **options).eval()
    x = torch.randn(2, 9, 32)
    whole, _ = attn(x, is_causal=True)
    cache = attn.new_cache(2, 9)  # the module makes its own
    steps = [attn(x[:, :4], is_causal=True, cache=cache)[0]]
    steps += [attn(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=0)


def test_positions_inside_attention_are_refused_for_cross_attention():
    cross = CrossAttention(32, 4, rope=True)
    with pytest.raises(InputError, match="self-attention, not to attention over another sequence"):
        cross(torch.randn(1, 3, 32), torch.randn(1, 5, 32))


def tiny_classifier(**overrides):
    kw = dict(vocab_size=50, drop_rate=0.0, attn_drop_rate=0.0, pos_drop_rate=0.0, depth=2)
    return create_model("sentiment_transformer_tiny", **{**kw, **overrides}).eval()


@pytest.mark.parametrize("attention", ["exact", "gqa"])
@pytest.mark.parametrize("pos_embed", ["rope", "alibi"])
def test_classifier_with_inner_positions_ignores_padding_and_sees_word_order(pos_embed, attention):
    torch.manual_seed(0)
    model = tiny_classifier(pos_embed=pos_embed, attention=attention)
    ids = torch.randint(2, 50, (1, 9))
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded), model(ids), atol=1e-5, rtol=0)
        shuffled = ids[:, torch.randperm(9)]
        assert not torch.allclose(model(shuffled), model(ids), atol=1e-4)  # mean pooling alone is orderless
    orderless = tiny_classifier(pos_embed="none")
    with torch.no_grad():
        torch.testing.assert_close(orderless(shuffled), orderless(ids), atol=1e-5, rtol=0)


def test_classifier_rope_reaches_every_layer_and_trains():
    torch.manual_seed(0)
    model = tiny_classifier(pos_embed="rope", rope_theta=100.0).train()
    assert [layer.self_attn.rotary.theta for layer in model.encoder.layers] == [100.0, 100.0]
    ids, labels = torch.randint(2, 50, (8, 12)), torch.randint(0, 2, (8,))
    torch.nn.functional.cross_entropy(model(ids), labels).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_inner_positions_need_a_kind_that_takes_them():
    with pytest.raises(InputError, match=r"pos_embed='rope' is given inside the attention, and "
                                         r"attention='linear' does not take it; kinds that do: differential, dsa, exact, latent, linformer, local, lsh"):
        tiny_classifier(pos_embed="rope", attention="linear")
    with pytest.raises(InputError, match="attention_options must not set 'rope': the model sets it from pos_embed"):
        tiny_classifier(attention_options={"rope": True})
    with pytest.raises(InputError, match="pos_embed must be one of"):
        create_model("transformer_tiny", pos_embed="rotary")


def test_the_old_name_pos_encoding_reads_as_pos_embed():
    assert upgrade_options("sentiment_transformer_small", {"pos_encoding": "learned"}) == {"pos_embed": "learned"}
    assert upgrade_options("transformer_tiny", {"pos_encoding": "none"}) == {"pos_embed": "none"}
    with pytest.raises(InputError, match="'pos_encoding' is now called 'pos_embed'"):
        tiny_classifier(pos_encoding="learned")


@pytest.mark.parametrize("pos_embed", ["rope", "alibi"])
def test_transformer_with_inner_positions_generates_with_its_cache_as_without(pos_embed):
    # (its decoding step by step with the cache: models/test_transformer.py::test_decoder_cache_equals_full_decoding)
    torch.manual_seed(0)
    m = create_model("transformer_tiny", pos_embed=pos_embed, drop_rate=0.0).eval()
    assert m.transformer.decoder.layers[0].cross_attn.rotary is None  # the cross-attention has no positions
    src = torch.randint(3, 1000, (3, 8))
    src[1, 5:] = 0
    for beams in (1, 3):
        assert torch.equal(m.generate(src, num_beams=beams, max_new_tokens=6),
                           m.generate(src, num_beams=beams, max_new_tokens=6, use_cache=False))
