"""One head, step by step: for one query token of a text, the arithmetic the tutorials write
out, done with the numbers of a real layer on the learner's own tokens.

    x (the layer's input) -> q = x W_q, k = x W_k, v = x W_v   (one head's rows; a grouped-query
                             layer shares its key/value head among a group of query heads)
    -> the heads' norms and rotary positions, where the layer has them
    -> dots_j = q_i . k_j -> scaled_j = dots_j * scale (1 / sqrt(head size) unless the layer says)
    -> soft-capped (Gemma 2), plus the ALiBi bias -> the mask (causal, a sliding window)
    -> weights = softmax over the keys left (with a sink's logit in the sum, gpt-oss)
    -> output_i = sum_j weights_j v_j

It reads the layer as the layer computes (its projections called as layers, so LoRA or 8-bit
weights give theirs), and its ``weights`` equal what :func:`~attnlab.attention.capture_attention`
records of the layer (tested): a step-by-step that drifted from the model would show it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..attention import GroupedQueryAttention
from ..errors import InputError

__all__ = ["head_step", "steppable"]


def steppable(module: nn.Module) -> str | None:
    """Why ``module``'s heads cannot be shown step by step, or ``None`` when they can: softmax
    attention over q, k and v of one head each (the ``exact`` kind, with any positions, window,
    soft-cap or sinks); a kind that changes that step (differential, nsa) or has no such heads
    (latent, linear) is named."""
    if not isinstance(module, GroupedQueryAttention):
        return f"its attention is {type(module).__name__}, not softmax attention over one head's q, k and v"
    if not type(module).standard_step:
        return f"its attention ({type(module).__name__}) changes the softmax step of exact attention"
    return None


def _rows(t: Tensor, digits: int = 5) -> Any:
    """A tensor as nested lists of floats of ``digits`` significant digits (JSON for the page)."""
    values = t.detach().double().cpu().tolist()

    def round_(v: Any) -> Any:
        if isinstance(v, list):
            return [round_(x) for x in v]
        if not math.isfinite(v):
            return None
        return float(f"{v:.{digits}g}")

    return round_(values)


@torch.no_grad()
def head_step(module: nn.Module, x: Tensor, head: int, query: int, *, positions: Tensor | None = None,
              causal: bool = True) -> dict[str, Any]:
    """The step-by-step of head ``head`` of ``module`` for query position ``query`` of ``x``
    ``(1, L, E)`` (the layer's input, as the model gave it): a dict of the vectors and numbers of
    each step (see the module docstring), as lists of floats, and ``weights`` ``(L,)`` with 0
    where the mask blocks a key. ``positions`` ``(L,)``: the tokens' positions (default 0..L-1)."""
    why = steppable(module)
    if why is not None:
        raise InputError(f"this layer's heads cannot be shown step by step: {why}")
    assert isinstance(module, GroupedQueryAttention)
    if x.dim() != 3 or x.shape[0] != 1:
        raise InputError(f"x must be one row, shape (1, L, E); got {tuple(x.shape)}")
    n, heads, kv_heads, d = x.shape[1], module.num_heads, module.num_kv_heads, module.head_dim
    if not (isinstance(head, int) and 0 <= head < heads):
        raise InputError(f"head must be in [0, {heads - 1}]; got {head!r}")
    if not (isinstance(query, int) and 0 <= query < n):
        raise InputError(f"query must be a position in [0, {n - 1}]; got {query!r}")
    q = module.q_proj(x)
    if module.output_gate:  # per head: the query's D rows, then the gate's
        q = q.view(1, n, heads, 2 * d)[..., :d]
    q = q.reshape(1, n, heads, d).transpose(1, 2)
    k = module.k_proj(x).view(1, n, kv_heads, d).transpose(1, 2)
    v = module.v_proj(x).view(1, n, kv_heads, d).transpose(1, 2)
    projected = {"query_projected": _rows(q[0, head, query])}
    if module.q_norm is not None:
        q, k = module.q_norm(q), module.k_norm(k)  # type: ignore[misc]
    pos = torch.arange(n, device=x.device) if positions is None else positions.to(x.device)
    if module.rotary is not None:
        q, k = module.rotary(q, k, pos)
    kv = head // (heads // kv_heads)
    qi, keys, values = q[0, head, query].float(), k[0, kv].float(), v[0, kv].float()
    dots = keys @ qi  # (L,)
    scale = module.scale if module.scale is not None else 1.0 / math.sqrt(d)
    scaled = dots * scale
    logits = scaled
    capped = None
    if module.softcap is not None:
        capped = torch.tanh(scaled / module.softcap) * module.softcap
        logits = capped
    bias = None
    if module.alibi_slopes is not None:
        bias = -module.alibi_slopes[head].float() * (pos[query] - pos).abs().float()
        logits = logits + bias
    j = torch.arange(n, device=x.device)
    allowed = torch.ones(n, dtype=torch.bool, device=x.device)
    if causal:
        allowed &= j <= query
    if module.sliding_window is not None:
        allowed &= (query - j < module.sliding_window) & (j - query < module.sliding_window)
    masked = logits.masked_fill(~allowed, -math.inf)
    sink = None if module.sinks is None else module.sinks[head].float()
    top = masked.max() if sink is None else torch.maximum(masked.max(), sink)
    exp = torch.exp(masked - top)
    total = exp.sum() + (0.0 if sink is None else torch.exp(sink - top))
    weights = exp / total
    output = weights @ values
    return {
        "layer_kind": type(module).__name__, "head": head, "kv_head": kv, "query": query, "head_dim": d,
        **projected,
        "query_vector": _rows(qi), "keys": _rows(keys), "values": _rows(values),
        "dots": _rows(dots), "scale": scale, "scaled": _rows(scaled),
        "softcap": module.softcap, "capped": None if capped is None else _rows(capped),
        "alibi": None if bias is None else _rows(bias),
        "allowed": allowed.tolist(), "window": module.sliding_window, "causal": causal,
        "sink": None if sink is None else float(sink), "sink_weight": None if sink is None else
        float(torch.exp(sink - top) / total),
        "weights": _rows(weights), "output": _rows(output),
        "rotary": module.rotary is not None, "qk_norm": module.q_norm is not None,
    }
