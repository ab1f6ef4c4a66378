"""The fast attention CNN: shapes, its attention, swappable kinds, config errors."""

import pytest
import torch

from attnlab.models import count_parameters, create_model
from attnlab.models.fast_cnn import MapSelfAttention


def test_shapes_and_parameter_count():
    model = create_model("attention_cnn_fast").eval()
    assert count_parameters(model) == 564_408
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert model.forward_features(torch.randn(2, 3, 32, 32)).shape == (2, 128, 3, 3)
    # Other sizes work too: the attention runs on whatever map it gets.
    assert model(torch.randn(1, 3, 40, 24)).shape == (1, 10)


def test_attention_maps_are_distributions_over_the_7x7_map():
    model = create_model("attention_cnn_fast").eval()
    (maps,) = model.attention_maps(torch.randn(2, 3, 32, 32))
    assert maps.shape == (2, 4, 49, 49)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 4, 49))


def test_attention_block_matches_a_hand_written_residual():
    block = MapSelfAttention(16, 2).eval()
    x = torch.randn(2, 16, 3, 5)
    tokens = x.flatten(2).transpose(1, 2)
    q, k, v = (p(block.norm(tokens)) for p in (block.attn.q_proj, block.attn.k_proj, block.attn.v_proj))
    split = lambda t: t.view(2, 15, 2, 8).transpose(1, 2)  # noqa: E731
    w = (split(q) @ split(k).transpose(-1, -2) / 8 ** 0.5).softmax(-1)
    out = block.attn.o_proj((w @ split(v)).transpose(1, 2).reshape(2, 15, 16))
    expected = x + out.transpose(1, 2).reshape(2, 16, 3, 5)
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)


def test_without_attention_and_with_attention_everywhere():
    plain = create_model("attention_cnn_fast", attention_after=())
    assert not any(isinstance(m, MapSelfAttention) for m in plain.modules())
    everywhere = create_model("attention_cnn_fast", attention_after=(0, 1, 2))
    assert len(everywhere.attention_maps(torch.randn(1, 3, 32, 32))) == 3


def test_trains_one_step_and_every_parameter_gets_a_gradient():
    model = create_model("attention_cnn_fast")
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("overrides, message", [
    (dict(widths=(32, 0)), "widths must be positive"),
    (dict(attention_after=(3,)), "attention_after must index widths"),
    (dict(num_heads=5), "must be divisible by num_heads=5"),
    (dict(attention="relpos2d"), "must be a 'tokens' kind"),
    (dict(attention="exactt"), "unknown attention 'exactt'"),
    (dict(depth=3), "unknown"),
])
def test_config_errors_name_the_argument(overrides, message):
    with pytest.raises(ValueError, match=message):
        create_model("attention_cnn_fast", **overrides)


def test_wrong_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"x must be \(B, 3, H, W\); got \(3, 32, 32\)"):
        create_model("attention_cnn_fast")(torch.randn(3, 32, 32))
