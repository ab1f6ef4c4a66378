"""Record the attention weights of a model's attention modules, without touching its code.

::

    with capture_attention(model) as maps:
        logits = model(x)
    maps["blocks.0.attn"]      # [Tensor (B, H, Lq, Lk)]: one entry per call of that module

Inside the block every supported attention module computes its softmax explicitly and
hands its per-head weights to the recorder; it returns exactly what it returns outside
(the output, and weights only when its caller asked for them). Outside the block the
modules take torch's fused kernel again: capturing costs nothing when it is off.

Which modules: those whose class declares ``forms_weights = True``, the capability flag
that :func:`~attnlab.attention.register_attention` records for every registered kind (and
that :class:`~attnlab.attention.MultiHeadAttention`, cross-attention and the tutorials'
``AttentionBlock`` declare). Such a module's ``forward`` reads one attribute,
``_attn_capture`` (``None`` by default), and when it is set computes its softmax
explicitly and hands the per-head weights to it; it returns exactly what it returns
outside. This context manager sets the attribute on the chosen instances and restores
the previous value on exit, also when the block raises. Nested captures of the same
modules both record (the inner hook calls the outer one).

What one call records:

* exact attention (``"exact"``, :class:`~attnlab.attention.GroupedQueryAttention`, with any
  number of key/value heads; :class:`~attnlab.attention.MultiHeadAttention`, cross-attention):
  ``(B, H, Lq, Lk)``. With a cache, ``Lk`` counts the cached positions; one decoding step
  through ``forward`` records ``Lq = 1``.
* ``"relpos2d"`` (BoTNet's MHSA) and ``AttentionBlock``: ``(B, heads, H*W, H*W)``, pixels
  in row-major order.

The efficient kinds (local, sparse, linear, performer, linformer, nystrom) never form the
weight matrix, and the other grid kinds (axial, standalone2d) form weights of other
shapes (``forms_weights = False``): they are not recorded, and capture says so: a model
whose attention is all of such kinds is an error naming them, and one that mixes them
with recordable attention gets one warning naming what is left out. Weights are recorded
before attention dropout. In training mode on CUDA the explicit path draws dropout
differently from the fused kernel; capture in eval mode to see the weights of the
outputs you get outside.
"""

from __future__ import annotations

import fnmatch
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from torch import Tensor, nn

from ..errors import AttentionUnavailable, InputError

__all__ = ["capture_attention", "attention_modules", "is_recording"]

Hook = Callable[[Tensor], None]


def attention_modules(model: nn.Module) -> tuple[list[tuple[str, nn.Module]], list[tuple[str, nn.Module]]]:
    """``(recordable, opaque)``: the attention modules of ``model`` (by their class's
    ``forms_weights`` flag) that form their weight matrix, and those that never do."""
    found = [(name, m, getattr(type(m), "forms_weights", None)) for name, m in model.named_modules()]
    return [(n, m) for n, m, f in found if f is True], [(n, m) for n, m, f in found if f is False]


def _describe(modules: list[tuple[str, nn.Module]]) -> str:
    shown = ", ".join(f"{name or '(the model)'} ({type(m).__name__})" for name, m in modules[:4])
    return shown + (f" and {len(modules) - 4} more" if len(modules) > 4 else "")


def _targets(model: nn.Module, include: str | Sequence[str] | None) -> list[tuple[str, nn.Module]]:
    found, opaque = attention_modules(model)
    if not found and opaque:
        kinds = sorted({type(m).__name__ for _, m in opaque})
        raise AttentionUnavailable(
            f"capture_attention has nothing to record: the model's attention never forms an n x n weight matrix: "
            f"{_describe(opaque)}",
            reason=f"its attention ({', '.join(kinds)}) never forms the n x n weight matrix that the pictures show",
            instead="The default kinds form it (exact; in a BoTNet relpos2d): train the model with its default "
                    "model.options.attention to see its attention.")
    if include is None:
        if opaque:
            warnings.warn(f"capture_attention records no weights of {_describe(opaque)}: these kinds never form "
                          f"an n x n weight matrix", stacklevel=3)
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


def is_recording(module: nn.Module) -> bool:
    """Whether :func:`capture_attention` records ``module``'s weights now (a lean path that
    forms none, a decoding step's, must then give way to ``forward``)."""
    return module.__dict__.get("_attn_capture") is not None


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
        not called keeps an empty list.

    Raises:
        InputError: the model's attention is all of kinds that form no weight matrix;
            ``include`` matches no recordable module.
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
