"""Beam search of a decoder-only model (attnlab.generation.beam) equals transformers'
generate(num_beams=...) on the same weights, with and without the cache."""

import pytest
import torch

from attnlab.errors import InputError
from attnlab.formats import from_hf
from attnlab.models import create_model

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

EOS, PAD = 5, 2  # a pad id other than 0: transformers fills with eos where pad_token_id is 0 ("pad or eos")


def _pair(tmp_path, seed, eos_boost):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   eos_token_id=EOS, bos_token_id=1, pad_token_id=PAD, tie_word_embeddings=False)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # make the end of text compete, so that hypotheses finish at different lengths
        ref.lm_head.weight[EOS] += ref.model.norm.weight * eos_boost
    folder = tmp_path / f"llama{seed}"
    ref.save_pretrained(folder)
    return ref, from_hf(folder).eval()


@pytest.mark.parametrize("seed, eos_boost", [(0, 0.0), (1, 0.4), (2, 0.7)])
@pytest.mark.parametrize("num_beams, length_penalty, early_stopping",
                         [(4, 1.0, False), (3, 0.5, True), (2, 2.0, "never"), (3, -0.5, False)])
def test_beam_search_equals_transformers(tmp_path, seed, eos_boost, num_beams, length_penalty, early_stopping):
    ref, ours = _pair(tmp_path, seed, eos_boost)
    ids = torch.randint(6, 64, (3, 4), generator=torch.Generator().manual_seed(seed))
    want = ref.generate(ids, num_beams=num_beams, max_new_tokens=10, do_sample=False, length_penalty=length_penalty,
                        early_stopping=early_stopping, eos_token_id=EOS, pad_token_id=PAD)
    got = ours.generate(ids, 10, num_beams=num_beams, eos_id=EOS, pad_id=PAD, length_penalty=length_penalty,
                        early_stopping=early_stopping)
    assert got.tolist() == want.tolist()
    uncached = ours.generate(ids, 10, num_beams=num_beams, eos_id=EOS, pad_id=PAD, length_penalty=length_penalty,
                             early_stopping=early_stopping, use_cache=False)
    assert uncached.tolist() == want.tolist()


def test_beam_search_reorders_every_kind_of_cache_a_hybrid_decoder_holds():
    torch.manual_seed(0)
    model = create_model("llama_tiny", vocab_size=64, depth=3, layer_types=["linear", "full", "sliding"], sliding_window=4,
                         attention_options={}).eval()
    ids = torch.randint(0, 64, (2, 5))
    cached = model.generate(ids, 8, num_beams=3, eos_id=7)
    assert cached.tolist() == model.generate(ids, 8, num_beams=3, eos_id=7, use_cache=False).tolist()


def test_one_beam_is_greedy_search():
    torch.manual_seed(0)
    model = create_model("gpt_tiny", vocab_size=64).eval()
    ids = torch.randint(0, 64, (2, 5))
    assert model.generate(ids, 6, num_beams=1, length_penalty=1.0).tolist() == model.generate(ids, 6).tolist()


@pytest.mark.parametrize("options, message", [
    ({"num_beams": 0}, "num_beams must be a positive integer; got 0"),
    ({"num_beams": 2, "temperature": 0.8}, "beam search takes no temperature"),
    ({"num_beams": 2, "early_stopping": "sometimes"}, "early_stopping must be true, false or 'never'"),
    ({"num_beams": 2, "length_penalty": float("nan")}, "length_penalty must be a finite number"),
    ({"num_beams": 65}, "num_beams must be at most the vocabulary's 64 tokens; got 65"),
    ({"num_beams": 2, "max_new_tokens": 10**12}, "max_new_tokens must be at most"),  # its cache, before any step
])
def test_beam_search_refuses_what_it_cannot_do_in_one_line(options, message):
    model = create_model("gpt_tiny", vocab_size=64, pos_embed="rope").eval()
    new = options.pop("max_new_tokens", 4)
    with pytest.raises(InputError, match=message):
        model.generate(torch.randint(0, 64, (1, 3)), new, **options)
