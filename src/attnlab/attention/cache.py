"""The key/value cache of every attention that keeps keys: :class:`DecodingCache`, with a
window and sinks as its policies, and ``static`` for cross-attention (the encoder's memory,
projected once). :class:`KVCache` is its older name for the growing and static caches."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ..errors import InputError

__all__ = ["DecodingCache", "KVCache", "ModelCache"]


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

    ``capacity`` None: no bound (the buffers keep doubling). ``static`` (cross-attention): the
    first update holds the keys and values of another sequence (the encoder's memory), and every
    later one returns them as they are (``k`` and ``v`` may then be None), so the memory is
    projected once per generation. While autograd records (training through a cache), an update
    makes new tensors instead of writing into the buffers, so no tensor saved for the backward
    pass is overwritten.

    :meth:`update` returns all the keys and values a step attends to and ``start``, the
    slot index of the first of them (slots count every position the cache has seen).
    """

    slide_room = 64  # positions a windowed cache writes before it moves its window to the front
    grow_room = 256  # positions past the first step that a cache without a window holds before it grows

    def __init__(self, capacity: int | None = None, *, window: int | None = None, sinks: int = 0,
                 static: bool = False) -> None:
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1):
            raise InputError(f"capacity must be a positive number of positions or None; got {capacity!r}")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise InputError(f"window must be a positive number of positions; got {window!r}")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0 or sinks and window is None:
            raise InputError(f"sinks must be a number of first positions, 0 or more, kept beside a window; got "
                             f"sinks={sinks!r} with window={window!r}")
        if static and (window is not None or sinks):
            raise InputError("a static cache holds another sequence's keys whole: it takes no window or sinks")
        self.capacity, self.window, self.sinks, self.static = capacity, window, sinks, bool(static)
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
    def filled(self) -> bool:
        """Whether it holds keys (a static cache: whether the memory is in)."""
        return self._k is not None

    @property
    def batch_size(self) -> int | None:
        """The rows it holds (None while empty)."""
        return None if self._k is None else self._k.shape[0]

    @property
    def k(self) -> Tensor | None:
        """The keys held now, ``(B, Hkv, stored, D)`` (the sinks apart)."""
        return None if self._k is None else self._k[:, :, self._end - self.stored : self._end]

    @property
    def v(self) -> Tensor | None:
        """The values held now, as :attr:`k`."""
        return None if self._v is None else self._v[:, :, self._end - self.stored : self._end]

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

    def update(self, k: Tensor | None, v: Tensor | None) -> tuple[Tensor, Tensor | None, int]:
        """Add this step's ``k``, ``v`` ``(B, Hkv, L_new, D)``; returns ``(keys, values,
        start)`` of everything the step attends to. ``v`` None: a cache of one tensor a
        position (latent attention keeps its latent there, the values being part of it)."""
        if self.static:
            if self.filled:
                return self._k, self._v, 0  # type: ignore[return-value]
            if k is None:
                raise InputError("a static cache needs the keys and values of the first step that fills it")
            self._k, self._v, self._end = k, v, k.shape[2]
            self.seq_len = k.shape[2]
            return k, v, 0
        if self._k is not None and k.shape[0] != self._k.shape[0]:
            raise InputError(f"the cache holds batch size {self._k.shape[0]} but the step has {k.shape[0]} rows; "
                             f"use a fresh cache, or reorder it, for a new batch")
        n = k.shape[2]
        keep = self.stored if self.window is None else min(self.window - 1, self.stored)  # seen besides this step
        if torch.is_grad_enabled() and (k.requires_grad or (v is not None and v.requires_grad)
                                        or (self._k is not None and self._k.requires_grad)):
            return self._update_recorded(k, v, n, keep)
        if self.window is None:
            if self.capacity is not None and self.seq_len + n > self.capacity:
                raise InputError(f"the cache holds {self.capacity} positions; {self.seq_len} are used and the step "
                                 f"adds {n}: make it larger (max_new_tokens plus the prompt)")
            if self._k is None or self._end + n > self._k.shape[2]:
                held = 0 if self._k is None else self._k.shape[2]
                size = max(self._end + n + self.grow_room, 2 * held)
                self._buffers(k, v, size if self.capacity is None else min(self.capacity, size), keep)
        elif self._k is None or self._end + n > self._k.shape[2]:
            # A window wider than the generation (a config's sliding_window of 10^12: full attention in
            # effect) never slides: its buffers are those of the positions the generation can take.
            size = self.window - 1 + max(n, self.slide_room)
            if self.capacity is not None:
                size = min(size, max(self.capacity, keep + n))
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
        return self._with_sinks(k, v, n, start, keys, values)

    def _update_recorded(self, k: Tensor, v: Tensor | None, n: int, keep: int) -> tuple[Tensor, Tensor | None, int]:
        """:meth:`update` while autograd records: the held positions and the new ones joined into
        new tensors (never written into), trimmed to the window."""
        if self.window is None and self.capacity is not None and self.seq_len + n > self.capacity:
            raise InputError(f"the cache holds {self.capacity} positions; {self.seq_len} are used and the step "
                             f"adds {n}: make it larger (max_new_tokens plus the prompt)")
        start = self.seq_len - keep
        held_k = None if self._k is None else self._k[:, :, self._end - keep : self._end]
        held_v = None if self._v is None or v is None else self._v[:, :, self._end - keep : self._end]
        # new tensors of their own (a clone rather than a view of the step's projection, kept alive otherwise)
        keys = k.clone() if held_k is None else torch.cat([held_k, k], dim=2)
        values = None if v is None else v.clone() if held_v is None else torch.cat([held_v, v], dim=2)
        self._k, self._v, self._end = keys, values, keys.shape[2]
        self.seq_len += n
        if self.window is not None:
            self.start = self.seq_len - min(self.window - 1, self.seq_len)
        return self._with_sinks(k, v, n, start, keys, values)

    def _with_sinks(self, k: Tensor, v: Tensor | None, n: int, start: int, keys: Tensor,
                    values: Tensor | None) -> tuple[Tensor, Tensor | None, int]:
        """The step's keys and values with the sinks in front once the window has moved past them."""
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

    append = update  # the name the exact attention calls, which KVCache, the older name, keeps apart

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
        if self.static:
            return f"DecodingCache(static, batch={self.batch_size}, len={self.seq_len})"
        return (f"DecodingCache(capacity={self.capacity}, window={self.window}, seen={self.seq_len}, "
                f"stored={self.stored})")


class KVCache(DecodingCache):
    """The older name of :class:`DecodingCache` as a growing (``KVCache()``) or a static
    (``KVCache(static=True)``) cache, kept for code written against it: the same cache, whose
    :meth:`update` returns ``(keys, values)`` as it did (a :class:`DecodingCache` also returns
    the slot of the first key). New code makes ``DecodingCache()`` or asks the attention
    module's ``new_cache``."""

    def __init__(self, static: bool = False) -> None:
        warnings.warn("KVCache is DecodingCache now: make DecodingCache() or DecodingCache(static=True), or ask the "
                      "attention module's new_cache()", DeprecationWarning, stacklevel=2)
        super().__init__(None, static=static)

    def update(self, k: Tensor | None, v: Tensor | None) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        if not self.static and (k is None or v is None):
            raise InputError("KVCache.update needs k and v until the cache is filled")
        keys, values, _ = DecodingCache.update(self, k, v)
        return keys, values  # type: ignore[return-value]

    def append(self, k: Tensor | None, v: Tensor | None) -> tuple[Tensor, Tensor | None, int]:
        """:class:`DecodingCache`'s update, which attnlab's attention calls."""
        return DecodingCache.update(self, k, v)


class ModelCache(list):
    """A model's cache while it generates, the one container of every model: one cache per
    layer, in order, each made by that layer's attention (``new_cache``: a kind keeps what it
    needs); ``cross``, a sequence-to-sequence decoder's static caches of the encoder's memory, one
    per layer (empty for a decoder-only model); and ``scratch``, what the model keeps for one
    generation (joined weights, the step's shared rotary angles). ``seq_len``: the positions seen.
    ``self_attn`` and ``cross_attn`` name the two lists as a decoder layer has them."""

    def __init__(self, layers: "list | tuple" = (), cross: "list | tuple" = ()) -> None:
        super().__init__(layers)
        self.cross = list(cross)
        self.scratch: dict = {}

    @classmethod
    def empty(cls, num_layers: int) -> "ModelCache":
        """Exact attention's caches made here rather than by each layer's attention: for code
        written before a model's ``new_cache``, which asks each layer's modules."""
        return cls([DecodingCache() for _ in range(num_layers)], [DecodingCache(static=True) for _ in range(num_layers)])

    @property
    def self_attn(self) -> "ModelCache":
        return self

    @property
    def cross_attn(self) -> list:
        return self.cross

    @property
    def seq_len(self) -> int:
        """Positions seen so far (a sequence-to-sequence decoder's: target positions)."""
        return self[0].seq_len if self else 0

    def nbytes(self) -> int:
        """Bytes the caches hold now."""
        return sum(c.nbytes() for c in [*self, *self.cross])

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` names, in every layer (beam search: reorder beams, drop
        finished sentences)."""
        for cache in [*self, *self.cross]:
            cache.reorder(index)
