"""Rotary positions in the efficient kinds that score with a softmax (local, sparse, top-k,
LSH, Nyström, Linformer), so that a rotary model (the shipped language-model recipe) can
take them; the kernel kinds refuse them."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import build_attention
from attnlab.errors import InputError
from attnlab.models import create_model
from attnlab.recipes import load_recipe
from attnlab.tasks import get_task

ROPE_KINDS = {"local": {"sliding_window": 4}, "sparse": {"block": 4}, "topk": {"top_k": 3},
              "lsh": {"bucket_size": 4, "n_buckets": 4}, "nystrom": {"num_landmarks": 4},
              "linformer": {"seq_len": 12, "k": 4}}


@pytest.mark.parametrize("kind, options, causal", [("topk", {"top_k": 12}, True), ("topk", {"top_k": 12}, False),
                                                    ("local", {"sliding_window": 12}, True), ("local", {"sliding_window": 12}, False)])
def test_a_kind_that_is_exact_at_its_settings_equals_exact_attention_with_rope(kind, options, causal):
    torch.manual_seed(0)
    exact = build_attention("exact", 32, 4, rope=True, rope_theta=500.0).eval()
    other = build_attention(kind, 32, 4, rope=True, rope_theta=500.0, **options).eval()
    other.load_state_dict(exact.state_dict())
    x = torch.randn(2, 12, 32)
    torch.testing.assert_close(other(x, is_causal=causal)[0], exact(x, is_causal=causal)[0], atol=1e-5, rtol=1e-5)
    plain = build_attention(kind, 32, 4, **options).eval()
    plain.load_state_dict(exact.state_dict())
    assert not torch.allclose(plain(x, is_causal=causal)[0], exact(x, is_causal=causal)[0], atol=1e-3)


@pytest.mark.parametrize("kind", ["topk", "local", "sparse"])
def test_scores_depend_on_relative_positions_only(kind):
    """Shifting every position by the same amount changes nothing: q_i . k_j sees i - j.
    (Not LSH: its scores do, but its buckets hash the rotated vectors, which move with the
    absolute position.)"""
    torch.manual_seed(0)
    attn = build_attention(kind, 32, 4, rope=True, **ROPE_KINDS[kind]).eval()
    x = torch.randn(2, 12, 32)
    base = attn(x, is_causal=True)[0]
    shifted = attn(x, is_causal=True, positions=torch.arange(12) + 7)[0]
    torch.testing.assert_close(shifted, base, atol=1e-4, rtol=1e-4)
    assert "rope_theta=10000" in repr(attn)


@pytest.mark.parametrize("kind", sorted(ROPE_KINDS))
def test_every_softmax_kind_takes_rope_and_the_kernel_kinds_refuse_it(kind):
    attn = build_attention(kind, 32, 4, rope=True, **ROPE_KINDS[kind])
    assert attn.rotary is not None
    with pytest.raises(InputError, match="rope"):
        build_attention("linear", 32, 4, rope=True)
    with pytest.raises(InputError, match="rope"):
        build_attention("performer", 32, 4, rope=True)
    with pytest.raises(InputError, match="even"):
        build_attention(kind, 12, 4, rope=True, **ROPE_KINDS[kind])  # head_dim 3


def test_a_rotary_language_model_takes_top_k_and_decodes_left_padded_prompts_row_by_row():
    torch.manual_seed(0)
    model = create_model("gpt_tiny", vocab_size=40, depth=2, pos_embed="rope", attention="topk",
                         attention_options={"top_k": 64}).eval()  # k above the length: exact attention
    prompt = torch.randint(3, 40, (1, 5))
    alone = model.generate(prompt, 6)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt], dim=1)
    pad = torch.zeros(1, 8, dtype=torch.bool)
    pad[0, :3] = True
    assert torch.equal(model.generate(padded, 6, padding_mask=pad)[:, 3:], alone)
    exact = create_model("gpt_tiny", vocab_size=40, depth=2, pos_embed="rope", attention="exact").eval()
    assert torch.equal(exact.generate(padded, 6, padding_mask=pad)[:, 3:], exact.generate(prompt, 6))
    with pytest.raises(InputError, match="kinds that do: .*topk"):
        create_model("gpt_tiny", pos_embed="rope", attention="linear")
    with pytest.raises(InputError, match="the model sets it from pos_embed"):
        create_model("gpt_tiny", attention="topk", attention_options={"rope": True})
    get_task("language_modeling").check(load_recipe("lm-shakespeare-char", ["model.options.attention=topk"]))
