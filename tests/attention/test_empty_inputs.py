"""Empty inputs: a batch of 0, a sequence of 0 positions, a map of height or width 0.

Every attention kind gives the empty result the math gives (the output shape with a 0
in it, weights too when asked), no NaN, and a backward pass whose gradients have the
inputs' shapes (parameters: zero, or no gradient at all). Where an empty input cannot
be honoured (a kind whose parameters fix the map size) it raises a ``ValueError``
naming the argument. Keys of length 0 for queries that exist follow the library's
convention for queries whose keys are all blocked: zeros, never NaN.

The kinds come from the registry, so a newly registered kind is covered here too.
"""

import pytest
import torch

from attnlab.attention import (
    CrossAttention,
    MultiHeadAttention,
    build_attention,
    list_attention,
    scaled_dot_product_attention,
)

DIM, HEADS = 16, 2
LENGTH = 5  # the non-empty length in the empty-batch cases
MAP = (3, 4)  # the non-empty map (H, W) in the empty-map cases

TOKEN_KINDS = list_attention("tokens")
GRID_KINDS = list_attention("grid")
# Grid kinds whose parameters are tied to one map size (``size`` required and positive):
# an empty map does not match it.
FIXED_SIZE_GRID_KINDS = {"relpos2d"}

TOKEN_CASES = {"empty batch": (0, LENGTH), "empty sequence": (2, 0), "empty batch and sequence": (0, 0)}
GRID_EMPTY_MAPS = {"height 0": (0, MAP[1]), "width 0": (MAP[0], 0), "height and width 0": (0, 0)}
MODES = {"train": True, "eval": False}  # dropout is on in training mode
# Options that cut the non-empty length into several blocks / landmarks, so that an empty
# batch reaches the blocked code paths; any other kind is built with its defaults.
TOKEN_OPTIONS = {"local": {"sliding_window": 2}, "sparse": {"block": 2}, "nystrom": {"num_landmarks": 2}}


def _check_backward(out, inputs, module=None, weights=None):
    """``out`` (and ``weights``) free of NaN; backward gives every input a gradient of its
    shape, and every parameter a zero gradient or none."""
    assert not torch.isnan(out).any()
    loss = out.sum()
    if weights is not None:
        for w in weights if isinstance(weights, tuple) else (weights,):
            assert not torch.isnan(w).any()
            loss = loss + w.sum()
    loss.backward()
    for t in inputs:
        assert t.grad is not None and t.grad.shape == t.shape
        assert not torch.isnan(t.grad).any()
    if module is not None:
        for name, p in module.named_parameters():
            assert p.grad is None or not p.grad.any(), name


def _token_module(kind, training):
    return build_attention(kind, DIM, HEADS, dropout=0.1, **TOKEN_OPTIONS.get(kind, {})).train(training)


def _token_call_kwargs(call, module, b, n):
    if call == "causal":
        if not getattr(module, "supports_causal", True):
            pytest.skip(f"{type(module).__name__} cannot be causal")
        return {"is_causal": True}
    if call != "causal" and getattr(module, "causal_only", False):  # the registry's capability
        pytest.skip(f"{type(module).__name__} is causal only")
    if call == "key_padding_mask":
        return {"key_padding_mask": torch.zeros(b, n, dtype=torch.bool)}
    return {}


# ---------------------------------------------------------------- "tokens" kinds
@pytest.mark.parametrize("call", ["plain", "causal", "key_padding_mask"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", TOKEN_CASES)
@pytest.mark.parametrize("kind", TOKEN_KINDS)
def test_token_attention_of_empty_input_is_empty_output(kind, case, mode, call):
    b, n = TOKEN_CASES[case]
    module = _token_module(kind, MODES[mode])
    x = torch.randn(b, n, DIM, requires_grad=True)
    out, weights = module(x, **_token_call_kwargs(call, module, b, n))
    assert out.shape == (b, n, DIM)
    assert weights is None
    _check_backward(out, [x], module)


@pytest.mark.parametrize("case", TOKEN_CASES)
def test_nystrom_attention_with_conv_residual_of_empty_input_is_empty_output(case):
    b, n = TOKEN_CASES[case]
    module = build_attention("nystrom", DIM, HEADS, num_landmarks=2, conv_kernel=3)
    x = torch.randn(b, n, DIM, requires_grad=True)
    out, _ = module(x)
    assert out.shape == (b, n, DIM)
    _check_backward(out, [x], module)


def test_linformer_attention_of_empty_batch_still_rejects_a_length_over_seq_len():
    module = build_attention("linformer", DIM, HEADS, seq_len=4, k=2)
    with pytest.raises(ValueError, match=r"input length 5 exceeds seq_len=4"):
        module(torch.randn(0, 5, DIM))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", TOKEN_CASES)
def test_exact_attention_of_empty_input_has_empty_weights(case, mode):
    b, n = TOKEN_CASES[case]
    module = _token_module("exact", MODES[mode])
    x = torch.randn(b, n, DIM, requires_grad=True)
    out, weights = module(x, need_weights=True)
    assert out.shape == (b, n, DIM)
    assert weights.shape == (b, n, n)
    _check_backward(out, [x], module, weights)


# ---------------------------------------------------------------- "grid" kinds
def _grid_module(kind, size, training):
    return build_attention(kind, DIM, HEADS, size=size, dropout=0.1).train(training)


def _grid_output(result, need_weights):
    """Every attention kind returns ``(output, weights or None)``, whatever ``need_weights`` is."""
    out, weights = result
    assert (weights is None) != need_weights
    return out, weights


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", GRID_KINDS)
def test_grid_attention_of_empty_batch_is_empty_output(kind, mode, need_weights):
    module = _grid_module(kind, MAP, MODES[mode])
    x = torch.randn(0, DIM, *MAP, requires_grad=True)
    out, weights = _grid_output(module(x, need_weights=need_weights), need_weights)
    assert out.shape == (0, DIM, *MAP)
    if need_weights:
        for w in weights if isinstance(weights, tuple) else (weights,):
            assert w.shape[0] == 0
    _check_backward(out, [x], module, weights)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("empty_map", GRID_EMPTY_MAPS)
@pytest.mark.parametrize("kind", sorted(set(GRID_KINDS) - FIXED_SIZE_GRID_KINDS))
def test_grid_attention_of_empty_map_is_empty_output(kind, empty_map, mode, need_weights):
    h, w = GRID_EMPTY_MAPS[empty_map]
    module = _grid_module(kind, None, MODES[mode])  # any map size
    x = torch.randn(2, DIM, h, w, requires_grad=True)
    out, weights = _grid_output(module(x, need_weights=need_weights), need_weights)
    assert out.shape == (2, DIM, h, w)
    if need_weights:
        for wt in weights if isinstance(weights, tuple) else (weights,):
            assert wt.shape[0] == 2 and wt.numel() == 0
    _check_backward(out, [x], module, weights)


def test_axial_attention_of_empty_map_has_empty_row_and_column_weights():
    module = _grid_module("axial", None, False)
    out, (rows, cols) = module(torch.randn(2, DIM, 0, 4), need_weights=True)
    assert out.shape == (2, DIM, 0, 4)
    assert rows.shape == (2, HEADS, 0, 4, 4)
    assert cols.shape == (2, HEADS, 4, 0, 0)


def test_standalone2d_attention_of_empty_map_has_empty_window_weights():
    module = build_attention("standalone2d", DIM, HEADS, kernel_size=3)
    out, weights = module(torch.randn(2, DIM, 3, 0), need_weights=True)
    assert out.shape == (2, DIM, 3, 0)
    assert weights.shape == (2, HEADS, 0, 9)


@pytest.mark.parametrize("empty_map", GRID_EMPTY_MAPS)
@pytest.mark.parametrize("kind", sorted(FIXED_SIZE_GRID_KINDS))
def test_fixed_size_grid_attention_rejects_an_empty_map_naming_x(kind, empty_map):
    h, w = GRID_EMPTY_MAPS[empty_map]
    module = _grid_module(kind, MAP, False)
    # (relpos2d takes any map size, resizing its tables, but not an empty one)
    shape = rf"\(B, {DIM}, H, W\) with H, W >= 1" if kind == "relpos2d" else rf"\(B, {DIM}, {MAP[0]}, {MAP[1]}\)"
    with pytest.raises(ValueError, match=rf"^x must have shape {shape}.*got \(2, {DIM}, {h}, {w}\)"):
        module(torch.randn(2, DIM, h, w))


@pytest.mark.parametrize("kind", sorted(FIXED_SIZE_GRID_KINDS))
def test_fixed_size_grid_attention_rejects_an_empty_size_naming_size(kind):
    with pytest.raises(ValueError, match=r"^size must be"):
        build_attention(kind, DIM, HEADS, size=(0, MAP[1]))


# ---------------------------------------------------------------- MultiHeadAttention
MHA_CASES = {  # (B, Lq, Lk)
    "empty batch": (0, 3, LENGTH),
    "no queries": (2, 0, LENGTH),
    "no queries and no keys": (2, 0, 0),
}


def _mha_kwargs(call, b, lk):
    return {
        "plain": {},
        "causal": {"is_causal": True},
        "key_padding_mask": {"key_padding_mask": torch.zeros(b, lk, dtype=torch.bool)},
        "need_weights": {"need_weights": True},
        "need_weights per head": {"need_weights": True, "average_attn_weights": False},
    }[call]


MHA_CALLS = ["plain", "causal", "key_padding_mask", "need_weights", "need_weights per head"]


@pytest.mark.parametrize("call", MHA_CALLS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", MHA_CASES)
def test_multihead_attention_of_empty_input_is_empty_output(case, mode, call):
    b, lq, lk = MHA_CASES[case]
    module = MultiHeadAttention(DIM, HEADS, dropout=0.1).train(MODES[mode])
    query = torch.randn(b, lq, DIM, requires_grad=True)
    context = torch.randn(b, lk, DIM, requires_grad=True)
    out, weights = module(query, context, context, **_mha_kwargs(call, b, lk))
    assert out.shape == (b, lq, DIM)
    if call == "need_weights":
        assert weights.shape == (b, lq, lk)
    elif call == "need_weights per head":
        assert weights.shape == (b, HEADS, lq, lk)
    _check_backward(out, [query, context], module, weights)


@pytest.mark.parametrize("call", MHA_CALLS)
@pytest.mark.parametrize("mode", MODES)
def test_multihead_attention_with_no_keys_gives_zero_attention(mode, call):
    # Queries with no key at all: as with every key blocked, the attention output is 0,
    # so the module's output is the output projection's bias (and no NaN anywhere).
    module = CrossAttention(DIM, HEADS, dropout=0.1).train(MODES[mode])
    torch.nn.init.normal_(module.o_proj.bias)  # zero at initialisation
    x = torch.randn(2, 3, DIM, requires_grad=True)
    context = torch.randn(2, 0, DIM, requires_grad=True)
    kwargs = _mha_kwargs(call, 2, 0)
    kwargs.pop("is_causal", None)  # cross-attention takes no is_causal
    out, weights = module(x, context, **kwargs)
    torch.testing.assert_close(out, module.o_proj.bias.detach().expand(2, 3, DIM))
    if call == "need_weights":
        assert weights.shape == (2, 3, 0)
    elif call == "need_weights per head":
        assert weights.shape == (2, HEADS, 3, 0)
    _check_backward(out, [x, context], weights=weights)


# ---------------------------------------------------------------- scaled_dot_product_attention
SDPA_CASES = {  # (B, Lq, Lk)
    "empty batch": (0, 3, LENGTH),
    "no queries": (2, 0, LENGTH),
    "no keys": (2, 3, 0),
    "no queries and no keys": (2, 0, 0),
}
SDPA_CALLS = ["plain", "causal", "key_padding_mask", "float key_padding_mask", "attn_mask"]


def _sdpa_kwargs(call, b, lq, lk):
    return {
        "plain": {},
        "causal": {"is_causal": True},
        "key_padding_mask": {"key_padding_mask": torch.zeros(b, lk, dtype=torch.bool)},
        "float key_padding_mask": {"key_padding_mask": torch.zeros(b, lk)},
        "attn_mask": {"attn_mask": torch.zeros(lq, lk, dtype=torch.bool)},
    }[call]


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("dropout_p", [0.0, 0.5])
@pytest.mark.parametrize("call", SDPA_CALLS)
@pytest.mark.parametrize("heads", [None, HEADS], ids=["3-D", "4-D"])
@pytest.mark.parametrize("case", SDPA_CASES)
def test_scaled_dot_product_attention_of_empty_input_is_empty_or_zero(case, heads, call, dropout_p, need_weights):
    b, lq, lk = SDPA_CASES[case]
    lead = (b,) if heads is None else (b, heads)
    q = torch.randn(*lead, lq, 8, requires_grad=True)
    k = torch.randn(*lead, lk, 8, requires_grad=True)
    v = torch.randn(*lead, lk, 6, requires_grad=True)
    out, weights = scaled_dot_product_attention(
        q, k, v, dropout_p=dropout_p, need_weights=need_weights, **_sdpa_kwargs(call, b, lq, lk)
    )
    assert out.shape == (*lead, lq, 6)
    assert not out.any()  # empty, or (no keys) zeros
    if need_weights:
        assert weights.shape == (*lead, lq, lk)
    else:
        assert weights is None
    _check_backward(out, [q, k, v], weights=weights)
