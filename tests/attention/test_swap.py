"""Every registered attention kind plugs into the models that take one, trains a step
with gradient checkpointing, and keeps the model's checkpoint keys of exact attention."""

import inspect

import pytest
import torch

from attnlab.attention import list_attention, attention_entry
from attnlab.models import create_model

TOKEN_OPTIONS = {"exact": {}, "local": {"sliding_window": 8}, "sparse": {"block": 8}, "linear": {}, "performer": {},
                 "linformer": {"seq_len": 64, "k": 16}, "nystrom": {"num_landmarks": 8}, "lsa": {},
                 "topk": {"top_k": 4}, "lsh": {"bucket_size": 8, "n_buckets": 4}, "differential": {}, "sinks": {}, "latent": {}, "gated_delta": {}, "dsa": {"index_topk": 4},
                 "nsa": {"block": 4, "num_selected": 1}}  # rotary positions: the models' pos_embed="rope" (test_inner_positions.py)
ENCODER_KINDS = [k for k in sorted(TOKEN_OPTIONS) if not attention_entry(k).capabilities.causal_only]  # a state, blocks seen once complete
GRID_OPTIONS = {"relpos2d": {}, "axial": {}, "standalone2d": {"kernel_size": 3}}


def test_the_option_tables_cover_the_registry():
    assert sorted(TOKEN_OPTIONS) == list_attention("tokens") and sorted(GRID_OPTIONS) == list_attention("grid")


def test_gqa_is_the_older_name_of_exact_attention_with_any_number_of_key_value_heads():
    from attnlab.attention import GroupedQueryAttention, build_attention

    grouped = build_attention("gqa", 32, 4, num_kv_heads=2)
    assert type(grouped) is GroupedQueryAttention and type(build_attention("exact", 32, 4)) is GroupedQueryAttention
    assert "gqa" not in list_attention() and grouped.num_kv_heads == 2
    m = create_model("sentiment_transformer_tiny", vocab_size=100, attention="gqa", attention_options={"num_kv_heads": 2})
    assert m(torch.randint(0, 100, (2, 9)), torch.ones(2, 9, dtype=torch.long)).shape == (2, 2)


def test_a_decoders_layers_say_the_kinds_own_name_whatever_name_the_config_used():
    from attnlab.attention.registry import canonical_attention
    from attnlab.models.convert import ConvertAttention, convert_options
    from attnlab.formats.hf.export import _layer_types

    assert canonical_attention("gqa") == canonical_attention("exact") == "exact"
    model = create_model("gpt_tiny", vocab_size=50, attention="gqa", depth=2, pos_embed="rope")
    assert {layer.attention for layer in model.config.layer_plan()} == {"exact"}
    assert _layer_types(model.config) == ["full", "full"]  # what a Hugging Face decoder computes: not refused
    options = {"vocab_size": 50, "depth": 2, "attention": "gqa", "pos_embed": "rope", "max_len": 64}
    assert convert_options(options, ConvertAttention(window=16))  # a softmax kind that slides: not refused


@pytest.mark.parametrize("kind", ENCODER_KINDS)
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
    assert all(p.grad is not None for n, p in m.named_parameters() if "self_attn.q_proj" in n)
    if kind == "nystrom":
        return  # its landmarks are segment means over the padded length: invariant to padded values, not to length
    # padding never changes a real sentence's logits
    m.eval()
    longer = torch.cat([ids[1:2, :30], torch.zeros(1, 10, dtype=torch.long)], 1)
    torch.testing.assert_close(m(ids[1:2, :30], mask[1:2, :30]), m(longer, mask[1:2]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", [k for k in ENCODER_KINDS if k not in ("linformer", "nystrom")])
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


@pytest.mark.parametrize("kind", ENCODER_KINDS)
def test_translator_encoder_with_each_kind(kind):
    torch.manual_seed(0)
    m = create_model("transformer_tiny", src_vocab_size=50, tgt_vocab_size=50, attention=kind,
                     attention_options=TOKEN_OPTIONS[kind])
    exact = create_model("transformer_tiny", src_vocab_size=50, tgt_vocab_size=50)
    kept = set(exact.state_dict())
    if kind in ("latent", "dsa"):  # DeepSeek's projections: q_proj or q_a/q_b, kv_a_proj_with_mqa, kv_b_proj, o_proj
        kept = {k for k in kept if ".encoder.layers." not in k or ".self_attn." not in k or "o_proj" in k
                or kind == "latent" and "q_proj.weight" in k}  # (latent's query projection has no bias)
    assert kept <= set(m.state_dict())  # a kind may add its own (Linformer's E, F, ...)
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


def test_vit_rejects_a_grid_kind():
    with pytest.raises(ValueError, match="attention must be a 'tokens' kind; 'axial' is a grid kind"):
        create_model("vit_digits_patch2", attention="axial")


@pytest.mark.parametrize("kind", sorted(TOKEN_OPTIONS) + sorted(GRID_OPTIONS))
def test_every_kind_is_built_from_embed_dim_and_num_heads(kind):
    from attnlab.attention import registry

    assert list(inspect.signature(registry._KINDS[kind].cls).parameters)[:2] == ["embed_dim", "num_heads"]
    options = TOKEN_OPTIONS[kind] if kind in TOKEN_OPTIONS else {"size": (4, 4), **GRID_OPTIONS[kind]}
    m = registry.build_attention(kind, 32, 4, **options)
    assert (m.embed_dim, m.num_heads) == (32, 4)


def test_build_attention_options_are_the_keywords_after_width_and_heads(monkeypatch):
    from attnlab.attention import registry
    from attnlab.attention.multihead import SelfAttention

    # The width and the heads are no options, whatever a kind calls them.
    with pytest.raises(ValueError,
                       match="unknown option 'dim' of attention 'local'; options: bias, dropout, rope, rope_theta, sliding_window$"):
        registry.build_attention("local", 32, 4, dim=32)

    class Plugin(SelfAttention):  # a kind registered by a plugin, with its own names for the first two
        def __init__(self, dim, heads, *, gain=1.0, dropout=0.0):
            super().__init__(dim, heads, dropout=dropout)
            self.gain = gain

    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    registry.register_attention("plugin_test")(Plugin)
    assert registry.build_attention("plugin_test", 16, 2, gain=0.5).gain == 0.5
    with pytest.raises(ValueError, match="unknown option 'gian' of attention 'plugin_test'; did you mean gain"):
        registry.build_attention("plugin_test", 16, 2, gian=0.5)
    with pytest.raises(ValueError, match="unknown option 'heads' of attention 'plugin_test'; options: dropout, gain$"):
        registry.build_attention("plugin_test", 16, 2, heads=2)


DECODER_KINDS = [k for k in sorted(TOKEN_OPTIONS) if attention_entry(k).capabilities.causal]


@pytest.mark.parametrize("kind", DECODER_KINDS)
def test_translator_decoder_with_each_kind_that_is_causal(kind):
    """The encoder-decoder's self-attention is any registry kind that honours a causal mask: it
    trains, each target position sees only those before it, and its cached decoding (the kind's
    own cache, where it keeps one) gives the tokens decoding without a cache gives."""
    torch.manual_seed(0)
    m = create_model("transformer_tiny", src_vocab_size=50, tgt_vocab_size=50, decoder_attention=kind,
                     decoder_attention_options=TOKEN_OPTIONS[kind])
    assert m.transformer.decoder.keeps_cache == attention_entry(kind).capabilities.cache
    src = torch.randint(3, 50, (2, 12))
    src[1, 9:] = 0  # padding
    tgt = torch.randint(3, 50, (2, 9))
    out = m(src, tgt)
    out.sum().backward()
    assert out.shape == (2, 9, 50) and torch.isfinite(out).all()
    m.eval()
    with torch.no_grad():
        full = m(src, tgt)
        prefix = m(src, tgt[:, :5])
        if kind != "lsh":  # LSH's chunks of sorted buckets hold past keys chosen with the later tokens among them
            torch.testing.assert_close(prefix, full[:, :5], atol=1e-5, rtol=0)  # causal: later tokens change nothing
        cached = m.generate(src, max_new_tokens=8)
        assert torch.equal(cached, m.generate(src, max_new_tokens=8, use_cache=False))
        assert m.generate(src, max_new_tokens=5, num_beams=2).shape[0] == 2


def test_translator_decoder_refuses_a_kind_that_cannot_be_causal():
    with pytest.raises(ValueError, match="decoder_attention must be a kind that honours a causal mask .* "
                                         "'linformer' does not"):
        create_model("transformer_tiny", decoder_attention="linformer", decoder_attention_options={"seq_len": 64})
    with pytest.raises(ValueError, match="decoder_attention_options: unknown option 'windw' of attention 'local'"):
        create_model("transformer_tiny", decoder_attention="local", decoder_attention_options={"windw": 8})
