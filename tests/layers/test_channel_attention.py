"""SE and CBAM keep the shape, gate in (0, 1), equal their formulas; the builder checks names."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.layers.channel_attention import CBAM, SqueezeExcite, build_channel_attention


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def test_se_keeps_shape():
    x = torch.randn(2, 32, 5, 7)
    assert SqueezeExcite(32).forward(x).shape == (2, 32, 5, 7)


def test_se_is_x_times_a_gate_in_0_1():
    se = SqueezeExcite(32, reduction=4)
    x = torch.randn(3, 32, 6, 6) * 5
    gate = se.gate(x)
    assert gate.shape == (3, 32, 1, 1)
    assert gate.gt(0).all() and gate.lt(1).all()
    torch.testing.assert_close(se(x), x * gate)
    assert not torch.allclose(gate[0], gate[1])  # the gate depends on the input


def test_se_equals_its_formula():
    se = SqueezeExcite(16, reduction=4)
    x = torch.randn(2, 16, 3, 5)
    s = x.mean((2, 3))  # (B, C)
    hidden = F.relu(s @ se.fc1.weight[:, :, 0, 0].T + se.fc1.bias)
    gate = torch.sigmoid(hidden @ se.fc2.weight[:, :, 0, 0].T + se.fc2.bias)
    torch.testing.assert_close(se(x), x * gate[:, :, None, None])


def test_se_parameter_count():
    # two FC layers with bias: C -> C/16 -> C
    assert n_params(SqueezeExcite(256)) == 256 * 16 + 16 + 16 * 256 + 256


def test_se_narrow_layer_keeps_one_hidden_unit():
    se = SqueezeExcite(8, reduction=16)
    assert se.fc1.out_channels == 1
    assert se(torch.randn(1, 8, 2, 2)).shape == (1, 8, 2, 2)


def test_cbam_keeps_shape():
    x = torch.randn(2, 32, 9, 6)
    assert CBAM(32).forward(x).shape == (2, 32, 9, 6)


def test_cbam_equals_its_formula():
    cbam = CBAM(16, reduction=4, spatial_kernel=7)
    x = torch.randn(2, 16, 8, 5)
    fc1, fc2 = cbam.channel.mlp[0], cbam.channel.mlp[2]

    def mlp(d):  # (B, C) -> (B, C), the one MLP shared by both descriptors
        return F.relu(d @ fc1.weight[:, :, 0, 0].T + fc1.bias) @ fc2.weight[:, :, 0, 0].T + fc2.bias

    mc = torch.sigmoid(mlp(x.mean((2, 3))) + mlp(x.flatten(2).max(-1).values))
    x1 = x * mc[:, :, None, None]
    maps = torch.stack([x1.mean(1), x1.max(1).values], dim=1)
    ms = torch.sigmoid(F.conv2d(maps, cbam.spatial.conv.weight, cbam.spatial.conv.bias, padding=3))
    torch.testing.assert_close(cbam(x), x1 * ms)
    assert ms.shape == (2, 1, 8, 5) and ms.gt(0).all() and ms.lt(1).all()


def test_cbam_parameter_count():
    c, h = 64, 4
    mlp = c * h + h + h * c + c
    spatial = 2 * 7 * 7 + 1
    assert n_params(CBAM(64)) == mlp + spatial


def test_cbam_rejects_even_kernel():
    with pytest.raises(ValueError, match="spatial_kernel must be a positive odd integer; got 4"):
        CBAM(16, spatial_kernel=4)


@pytest.mark.parametrize("name", [None, "none"])
def test_builder_none_is_identity_without_parameters(name):
    m = build_channel_attention(name, 64)
    assert isinstance(m, nn.Identity) and n_params(m) == 0


def test_builder_names():
    assert isinstance(build_channel_attention("se", 64), SqueezeExcite)
    assert isinstance(build_channel_attention("cbam", 64), CBAM)
    assert build_channel_attention("se", 64, reduction=8).fc1.out_channels == 8


def test_builder_unknown_name_names_argument_value_and_choices():
    with pytest.raises(ValueError, match=r"channel_attention must be None or one of 'none', 'se', 'cbam'; got 'eca'"):
        build_channel_attention("eca", 64)


def test_bad_channels_and_reduction():
    with pytest.raises(ValueError, match="channels must be a positive integer; got 0"):
        SqueezeExcite(0)
    with pytest.raises(ValueError, match="reduction must be a positive integer; got 0"):
        CBAM(16, reduction=0)
