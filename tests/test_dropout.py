"""attnlab's CPU dropout: the right drop rate and scale, exact gradients, reproducible
from the seed, and the CPU attention-dropout path equal to its explicit formula."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention.functional import scaled_dot_product_attention
from attnlab.dropout import Dropout, dropout, dropout_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_drop_rate_and_scale(p):
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = dropout(x, p)
    dropped = (y == 0).float().mean().item()
    # 1e6 Bernoulli draws: the rate is within 5 standard deviations of p
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / 1e6)
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - p)))


def test_every_16_bit_lane_is_uniform():
    # one int64 feeds four elements: a biased lane would show as a periodic drop rate
    torch.manual_seed(1)
    keep = dropout_mask((400_000, 4), 0.5).float().mean(0)
    assert torch.all((keep - 0.5).abs() < 5 * math.sqrt(0.25 / 400_000)), keep


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(0)
    x = torch.randn(37, 53, requires_grad=True)
    y = dropout(x, 0.4)
    y.backward(torch.ones_like(y))
    expected = (y.detach() != 0).float() / 0.6
    assert torch.equal(x.grad, expected)
    assert torch.allclose(y, x.detach() * expected)


def test_reproducible_from_the_seed_and_odd_sizes():
    for shape in [(1,), (3,), (5, 7), (2, 3, 5)]:
        torch.manual_seed(7)
        a = dropout(torch.ones(shape), 0.5)
        torch.manual_seed(7)
        b = dropout(torch.ones(shape), 0.5)
        assert a.shape == shape and torch.equal(a, b)


def test_identity_cases_and_module():
    x = torch.randn(4, 5)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))  # torch's own rule for p = 1
    m = Dropout(0.3)
    assert isinstance(m, torch.nn.Dropout) and m.state_dict() == {}
    assert torch.equal(m.eval()(x), x)
    assert dropout(torch.empty(0, 3), 0.5).shape == (0, 3)


def test_cpu_attention_dropout_is_the_explicit_formula():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    pad = torch.tensor([[False] * 4 + [True], [False] * 5])
    torch.manual_seed(3)
    out, w = scaled_dot_product_attention(q, k, v, key_padding_mask=pad, dropout_p=0.25)
    assert w is None
    torch.manual_seed(3)
    logits = (q @ k.transpose(-2, -1)) / math.sqrt(8)
    weights = logits.masked_fill(pad.view(2, 1, 1, 5), -math.inf).softmax(-1)
    keep = dropout_mask(weights.shape, 0.25)
    torch.testing.assert_close(out, (weights * keep / 0.75) @ v)
    # and without dropout, the fused kernel's result
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad.view(2, 1, 1, 5))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, key_padding_mask=pad)[0], ref)
