"""Token BatchNorm: the right axis, padding left out, running statistics in eval."""

import pytest
import torch
from torch import nn

from attnlab.layers import LayerNorm, TokenBatchNorm, build_norm


def test_normalizes_each_feature_over_batch_and_positions():
    bn = TokenBatchNorm(6)
    x = torch.randn(4, 9, 6) * 3 + 2
    y = bn(x)
    flat = y.reshape(-1, 6)
    torch.testing.assert_close(flat.mean(0), torch.zeros(6), atol=1e-5, rtol=0)
    torch.testing.assert_close(flat.var(0, unbiased=False), torch.ones(6), atol=1e-3, rtol=0)
    # The tutorials' nn.BatchNorm1d(E) on (B, L, E) normalizes over L instead: different.
    with pytest.raises(Exception):
        nn.BatchNorm1d(6)(x)  # L=9 channels expected, not 6


def test_padded_tokens_are_left_out_of_the_statistics():
    bn = TokenBatchNorm(5)
    x = torch.randn(3, 8, 5)
    pad = torch.zeros(3, 8, dtype=torch.bool)
    pad[0, 5:] = True
    pad[2, 2:] = True
    y = bn(x, pad)
    valid = x[~pad]
    expected = (valid - valid.mean(0)) / torch.sqrt(valid.var(0, unbiased=False) + bn.eps)
    torch.testing.assert_close(y[~pad], expected, atol=1e-5, rtol=0)
    assert (y[pad] == 0).all()
    # Whatever the padding holds changes nothing.
    x2 = x.clone()
    x2[pad] = 1e4
    torch.testing.assert_close(TokenBatchNorm(5)(x2, pad)[~pad], y[~pad])
    # Running statistics come from the real tokens only (momentum 0.1 from mean 0, var 1).
    torch.testing.assert_close(bn.running_mean, 0.1 * valid.mean(0), atol=1e-6, rtol=0)
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * valid.var(0, unbiased=True), atol=1e-6, rtol=0)


def test_eval_uses_running_statistics_independent_of_batch():
    bn = TokenBatchNorm(4)
    for _ in range(20):
        bn(torch.randn(8, 10, 4) * 2 + 1)
    bn.eval()
    a = torch.randn(1, 10, 4)
    alone = bn(a)
    together = bn(torch.cat([a, torch.randn(5, 10, 4) * 100]))[:1]
    torch.testing.assert_close(alone, together)
    torch.testing.assert_close(alone, (a - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias)


def test_gradients_flow_through_padded_norm():
    bn = TokenBatchNorm(4)
    x = torch.randn(2, 5, 4, requires_grad=True)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    (bn(x, pad) * torch.randn(2, 5, 4)).sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[pad] == 0).all() and (x.grad[~pad] != 0).any()


def test_state_dict_names_match_batchnorm1d():
    assert set(TokenBatchNorm(4).state_dict()) == set(nn.BatchNorm1d(4).state_dict())


def test_build_norm_by_name():
    assert isinstance(build_norm("layernorm", 8), LayerNorm)
    assert isinstance(build_norm("ln", 8), LayerNorm)
    assert isinstance(build_norm("batchnorm", 8), TokenBatchNorm)
    with pytest.raises(ValueError, match="norm must be one of"):
        build_norm("groupnorm", 8)
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(build_norm("ln", 8)(x, torch.zeros(2, 3, dtype=torch.bool)), nn.LayerNorm(8)(x))
