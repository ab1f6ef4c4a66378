"""The base of the efficient attention kinds: projections shared with exact attention,
and clear errors for what a kind cannot honour."""

import pytest
import torch

from attnlab.attention.functional import scaled_dot_product_attention
from attnlab.attention import build_attention
from attnlab.attention.variants.base import TokenAttention

from refusals import under_an_address_space_limit


class Dense(TokenAttention):
    """The exact kernel behind the base: the base with it must equal SelfAttention."""

    kind = "dense-test"

    def attend(self, q, k, v, *, key_padding_mask, is_causal):
        return scaled_dot_product_attention(q, k, v, key_padding_mask=key_padding_mask, is_causal=is_causal)[0]


class NoCausal(Dense):
    kind = "nocausal-test"
    supports_causal = False
    supports_padding = False


@pytest.mark.parametrize("causal", [False, True])
def test_same_parameters_and_result_as_exact_attention(causal):
    torch.manual_seed(0)
    ours, exact = Dense(32, 4).eval(), build_attention("exact", 32, 4).eval()
    assert sorted(ours.state_dict()) == sorted(exact.state_dict())
    ours.load_state_dict(exact.state_dict())
    x = torch.randn(3, 9, 32)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, 6:] = True
    out, w = ours(x, key_padding_mask=pad, is_causal=causal)
    ref, _ = exact(x, key_padding_mask=pad, is_causal=causal)
    assert w is None
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_errors_name_the_kind_and_the_argument():
    m = NoCausal(32, 4)
    x = torch.randn(2, 5, 32)
    with pytest.raises(ValueError, match="nocausal-test attention cannot be causal"):
        m(x, is_causal=True)
    with pytest.raises(ValueError, match="nocausal-test attention cannot mask padding"):
        m(x, key_padding_mask=torch.ones(2, 5, dtype=torch.bool))
    assert torch.equal(m(x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))[0], m(x)[0])  # no padding: fine
    with pytest.raises(ValueError, match="takes no attn_mask"):
        m(x, attn_mask=torch.zeros(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="need_weights must be False"):
        m(x, need_weights=True)
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, 32\)"):
        m(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=r"key_padding_mask must be bool of shape \(2, 5\)"):
        Dense(32, 4)(x, key_padding_mask=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        Dense(30, 4)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        Dense(32, 4, dropout=1.0)


# ----------------------------------------------------------------------------- position counts past a kind's cap


@pytest.fixture(scope="module")
def limited() -> dict[str, list]:
    """``{case: [what happened, message]}`` of the kinds whose buffers used to take gigabytes, built
    in one child process under a 4 GB address-space limit."""
    return under_an_address_space_limit({
        "lsh n_buckets": ["build_attention", ["lsh", 64, 4], {"n_buckets": 10**9}],
        "linformer seq_len": ["build_attention", ["linformer", 64, 4], {"seq_len": 10**9}],
        "sparse random_blocks": ["build_attention", ["sparse", 64, 4], {"random_blocks": 10**9}],
    })


@pytest.mark.parametrize("case, said", [
    ("lsh n_buckets", "lsh: n_buckets must be at most 1048576"),
    ("linformer seq_len", "linformer: seq_len must be at most 1048576"),
    ("sparse random_blocks", "sparse: random_blocks must be at most 1048576"),
])
def test_a_kind_alone_refuses_position_counts_past_its_cap_before_its_buffers(limited, case, said):
    kind, message = limited[case]
    assert kind == "InputError" and said in message and "got" in message
