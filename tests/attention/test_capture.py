"""capture_attention: the recorded weights are the ones need_weights=True gives, the outputs
do not change, and outside the block the fused kernel runs again (also after an error)."""

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.attention import (CrossAttention, GroupedQueryAttention, DecodingCache, MultiHeadAttention, RelPosSelfAttention2d, SelfAttention,
                               capture_attention)
from attnlab.models import create_model


def _padding(batch: int, length: int) -> torch.Tensor:
    pad = torch.zeros(batch, length, dtype=torch.bool)
    pad[0, length - 2 :] = True
    return pad


def _call_args(model, module, *inputs, **kw):
    """The (args, kwargs) ``module`` is called with when ``model(*inputs)`` runs."""
    seen = []
    handle = module.register_forward_pre_hook(lambda m, a, k: seen.append((a, dict(k))), with_kwargs=True)
    try:
        with torch.no_grad():
            model(*inputs, **kw)
    finally:
        handle.remove()
    return seen[0]


def _cleared(model) -> bool:
    return all(m._attn_capture is None and "_attn_capture" not in m.__dict__ for m in model.modules()
               if isinstance(m, (MultiHeadAttention, GroupedQueryAttention, RelPosSelfAttention2d)))


# ----------------------------------------------------------------------------- modules
def test_recorded_weights_equal_the_need_weights_call_and_the_output_is_unchanged():
    m = SelfAttention(32, 4).eval()
    x, pad = torch.randn(3, 7, 32), _padding(3, 7)
    outside, _ = m(x, key_padding_mask=pad)
    with capture_attention(m) as maps:
        inside, w = m(x, key_padding_mask=pad)
    assert w is None  # the caller did not ask for weights: it gets none
    ref_out, ref_w = m(x, key_padding_mask=pad, need_weights=True, average_attn_weights=False)
    assert list(maps) == [""] and len(maps[""]) == 1
    assert maps[""][0].shape == (3, 4, 7, 7)
    assert torch.equal(maps[""][0], ref_w)
    assert torch.allclose(inside, outside, atol=1e-6) and torch.equal(inside, ref_out)
    assert maps[""][0][0, :, :, 5:].abs().max() == 0  # padded keys get no attention
    assert not maps[""][0].requires_grad


def test_a_caller_that_asks_for_weights_still_gets_them_averaged():
    m = SelfAttention(16, 2).eval()
    x = torch.randn(2, 5, 16)
    _, ref = m(x, need_weights=True)
    with capture_attention(m) as maps:
        _, w = m(x, need_weights=True)
    assert w.shape == (2, 5, 5) and torch.allclose(w, ref)
    assert torch.allclose(maps[""][0].mean(1), ref)


def test_the_fused_kernel_runs_outside_the_block_and_not_inside():
    m = SelfAttention(16, 2).eval()
    x = torch.randn(2, 5, 16)
    with mock.patch("torch.nn.functional.scaled_dot_product_attention",
                    wraps=F.scaled_dot_product_attention) as fused:
        m(x)
        assert fused.call_count == 1
        with capture_attention(m):
            m(x)
        assert fused.call_count == 1  # inside: the explicit softmax, which forms the weights
        m(x)
        assert fused.call_count == 2  # after the block: the fused kernel again
    assert _cleared(m)


def test_an_exception_in_the_block_clears_the_hooks():
    model = create_model("sentiment_transformer_tiny", vocab_size=50).eval()
    with pytest.raises(RuntimeError, match="boom"):
        with capture_attention(model):
            assert not _cleared(model)
            raise RuntimeError("boom")
    assert _cleared(model)


def test_nested_captures_both_record_and_unwind_in_order():
    m = SelfAttention(16, 2).eval()
    x = torch.randn(1, 4, 16)
    with capture_attention(m) as outer:
        m(x)
        with capture_attention(m) as inner:
            m(x)
        m(x)
        assert "_attn_capture" in m.__dict__  # the outer capture is still on
    assert len(outer[""]) == 3 and len(inner[""]) == 1
    assert torch.equal(inner[""][0], outer[""][1])
    assert _cleared(m)


def test_include_patterns_choose_modules_and_a_pattern_matching_none_is_an_error():
    model = create_model("sentiment_transformer_tiny", vocab_size=50, depth=2).eval()
    ids = torch.randint(1, 50, (2, 6))
    with capture_attention(model, include="encoder.layers.1.*") as maps:
        model(ids)
    assert list(maps) == ["encoder.layers.1.self_attn"] and len(maps["encoder.layers.1.self_attn"]) == 1
    with pytest.raises(ValueError, match="include=.*matches no attention module.*encoder.layers.0.self_attn"):
        with capture_attention(model, include="decoder.*"):
            pass
    assert _cleared(model)


def test_efficient_kinds_form_no_weights_and_capture_says_so():
    model = create_model("sentiment_transformer_tiny", vocab_size=50, attention="linear").eval()
    ids = torch.randint(1, 50, (2, 6))
    with pytest.raises(ValueError, match=r"nothing to record: the model's attention never forms an n x n weight "
                                         r"matrix: encoder.layers.0.self_attn \(LinearAttention\)"):
        with capture_attention(model):
            model(ids)


def test_a_model_mixing_kinds_records_the_exact_ones_and_warns_of_the_others():
    model = create_model("transformer_tiny", src_vocab_size=30, tgt_vocab_size=30, attention="local",
                         attention_options={"sliding_window": 2}).eval()
    src, tgt = torch.randint(3, 30, (2, 5)), torch.randint(3, 30, (2, 4))
    with pytest.warns(UserWarning, match=r"records no weights of transformer.encoder.layers.0.self_attn "
                                         r"\(LocalAttention\), transformer.encoder.layers.1.self_attn"):
        with capture_attention(model, cpu=True) as maps:
            model(src, tgt)
    assert sorted(maps) == [f"transformer.decoder.layers.{i}.{a}" for i in (0, 1) for a in ("cross_attn", "self_attn")]
    assert all(len(calls) == 1 for calls in maps.values())


def test_capture_finds_a_newly_registered_kind_through_its_flag(monkeypatch):
    """Discovery goes through the capability the registry records, not a list of classes."""
    from attnlab.attention import registry
    from attnlab.attention.multihead import SelfAttention

    class Doubled(SelfAttention):
        pass

    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    registry.register_attention("doubled_test", forms_weights=True)(Doubled)
    model = create_model("sentiment_transformer_tiny", vocab_size=50, attention="doubled_test").eval()
    with capture_attention(model) as maps:
        model(torch.randint(1, 50, (2, 6)))
    assert list(maps) == ["encoder.layers.0.self_attn"] and maps["encoder.layers.0.self_attn"][0].shape == (2, 4, 6, 6)


def test_the_tutorials_attention_block_is_recorded():
    model = create_model("attention_cnn_cifar", widths=(8, 16)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
        with capture_attention(model) as maps:
            out = model(x)
        fmap, blk = model.stage2(model.stage1(x)), model.attention
        q, k = (conv(fmap).flatten(2).transpose(1, 2) for conv in (blk.query, blk.key))  # (B, 64, C/8)
        w = torch.softmax(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5, dim=-1)  # the block's formula, by hand
    assert list(maps) == ["attention"] and torch.equal(out, ref)
    assert maps["attention"][0].shape == (2, 1, 64, 64) and torch.allclose(maps["attention"][0][:, 0], w, atol=1e-6)


def test_cross_attention_and_relpos2d_modules():
    ca = CrossAttention(16, 4, kdim=8, vdim=8).eval()
    x, ctx = torch.randn(2, 3, 16), torch.randn(2, 5, 8)
    with capture_attention(ca) as maps:
        ca(x, ctx)
    assert torch.equal(maps[""][0], ca(x, ctx, need_weights=True, average_attn_weights=False)[1])

    rp = RelPosSelfAttention2d(8, 2, size=(3, 4)).eval()
    img = torch.randn(2, 8, 3, 4)
    ref_out, ref_w = rp(img, need_weights=True)
    with capture_attention(rp) as maps:
        out, none = rp(img)
    assert none is None and torch.allclose(out, rp(img)[0], atol=1e-6)  # no weights asked for: as outside
    assert maps[""][0].shape == (2, 2, 12, 12) and torch.equal(maps[""][0], ref_w)
    assert _cleared(rp)


def test_a_kv_cache_records_one_step_at_a_time_over_all_cached_keys():
    m = SelfAttention(16, 2).eval()
    x = torch.randn(2, 4, 16)
    cache = DecodingCache()
    with capture_attention(m) as maps:
        for t in range(4):
            m(x[:, t : t + 1], is_causal=True, cache=cache)
    assert [tuple(w.shape) for w in maps[""]] == [(2, 2, 1, t + 1) for t in range(4)]
    _, full = m(x, is_causal=True, need_weights=True, average_attn_weights=False)
    for t, w in enumerate(maps[""]):  # step t equals row t of the full causal pass
        assert torch.allclose(w[:, :, 0], full[:, :, t, : t + 1], atol=1e-6)


# ----------------------------------------------------------------------------- models
def test_vit_blocks_record_what_need_weights_gives():
    model = create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=3).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
        with capture_attention(model) as maps:
            out = model(x)
    assert list(maps) == ["blocks.0.attn", "blocks.1.attn"]
    assert torch.allclose(out, ref, atol=1e-5)
    args, kw = _call_args(model, model.blocks[1].attn, x)
    with torch.no_grad():
        _, w = model.blocks[1].attn(*args, **kw, need_weights=True, average_attn_weights=False)
    assert maps["blocks.1.attn"][0].shape == (2, 3, 5, 5)  # 4 patches + the class token
    assert torch.allclose(maps["blocks.1.attn"][0], w, atol=1e-6)
    assert _cleared(model)


def test_botnet_records_what_its_attention_gives_when_asked_for_weights():
    model = create_model("botnet_cifar", layers=[1, 1, 1, 2], widths=[8, 8, 8, 8], stem_width=8).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref_logits = model(x)
        with capture_attention(model) as maps:
            logits = model(x)
    assert list(maps) == ["layer4.0.attn", "layer4.1.attn"]
    assert torch.allclose(logits, ref_logits, atol=1e-5)
    assert [tuple(w[0].shape) for w in maps.values()] == [(2, 4, 64, 64), (2, 4, 16, 16)]  # 8x8, then 4x4
    for name, calls in maps.items():
        attn = model.get_submodule(name)
        args, kw = _call_args(model, attn, x)
        with torch.no_grad():
            _, w = attn(*args, **kw, need_weights=True)
        assert torch.allclose(calls[0], w, atol=1e-6), name
    assert [torch.equal(a, c[0]) for a, c in zip(model.attention_maps(x), maps.values())] == [True, True]


def test_sentiment_classifier_records_what_its_attention_gives_when_asked_for_weights():
    model = create_model("sentiment_transformer_tiny", vocab_size=50, depth=2).eval()
    ids = torch.randint(1, 50, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 6:] = 0
    with torch.no_grad():
        ref_logits = model(ids, mask)
        with capture_attention(model) as maps:
            logits = model(ids, mask)
    assert torch.allclose(logits, ref_logits, atol=1e-5)
    assert len(maps) == 2
    for name, calls in maps.items():
        attn = model.get_submodule(name)
        args, kw = _call_args(model, attn, ids, mask)
        with torch.no_grad():
            _, w = attn(*args, **{**kw, "need_weights": True, "average_attn_weights": False})
        assert len(calls) == 1 and torch.allclose(calls[0], w, atol=1e-6), name


def test_translator_generation_records_cross_attention_per_step_with_the_cache():
    model = attnlab.create_model("transformer_tiny", src_vocab_size=40, tgt_vocab_size=40, embed_dim=32, num_heads=4,
                                 encoder_depth=1, decoder_depth=2, mlp_ratio=2.0).eval()
    src = torch.randint(3, 40, (2, 7))
    src[1, 5:] = 0  # padding
    with torch.no_grad():
        ref = model.generate(src, max_new_tokens=6)
        with capture_attention(model, include="*.cross_attn") as cached:
            hyp = model.generate(src, max_new_tokens=6)
        with capture_attention(model, include="*.cross_attn") as full:
            model.generate(src, max_new_tokens=6, use_cache=False)
    assert torch.equal(hyp, ref)
    names = ["transformer.decoder.layers.0.cross_attn", "transformer.decoder.layers.1.cross_attn"]
    assert list(cached) == names
    steps = hyp.shape[1]
    for name in names:
        assert len(cached[name]) == steps
        assert all(tuple(w.shape) == (2, 4, 1, 7) for w in cached[name])  # one query over all 7 source keys
        assert all(w[1, :, :, 5:].abs().max() == 0 for w in cached[name])  # padded source keys
        for t in range(steps):  # the cached step equals the last row of re-decoding the prefix
            assert torch.allclose(cached[name][t][:, :, 0], full[name][t][:, :, -1], atol=1e-5)
    assert _cleared(model)


def test_translator_self_attention_cache_grows_by_one_key_per_step():
    model = attnlab.create_model("transformer_tiny", src_vocab_size=40, tgt_vocab_size=40, embed_dim=32, num_heads=4,
                                 encoder_depth=1, decoder_depth=1, mlp_ratio=2.0).eval()
    src = torch.randint(3, 40, (1, 5))
    with torch.no_grad(), capture_attention(model, include="transformer.decoder.*") as maps:
        hyp = model.generate(src, max_new_tokens=4)
    lengths = [w.shape[-1] for w in maps["transformer.decoder.layers.0.self_attn"]]
    assert lengths == list(range(1, hyp.shape[1] + 1))
