"""Runs of the encoder-decoder saved before its decoder's attention became the exact kind still
load and give the same outputs. The fixture ``run_seq2seq_before_one_attention`` is a tiny
Transformer that the previous code trained (``attnlab train demo-reverse`` with a width of 32,
one encoder and one decoder layer, 300 steps, at commit 8b2c2bb), when the decoder's self- and
cross-attention were ``MultiHeadAttention`` (the packed ``in_proj`` and ``out_proj``, a
``KVCache`` each); ``expected_outputs.safetensors`` holds what that code gave for three source
rows (one padded): the logits of a teacher-forced target, and greedy and beam-search tokens."""

from pathlib import Path

import torch
from safetensors.torch import load_file

from attnlab.attention import DecodingCache, GroupedQueryAttention
from attnlab.tasks import load_run

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_seq2seq_before_one_attention"


def _loaded():
    return load_run(FIXTURE).model.eval(), load_file(FIXTURE / "expected_outputs.safetensors")


def test_its_checkpoint_loads_into_the_one_exact_attention_with_the_same_logits():
    model, expected = _loaded()
    layer = model.transformer.decoder.layers[0]
    assert type(layer.self_attn) is GroupedQueryAttention and type(layer.cross_attn) is GroupedQueryAttention
    with torch.no_grad():
        got = model(expected["src"], expected["tgt"])
    # one (3E, E) product then became three (E, E) ones, and the fixture may come from another CPU's
    # kernels: a few ulps of float32 (2.9e-6 at most, seen on an AMX Xeon), not a changed computation
    torch.testing.assert_close(got, expected["logits"], atol=1e-5, rtol=1e-5)


def test_it_decodes_the_tokens_it_decoded_greedy_and_by_beam_search():
    model, expected = _loaded()
    assert not torch.equal(expected["greedy"], expected["beam"])  # the two searches differ on these rows
    with torch.no_grad():
        assert torch.equal(model.generate(expected["src"], max_new_tokens=10), expected["greedy"])
        assert torch.equal(model.generate(expected["src"], max_new_tokens=10, num_beams=3), expected["beam"])


def test_its_decoder_caches_are_the_one_cache():
    model, expected = _loaded()
    cache = model.new_cache(3, 11)
    assert all(type(c) is DecodingCache for c in cache.self_attn + cache.cross_attn)
    assert all(c.static for c in cache.cross_attn) and not any(c.static for c in cache.self_attn)
