"""The recurrent baseline: a bidirectional GRU encoder and a GRU decoder with additive
(Bahdanau) or multiplicative (Luong) attention, decoded by the same greedy and beam search
as the Transformer, trained and drawn by the translation task."""

import pytest
import torch

from attnlab.attention import capture_attention
from attnlab.errors import InputError
from attnlab.models import RNNSeq2Seq, create_model


@pytest.fixture(params=["additive", "multiplicative"])
def model(request):
    torch.manual_seed(0)
    return create_model("gru_attention_tiny", src_vocab_size=30, tgt_vocab_size=30, score=request.param).eval()


def _batch():
    src = torch.randint(3, 30, (3, 7))
    src[1, 5:] = 0  # padding
    tgt = torch.randint(3, 30, (3, 5))
    tgt[:, 0] = 1  # BOS
    return src, tgt


def test_attention_weights_sum_to_one_over_real_source_positions(model):
    src, tgt = _batch()
    with capture_attention(model, include="attention") as maps, torch.no_grad():
        logits = model(src, tgt)
    assert logits.shape == (3, 5, 30)
    weights = torch.cat(maps["attention"], dim=2)  # one call per decoder step
    assert weights.shape == (3, 1, 5, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 1, 5))
    assert torch.all(weights[1, :, :, 5:] == 0)


def test_padding_changes_no_real_output(model):
    src, tgt = _batch()
    with torch.no_grad():
        short = model(src[1:2, :5], tgt[1:2])
        padded = model(src[1:2], tgt[1:2])
    torch.testing.assert_close(short, padded, atol=1e-5, rtol=1e-5)


def test_cached_decoding_equals_decoding_the_whole_prefix(model):
    src, _ = _batch()
    for beams in (1, 3):
        cached = model.generate(src, max_new_tokens=6, num_beams=beams)
        uncached = model.generate(src, max_new_tokens=6, num_beams=beams, use_cache=False)
        assert torch.equal(cached, uncached)


def test_it_learns_to_copy_and_the_config_is_checked():
    torch.manual_seed(0)
    model = create_model("gru_attention_tiny", src_vocab_size=12, tgt_vocab_size=12, drop_rate=0.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(150):
        src = torch.randint(3, 12, (32, 5))
        tgt = torch.cat([torch.ones(32, 1, dtype=torch.long), src], dim=1)  # BOS, then the source
        logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 12), tgt[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src = torch.randint(3, 12, (16, 5))
    assert (model.generate(src, max_new_tokens=5)[:, :5] == src).float().mean() > 0.9
    with pytest.raises(InputError, match="score must be one of 'additive', 'multiplicative'; got 'dot'"):
        RNNSeq2Seq(score="dot")
