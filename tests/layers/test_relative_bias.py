"""T5 relative position bias: bucketing, the bias tensor, and the sentiment classifier with pos_embed="relative"."""

import pytest
import torch
import torch.nn.functional as F

from attnlab.layers.relative_bias import RelativePositionBias, relative_position_bucket
from attnlab.models import create_model

VOCAB = 50


def tiny(**overrides):
    kw = dict(vocab_size=VOCAB, drop_rate=0.0, attn_drop_rate=0.0, pos_drop_rate=0.0, pos_embed="relative")
    return create_model("sentiment_transformer_tiny", **{**kw, **overrides})


def sentences(lengths):
    """Right-padded ids and the Hugging Face mask (1 = real)."""
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, VOCAB, (n,))
        mask[i, :n] = 1
    return ids, mask


# --------------------------------------------------------------------------- bucketing
def test_buckets_bidirectional():
    d = torch.arange(0, 400)
    after, before = relative_position_bucket(d), relative_position_bucket(-d)  # 32 buckets, max_distance 128
    assert after[0] == before[0] == 0
    assert torch.equal(after[1:8], torch.arange(17, 24)) and torch.equal(before[:8], torch.arange(8))  # exact
    for side in (after[1:], before):
        assert (side.diff() >= 0).all()  # monotone in |distance|
    # Every distance from max_distance on shares the last bucket of its side.
    assert (after[128:] == 31).all() and (before[128:] == 15).all()
    assert after[127] <= 31 and before[127] <= 15
    # Signs never share a bucket (0 aside): keys before the query in [0, 16), after in [16, 32).
    assert (before < 16).all() and (after[1:] >= 16).all()
    assert after.max() == 31 and before.max() == 15  # every bucket is reachable


def test_buckets_unidirectional():
    d = torch.arange(0, 400)
    past = relative_position_bucket(-d, bidirectional=False)
    assert torch.equal(past[:16], torch.arange(16)) and (past.diff() >= 0).all() and (past[128:] == 31).all()
    assert (relative_position_bucket(d[1:], bidirectional=False) == 0).all()  # future keys: bucket 0


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="num_buckets >= 4"):
        RelativePositionBias(4, num_buckets=2)
    with pytest.raises(ValueError, match="max_distance > 8"):
        RelativePositionBias(4, num_buckets=32, max_distance=8)


# --------------------------------------------------------------------------- the bias
def test_shape_dtype_and_toeplitz():
    rb = RelativePositionBias(3, num_buckets=8, max_distance=16)
    bias = rb(5, 7)
    assert bias.shape == (1, 3, 5, 7) and bias.dtype == torch.float32
    assert rb(5, 7, dtype=torch.float64).dtype == torch.float64
    # Depends only on k - q: constant along every diagonal.
    for i in range(1, 5):
        for j in range(1, 7):
            assert torch.equal(bias[..., i, j], bias[..., i - 1, j - 1])
    # The value is the table entry of the bucket of k - q.
    assert torch.equal(bias[0, :, 4, 0], rb.embedding.weight[relative_position_bucket(torch.tensor(-4), 8, 16)])


def test_gradients_reach_the_table():
    rb = RelativePositionBias(2, num_buckets=8, max_distance=16)
    rb(6, 6).pow(2).sum().backward()
    assert rb.embedding.weight.grad is not None and rb.embedding.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------- the classifier
def test_relative_needs_exact_attention():
    with pytest.raises(ValueError, match=r"pos_embed='relative' needs attention='exact'.*attention='linear'"):
        tiny(attention="linear")


def test_model_has_one_shared_table_and_no_absolute_positions():
    model = tiny(depth=2)
    tables = [m for m in model.modules() if isinstance(m, RelativePositionBias)]
    assert tables == [model.rel_bias] and model.rel_bias.num_heads == 4
    x = torch.randn(1, 3, 64)
    assert torch.equal(model.pos(x), x)


def test_trains_one_step():
    torch.manual_seed(0)
    model = tiny(depth=2, drop_rate=0.1, attn_drop_rate=0.1)
    ids, mask = sentences([6, 3, 9])
    loss = F.cross_entropy(model(ids, mask), torch.tensor([0, 1, 1]))
    loss.backward()
    assert torch.isfinite(loss) and model.rel_bias.embedding.weight.grad.abs().sum() > 0
    before = model.rel_bias.embedding.weight.detach().clone()
    with torch.no_grad():  # a plain SGD step (torch.optim's first use costs seconds of imports)
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.1 * p.grad
    assert not torch.equal(before, model.rel_bias.embedding.weight)
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(F.cross_entropy(model(ids, mask), torch.tensor([0, 1, 1])))


def test_gradient_checkpointing_passes_the_bias_to_every_layer():
    torch.manual_seed(0)
    model = tiny(depth=2)
    ids, mask = sentences([6, 3])
    grads = []
    for enable in (False, True):
        model.zero_grad()
        model.set_grad_checkpointing(enable)
        model(ids, mask).sum().backward()
        grads.append(model.rel_bias.embedding.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_padding_invariance(pooling):
    torch.manual_seed(0)
    model = tiny(depth=2, pooling=pooling).eval()
    ids, mask = sentences([4, 7])
    longer_ids = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    longer_mask = torch.cat([mask, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask), model(longer_ids, longer_mask), atol=1e-5, rtol=0)
        torch.testing.assert_close(model(ids[:1, :4], mask[:1, :4]), model(ids, mask)[:1], atol=1e-5, rtol=0)


def test_forward_equals_forward_with_attention():
    torch.manual_seed(0)
    model = tiny(depth=2).eval()
    ids, mask = sentences([5, 8])
    with torch.no_grad():
        logits, maps = model.forward_with_attention(ids, mask)
        torch.testing.assert_close(logits, model(ids, mask), atol=1e-5, rtol=0)
    assert [tuple(m.shape) for m in maps] == [(2, 4, 8, 8)] * 2
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(2, 4, 8))


def test_relative_positions_encode_word_order():
    torch.manual_seed(0)
    ids = torch.randint(1, VOCAB, (1, 8))
    perm = ids[:, torch.randperm(8)]
    orderless = tiny(pos_embed="none", pooling="mean").eval()
    relative = tiny(pooling="mean").eval()
    with torch.no_grad():
        torch.testing.assert_close(orderless(perm), orderless(ids), atol=1e-5, rtol=0)
        assert (relative(perm) - relative(ids)).abs().max() > 1e-4
