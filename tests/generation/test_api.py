"""One generation API for decoders and encoder-decoders: each step's choice is a list of logits
processors (the options' own, then the caller's), a stopping rule ends rows on strings, and an
observer sees every step (the tokens, the logits, the cache) without a loop of its own."""

import pytest
import torch

from attnlab.models import create_model
from attnlab.generation.processors import (MinP, RepetitionPenalty, StopStrings, Temperature, TopK, TopP, choose,
                                       processors_for)

TINY = dict(vocab_size=40, embed_dim=32, num_heads=4, depth=2, max_len=64, pos_embed="rope")


def _model():
    torch.manual_seed(0)
    return create_model("gpt_tiny", **TINY).eval()


def test_the_options_become_processors_in_transformers_order():
    chosen = processors_for(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.2, decodable=30)
    assert [type(p).__name__ for p in chosen] == ["Decodable", "RepetitionPenalty", "Temperature", "TopK", "TopP",
                                                  "MinP"]
    assert processors_for() == [] and processors_for(top_k=5) == []  # greedy: the sampling filters drop out


def test_a_callers_processor_acts_on_every_step():
    model = _model()
    ids = torch.randint(0, 40, (2, 5))
    greedy = model.generate(ids, 12)
    banned = int(greedy[0, 5])
    forbid = lambda seen, logits: logits.index_fill(1, torch.tensor([banned]), float("-inf"))  # noqa: E731
    out = model.generate(ids, 12, processors=[forbid])
    assert not (out[:, 5:] == banned).any() and not torch.equal(out, greedy)


def test_the_repetition_penalty_reads_the_rows_tokens_and_leaves_padding_out():
    logits = torch.zeros(1, 6)
    logits[0, 0], logits[0, 3] = 2.0, -1.0
    ids = torch.tensor([[0, 0, 3]])
    penalty = RepetitionPenalty(2.0, pad=torch.tensor([[True, True, False]]))  # the two 0s are padding
    assert penalty(ids, logits).tolist() == [[2.0, 0, 0, -2.0, 0, 0]]
    assert RepetitionPenalty(2.0)(ids, logits).tolist() == [[1.0, 0, 0, -2.0, 0, 0]]


def test_sampling_filters_keep_what_they_say():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    gen = torch.Generator().manual_seed(0)
    for processors, allowed in (([Temperature(1.0), TopK(2)], {0, 1}), ([Temperature(1.0), TopP(0.7)], {0, 1}),
                                ([Temperature(1.0), MinP(0.4)], {0, 1})):
        assert {int(choose(logits, logits, processors, gen)) for _ in range(100)} == allowed


def test_an_observer_sees_the_prompt_and_every_step_of_a_decoder():
    model = _model()
    ids = torch.randint(0, 40, (2, 6))
    steps = []
    out = model.generate(ids, 8, observer=steps.append)
    assert torch.equal(torch.stack([s.tokens for s in steps], dim=1), out[:, 6:])
    with torch.no_grad():
        whole = model(out)
    torch.testing.assert_close(steps[0].prompt_logits, whole[:, :6], atol=1e-5, rtol=0)
    for s in steps:
        torch.testing.assert_close(s.logits, whole[:, 5 + s.index].float(), atol=1e-5, rtol=0)
    assert steps[-1].cache[0].seq_len == 6 + 7  # the last token is chosen, not read
    assert all(s.prompt_logits is None for s in steps[1:])


def test_stop_strings_end_a_row_and_the_rest_go_on():
    model = _model()
    ids = torch.randint(0, 40, (2, 4))
    greedy = model.generate(ids, 10)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789ABCD"
    decode = lambda row: "".join(letters[i] for i in row)  # noqa: E731
    stop = letters[int(greedy[0, 6])]  # the first row's third new token
    out = model.generate(ids, 10, eos_id=39, stop=StopStrings([stop], decode))
    first = decode(out[0, 4:].tolist())
    assert first.index(stop) == decode(greedy[0, 4:].tolist()).index(stop)
    assert set(first[first.index(stop) + 1:]) <= {letters[39]}  # the ended row goes on with eos_id


def test_seeded_sampling_is_reproducible_for_decoders_and_translators():
    model = _model()
    ids = torch.randint(0, 40, (2, 4))
    a = model.generate(ids, 10, temperature=1.0, seed=5)
    assert torch.equal(a, model.generate(ids, 10, temperature=1.0, seed=5))
    torch.manual_seed(0)
    translator = create_model("transformer_tiny", src_vocab_size=50, tgt_vocab_size=50).eval()
    src = torch.randint(3, 50, (2, 7))
    b = translator.generate(src, max_new_tokens=9, temperature=1.0, seed=5)
    assert torch.equal(b, translator.generate(src, max_new_tokens=9, temperature=1.0, seed=5))


@pytest.mark.parametrize("beams", [1, 3])
def test_decoders_and_translators_beam_search_through_the_one_search(beams):
    model = _model()
    ids = torch.randint(0, 40, (2, 4))
    seen = []
    out = model.generate(ids, 6, num_beams=beams, eos_id=39, observer=seen.append)
    assert out.shape[0] == 2 and seen and all(s.tokens.shape == (2 * beams,) for s in seen)
