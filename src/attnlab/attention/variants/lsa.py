"""Locality self-attention (Lee, Lee and Song, 2021, "Vision Transformer for Small-Size
Datasets"): exact multi-head self-attention with two changes that sharpen it on small data.

* A learned temperature: the logits are ``q·k`` times ``exp(s)``, with ``s`` learned and
  starting at ``log(1/sqrt(D))`` (the usual scale), so a head can grow sharper.
* Diagonal masking: a token does not attend to itself (its logit is ``-inf``), so its
  attention goes to the other tokens; the residual connection keeps its own value.

A query left with no other key (a single token, the first of a causal sequence, or one
whose other keys are all padding) attends to itself rather than to nothing. Computed by torch's fused kernel, with the diagonal as a mask.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..registry import register_attention
from .base import PLAIN_TOKEN_OPTIONS, TokenAttention

__all__ = ["LocalitySelfAttention"]


LSA_OPTIONS = PLAIN_TOKEN_OPTIONS


@register_attention("lsa", options=LSA_OPTIONS, takes_positions=True, causal=True, padding=True,
                    lora_roles=("attention",),
                    summary="locality self-attention: a learned temperature, no attention to oneself")
class LocalitySelfAttention(TokenAttention):
    """Self-attention with a learned temperature and no attention to oneself (see the
    module docstring). Args as :class:`~.base.TokenAttention`."""

    kind = "lsa"

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias)
        self.log_scale = nn.Parameter(torch.tensor(math.log(self.head_dim**-0.5)))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        n = q.shape[-2]
        allowed = ~torch.eye(n, dtype=torch.bool, device=q.device) if n > 1 else \
            torch.ones(1, 1, dtype=torch.bool, device=q.device)
        if is_causal:
            allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            if n:
                allowed[0, 0] = True  # the first token has only itself
        mask = allowed[None, None]
        if key_padding_mask is not None:
            mask = mask & ~key_padding_mask[:, None, None, :]
            # a query whose every other key is padding attends to itself rather than to nothing
            eye = torch.eye(n, dtype=torch.bool, device=q.device)[None, None]
            mask = mask | (eye & ~mask.any(-1, keepdim=True))
        return F.scaled_dot_product_attention(q * self.log_scale.exp(), k, v, attn_mask=mask, scale=1.0,
                                              dropout_p=self.dropout if self.training else 0.0)
