"""Top-k and hard self-attention, registered as ``"topk"``.

Each query keeps its ``k`` largest scores and gives every other key weight zero: the
softmax runs over the kept scores alone. ``k = 1`` is *hard* attention, each query taking
the value of its arg-max key (the "hard" attention that the tutorials set beside soft
attention, in its deterministic form: the arg-max instead of a sample); ``k >= L`` is exact
attention. The weights are sparse by content (which keys win depends on the input),
where the sparse kinds' patterns (``"sparse"``, ``"local"``) are fixed by position.

The output is differentiable through the kept scores: the choice of the ``k`` keys is
a step function of the scores (no gradient), the softmax over them is not. With ``k =
1`` the weight of the chosen key is 1 whatever its score, so no gradient reaches the
queries and keys through the weights, only through which value is picked; such a model
learns its projections of queries and keys from other layers (or not at all), which is
why hard attention was trained with sampling and REINFORCE in the papers that used it
(Xu et al., 2015). Ties at the ``k``-th score are broken by position (the first kept).

Cost: the ``n x n`` scores are formed, so time and memory are those of exact attention
with its weights formed (``O(n^2 d)``, ``O(n^2)``), plus a top-k selection per query:
top-k attention changes what attention can express, not what it costs. (A kind whose cost
grows below ``n^2`` must choose its keys without scoring all of them first.)

Masks: ``key_padding_mask`` ``(B, L)`` bool (``True`` = padding) and ``is_causal``: masked
keys are never kept; a query with fewer than ``k`` visible keys keeps them all, and a
query with none outputs zeros, as in :mod:`attnlab.attention.functional`. Softmax runs in
float32 for half-precision inputs.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from ...dropout import dropout
from ...errors import InputError
from ..functional import masked_softmax
from ..contract import Option
from ..registry import register_attention
from .base import TOKEN_OPTIONS, TokenAttention

__all__ = ["TopKAttention", "topk_attention"]


def topk_attention(q: Tensor, k: Tensor, v: Tensor, top_k: int, *, key_padding_mask: Tensor | None = None,
                   is_causal: bool = False, dropout_p: float = 0.0) -> Tensor:
    """Top-k attention on ``(B, H, L, D)`` tensors (see the module docstring): ``(B, H, L, Dv)``.

    ``key_padding_mask``: ``(B, L)`` bool, ``True`` = padding. ``dropout_p``: dropout on
    the kept weights (pass 0 in eval mode)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)).to(torch.promote_types(q.dtype, torch.float32))
    scores = scores * (1.0 / math.sqrt(q.shape[-1]))
    blocked = None
    if key_padding_mask is not None:
        blocked = key_padding_mask[:, None, None, :]
    if is_causal:
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1)
        blocked = future if blocked is None else blocked | future
    if blocked is not None:
        scores = scores.masked_fill(blocked, -math.inf)
    if top_k < n_k:
        kept = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, scores.topk(top_k, dim=-1).indices, True)
        scores = scores.masked_fill(~kept, -math.inf)  # a masked key among the top k stays -inf
    weights = masked_softmax(scores)
    if dropout_p > 0:
        weights = dropout(weights, p=dropout_p)
    return torch.matmul(weights.to(v.dtype), v)


TOPK_OPTIONS = TOKEN_OPTIONS.extend(Option("top_k", int, 8, "the logits each query keeps", low=1, counts_positions=True))


@register_attention("topk", options=TOPK_OPTIONS, takes_positions=True, causal=True, padding=True,
                    lora_roles=("attention",),
                    summary="each query keeps only its k largest logits")
class TopKAttention(TokenAttention):
    """Top-k self-attention (see the module docstring); ``top_k=1`` is hard attention.

    Args:
        embed_dim: as :class:`~.base.TokenAttention`.
        num_heads: as :class:`~.base.TokenAttention`.
        dropout: as :class:`~.base.TokenAttention`.
        bias: as :class:`~.base.TokenAttention`.
        rope: rotary positions on queries and keys, as :class:`~.base.TokenAttention`.
        rope_theta: the base of the rotary wavelengths.
        top_k: positive int ``k``: the keys each query keeps.
    """

    kind = "topk"

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rope: bool = False, rope_theta: float = 10000.0, top_k: int = 8) -> None:
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k <= 0:
            raise InputError(f"{self.kind}: top_k must be a positive int; got top_k={top_k!r}")
        self.check_positions(top_k=top_k)
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, rope=rope, rope_theta=rope_theta)
        self.top_k = int(top_k)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        return topk_attention(q, k, v, self.top_k, key_padding_mask=key_padding_mask, is_causal=is_causal,
                              dropout_p=self.dropout if self.training else 0.0)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", top_k={self.top_k}"
