"""Rope scaling (linear, dynamic, yarn, llama3, longrope) and partial rotary, against Hugging
Face transformers: the frequencies and attention factor of each type, the cos/sin of its
rotary module at positions within and past the pretraining length (whole sequences and
single decoding steps), and Phi-3's partial rotation; then the settings refused."""

import math

import pytest
import torch

from attnlab.attention.rope_scaling import ROPE_TYPES, check_rope_scaling, depends_on_length, rope_frequencies
from attnlab.attention.rotary import RotaryEmbedding, apply_rotary, rotate_half
from attnlab.errors import InputError

LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}


def longrope(rotary_dim, **extra):
    short = [1.0 + 0.05 * i for i in range(rotary_dim // 2)]
    long = [1.0 + 0.9 * i for i in range(rotary_dim // 2)]
    return {"rope_type": "longrope", "short_factor": short, "long_factor": long, **extra}


# (scaling, head_dim, fraction, theta, max_len, seq_lens to ask for: None is "as built")
CASES = {
    "linear-2-d16": ({"rope_type": "linear", "factor": 2.0}, 16, 1.0, 10000.0, 64, [None]),
    "linear-8-d8": ({"rope_type": "linear", "factor": 8}, 8, 1.0, 500000.0, 64, [None]),
    "linear-2-d16-half": ({"rope_type": "linear", "factor": 2.0}, 16, 0.5, 10000.0, 64, [None]),
    "dynamic-2-d16": ({"rope_type": "dynamic", "factor": 2.0}, 16, 1.0, 10000.0, 32, [None, 1, 32, 33, 100]),
    "dynamic-8-d8": ({"rope_type": "dynamic", "factor": 8.0}, 8, 1.0, 10000.0, 32, [None, 31, 33, 1000]),
    "dynamic-2-d16-quarter": ({"rope_type": "dynamic", "factor": 2.0}, 32, 0.25, 10000.0, 32, [None, 40]),
    "yarn-2-d16": ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096}, 16, 1.0,
                   10000.0, 8192, [None]),
    "yarn-8-d8-small": ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32}, 8, 1.0,
                        10000.0, 256, [None]),
    "yarn-4-mscale": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
                       "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2}, 16, 1.0, 10000.0, 16384, [None]),
    "yarn-40-deepseek": ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}, 16, 1.0, 10000.0,
                        163840, [None]),
    "yarn-mscale-small": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.707,
                           "mscale_all_dim": 1.0}, 16, 1.0, 10000.0, 128, [None]),
    "yarn-attention-untruncated": ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024,
                                    "attention_factor": 1.3, "truncate": False}, 16, 0.75, 1000000.0, 8192, [None]),
    "yarn-no-original": ({"rope_type": "yarn", "factor": 2.0}, 16, 1.0, 10000.0, 2048, [None]),
    "llama3-8192": (LLAMA31, 16, 1.0, 500000.0, 131072, [None]),
    "llama3-64": ({**LLAMA31, "original_max_position_embeddings": 64}, 16, 1.0, 500000.0, 256, [None]),
    "llama3-16-d8": ({**LLAMA31, "original_max_position_embeddings": 16, "factor": 2.0}, 8, 1.0, 10000.0, 64, [None]),
    "longrope-d8": (longrope(8, original_max_position_embeddings=16), 8, 1.0, 10000.0, 64, [None, 16, 17, 100]),
    "longrope-d16-factor": (longrope(16, original_max_position_embeddings=16, factor=8.0), 16, 1.0, 10000.0, 64,
                            [None, 17]),
    "longrope-half-attention": (longrope(8, original_max_position_embeddings=32, attention_factor=1.2), 16, 0.5,
                                10000.0, 128, [None, 32, 33]),
    "longrope-no-original": (longrope(16), 16, 1.0, 10000.0, 64, [None, 64, 65]),
}


@pytest.fixture(scope="module")
def hf():
    return pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")


def hf_config(hf, scaling, head_dim, fraction, theta, max_len):
    params = {**scaling, "rope_theta": theta}
    if fraction != 1.0:
        params["partial_rotary_factor"] = fraction
    return hf.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                          max_position_embeddings=max_len, rope_parameters=params)


@pytest.mark.parametrize("case", sorted(CASES))
def test_frequencies_and_attention_factor_equal_transformers(hf, case):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling, head_dim, fraction, theta, max_len, seq_lens = CASES[case]
    config = hf_config(hf, scaling, head_dim, fraction, theta, max_len)
    rotary_dim = int(head_dim * fraction)
    for seq_len in seq_lens:
        theirs, their_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, None, seq_len=seq_len)
        ours, our_factor = rope_frequencies(rotary_dim, theta, scaling, max_len=max_len, seq_len=seq_len)
        assert ours.dtype == torch.float32 and ours.shape == (rotary_dim // 2,)
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
        assert our_factor == pytest.approx(their_factor, rel=1e-6)


def test_the_cases_reach_every_branch_they_are_meant_to():
    """Scaled and plain frequencies differ where they should, so the parity above is no accident."""
    for name in ("llama3-64", "llama3-8192"):  # kept, smoothed and divided wavelengths all occur
        scaling, head_dim, _, theta, max_len, _ = CASES[name]
        plain = rope_frequencies(head_dim, theta, None, max_len=max_len)[0]
        ours = rope_frequencies(head_dim, theta, scaling, max_len=max_len)[0]
        ratio = plain / ours
        assert (ratio == 1).any() and torch.isclose(ratio, torch.tensor(8.0)).any()
        assert ((ratio > 1.01) & (ratio < 7.99)).any()
    scaling, head_dim, _, theta, max_len, _ = CASES["yarn-2-d16"]  # extrapolated, ramped and interpolated
    ratio = rope_frequencies(head_dim, theta, None, max_len=max_len)[0] / rope_frequencies(
        head_dim, theta, scaling, max_len=max_len)[0]
    assert ratio[0] == 1 and torch.isclose(ratio[-1], torch.tensor(2.0)) and ((ratio > 1.01) & (ratio < 1.99)).any()
    assert rope_frequencies(16, 1e4, CASES["yarn-2-d16"][0], max_len=8192)[1] == pytest.approx(0.1 * math.log(2) + 1)
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    plain = rope_frequencies(16, 1e4, None, max_len=32)[0]
    assert torch.equal(rope_frequencies(16, 1e4, scaling, max_len=32, seq_len=32)[0], plain)
    assert (rope_frequencies(16, 1e4, scaling, max_len=32, seq_len=33)[0][1:] < plain[1:]).all()


def rotary_pair(hf, scaling, head_dim, fraction, theta, max_len, phi3=False):
    """Our RotaryEmbedding and transformers' rotary module for one config (built from the
    rope dict that transformers itself writes, rope_theta and partial_rotary_factor included)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    if phi3:  # Phi-3 keeps original_max_position_embeddings and partial_rotary_factor out of the rope dict
        params = {k: v for k, v in scaling.items() if k != "original_max_position_embeddings"}
        config = hf.Phi3Config(hidden_size=4 * head_dim, num_attention_heads=4, num_key_value_heads=4,
                               max_position_embeddings=max_len, partial_rotary_factor=fraction,
                               original_max_position_embeddings=scaling["original_max_position_embeddings"],
                               rope_parameters={**params, "rope_theta": theta})
        theirs = Phi3RotaryEmbedding(config)
    else:
        config = hf_config(hf, scaling, head_dim, fraction, theta, max_len)
        theirs = LlamaRotaryEmbedding(config)
    ours = RotaryEmbedding(head_dim, theta, fraction=fraction, scaling=dict(config.rope_parameters), max_len=max_len)
    return ours, theirs


def assert_same_cos_sin(ours, theirs, positions):
    """``positions`` ``(B, L)`` through both modules, by a tensor and, for one row, as a slice."""
    x = torch.zeros(1)
    cos, sin = theirs(x, positions)
    our_cos, our_sin = ours.cos_sin(positions, torch.float32)
    torch.testing.assert_close(our_cos[:, 0], cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(our_sin[:, 0], sin, rtol=0, atol=1e-6)
    start, length = int(positions[0, 0]), positions.shape[1]
    if positions.shape[0] == 1 and torch.equal(positions[0], torch.arange(start, start + length)):
        our_cos, our_sin = ours.cos_sin_from(start, length, torch.float32, positions.device)
        torch.testing.assert_close(our_cos, cos, rtol=0, atol=1e-6)
        torch.testing.assert_close(our_sin, sin, rtol=0, atol=1e-6)


MODULE_CASES = ["linear-2-d16-half", "dynamic-2-d16", "dynamic-8-d8", "dynamic-2-d16-quarter", "yarn-8-d8-small",
                "yarn-mscale-small", "llama3-64", "longrope-d8", "longrope-d16-factor",
                "longrope-no-original"]


@pytest.mark.parametrize("case", MODULE_CASES)
def test_cos_sin_equal_the_transformers_module_within_and_past_the_pretraining_length(hf, case):
    scaling, head_dim, fraction, theta, max_len, _ = CASES[case]
    ours, theirs = rotary_pair(hf, scaling, head_dim, fraction, theta, max_len)
    assert ours.attention_factor == pytest.approx(theirs.attention_scaling, rel=1e-12)
    for length in (5, max_len // 2, max_len, max_len + 1, 2 * max_len + 3, 7):
        assert_same_cos_sin(ours, theirs, torch.arange(length)[None])
    assert_same_cos_sin(ours, theirs, torch.tensor([[3, 0, 9], [max_len + 4, 2, 1]]))  # a batch: its longest row


@pytest.mark.parametrize("case", MODULE_CASES)
def test_cos_sin_equal_the_transformers_module_step_by_step_while_decoding(hf, case):
    """A prompt, then one position per call past the pretraining length, then a new shorter
    prompt: each call's own longest position decides (transformers' seq_len = max + 1)."""
    scaling, head_dim, fraction, theta, max_len, _ = CASES[case]
    ours, theirs = rotary_pair(hf, scaling, head_dim, fraction, theta, max_len)
    original = (ours.scaling or {}).get("original_max_position_embeddings", max_len)
    prompt = min(original, max_len) - 3
    assert_same_cos_sin(ours, theirs, torch.arange(prompt)[None])
    for pos in range(prompt, max(original, max_len) + 6):
        assert_same_cos_sin(ours, theirs, torch.tensor([[pos]]))
        assert_same_cos_sin(ours, theirs, torch.tensor([[pos], [pos - 2]]))  # left-padded rows: (B, 1)
    assert_same_cos_sin(ours, theirs, torch.arange(6)[None])


def test_phi3_longrope_with_partial_rotary_equals_transformers(hf):
    scaling = longrope(8, original_max_position_embeddings=24)
    ours, theirs = rotary_pair(hf, scaling, 16, 0.5, 10000.0, 96, phi3=True)
    assert ours.rotary_dim == 8 and ours.attention_factor == pytest.approx(theirs.attention_scaling)
    for length in (10, 24, 25, 96, 120):
        assert_same_cos_sin(ours, theirs, torch.arange(length)[None])
    for pos in range(20, 30):
        assert_same_cos_sin(ours, theirs, torch.tensor([[pos]]))


@pytest.mark.parametrize("fraction", [0.5, 0.75, 1.0])
def test_partial_rotary_equals_phi3_apply_rotary_pos_emb(hf, fraction):
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 10000.0, fraction=fraction)
    assert rope.rotary_dim == int(16 * fraction)
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16)
    positions = torch.arange(3, 12).expand(2, 9)
    cos, sin = rope.cos_sin(positions, torch.float32)
    assert cos.shape == (2, 1, 9, rope.rotary_dim)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos[:, 0], sin[:, 0])
    q_ours, k_ours = rope(q, k, positions)
    assert torch.equal(q_ours, q_hf) and torch.equal(k_ours, k_hf)
    r = rope.rotary_dim
    assert torch.equal(q_ours[..., r:], q[..., r:])  # the rest passes through
    assert not torch.allclose(q_ours[..., :r], q[..., :r])


def test_full_rotary_is_the_formula_it_always_was():
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, 100.0)
    x = torch.randn(1, 2, 5, 8)
    cos, sin = rope.cos_sin(torch.arange(5), torch.float32)
    assert torch.equal(apply_rotary(x, cos, sin), x * cos + rotate_half(x) * sin)
    assert rope.rotary_dim == 8 and rope.scaling is None and rope.attention_factor == 1.0
    assert repr(rope) == "RotaryEmbedding(head_dim=8, theta=100)"


@pytest.mark.parametrize("scaling", [{"rope_type": "linear", "factor": 4.0}, CASES["yarn-8-d8-small"][0],
                                     {**LLAMA31, "original_max_position_embeddings": 16}])
def test_scores_of_a_fixed_scaling_still_depend_on_relative_positions_only(scaling):
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, 10000.0, scaling=scaling, max_len=256)
    q, k = torch.randn(1, 1, 6, 8), torch.randn(1, 1, 6, 8)
    scores = [(lambda a, b: a @ b.transpose(-1, -2))(*rope(q, k, torch.arange(6) + shift)) for shift in (0, 40)]
    torch.testing.assert_close(scores[0], scores[1], atol=1e-4, rtol=1e-4)


def test_length_dependent_frequencies_depend_on_the_call_alone():
    """After a call past max_len, a shorter call gets its own frequencies back (transformers
    keeps the longer ones until a call falls below max_len again: see the module docstring)."""
    rope = RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2.0}, max_len=16)
    fresh = RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2.0}, max_len=16)
    rope.cos_sin(torch.arange(40), torch.float32)
    for length in (20, 16, 8):
        assert torch.equal(rope.cos_sin(torch.arange(length), torch.float32)[0],
                           fresh.cos_sin(torch.arange(length), torch.float32)[0])
    assert depends_on_length({"rope_type": "dynamic", "factor": 2.0}) and depends_on_length(longrope(8))
    assert not depends_on_length(None) and not depends_on_length({"type": "linear", "factor": 2.0})


def test_scaling_is_normalized_and_named_in_the_repr():
    assert check_rope_scaling(None, rotary_dim=8) is None
    assert check_rope_scaling({"rope_type": "default", "rope_theta": 1e4}, rotary_dim=8) is None
    assert check_rope_scaling({"type": "linear", "factor": 2, "rope_theta": 1e4, "partial_rotary_factor": 0.5},
                              rotary_dim=8) == {"rope_type": "linear", "factor": 2}
    assert check_rope_scaling({"rope_type": "yarn", "factor": 2.0, "mscale": None}, rotary_dim=8) == \
        {"rope_type": "yarn", "factor": 2.0}
    rope = RotaryEmbedding(16, 1e4, fraction=0.5, scaling={"rope_type": "yarn", "factor": 4.0}, max_len=64)
    assert rope.scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert "fraction=0.5" in repr(rope) and "rope_type=yarn" in repr(rope) and "factor=4" in repr(rope)
    assert ROPE_TYPES == ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


@pytest.mark.parametrize("scaling, match", [
    ({"rope_type": "linear", "factor": -1}, r"rope_scaling\.factor must be a number > 0; got -1"),
    ({"rope_type": "linear", "factor": "2"}, r"rope_scaling\.factor must be a number > 0; got '2'"),
    ({"rope_type": "linear"}, r"rope_scaling\.factor is required for rope_type 'linear'"),
    ({"rope_type": "ntk", "factor": 2}, r"rope_scaling\.rope_type must be one of default, linear, dynamic, yarn, "
                                        r"llama3, longrope; got 'ntk'"),
    ({"rope_type": "linear", "factor": 2, "beta_fast": 4}, r"rope_scaling\.beta_fast is not a setting of rope_type "
                                                           r"'linear' \(its settings: factor\)"),
    ({"rope_type": "dynamic", "factor": 2, "original_max_position_embeddings": 8},
     r"rope_scaling\.original_max_position_embeddings is not a setting of rope_type 'dynamic'"),
    ({"rope_type": "default", "factor": 2}, r"rope_scaling\.factor is not a setting of rope_type 'default'"),
    ({"type": "linear", "rope_type": "yarn", "factor": 2}, r"rope_scaling\.type 'linear' disagrees"),
    (longrope(6), r"rope_scaling\.short_factor must have rotary_dim / 2 = 4 numbers, one per frequency; got 3"),
    ({**longrope(8), "long_factor": [1.0, 2.0]}, r"rope_scaling\.long_factor must have rotary_dim / 2 = 4 numbers"),
    ({**longrope(8), "long_factor": [1.0, 0.0, 1.0, 1.0]}, r"rope_scaling\.long_factor must be a list of numbers > 0"),
    ({**LLAMA31, "high_freq_factor": 1.0}, r"rope_scaling\.high_freq_factor must be > low_freq_factor \(1.0\); got 1"),
    ({**LLAMA31, "original_max_position_embeddings": 81.5},
     r"rope_scaling\.original_max_position_embeddings must be a positive integer; got 81.5"),
    ({"rope_type": "yarn", "factor": 2, "truncate": "no"}, r"rope_scaling\.truncate must be true or false; got 'no'"),
    ({"rope_type": "yarn", "factor": 2, "beta_fast": 1, "beta_slow": 4}, r"rope_scaling\.beta_fast must be >= "),
    ({"rope_type": "yarn", "factor": 2, "attention_factor": 0}, r"rope_scaling\.attention_factor must be a number > 0"),
    ([("rope_type", "linear")], r"rope_scaling must be a dict with a rope_type, or None; got list"),
])
def test_a_bad_scaling_is_refused_naming_its_setting(scaling, match):
    with pytest.raises(InputError, match=match):
        check_rope_scaling(scaling, rotary_dim=8)
    with pytest.raises(InputError, match=match):
        RotaryEmbedding(8, scaling=scaling, max_len=64)


def test_bad_rotary_settings_are_refused():
    with pytest.raises(InputError, match=r"partial_rotary: rotary_dim = int\(head_dim 10 \* fraction 0.5\) = 5 must be "
                                         r"even"):
        RotaryEmbedding(10, fraction=0.5)
    with pytest.raises(InputError, match=r"partial_rotary: rotary_dim = int\(head_dim 8 \* fraction 0.1\) = 0"):
        RotaryEmbedding(8, fraction=0.1)
    with pytest.raises(InputError, match=r"partial_rotary \(fraction\) must be a number in \(0, 1\]; got 1.5"):
        RotaryEmbedding(8, fraction=1.5)
    with pytest.raises(InputError, match="head_dim must be even"):
        RotaryEmbedding(7)
    with pytest.raises(InputError, match=r"max_len must be a positive integer with rope_scaling 'linear'"):
        RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(InputError, match=r"rope_scaling\.rope_type 'dynamic' needs a rotary dimension of 4 or more"):
        RotaryEmbedding(8, fraction=0.25, scaling={"rope_type": "dynamic", "factor": 2.0}, max_len=16)
    with pytest.raises(InputError, match=r"rope_scaling\.rope_theta 500000.0 differs from theta 10000"):
        RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}, max_len=16)
    with pytest.raises(InputError, match=r"rope_scaling\.partial_rotary_factor 0.5 differs from fraction 1"):
        RotaryEmbedding(8, scaling={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, max_len=16)
    with pytest.raises(InputError, match="rotary_dim must be a positive even integer; got 7"):
        rope_frequencies(7, 1e4, None, max_len=16)
