"""Key/value cache for incremental decoding."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InputError

__all__ = ["KVCache"]


class KVCache:
    """Projected keys and values of the steps decoded so far, ``(B, H, L, D)`` each.

    A self-attention cache grows by the new step's keys and values on every call. A
    ``static`` cache (cross-attention) is filled once from the encoder memory and then
    reused: its attention module skips projecting the memory again.

    Storage grows by doubling, so appending one step costs O(step) instead of copying
    the whole prefix as ``torch.cat`` would. While autograd records (training through a
    cache), appends fall back to ``torch.cat`` so no saved tensor is overwritten.
    """

    def __init__(self, static: bool = False) -> None:
        self.static = static
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self._len = 0

    @property
    def seq_len(self) -> int:
        """Number of cached positions."""
        return self._len

    @property
    def batch_size(self) -> int | None:
        return None if self._k is None else self._k.shape[0]

    @property
    def filled(self) -> bool:
        return self._k is not None

    @property
    def k(self) -> Tensor | None:
        return None if self._k is None else self._k[:, :, : self._len]

    @property
    def v(self) -> Tensor | None:
        return None if self._v is None else self._v[:, :, : self._len]

    def update(self, k: Tensor | None, v: Tensor | None) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` ``(B, H, L_new, D)`` (ignored once a static cache is
        filled) and return all cached keys and values."""
        if self.static and self.filled:
            return self.k, self.v  # type: ignore[return-value]
        if k is None or v is None:
            raise InputError("KVCache.update needs k and v until the cache is filled")
        if self._k is None or self.static:
            self._k, self._v, self._len = k, v, k.shape[2]
            return k, v
        n = k.shape[2]
        if torch.is_grad_enabled() and (k.requires_grad or self._k.requires_grad):
            self._k = torch.cat([self.k, k], dim=2)
            self._v = torch.cat([self.v, v], dim=2)
        else:
            if self._len + n > self._k.shape[2]:
                self._k = self._grow(self._k, self._len + n)
                self._v = self._grow(self._v, self._len + n)
            self._k[:, :, self._len : self._len + n] = k
            self._v[:, :, self._len : self._len + n] = v
        self._len += n
        return self.k, self.v  # type: ignore[return-value]

    def _grow(self, buf: Tensor, need: int) -> Tensor:
        cap = max(need, 2 * buf.shape[2], 16)
        new = buf.new_empty(buf.shape[0], buf.shape[1], cap, buf.shape[3])
        new[:, :, : self._len] = buf[:, :, : self._len]
        return new

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search reorders and drops hypotheses this way)."""
        if self._k is not None:
            self._k = self._k.index_select(0, index)
            self._v = self._v.index_select(0, index)  # type: ignore[union-attr]

    def __repr__(self) -> str:
        kind = "static" if self.static else "growing"
        return f"KVCache({kind}, batch={self.batch_size}, len={self._len})"
