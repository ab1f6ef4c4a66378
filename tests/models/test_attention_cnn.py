"""The tutorials' attention CNNs: shapes (square or not), attention weights, BatchNorm in eval."""

import pytest
import torch

from attnlab.attention import capture_attention
from attnlab.models import count_parameters, create_model
from attnlab.models.attention_cnn import AttentionBlock, ConvSelfAttentionBN


def test_attention_block_starts_as_identity_and_returns_pixel_weights():
    blk = AttentionBlock(16)
    x = torch.randn(2, 16, 5, 7)  # not square
    with capture_attention(blk) as maps:  # a block returns its output; the weights come from a capture
        out = blk(x)
    torch.testing.assert_close(out, x)  # gamma = 0 at initialisation
    (w,) = maps[""]
    assert w.shape == (2, 1, 35, 35)  # one head
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 1, 35))
    with torch.no_grad():
        blk.gamma.fill_(1.0)
    assert not torch.allclose(blk(x), x)


def test_attention_block_matches_explicit_formula():
    blk = AttentionBlock(8, reduction=2)
    with torch.no_grad():
        blk.gamma.fill_(0.5)
    x = torch.randn(1, 8, 3, 4)
    q = blk.query(x).flatten(2)[0].T  # (12, 4)
    k = blk.key(x).flatten(2)[0].T
    v = blk.value(x).flatten(2)[0].T  # (12, 8)
    attn = torch.softmax(q @ k.T / 2.0, dim=-1)  # sqrt(4) = 2
    expected = x + 0.5 * (attn @ v).T.reshape(1, 8, 3, 4)
    torch.testing.assert_close(blk(x), expected, atol=1e-5, rtol=1e-5)


def test_conv_self_attention_bn_non_square():
    blk = ConvSelfAttentionBN(3, 16, num_heads=4)
    assert blk(torch.randn(2, 3, 6, 10)).shape == (2, 16, 6, 10)


@pytest.mark.parametrize("name", ["attention_cnn_cifar", "conv_sa_bn_cifar"])
@pytest.mark.parametrize("channel_attention", [None, "se", "cbam"])
def test_models_classify_32x32_and_train(name, channel_attention):
    m = create_model(name, channel_attention=channel_attention)
    x = torch.randn(4, 3, 32, 32)
    logits = m(x)
    assert logits.shape == (4, 10)
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters() if p.requires_grad)


def test_channel_attention_adds_parameters():
    base = count_parameters(create_model("attention_cnn_cifar"))
    se = count_parameters(create_model("attention_cnn_cifar", channel_attention="se"))
    cbam = count_parameters(create_model("attention_cnn_cifar", channel_attention="cbam"))
    assert base < se < cbam


@pytest.mark.parametrize("name", ["attention_cnn_cifar", "conv_sa_bn_cifar"])
def test_eval_outputs_do_not_depend_on_the_rest_of_the_batch(name):
    m = create_model(name)
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(8, 3, 32, 32))  # fill running statistics
    m.eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        alone = m(x[:1])
        mixed = m(torch.cat([x[:1], torch.randn(5, 3, 32, 32) * 10]))[:1]
    torch.testing.assert_close(alone, mixed, atol=1e-5, rtol=1e-5)


def test_bad_config():
    with pytest.raises(ValueError, match="block must be 'pixel' or 'conv_sa_bn'; got 'axial'"):
        create_model("attention_cnn_cifar", block="axial")
    with pytest.raises(ValueError, match="attention must be a 'tokens' kind; 'axial' is a grid kind"):
        create_model("conv_sa_bn_cifar", attention="axial")


def test_the_conv_sa_bn_block_takes_its_attention_kind_at_construction():
    m = create_model("conv_sa_bn_cifar", widths=(8, 16), attention="local", attention_options={"sliding_window": 8}).eval()
    assert type(m.attention.attn).__name__ == "LocalAttention" and m.attention.attn.sliding_window == 8
    with torch.no_grad():
        assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
