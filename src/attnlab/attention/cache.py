"""Key/value cache for incremental decoding."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InputError

__all__ = ["KVCache", "DecodingCache"]


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


class DecodingCache:
    """One attention layer's keys and values while a decoder generates, ``(B, Hkv, L, D)``.

    Only the key/value heads are stored (grouped-query attention stores ``Hkv`` heads, not
    ``H``), in buffers of the cache's own, written in place: no copy of the prefix per token.
    Without a ``window`` the buffers hold the first step and ``grow_room`` positions more,
    and double when full, up to ``capacity`` positions (the most the generation may take):
    a copy of the prefix now and then, and a long ``max_new_tokens`` that ends early costs
    only what it used. With a
    ``window`` (sliding-window attention) a step needs only the last ``window - 1`` positions
    besides its own, so the buffers hold those and room for ``slide_room`` more; when the room
    is used up, the last ``window - 1`` move to the front of a new buffer (one copy every
    ``slide_room`` steps), so memory is bounded however long the generation runs.

    :meth:`update` returns all the keys and values a step attends to and ``start``, the
    slot index of the first of them (slots count every position the cache has seen).
    """

    slide_room = 64  # positions a windowed cache writes before it moves its window to the front
    grow_room = 256  # positions past the first step that a cache without a window holds before it grows

    def __init__(self, capacity: int, *, window: int | None = None, sinks: int = 0) -> None:
        if capacity < 1:
            raise InputError(f"capacity must be a positive number of positions; got {capacity}")
        if window is not None and window < 1:
            raise InputError(f"window must be a positive number of positions; got {window}")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0 or sinks and window is None:
            raise InputError(f"sinks must be a number of first positions, 0 or more, kept beside a window; got "
                             f"sinks={sinks!r} with window={window!r}")
        self.capacity, self.window, self.sinks = capacity, window, sinks
        self._sink_k: Tensor | None = None  # the first `sinks` positions, kept for good (StreamingLLM)
        self._sink_v: Tensor | None = None
        self.sinks_in_last = 0  # how many of the keys the last update returned are those, at their front
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self._end = 0  # positions written into the buffers
        self.seq_len = 0  # positions seen
        self.start = 0  # slot of the first stored position
        self.scratch: dict = {}  # what the attention keeps for one generation (its joined weights)

    @property
    def stored(self) -> int:
        """Positions held now."""
        return self.seq_len - self.start

    def _buffers(self, k: Tensor, v: Tensor | None, size: int, keep: int) -> None:
        """New buffers of ``size`` positions that begin with the last ``keep`` stored ones."""
        b, h, _, d = k.shape
        new_k = k.new_empty(b, h, size, d)
        new_v = None if v is None else v.new_empty(b, h, size, v.shape[3])
        if keep:
            new_k[:, :, :keep] = self._k[:, :, self._end - keep : self._end]  # type: ignore[index]
            if new_v is not None:
                new_v[:, :, :keep] = self._v[:, :, self._end - keep : self._end]  # type: ignore[index]
        self._k, self._v, self._end = new_k, new_v, keep

    def update(self, k: Tensor, v: Tensor | None) -> tuple[Tensor, Tensor | None, int]:
        """Add this step's ``k``, ``v`` ``(B, Hkv, L_new, D)``; returns ``(keys, values,
        start)`` of everything the step attends to. ``v`` None: a cache of one tensor a
        position (latent attention keeps its latent there, the values being part of it)."""
        n = k.shape[2]
        keep = self.stored if self.window is None else min(self.window - 1, self.stored)  # seen besides this step
        if self.window is None:
            if self.seq_len + n > self.capacity:
                raise InputError(f"the cache holds {self.capacity} positions; {self.seq_len} are used and the step "
                                 f"adds {n}: make it larger (max_new_tokens plus the prompt)")
            if self._k is None or self._end + n > self._k.shape[2]:
                held = 0 if self._k is None else self._k.shape[2]
                self._buffers(k, v, min(self.capacity, max(self._end + n + self.grow_room, 2 * held)), keep)
        elif self._k is None or self._end + n > self._k.shape[2]:
            # A window wider than the generation (a config's sliding_window of 10^12: full attention in
            # effect) never slides: its buffers are those of the positions the generation can take.
            size = min(self.window - 1 + max(n, self.slide_room), max(self.capacity, keep + n))
            self._buffers(k, v, size, keep)
        first, start = self._end - keep, self.seq_len - keep
        self._k[:, :, self._end : self._end + n] = k  # type: ignore[index]
        if v is not None:
            self._v[:, :, self._end : self._end + n] = v  # type: ignore[index]
        self._end += n
        self.seq_len += n
        if self.window is not None:
            self.start = self.seq_len - min(self.window - 1, self.seq_len)
        values = None if v is None else self._v[:, :, first : self._end]  # type: ignore[index]
        keys = self._k[:, :, first : self._end]  # type: ignore[index]
        self.sinks_in_last = 0
        if self.sinks:
            seen_before = self.seq_len - n
            if seen_before < self.sinks:  # this step holds some of the first positions: keep them
                take = min(self.sinks - seen_before, n)
                part_k, part_v = k[:, :, :take], None if v is None else v[:, :, :take]
                self._sink_k = part_k if self._sink_k is None else torch.cat([self._sink_k, part_k], dim=2)
                if part_v is not None:
                    self._sink_v = part_v if self._sink_v is None else torch.cat([self._sink_v, part_v], dim=2)
            if start > 0:  # the window has moved past some of the first positions: they come first
                m = min(self._sink_k.shape[2], start)  # type: ignore[union-attr]
                keys = torch.cat([self._sink_k[:, :, :m], keys], dim=2)  # type: ignore[index]
                if values is not None:
                    values = torch.cat([self._sink_v[:, :, :m], values], dim=2)  # type: ignore[index]
                self.sinks_in_last = m
        return keys, values, start

    def nbytes(self) -> int:
        """Bytes of the buffers held now."""
        return sum(t.untyped_storage().nbytes() for t in (self._k, self._v, self._sink_k, self._sink_v)
                   if t is not None)

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` ``(B',)`` names, in that order (beam search reorders and
        drops hypotheses this way). What ``scratch`` holds does not depend on the rows."""
        self._k, self._v, self._sink_k, self._sink_v = (
            None if t is None else t.index_select(0, index) for t in (self._k, self._v, self._sink_k, self._sink_v))

    def __repr__(self) -> str:
        return (f"DecodingCache(capacity={self.capacity}, window={self.window}, seen={self.seq_len}, "
                f"stored={self.stored})")
