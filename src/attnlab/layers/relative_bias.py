"""Relative position bias: a learned scalar per head and relative-distance bucket, added to the attention logits.

Attention logits get ``b[h, bucket(j - i)]`` for query ``i`` and key ``j``, so attention
sees how far apart (and in which order) two tokens are rather than where they are
(relative positions: Shaw et al., 2018, "Self-Attention with Relative Position
Representations"). The scalar-per-bucket form with log-spaced buckets is T5's (Raffel et
al., 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer", §2.1); as in T5, one table can be shared by all layers.

Buckets of the distance ``d = j - i`` (key position minus query position):

* bidirectional: ``d < 0`` (key before the query) uses buckets ``[0, n/2)``, ``d > 0``
  uses ``[n/2, n)``, ``d = 0`` is bucket 0; unidirectional (causal): all ``n`` buckets
  for ``d <= 0``, and every ``d > 0`` falls in bucket 0 (those keys are masked anyway);
* within a side of ``m`` buckets, the first ``m/2`` are the exact distances
  ``0 .. m/2 - 1``; the rest are log-spaced up to ``max_distance``, and every farther
  distance shares the side's last bucket.

Shapes::

    relative_position_bucket(d)   integer (...) -> bucket ids (...), in [0, num_buckets)
    forward(q_len, k_len)         (1, H, q_len, k_len) float, added to the logits
                                  (an additive ``attn_mask``, see attnlab.attention.functional)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["RelativePositionBias", "relative_position_bucket"]


def relative_position_bucket(
    distance: Tensor, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
) -> Tensor:
    """Bucket ids (same shape, int64) of relative distances ``key - query``; see the module docstring."""
    distance = distance.long()
    if bidirectional:
        side = num_buckets // 2
        offset = (distance > 0).long() * side  # keys after the query: upper half
        n = distance.abs()
    else:
        side = num_buckets
        offset = torch.zeros_like(distance)
        n = (-distance).clamp_min(0)  # only keys at or before the query are told apart
    exact = side // 2
    # Log-spaced buckets: exact .. side-1 cover n in [exact, max_distance). clamp_min keeps
    # log() finite for the small n that torch.where discards anyway.
    log_ratio = torch.log(n.clamp_min(exact).float() / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (side - exact)).long()).clamp_max(side - 1)
    return offset + torch.where(n < exact, n, far)


class RelativePositionBias(nn.Module):
    """Learned ``(num_buckets, num_heads)`` table of logit biases, indexed by distance bucket.

    Args:
        num_heads: ``H``, one scalar per head and bucket.
        num_buckets: buckets in all (both sides together when ``bidirectional``).
        max_distance: distances at or beyond it share the last bucket of their side.
        bidirectional: tell keys before and after the query apart (encoders); ``False``
            for causal self-attention.

    ``forward(q_len, k_len, device=None, dtype=None)`` -> ``(1, H, q_len, k_len)``; query
    ``i`` and key ``j`` are at positions ``i`` and ``j`` (both counted from 0).
    """

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True) -> None:
        super().__init__()
        side = num_buckets // 2 if bidirectional else num_buckets
        # Each side needs an exact bucket and a log bucket, and room to grow past the exact ones.
        if num_heads <= 0 or side < 2 or max_distance <= side // 2:
            raise InputError(
                f"need num_heads > 0, num_buckets >= {4 if bidirectional else 2} and max_distance > "
                f"{max(side // 2, 1)}; got num_heads={num_heads}, num_buckets={num_buckets}, "
                f"max_distance={max_distance}, bidirectional={bidirectional}"
            )
        self.num_heads, self.num_buckets = num_heads, num_buckets
        self.max_distance, self.bidirectional = max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, num_heads)
        # Small normal rather than zeros: zeros would also train (each bucket gets its own
        # gradient), but the model would start blind to word order; std 0.02, as the learned
        # absolute positions, tells orders apart while leaving the logits nearly unchanged.
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, q_len: int, k_len: int, device: torch.device | str | None = None,
                dtype: torch.dtype | None = None) -> Tensor:
        weight = self.embedding.weight
        pos = torch.arange(max(q_len, k_len), device=weight.device)
        distance = pos[None, :k_len] - pos[:q_len, None]  # (q_len, k_len): key - query
        bucket = relative_position_bucket(distance, self.num_buckets, self.max_distance, self.bidirectional)
        bias = self.embedding(bucket).permute(2, 0, 1).unsqueeze(0)  # (L, S, H) -> (1, H, L, S)
        return bias.to(device=device or weight.device, dtype=dtype or weight.dtype)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
                f"max_distance={self.max_distance}, bidirectional={self.bidirectional}")
