"""Bad input raises ValueError naming the argument, the shape given and the shape expected."""

import pytest
import torch

from attnlab.attention import CrossAttention, DecodingCache, MultiHeadAttention


E, H = 16, 4


@pytest.fixture
def mha():
    return MultiHeadAttention(E, H)


def test_embed_dim_not_divisible_by_heads():
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads; got embed_dim=10, num_heads=4"):
        MultiHeadAttention(10, 4)


def test_bad_dropout():
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\); got 1.5"):
        MultiHeadAttention(E, H, dropout=1.5)


def test_query_of_wrong_rank(mha):
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, 16\); got \(5, 16\)"):
        mha(torch.randn(5, E))


def test_query_feature_size(mha):
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, 16\); got \(2, 5, 12\)"):
        mha(torch.randn(2, 5, 12))


def test_key_feature_size_and_rank(mha):
    with pytest.raises(ValueError, match=r"context must have shape \(B, Lk, 16\); got \(2, 7, 8\)"):
        mha(torch.randn(2, 5, E), torch.randn(2, 7, 8))
    with pytest.raises(ValueError, match=r"context must have shape \(B, Lk, 16\); got \(7, 16\)"):
        mha(torch.randn(2, 5, E), torch.randn(7, E))


def test_mismatched_batch(mha):
    with pytest.raises(ValueError, match=r"context must have the batch size 2 of x; got shape \(3, 7, 16\)"):
        mha(torch.randn(2, 5, E), torch.randn(3, 7, E))


def test_value_length_differs_from_key(mha):
    with pytest.raises(ValueError, match=r"value must have context's length 7; got \(2, 6, 16\) for context \(2, 7, 16\)"):
        mha(torch.randn(2, 5, E), torch.randn(2, 7, E), torch.randn(2, 6, E))


def test_key_padding_mask_of_wrong_shape(mha):
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, Lk\) = \(2, 5\); got \(2, 6\)"):
        mha(torch.randn(2, 5, E), key_padding_mask=torch.zeros(2, 6, dtype=torch.bool))


def test_attn_mask_of_wrong_shape(mha):
    with pytest.raises(ValueError, match=r"attn_mask must have shape \(Lq, Lk\) = \(5, 5\) or be broadcastable to "
                                         r"\(2, 4, 5, 5\); got \(5, 4\)"):
        mha(torch.randn(2, 5, E), attn_mask=torch.zeros(5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"a 3-D attn_mask must have shape \(B\*H, Lq, Lk\) with B\*H = 8; got \(2, 5, 5\)"):
        mha(torch.randn(2, 5, E), attn_mask=torch.zeros(2, 5, 5))


def test_mask_of_wrong_dtype(mha):
    with pytest.raises(ValueError, match="attn_mask must be a torch.bool mask .* got dtype torch.int64"):
        mha(torch.randn(2, 5, E), attn_mask=torch.zeros(5, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="key_padding_mask must be a torch.bool mask .* got dtype torch.int32"):
        mha(torch.randn(2, 5, E), key_padding_mask=torch.zeros(2, 5, dtype=torch.int32))


def test_cache_from_another_batch_size(mha):
    cache = DecodingCache()
    mha(torch.randn(2, 3, E), cache=cache)
    with pytest.raises(ValueError, match=r"the cache holds batch size 2 but the step has 3 rows"):
        mha(torch.randn(3, 1, E), cache=cache)


def test_cross_attention_needs_context_until_cached():
    with pytest.raises(ValueError, match="context is required"):
        CrossAttention(E, H)(torch.randn(2, 3, E), None)
