"""One head, step by step (attnlab.lab.steps): on every configuration of the exact kind that a
decoder loads (grouped-query heads, rotary positions, QK-norm, a sliding window, soft-capping,
ALiBi, sinks, an output gate), the weights of the step-by-step equal those the layer computes and
capture_attention records, and its output is their sum of value rows."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import build_attention, capture_attention
from attnlab.errors import InputError
from attnlab.lab.steps import head_step, steppable


@pytest.mark.parametrize("options", [
    {},
    {"num_kv_heads": 2, "rope": True},
    {"num_kv_heads": 1, "rope": True, "qk_norm": True},
    {"rope": True, "sliding_window": 3},
    {"softcap": 5.0},
    {"alibi": True},
    {"kind": "sinks"},
    {"output_gate": True, "rope": True},
    {"rope": True, "rope_theta": 500.0, "partial_rotary": 0.5},
])
def test_the_step_by_step_weights_are_the_layers(options):
    options = dict(options)
    kind = options.pop("kind", "exact")
    torch.manual_seed(0)
    attn = build_attention(kind, 32, 4, **options).eval()
    if kind == "sinks":
        with torch.no_grad():
            attn.sinks.normal_()
    x = torch.randn(1, 9, 32)
    with capture_attention(attn) as maps:
        attn(x, is_causal=True)
    recorded = maps[""][0][0]  # (H, L, L)
    for head in range(4):
        for query in (0, 4, 8):
            step = head_step(attn, x, head, query)
            got = torch.tensor([w if w is not None else 0.0 for w in step["weights"]])
            assert torch.allclose(got, recorded[head, query].float(), atol=1e-4), (head, query, options)
            values = torch.tensor(step["values"])
            assert torch.allclose(torch.tensor(step["output"]), got @ values, atol=1e-3)
            assert not any(step["allowed"][query + 1:])  # causal: no key after the query
    if options.get("sliding_window"):
        assert step["allowed"] == [False] * 6 + [True] * 3  # the last query sees the window's 3 keys


def test_kinds_that_change_the_step_are_named():
    for kind in ("differential", "latent"):
        attn = build_attention(kind, 32, 4)
        assert steppable(attn) is not None
        with pytest.raises(InputError, match="cannot be shown step by step"):
            head_step(attn, torch.randn(1, 3, 32), 0, 0)
    attn = build_attention("exact", 32, 4)
    with pytest.raises(InputError, match=r"head must be in \[0, 3\]"):
        head_step(attn, torch.randn(1, 3, 32), 4, 0)
    with pytest.raises(InputError, match=r"query must be a position in \[0, 2\]"):
        head_step(attn, torch.randn(1, 3, 32), 0, 3)
