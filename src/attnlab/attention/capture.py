"""Record the attention weights of a model's attention modules, without touching its code.

::

    with capture_attention(model) as maps:
        logits = model(x)
    maps["blocks.0.attn"]      # [Tensor (B, H, Lq, Lk)]: one entry per call of that module

Inside the block every supported attention module computes its softmax explicitly and
hands its per-head weights to the recorder; it returns exactly what it returns outside
(the output, and weights only when its caller asked for them). Outside the block the
modules take torch's fused kernel again: capturing costs nothing when it is off.

How: each supported module class has one attribute, ``_attn_capture`` (``None`` by
default, a class attribute), that its ``forward`` reads once. This context manager sets
it on the chosen instances and restores the previous value on exit, also when the block
raises. Nested captures of the same modules both record (the inner hook calls the
outer one).

Supported modules and what one call records:

* :class:`~attnlab.attention.MultiHeadAttention` (and ``SelfAttention``, the ``"exact"``
  kind, and ``CrossAttention``): ``(B, H, Lq, Lk)``. With a :class:`KVCache`, ``Lk``
  counts the cached positions; one decoding step records ``Lq = 1``.
* :class:`~attnlab.attention.RelPosSelfAttention2d` (``"relpos2d"``, BoTNet's MHSA):
  ``(B, heads, H*W, H*W)``, pixels in row-major order.

The efficient kinds (:class:`~attnlab.attention.variants.base.TokenAttention`
subclasses: linear, performer, local, sparse, linformer, nystrom) never form the weight
matrix, and the other grid kinds (axial, standalone2d) have weights of other shapes:
they are skipped and record nothing. Weights are recorded before attention dropout.
In training mode on CUDA the explicit path draws dropout differently from the fused
kernel; capture in eval mode to see the weights of the outputs you get outside.
"""

from __future__ import annotations

import fnmatch
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from torch import Tensor, nn

from ..errors import InputError
from .multihead import MultiHeadAttention
from .variants.relpos2d import RelPosSelfAttention2d

__all__ = ["capture_attention", "CAPTURED_MODULES"]

# The module classes whose forward checks ``_attn_capture``.
CAPTURED_MODULES: tuple[type[nn.Module], ...] = (MultiHeadAttention, RelPosSelfAttention2d)

Hook = Callable[[Tensor], None]


def _targets(model: nn.Module, include: str | Sequence[str] | None) -> list[tuple[str, nn.Module]]:
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, CAPTURED_MODULES)]
    if include is None:
        return found
    patterns = [include] if isinstance(include, str) else list(include)
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise InputError(f"include must be None, a name pattern or a list of them; got {include!r}")
    chosen = [(n, m) for n, m in found if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not chosen:
        names = ", ".join(repr(n) for n, _ in found) or "none"
        raise InputError(f"include={include!r} matches no attention module of the model; "
                         f"its attention modules: {names}")
    return chosen


def _recorder(store: list[Tensor], cpu: bool, previous: Hook | None) -> Hook:
    def hook(weights: Tensor) -> None:
        w = weights.detach()
        store.append(w.cpu() if cpu else w)
        if previous is not None:  # an enclosing capture of the same module records too
            previous(weights)

    return hook


@contextmanager
def capture_attention(
    model: nn.Module, *, include: str | Sequence[str] | None = None, cpu: bool = False
) -> Iterator[dict[str, list[Tensor]]]:
    """Record the per-head attention weights of ``model``'s attention modules in the block.

    Args:
        model: any module; its submodules of a supported class (see the module
            docstring) are captured, ``model`` itself too if it is one (name ``""``).
        include: ``fnmatch`` patterns on qualified module names (``"encoder.*"``,
            ``["blocks.11.attn"]``); ``None`` captures every supported module. A pattern
            list that matches none of them is a ``ValueError`` listing the names.
        cpu: move each recorded tensor to the CPU (keeps accelerator memory free over
            long generations).

    Yields:
        ``{qualified name: [weights, ...]}``, one key per captured module in the order
        of ``model.named_modules()``, each list growing by one detached tensor
        ``(B, H, Lq, Lk)`` per call (per decoding step with a cache). A module that was
        not called keeps an empty list; a model whose attention is of an efficient kind
        yields a dict without keys for it.
    """
    targets = _targets(model, include)
    maps: dict[str, list[Tensor]] = {name: [] for name, _ in targets}
    saved: list[tuple[nn.Module, Hook | None]] = []
    try:
        for name, module in targets:
            previous = module.__dict__.get("_attn_capture")  # an enclosing capture's hook, if any
            saved.append((module, previous))
            module._attn_capture = _recorder(maps[name], cpu, previous)
        yield maps
    finally:
        for module, previous in reversed(saved):
            if previous is None:
                del module._attn_capture  # back to the class default, None: fused path
            else:
                module._attn_capture = previous
