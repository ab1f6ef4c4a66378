"""Greedy and beam search: cache vs no cache, beam 1 = greedy, beam search = exact search when wide."""

import itertools
import math

import pytest
import torch

from attnlab.models import create_model
from attnlab.generation.search import beam_search, greedy_search


def model(vocab=1000, **kw):
    torch.manual_seed(0)
    m = create_model("transformer_tiny", src_vocab_size=vocab, tgt_vocab_size=vocab, drop_rate=0.0, **kw).eval()
    return m


def sources(n=5, vocab=1000, length=9):
    src = torch.randint(3, vocab, (n, length))
    src[1, 4:] = 0
    src[3, 7:] = 0
    return src


def test_greedy_with_cache_equals_without():
    m = model()
    src = sources()
    with_cache, s1 = greedy_search(m, src, 16, use_cache=True)
    without, s2 = greedy_search(m, src, 16, use_cache=False)
    assert torch.equal(with_cache, without)
    torch.testing.assert_close(s1, s2, atol=1e-4, rtol=0)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_beam_of_one_is_greedy(length_penalty):
    m = model(vocab=8)  # small vocabulary: EOS is likely, so sentences end at different steps
    src = sources(vocab=8)
    greedy, _ = greedy_search(m, src, 12)
    beam, _ = beam_search(m, src, 1, 12, length_penalty=length_penalty)
    assert torch.equal(beam, greedy)
    assert torch.equal(m.generate(src, max_new_tokens=12, num_beams=1), greedy)


def sequence_log_prob(m, src, hyp):
    memory, pad = m.encode(src)
    dec_in = torch.cat([torch.tensor([[m.config.bos_id]]), hyp[:-1].view(1, -1)], 1)
    logp = torch.log_softmax(m.decode(dec_in, memory, pad)[0].float(), -1)
    return logp.gather(1, hyp.view(-1, 1)).sum().item()


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_wide_beam_finds_the_exact_best_sequence(length_penalty):
    # 5 ids: pad, bos, eos and two words. All sequences of up to 3 tokens can be listed.
    m = model(vocab=5)
    src = torch.tensor([[3, 4, 4, 3]])
    cfg, steps = m.config, 3
    candidates = []
    for n in range(0, steps):
        for words in itertools.product([3, 4], repeat=n):
            candidates.append(list(words) + [cfg.eos_id])
    candidates += [list(w) for w in itertools.product([3, 4], repeat=steps)]  # cut at the limit
    with torch.no_grad():
        scored = [(sequence_log_prob(m, src, torch.tensor(c)) / len(c) ** length_penalty, c) for c in candidates]
        best_score, best = max(scored)
        out, score = beam_search(m, src, 16, steps, length_penalty=length_penalty)
    assert out[0][out[0] != cfg.pad_id].tolist() == best
    assert score.item() == pytest.approx(best_score, abs=1e-4)


def test_batched_beam_search_equals_one_sentence_at_a_time():
    m = model(vocab=12)
    src = sources(vocab=12)
    batched, scores = beam_search(m, src, 4, 10)
    for i in range(src.shape[0]):
        row = src[i : i + 1]
        row = row[:, : int((row != 0).sum())]  # the same sentence without padding
        single, s = beam_search(m, row, 4, 10)
        n = single.shape[1]
        assert batched[i, :n].tolist() == single[0].tolist()
        assert (batched[i, n:] == m.config.pad_id).all()
        assert scores[i].item() == pytest.approx(s.item(), abs=1e-4)


def test_output_format_eos_then_padding():
    m = model(vocab=8)
    out = m.generate(sources(vocab=8), max_new_tokens=12, num_beams=3)
    cfg = m.config
    for row in out.tolist():
        assert cfg.bos_id not in row
        if cfg.eos_id in row:
            end = row.index(cfg.eos_id)
            assert all(t == cfg.pad_id for t in row[end + 1 :])
            assert cfg.pad_id not in row[:end]


def test_generate_validates_arguments():
    m = model()
    src = sources()
    with pytest.raises(ValueError, match="num_beams must be a positive integer; got 0"):
        m.generate(src, num_beams=0)
    with pytest.raises(ValueError, match=r"max_new_tokens must be in \[1, 512\]; got 9999"):
        m.generate(src, max_new_tokens=9999)
    with pytest.raises(ValueError, match="src must be integer token ids"):
        m.generate(src.float())


def test_generate_runs_on_the_models_device_and_dtype():
    m = model().to(torch.float64)
    out = m.generate(sources(), max_new_tokens=4, num_beams=2)
    assert out.dtype == torch.long and out.shape[0] == 5 and math.isfinite(out.float().sum().item())


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_search_with_cache_equals_without(length_penalty):
    m = model(vocab=8)  # sentences end at different steps and leave the batch
    src = sources(vocab=8)
    with_cache, s1 = beam_search(m, src, 3, 12, length_penalty=length_penalty, use_cache=True)
    without, s2 = beam_search(m, src, 3, 12, length_penalty=length_penalty, use_cache=False)
    assert torch.equal(with_cache, without)
    torch.testing.assert_close(s1, s2, atol=1e-4, rtol=0)
    assert torch.equal(m.generate(src, max_new_tokens=12, num_beams=3, use_cache=False,
                                  length_penalty=length_penalty), with_cache)


def test_a_translation_samples_reproducibly_with_a_seed():
    m = model(vocab=50)
    src = sources(vocab=50)
    a = m.generate(src, max_new_tokens=10, temperature=1.0, top_k=20, seed=3)
    assert torch.equal(a, m.generate(src, max_new_tokens=10, temperature=1.0, top_k=20, seed=3))
    draws = {tuple(m.generate(src, max_new_tokens=10, temperature=1.0, seed=s)[0].tolist()) for s in range(6)}
    assert len(draws) > 1 and not torch.equal(a, m.generate(src, max_new_tokens=10))  # draws differ, greedy too
    cfg = m.config
    assert not (a == cfg.bos_id).any()  # padding and a second start are never drawn (padding only after EOS)
    for row in a.tolist():
        end = row.index(cfg.eos_id) if cfg.eos_id in row else len(row)
        assert cfg.pad_id not in row[:end] and all(t == cfg.pad_id for t in row[end + 1:])


def test_the_gru_translator_samples_and_beams_through_the_same_api():
    torch.manual_seed(0)
    m = create_model("gru_attention_tiny").eval()
    src = sources(vocab=1000)
    assert torch.equal(m.generate(src, max_new_tokens=8, temperature=0.7, seed=1),
                       m.generate(src, max_new_tokens=8, temperature=0.7, seed=1))
    assert m.generate(src, max_new_tokens=8, num_beams=3).shape[0] == 5


def test_an_observer_sees_every_step_of_a_translation_and_of_a_beam_search():
    m = model(vocab=8)
    src = sources(vocab=8)
    seen = []
    out = m.generate(src, max_new_tokens=12, observer=seen.append)
    assert [s.index for s in seen] == list(range(len(seen))) and len(seen) == out.shape[1]
    assert torch.equal(torch.stack([s.tokens for s in seen], dim=1), out)
    assert all(s.logits.shape == (5, 8) and s.cache is not None for s in seen)
    beams = []
    m.generate(src, max_new_tokens=12, num_beams=3, observer=beams.append)
    assert beams and all(s.tokens.shape == (15,) for s in beams)  # 5 sentences x 3 beams


def test_beam_search_refuses_sampling_options_in_one_line():
    m = model(vocab=8)
    with pytest.raises(ValueError, match="beam search takes no temperature"):
        m.generate(sources(vocab=8), max_new_tokens=4, num_beams=2, temperature=0.5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_lean_decoder_step_gives_the_logits_of_the_whole_target(norm_first):
    m = model(vocab=50, norm_first=norm_first)
    assert m.transformer.decoder.has_step
    src, tgt = sources(vocab=50), torch.randint(3, 50, (5, 9))
    tgt[:, 0] = m.config.bos_id
    with torch.no_grad():
        memory, pad = m.encode(src)
        whole = m.decode(tgt, memory, pad)
        cache = m.new_cache(5, 9)
        steps = [m.decode(tgt[:, t:t + 1], memory, pad, cache=cache, last_only=True) for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=0)


def test_a_batchnorm_decoder_steps_through_forward():
    m = model(vocab=50, norm="batchnorm")
    assert not m.transformer.decoder.has_step
    assert m.generate(sources(vocab=50), max_new_tokens=4).shape[0] == 5
