"""The attention sentiment classifier: shapes, padding invariance, masks, torch parity, learning."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention import SelfAttention
from attnlab.attention import registry as attention_registry
from attnlab.models import count_parameters, create_model, model_entry
from attnlab.models.sentiment import AttentionSentimentClassifier, SentimentConfig

VOCAB = 50


def tiny(**overrides):
    kw = dict(vocab_size=VOCAB, drop_rate=0.0, attn_drop_rate=0.0, pos_drop_rate=0.0)
    return create_model("sentiment_transformer_tiny", **{**kw, **overrides})


def sentences(lengths, vocab=VOCAB):
    """Right-padded ids (token 1 first, as [CLS]) and the Hugging Face mask (1 = real)."""
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, 0] = 1
        ids[i, 1:n] = torch.randint(2, vocab, (n - 1,))
        mask[i, :n] = 1
    return ids, mask


def repad(ids, mask, length, fill=0):
    """The same sentences padded to ``length`` with ``fill`` ids under a zero mask."""
    b, n = ids.shape
    new_ids = torch.full((b, length), fill, dtype=ids.dtype)
    new_mask = torch.zeros(b, length, dtype=mask.dtype)
    new_ids[:, :n] = ids * mask + fill * (1 - mask)
    new_mask[:, :n] = mask
    return new_ids, new_mask


def test_shapes_registry_and_parameter_counts():
    model = tiny().eval()
    ids, mask = sentences([5, 9, 2])
    assert model(ids, mask).shape == (3, 2)
    assert model.forward_features(ids, mask).shape == (3, 9, 64)
    assert tiny(num_classes=5)(ids, mask).shape == (3, 5)
    assert tiny(depth=0)(ids, mask).shape == (3, 2)  # bag of embeddings: no attention at all
    assert model_entry("sentiment_transformer_small").family == "text"
    # E=128, 2 layers, FFN 512: embedding 16000*E; per layer attention 4E^2+4E, FFN 2*E*512+512+E,
    # two norms 4E; final norm 2E; head 2E+2.
    e = 128
    layer = 4 * e * e + 4 * e + 2 * e * 512 + 512 + e + 4 * e
    with torch.device("meta"):  # as `attnlab models` builds them
        small = create_model("sentiment_transformer_small")
    assert count_parameters(small) == 16000 * e + 2 * layer + 2 * e + 2 * e + 2 == 2_445_058
    assert isinstance(create_model("sentiment_transformer_small", vocab_size=100), AttentionSentimentClassifier)
    direct = AttentionSentimentClassifier(SentimentConfig(vocab_size=100, pooling="cls"), depth=1)
    assert (direct.config.pooling, len(direct.encoder.layers)) == ("cls", 1)


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_padding_does_not_change_the_logits(pooling, norm_first):
    model = tiny(pooling=pooling, norm_first=norm_first, depth=2, pos_embed="learned").eval()
    ids, mask = sentences([4, 11, 7, 2])
    with torch.no_grad():
        ref = model(ids, mask)
        # Longer padding, filled with arbitrary ids: only the mask says what is padding.
        long_ids, long_mask = repad(ids, mask, 30, fill=17)
        torch.testing.assert_close(model(long_ids, long_mask), ref, atol=1e-5, rtol=0)
        # Each sentence alone, unpadded, gives the same logits as in the padded batch.
        for i, n in enumerate(mask.sum(1).tolist()):
            torch.testing.assert_close(model(ids[i : i + 1, :n]), ref[i : i + 1], atol=1e-5, rtol=0)
        # A boolean mask works like the 0/1 one.
        torch.testing.assert_close(model(long_ids, long_mask.bool()), ref, atol=1e-5, rtol=0)


def test_without_a_mask_padding_idx_marks_padding():
    model = tiny().eval()
    ids, mask = sentences([3, 8])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), model(ids, mask), atol=0, rtol=0)
        unmasked = tiny(padding_idx=None)
        unmasked.load_state_dict(model.state_dict())
        assert not torch.allclose(unmasked.eval()(ids)[0], model(ids)[0], atol=1e-3)  # padding attended


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_fully_masked_row_gives_finite_logits_and_gradients(pooling):
    model = tiny(pooling=pooling, depth=2)
    ids, mask = sentences([6, 4])
    mask[1] = 0
    logits = model(ids, mask)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # The other row is unaffected by its empty neighbour.
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids, mask)[0], model(ids[:1, :6])[0], atol=1e-5, rtol=0)


def test_gradient_reaches_embeddings_and_every_parameter():
    model = tiny(drop_rate=0.1, attn_drop_rate=0.1, pos_drop_rate=0.1).train()
    ids, mask = sentences([5, 9, 3])
    F.cross_entropy(model(ids, mask), torch.tensor([0, 1, 1])).backward()
    grad = model.embed.weight.grad
    used = ids[mask.bool()].unique()
    assert (grad[used].abs().sum(-1) > 0).all()
    assert grad[0].abs().sum() == 0  # padding_idx row stays zero
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def sinusoids(length, dim):
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    i = torch.arange(0, dim, 2, dtype=torch.float64)
    angle = pos / 10000 ** (i / dim)
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = angle.sin(), angle.cos()
    return table.float()


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first,activation,pooling", [(True, "gelu", "mean"), (False, "relu", "cls")])
def test_equals_torch_encoder_with_copied_weights(norm_first, activation, pooling):
    e, heads, ff, depth = 32, 4, 64, 2
    model = tiny(embed_dim=e, num_heads=heads, mlp_ratio=ff / e, depth=depth, norm_first=norm_first,
                 activation=activation, pooling=pooling).eval()
    layer = nn.TransformerEncoderLayer(e, heads, ff, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first)
    ref = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(e) if norm_first else None,
                                enable_nested_tensor=False).eval()
    with torch.no_grad():  # perturb norms and biases so that every mapping matters
        for p in ref.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    renames = {"linear1.": "ff.fc1.", "linear2.": "ff.fc2.", "in_proj_weight": "in_proj.weight",
               "in_proj_bias": "in_proj.bias"}
    state = {}
    for key, value in ref.state_dict().items():
        for old, new in renames.items():
            key = key.replace(old, new)
        state["encoder." + key] = value
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and sorted(missing) == ["embed.weight", "head.bias", "head.weight"]

    ids, mask = sentences([7, 3, 5])
    pad = mask == 0
    with torch.no_grad():
        x = model.embed.weight[ids] * math.sqrt(e) + sinusoids(7, e)
        h = ref(x, src_key_padding_mask=pad)
        if pooling == "cls":
            pooled = h[:, 0]
        else:
            pooled = torch.stack([h[i][~pad[i]].mean(0) for i in range(3)])
        expected = pooled @ model.head.weight.T + model.head.bias
        torch.testing.assert_close(model(ids, mask), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("overrides, message", [
    (dict(pooling="max"), r"pooling must be one of \['cls', 'mean'\]; got 'max'"),
    (dict(embed_dim=66), "embed_dim must be divisible by num_heads; got embed_dim=66, num_heads=4"),
    (dict(attention="relpos2d"), "attention must be a 'tokens' kind; 'relpos2d' is a grid kind"),
    (dict(attention="exactt"), "unknown attention 'exactt'"),
    (dict(pos_embed="rotary"), "pos_embed must be one of"),
    (dict(padding_idx=VOCAB), "padding_idx must be None or in"),
    (dict(drop_rate=1.0), r"SentimentConfig.drop_rate must be >= 0.0 and < 1.0; got 1.0"),
    (dict(dropout=0.1), "SentimentConfig field 'dropout' is now called 'drop_rate'"),
    (dict(depth=-1), "depth must be a non-negative integer"),
    (dict(vocab_size=0), "SentimentConfig.vocab_size must be >= 1; got 0"),
    (dict(attention_options={"dropout": 0.1}), "the model sets it from attn_drop_rate"),
    (dict(poolling="cls"), "unknown SentimentConfig field 'poolling'; did you mean pooling"),
])
def test_config_errors_name_the_argument(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny(**overrides)


def test_wrong_inputs_are_clear_errors():
    model = tiny(max_len=16)
    ids, mask = sentences([5, 3])
    with pytest.raises(ValueError, match=r"input_ids must be integer token ids of shape \(B, L\)"):
        model(ids[0])
    with pytest.raises(ValueError, match=r"input_ids must be integer token ids"):
        model(ids.float())
    with pytest.raises(ValueError, match=r"attention_mask must have the shape of input_ids \(2, 5\); got \(2, 4\)"):
        model(ids, mask[:, :4])
    with pytest.raises(ValueError, match="exceed max_len=16"):
        model(torch.ones(1, 17, dtype=torch.long))


def test_attention_maps_are_distributions_over_real_keys():
    model = tiny(depth=2).eval()
    ids, mask = sentences([6, 3, 9])
    mask[2] = 0  # a row with no real token
    with torch.no_grad():
        maps = model.attention_maps(ids, mask)
    assert [tuple(m.shape) for m in maps] == [(3, 4, 9, 9)] * 2
    for m in maps:
        for i, n in enumerate([6, 3]):
            torch.testing.assert_close(m[i, :, :n, :n].sum(-1), torch.ones(4, n))  # real queries
            assert (m[i, :, :, n:] == 0).all()  # padded keys get nothing, from any query
        assert (m[2] == 0).all()


@pytest.mark.parametrize("norm_first,pooling", [(True, "cls"), (True, "mean"), (False, "mean")])
def test_forward_with_attention_equals_forward(norm_first, pooling):
    model = tiny(depth=3, norm_first=norm_first, pooling=pooling).eval()
    ids, mask = sentences([8, 5])
    with torch.no_grad():
        logits, maps = model.forward_with_attention(ids, mask)
        torch.testing.assert_close(logits, model(ids, mask), atol=1e-5, rtol=0)
    assert len(maps) == 3


def test_grad_checkpointing_gives_the_same_gradients():
    model = tiny(depth=2).train()
    ids, mask = sentences([6, 4])
    target = torch.tensor([1, 0])

    def grads():
        model.zero_grad()
        F.cross_entropy(model(ids, mask), target).backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    model.set_grad_checkpointing(True)
    assert model.encoder.grad_checkpointing
    for a, b in zip(grads(), plain):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_a_registered_tokens_kind_is_used_with_its_options(monkeypatch):
    class ScaledSelfAttention(SelfAttention):
        def __init__(self, embed_dim, num_heads, *, gain=1.0, **kw):
            super().__init__(embed_dim, num_heads, **kw)
            self.gain = gain

        def forward(self, x, **kw):
            out, w = super().forward(x, **kw)
            return out * self.gain, w

    monkeypatch.setattr(attention_registry, "_KINDS", dict(attention_registry._KINDS))
    attention_registry.register_attention("scaled_test", forms_weights=True)(ScaledSelfAttention)
    model = tiny(attention="scaled_test", attention_options={"gain": 0.0}).eval()
    assert all(isinstance(layer.self_attn, ScaledSelfAttention) for layer in model.encoder.layers)
    assert model.encoder.layers[0].self_attn.gain == 0.0
    # gain 0 removes the attention branch: the result equals an attention-free computation.
    ids, mask = sentences([5, 3])
    exact = tiny().eval()
    exact.load_state_dict(model.state_dict())
    with torch.no_grad():
        layer = exact.encoder.layers[0]
        x = exact.embed(ids) * 8 + exact.pos.table[:5]
        x = x + layer.ff(layer.norm2(x))
        expected = exact.pool(exact.encoder.norm(x), mask == 0) @ exact.head.weight.T + exact.head.bias
        torch.testing.assert_close(model(ids, mask), expected, atol=1e-5, rtol=0)
        assert not torch.allclose(exact(ids, mask), expected, atol=1e-3)


def contains_five(n, generator, vocab=16, max_tokens=10):
    """[CLS]=1 + 3..10 tokens from 2..15; label 1 when token 5 appears."""
    lengths = torch.randint(3, max_tokens + 1, (n,), generator=generator)
    others = torch.tensor([t for t in range(2, vocab) if t != 5])
    tokens = others[torch.randint(0, len(others), (n, max_tokens), generator=generator)]
    labels = torch.randint(0, 2, (n,), generator=generator)
    where = (torch.rand(n, generator=generator) * lengths).long()
    tokens[labels.bool(), where[labels.bool()]] = 5
    real = torch.arange(max_tokens) < lengths[:, None]
    ids = torch.cat([torch.ones(n, 1, dtype=torch.long), tokens * real], dim=1)
    mask = torch.cat([torch.ones(n, 1, dtype=torch.long), real.long()], dim=1)
    return ids, mask, labels


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_tiny_model_learns_whether_token_5_appears(pooling):
    g = torch.Generator().manual_seed(0)
    model = tiny(vocab_size=16, pooling=pooling)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        ids, mask, y = contains_five(64, g)
        loss = F.cross_entropy(model(ids, mask), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    ids, mask, y = contains_five(1000, g)
    with torch.no_grad():
        accuracy = (model.eval()(ids, mask).argmax(-1) == y).float().mean().item()
    assert accuracy > 0.95


LENGTH_FREE = {"exact": {}, "local": {"window": 8}, "linear": {}, "lsa": {}, "performer": {},
               "linformer": {"seq_len": 128}, "sparse-fixed": {"pattern": "fixed", "block": 8},
               "sparse-strided": {"pattern": "strided", "block": 8}}
LENGTH_BOUND = {"sparse-bigbird": {"pattern": "bigbird", "block": 8}, "nystrom": {"num_landmarks": 8}}


def _classifier(kind: str, options: dict):
    torch.manual_seed(0)
    return create_model("sentiment_transformer_tiny", vocab_size=VOCAB, attention=kind.split("-")[0],
                        attention_options=options).eval()


@pytest.mark.parametrize("kind", sorted(LENGTH_FREE))
def test_the_same_sentence_padded_to_any_length_gives_the_same_logits(kind):
    model = _classifier(kind, LENGTH_FREE[kind])
    ids = torch.randint(5, VOCAB, (2, 37))
    with torch.no_grad():
        alone = model(ids)
        for length in (64, 100, 128):
            padded = torch.cat([ids, torch.zeros(2, length - 37, dtype=torch.long)], 1)
            torch.testing.assert_close(model(padded), alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(LENGTH_BOUND))
def test_kinds_bound_to_the_length_ignore_what_the_padding_holds_but_not_its_length(kind):
    model = _classifier(kind, LENGTH_BOUND[kind])
    ids = torch.randint(5, VOCAB, (2, 37))
    mask = torch.cat([torch.ones(2, 37), torch.zeros(2, 63)], 1).long()
    with torch.no_grad():
        zeros = model(torch.cat([ids, torch.zeros(2, 63, dtype=torch.long)], 1), mask)
        noise = model(torch.cat([ids, torch.randint(5, VOCAB, (2, 63))], 1), mask)
        torch.testing.assert_close(noise, zeros, atol=1e-5, rtol=1e-5)  # what padding holds: nothing
        assert (model(ids) - zeros).abs().max() > 1e-4  # its length: something, as the docstring says
