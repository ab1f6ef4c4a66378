"""What each head does for a language model's loss: the change in the next-token loss on an
input when one head's output is removed (zeroed before the attention's output projection),
every head of every layer. A head that looks like an induction head on the weights can so be
shown to do that job on the input: removing it raises the loss on the repeated tokens.

Any attention module with an output projection ``o_proj`` (a plain linear layer: merge LoRA
adapters first) over ``num_heads`` equal slices (attnlab's exact, grouped-query and latent
attention, whatever model holds them) is taken; the model is only called, once a head.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["removable_heads", "head_ablation", "heads_removed", "next_token_loss"]


def removable_heads(module: nn.Module) -> int | None:
    """How many heads ``module``'s output can be removed by (its ``o_proj`` input is
    ``num_heads`` slices), or ``None``."""
    out, heads = getattr(module, "o_proj", None), getattr(module, "num_heads", None)
    if type(out) is not nn.Linear or not isinstance(heads, int) or heads < 1 or out.in_features % heads:
        return None
    return heads


@contextmanager
def heads_removed(model: nn.Module, heads: Mapping[str, Sequence[int]]) -> Iterator[None]:
    """``model`` with the output of the heads ``heads`` (module name -> head indices) removed
    inside the block: their columns of ``o_proj``'s weight zeroed, then put back (the attention
    kinds read that weight directly when no gradient is wanted: a hook on the layer would see
    nothing). A module whose heads cannot be removed (:func:`removable_heads`), or a head it has
    not, is refused by name. The model is changed in place: one caller at a time."""
    kept: list[tuple[Tensor, slice, Tensor]] = []
    plan = []
    for name, which in heads.items():
        module = model.get_submodule(name)
        count = removable_heads(module)
        if count is None:
            raise InputError(f"the heads of {name} cannot be switched off (its attention has no output projection "
                             f"over equal slices of its heads)")
        bad = [h for h in which if not (isinstance(h, int) and 0 <= h < count)]
        if bad:
            raise InputError(f"{name} has heads 0 to {count - 1}; got {bad[0]!r}")
        size = module.o_proj.weight.shape[1] // count
        plan += [(module.o_proj.weight, slice(h * size, (h + 1) * size)) for h in which]
    with torch.no_grad():
        try:
            for weight, cols in plan:
                kept.append((weight, cols, weight[:, cols].clone()))
                weight[:, cols] = 0
            yield
        finally:
            for weight, cols, saved in reversed(kept):
                weight[:, cols] = saved


def next_token_loss(logits: Tensor, ids: Tensor, start: int = 1) -> Tensor:
    """The mean next-token cross-entropy of each row, ``(B,)``, in nats, over the tokens from
    position ``start`` on (each predicted from those before it)."""
    return F.cross_entropy(logits[:, start - 1:-1].float().transpose(1, 2), ids[:, start:], reduction="none").mean(-1)


@torch.no_grad()
def head_ablation(model: nn.Module, ids: Tensor, layers: Sequence[str], *, start: int = 1,
                  ) -> list[list[float] | None]:
    """For each module named in ``layers``, the change of ``model``'s next-token loss on
    ``ids`` ``(1, L)`` (nats per token, positive: the head helped; the tokens from position
    ``start`` on: the second half of a repeated sequence, say) when each of its heads' output
    is removed; ``None`` for a module whose heads cannot be removed (:func:`removable_heads`).
    ``model(ids)`` must give ``(B, L, vocab)`` logits.

    A head is removed for one pass as :func:`heads_removed` removes it."""
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise InputError(f"ids must be one row of at least 2 tokens, shape (1, L); got {tuple(ids.shape)}")
    if not isinstance(start, int) or isinstance(start, bool) or not 1 <= start < ids.shape[1]:
        raise InputError(f"start must be a position in [1, {ids.shape[1] - 1}]; got {start!r}")
    was_training = model.training
    model.eval()
    try:
        base = float(next_token_loss(model(ids), ids, start)[0])
        out: list[list[float] | None] = []
        for name in layers:
            heads = removable_heads(model.get_submodule(name))
            if heads is None:
                out.append(None)
                continue
            changes = []
            for h in range(heads):
                with heads_removed(model, {name: [h]}):
                    changes.append(round(float(next_token_loss(model(ids), ids, start)[0]) - base, 6))
            out.append(changes)
        return out
    finally:
        model.train(was_training)
