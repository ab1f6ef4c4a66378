"""Weights in 8 bits for decoding (``attnlab.attention.int8``): each row within half a step of
its scale, products equal to the dequantized weights' (activations in bfloat16), cached
decoding equal to recomputing the sequence, and the command line's ``--int8``."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import list_attention
from attnlab.attention.int8 import Int8Linear, int8_product, quantize_int8
from attnlab.attention.registry import attention_entry
from attnlab.models.gpt import GPT


def test_rows_keep_their_values_within_half_a_step() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    q = Int8Linear(linear)
    dequantized = q.rows.float() * q.scale[:, None]
    step = q.scale[:, None]
    assert ((dequantized - linear.weight).abs() <= step / 2 + 1e-7).all()
    assert q.rows.dtype == torch.int8 and q.rows.abs().max() == 127


def test_the_product_is_the_dequantized_weights_product() -> None:
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 96)
    q = Int8Linear(linear)
    x = torch.randn(3, 5, 64)
    want = x.bfloat16().float() @ (q.rows.float() * q.scale[:, None]).t() + linear.bias
    got = q(x)
    assert got.shape == (3, 5, 96) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)  # the kernel's bfloat16 arithmetic
    torch.testing.assert_close(int8_product(x, q.int8_weight, q.bias), got)


def test_cached_decoding_with_8_bit_weights_equals_recomputing() -> None:
    torch.manual_seed(2)
    model = GPT(vocab_size=97, embed_dim=64, depth=2, num_heads=4, num_kv_heads=2, max_len=64, norm="rmsnorm",
                mlp="swiglu", pos_embed="rope", bias=False, tie_embeddings=True).eval()
    ids = torch.randint(0, 97, (2, 6))
    with torch.no_grad():
        full = model(ids)
        quantize_int8(model)
        assert isinstance(model.head, Int8Linear) and isinstance(model.blocks[0].attn.q_proj, Int8Linear)
        assert model.tok_embed.weight.dtype == torch.float32  # looked up, not multiplied: kept
        close = model(ids)
        cached = model.generate(ids, max_new_tokens=8)
        recomputed = model.generate(ids, max_new_tokens=8, use_cache=False)
    assert (close - full).abs().max() < 0.05 * full.abs().max()
    assert cached.tolist() == recomputed.tolist()


CAUSAL_KINDS = [kind for kind in list_attention("tokens") if attention_entry(kind).honours()["causal"]]


@pytest.mark.parametrize("kind", CAUSAL_KINDS)
def test_every_causal_kind_decodes_with_8_bit_weights(kind: str) -> None:
    """``--int8`` takes every decoder: latent and dsa attention read ``kv_b_proj``'s matrix itself
    (absorbed into the query), which an 8-bit layer gives as its rows times their scales."""
    torch.manual_seed(3)
    positions = "rope" if attention_entry(kind).takes("rope") else "learned"
    model = GPT(vocab_size=50, max_len=64, embed_dim=32, depth=2, num_heads=4, pos_embed=positions,
                norm="rmsnorm", attention=kind).eval()
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        full = model(ids)
        quantize_int8(model)
        close = model(ids)
        out = model.generate(ids, max_new_tokens=5)
    assert (close - full).abs().max() < 0.05 * full.abs().max()
    assert out.shape == (2, 11) and torch.equal(out[:, :6], ids)
