"""Local (sliding-window) self-attention, registered as ``"local"``.

Each query attends only to the keys near it in the sequence: the banded attention of
the Sparse Transformer's local pattern (Child et al., 2019) and of Longformer's
sliding window (Beltagy et al., 2020), without their global or strided tokens.

Band (``w`` = ``sliding_window``), for query position ``i`` and key position ``j``:

* bidirectional: ``j`` is seen when ``|i - j| < w`` (``2w - 1`` keys, ``w - 1`` on
  each side); so ``w >= L`` is exact (full) attention;
* causal (``is_causal=True``): ``j`` is seen when ``0 <= i - j < w`` (the query itself
  and the ``w - 1`` keys before it); ``w >= L`` is exact causal attention.

Padded keys (``key_padding_mask`` ``True``) are never seen; a query whose window holds
no real key outputs zeros (zero gradient), as in :mod:`attnlab.attention.functional`.

Computation is blocked (:func:`~attnlab.attention.blocksparse.window_attention`, which the
``exact`` kind's sliding window and native sparse attention's window branch also run on): the
queries are cut into chunks, and every chunk attends, in one call of torch's fused kernel for
all chunks, to the stretch of keys its band covers.

Shapes: ``x`` ``(B, L, E)`` -> ``(B, L, E)``; :meth:`LocalAttention.attend` works on
per-head ``(B, H, L, D)``. Cost for ``n = L``: ``O(n · w · d)`` time and ``O(n · w)``
memory; the ``n x n`` matrix is never formed.
"""

from __future__ import annotations

import numbers

from torch import Tensor

from ...errors import InputError
from ..blocksparse import window_attention
from ..contract import Option
from ..registry import register_attention
from .base import TOKEN_OPTIONS, TokenAttention

__all__ = ["LocalAttention", "local_attention"]


def local_attention(q: Tensor, k: Tensor, v: Tensor, window: int, *, key_padding_mask: Tensor | None = None,
                    is_causal: bool = False, dropout_p: float = 0.0) -> Tensor:
    """Sliding-window attention on ``(B, H, L, D)`` tensors; see the module docstring.

    ``key_padding_mask``: ``(B, L)`` bool, ``True`` = padding. ``dropout_p``: dropout on
    the attention weights (pass 0 in eval mode). Returns ``(B, H, L, Dv)``.
    """
    return window_attention(q, k, v, window, causal=is_causal, key_padding_mask=key_padding_mask,
                            dropout_p=dropout_p)


# The same band as the exact kind's sliding_window (causal: itself and the w - 1 keys before it), so the same name.
LOCAL_OPTIONS = TOKEN_OPTIONS.extend(Option("sliding_window", int, 128, "each query sees the keys less than "
                                            "sliding_window positions away", low=1, counts_positions=True, was="window"))


@register_attention("local", options=LOCAL_OPTIONS, takes_positions=True, causal=True, padding=True,
                    lora_roles=("attention",),
                    summary="sliding-window attention: each query sees the keys within w of it")
class LocalAttention(TokenAttention):
    """Sliding-window self-attention (see the module docstring).

    Args:
        embed_dim: as :class:`~.base.TokenAttention`.
        num_heads: as :class:`~.base.TokenAttention`.
        dropout: as :class:`~.base.TokenAttention`.
        bias: as :class:`~.base.TokenAttention`.
        rope: rotary positions on queries and keys, as :class:`~.base.TokenAttention`.
        rope_theta: the base of the rotary wavelengths.
        sliding_window: positive int ``w``; bidirectional queries see ``|i - j| < w``, causal
            ones ``0 <= i - j < w``.
    """

    kind = "local"

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rope: bool = False, rope_theta: float = 10000.0, sliding_window: int = 128) -> None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, numbers.Integral) or sliding_window <= 0:
            raise InputError(f"{self.kind}: sliding_window must be a positive int; got {sliding_window!r}")
        self.check_positions(sliding_window=sliding_window)
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, rope=rope, rope_theta=rope_theta)
        self.sliding_window = int(sliding_window)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        return local_attention(q, k, v, self.sliding_window, key_padding_mask=key_padding_mask, is_causal=is_causal,
                               dropout_p=self.dropout if self.training else 0.0)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", sliding_window={self.sliding_window}"
