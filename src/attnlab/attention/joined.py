"""Weights joined once for decoding: the query, key and value projections (or an MLP's gate and
up projections) as one transposed matrix, kept on their module and joined again when a weight
changes. A decoding step then makes one product where it made three (:func:`fused_linear`); the
modules that keep such weights mix in :class:`KeepsJoinedWeights`. An optimizer step counts as a
change (a torch hook, installed when this module is imported), since torch's fused AdamW writes
the weights without moving their version counters."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from .int8 import Int8Linear, Int8Weight, int8_product

__all__ = ["KeepsJoinedWeights", "fused_linear", "joined_weight", "product", "bound_product"]


def _weight_of(layer: nn.Linear) -> Tensor:
    """The ``(out, in)`` weight that ``layer``'s product applies in eval mode: a plain layer's own,
    LoRA's merged one, an 8-bit layer's rows times their scales (for the few products that need the
    matrix itself, such as latent attention's absorbed projections)."""
    if isinstance(layer, Int8Linear):
        return layer.rows.float() * layer.scale[:, None]
    merged = getattr(layer, "merged_weight", None)
    return layer.weight if merged is None else merged()


def _tracked(layer: nn.Module) -> tuple[Tensor, ...]:
    """The parameters whose changes a joined weight follows: a plain linear layer's weight and
    bias read directly (``parameters()`` walks the module's members, and a translator's step
    walks 24 layers), any other layer's own."""
    if type(layer) is nn.Linear:
        return (layer.weight,) if layer.bias is None else (layer.weight, layer.bias)
    return (*layer.parameters(recurse=False), *layer.buffers(recurse=False))  # an Int8Linear's rows and scales


def joined_weight(owner: nn.Module, name: str,
                  layers: tuple[nn.Linear, ...]) -> tuple[Tensor | Int8Weight, Tensor | None]:
    """The layers' weights joined and transposed, ``(in, sum of out)``, and their joined bias
    (or None): kept on ``owner`` under ``name`` and joined again when a weight changes (its
    version counter moves on an optimizer step or a load). A layer with a low-rank update
    (LoRA's :class:`~attnlab.layers.lora.LoRALinear`) gives its ``merged_weight``: what it
    computes in eval mode, the only mode these joined weights serve. Every optimizer step
    (counted by a torch hook) counts as a change too: torch's fused AdamW writes without
    moving the version counters. Layers kept in 8 bits (:class:`~attnlab.attention.int8.Int8Linear`)
    join as an :class:`~attnlab.attention.int8.Int8Weight` (their rows and scales stacked)."""
    key = (_OPTIMIZER_STEPS[0], *((p.data_ptr(), p._version) for layer in layers for p in _tracked(layer)))
    cached = owner.__dict__.get(f"_fused_{name}")
    if cached is None or cached[0] != key:
        with torch.no_grad():
            if all(isinstance(layer, Int8Linear) for layer in layers):
                weight: Tensor | Int8Weight = Int8Weight(torch.cat([layer.rows for layer in layers]),
                                                         torch.cat([layer.scale for layer in layers]))
            else:
                weight = torch.cat([_weight_of(layer) for layer in layers]).t().contiguous()
            bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])  # type: ignore[misc]
        cached = (key, weight, bias)
        owner.__dict__[f"_fused_{name}"] = cached
    return cached[1], cached[2]


def product(x: Tensor, weight: Tensor | Int8Weight, bias: Tensor | None) -> Tensor:
    """``x @ weight + bias`` for ``x`` ``(..., in)`` and a joined ``weight`` ``(in, out)``."""
    if isinstance(weight, Int8Weight):
        return int8_product(x, weight, bias)
    if x.dim() == 2:  # a decoding step's (B, E): one operator, not reshape, @ and view (two-d-product)
        return torch.mm(x, weight) if bias is None else torch.addmm(bias, x, weight)
    flat = x.reshape(-1, x.shape[-1])
    out = flat @ weight if bias is None else torch.addmm(bias, flat, weight)
    return out.view(*x.shape[:-1], out.shape[-1])


# Optimizer steps taken in this process, counted by a global torch hook: part of the key of every
# joined weight, since torch's fused AdamW (``fused=True``, attnlab's default) leaves the version
# counters as they were (a model evaluated, trained a step and evaluated again kept its first weights).
_OPTIMIZER_STEPS = [0]


def _count_optimizer_step(*_: Any) -> None:
    _OPTIMIZER_STEPS[0] += 1


register_optimizer_step_post_hook(_count_optimizer_step)


class KeepsJoinedWeights:
    """Mixin of the modules that keep joined weights (:func:`joined_weight`): they drop them
    when training starts or ends (``train()`` from eval mode, ``eval()`` from training), for
    the writes that neither the version counters nor an optimizer step show (through
    ``.data``). ``eval()`` on a model already in eval mode keeps them: every ``generate``
    sets eval mode, and joining the weights again would cost every call a copy of them."""

    def train(self, mode: bool = True):  # type: ignore[no-untyped-def]
        if mode or self.training:  # type: ignore[attr-defined]
            for key in [k for k in vars(self) if k.startswith("_fused_")]:
                del self.__dict__[key]
        return super().train(mode)  # type: ignore[misc]


_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def _tracing() -> bool:
    """Under ``torch.compile`` or ``torch.export`` (ONNX): the weights are fake tensors there,
    with no data to key a cache by."""
    return _is_compiling()


def fused_linear(owner: nn.Module, name: str, layers: tuple[nn.Linear, ...], x: Tensor) -> tuple[Tensor, ...]:
    """``tuple(layer(x) for layer in layers)``; when no gradient is wanted (decoding), as one
    product ``x @ W`` with the layers' weights joined and kept transposed
    (:func:`joined_weight`). On the CPU a product with one or a few rows is cheaper so than
    through ``F.linear`` (results page "Why the fast paths", two-d-product), and joining the
    query, key and value projections makes three such products one."""
    if torch.is_grad_enabled() or owner.training or _tracing():  # a trace keeps no weights of its own: no cache
        if len(layers) == 1 or not all(type(layer) is nn.Linear for layer in layers):  # LoRA's train their own way
            return tuple(layer(x) for layer in layers)
        # Training: one product with the weights joined (autograd splits the gradient back), as the packed
        # in_proj of exact attention always computed it, so a run trains bit for bit as it did, and a layer
        # whose output a kind leaves unused (LSH's keys) still takes part, as a packed projection's rows did.
        bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])  # type: ignore[misc]
        out = F.linear(x, torch.cat([layer.weight for layer in layers]), bias)
        return tuple(out.split([layer.out_features for layer in layers], dim=-1))
    if len(layers) == 1 and type(layers[0]) is nn.Linear and x.numel() > 16 * x.shape[-1]:
        # Many rows (a whole sequence, not a decoding step): torch's own product, whose sums are those of
        # every other library (SmolLM2-135M's output layer over 118 tokens, 2 threads: 6.7e-4 apart from
        # transformers' logits through the joined weight, 0 through F.linear); joining one layer saves nothing.
        return (F.linear(x, layers[0].weight, layers[0].bias),)
    out = product(x, *joined_weight(owner, name, layers))
    if len(layers) == 1:
        return (out,)
    return tuple(out.split([layer.out_features for layer in layers], dim=-1))


def bound_product(weight: Tensor | Int8Weight, bias: Tensor | None) -> Callable[[Tensor], Tensor]:
    """``x @ weight + bias`` of a decoding step's ``(B, in)`` with a joined ``weight`` ``(in, out)``,
    as a function bound once per generation."""
    if isinstance(weight, Int8Weight):
        return lambda x: int8_product(x, weight, bias)
    if bias is None:
        return lambda x: torch.mm(x, weight)
    return lambda x: torch.addmm(bias, x, weight)
