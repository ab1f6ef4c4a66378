"""LoRA: low-rank adapters on a model's linear layers (Hu et al., 2021, "LoRA: Low-Rank
Adaptation of Large Language Models").

A frozen linear layer ``y = x W^T + b`` gains a trainable update of rank ``r``::

    y = x W^T + b + (alpha / r) * dropout(x) A^T B^T        A: (r, in), B: (out, r)

``A`` starts random (Kaiming-uniform, as ``nn.Linear``'s weight) and ``B`` at zero, so an
adapted model starts as the model it adapts. Only the adapters (and the task's head)
train: for a BERT-base classifier at rank 8 on the attention projections that is 0.6 M
of 110 M parameters. :func:`merge_lora` folds the update into ``W`` for export; the
merged model computes the same function without the extra products.

Which layers are adapted is said by *role*, not by name: a module declares the role of
the linear layers it owns in a class attribute ``lora_role`` (``"attention"``: every
attention kind's query/key/value and output projections; ``"mlp"``: the feed-forward
layers of :class:`~attnlab.layers.mlp.Mlp` and the language models' MLPs). A
``targets`` entry that is not a role is a glob over qualified module names
(``"blocks.*.attn.out_proj"``), as peft's ``target_modules``. A layer that packs several
projections into one (``in_proj``: query, key and value) gets one adapter per
projection, as the module declares in ``lora_parts``, so that rank ``r`` means the
same thing as on separate ``q_proj``/``k_proj``/``v_proj`` layers (and as in peft).

    apply_lora(model, rank=8, alpha=16, targets=["attention"])
    mark_only_lora_trainable(model, keep=["head"])  # the classifier learns too
    merged = merge_lora(copy.deepcopy(model))       # plain nn.Linear layers again
"""

from __future__ import annotations

import difflib
import fnmatch
import math
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..dropout import Dropout
from ..errors import InputError

__all__ = ["LoRALinear", "ROLES", "apply_lora", "merge_lora", "lora_layers", "is_adapter_key",
           "mark_only_lora_trainable", "lora_targets"]

ROLES = ("attention", "mlp")
ADAPTER_NAMES = ("lora_A", "lora_B")


class LoRALinear(nn.Linear):
    """A linear layer with a low-rank update: ``weight`` and ``bias`` are the frozen layer's
    own (its ``state_dict`` keys unchanged), ``lora_A`` ``(parts * r, in)`` and ``lora_B``
    ``(out, r)`` the adapters. With ``parts`` > 1 the output rows form ``parts`` equal
    blocks (a packed query/key/value projection), each with its own rank-``r`` adapter:
    block ``p`` adds ``B_p A_p`` with ``A_p`` rows ``p*r:(p+1)*r`` of ``lora_A`` and
    ``B_p`` its rows of ``lora_B``.

    Shapes: ``(..., in)`` -> ``(..., out)``."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0, parts: int = 1) -> None:
        nn.Module.__init__(self)
        if base.out_features % parts:
            raise InputError(f"parts must divide the layer's {base.out_features} outputs; got {parts}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias  # the same Parameters: nothing is copied
        self.rank, self.alpha, self.parts = rank, alpha, parts
        self.scaling = alpha / rank
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(parts * rank, self.in_features, **kw))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, **kw))
        self.lora_dropout = Dropout(dropout)
        self.reset_adapters()

    def reset_adapters(self) -> None:
        """``A`` as ``nn.Linear`` initialises a weight, ``B`` zero: the update starts at zero."""
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B)

    def _update(self, x: Tensor, lo: int, hi: int) -> Tensor:
        """``scaling * dropout(x) A^T B^T`` for output rows ``lo:hi``: the parts' ``B`` side by
        side as one block-diagonal matrix, so that the update is two products whatever the
        parts (no slower than a batched product per part, and simpler)."""
        r, size = self.rank, self.out_features // self.parts
        b = self.lora_B[lo:hi]
        if self.parts == 1:
            first, last = 0, 1
        else:
            if lo % size or hi % size:
                raise InputError(f"rows {lo}:{hi} must cover whole blocks of {size} of this packed layer")
            first, last = lo // size, hi // size
            if last - first > 1:
                b = torch.block_diag(*b.split(size))  # (rows, blocks * r)
        h = F.linear(self.lora_dropout(x), self.lora_A[first * r:last * r])  # (..., blocks * r)
        return F.linear(h, b) * self.scaling

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias) + self._update(x, 0, self.out_features)

    def forward_rows(self, x: Tensor, lo: int, hi: int) -> Tensor:
        """``self(x)[..., lo:hi]`` without computing the other rows (a packed projection's
        query alone, in cross-attention)."""
        bias = None if self.bias is None else self.bias[lo:hi]
        return F.linear(x, self.weight[lo:hi], bias) + self._update(x, lo, hi)

    def delta_weight(self) -> Tensor:
        """``scaling * B A``, ``(out, in)``: block-diagonal in the parts."""
        size = self.out_features // self.parts
        return torch.block_diag(*self.lora_B.split(size)) @ self.lora_A * self.scaling

    def merged_weight(self) -> Tensor:
        """The weight of the merged layer, ``W + scaling * B A``, as the output uses it in
        eval mode (the layers that join weights for decoding read it)."""
        return self.weight + self.delta_weight()

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` computing what this layer computes in eval mode."""
        kw = {"device": self.weight.device, "dtype": self.weight.dtype}
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, **kw)
        with torch.no_grad():
            out.weight.copy_(self.merged_weight())
            if self.bias is not None:
                out.bias.copy_(self.bias)
        out.weight.requires_grad_(self.weight.requires_grad)
        return out

    def extra_repr(self) -> str:
        parts = f", parts={self.parts}" if self.parts > 1 else ""
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha:g}{parts}"


def _matches(name: str, attr: str, role: str | None, targets: Sequence[str]) -> bool:
    for t in targets:
        if t in ROLES:
            hit = t == role
        elif any(c in t for c in ".*?["):
            hit = fnmatch.fnmatchcase(name, t)
        else:  # a bare attribute name, as peft's target_modules: "q_proj" is every layer so named
            hit = t == attr
        if hit:
            return True
    return False


def lora_targets(model: nn.Module, targets: Sequence[str]) -> list[tuple[str, nn.Module, str, int]]:
    """``[(qualified name, parent, attribute, parts), ...]``: the plain ``nn.Linear`` layers
    of ``model`` that ``targets`` selects: a role (``"attention"``, ``"mlp"``: the layers of
    modules whose class declares that ``lora_role``), a bare attribute name (``"q_proj"``)
    or a glob over qualified names (``"blocks.*.attn.out_proj"``)."""
    found = []
    for parent_name, parent in model.named_modules():
        role = getattr(type(parent), "lora_role", None)
        for attr, child in parent.named_children():
            name = f"{parent_name}.{attr}" if parent_name else attr
            if type(child) is nn.Linear and _matches(name, attr, role, targets):
                found.append((name, parent, attr, getattr(type(parent), "lora_parts", {}).get(attr, 1)))
    return found


def _full_rank(layer: nn.Linear, parts: int) -> int:
    """The largest rank an update of ``layer`` can have: its smaller side (of each of its
    ``parts`` packed projections)."""
    return min(layer.in_features, layer.out_features // parts)


def apply_lora(model: nn.Module, *, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0,
               targets: Sequence[str] = ("attention",)) -> list[str]:
    """Put a :class:`LoRALinear` in place of every linear layer ``targets`` selects
    (:func:`lora_targets`), in place; returns their names. Raises :class:`InputError`
    when none is found, with the roles and a module name to pattern on, and when ``rank``
    exceeds the smaller side of a selected layer (of each projection of a packed one)."""
    if isinstance(targets, str) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise InputError(f"targets must be a non-empty list of roles ({', '.join(ROLES)}), layer names or name "
                         f"patterns; got {targets!r}")
    if not (isinstance(rank, int) and rank >= 1) or not alpha > 0 or not 0 <= dropout < 1:
        raise InputError(f"LoRA needs rank >= 1, alpha > 0 and 0 <= dropout < 1; got rank={rank!r}, "
                         f"alpha={alpha!r}, dropout={dropout!r}")
    found = lora_targets(model, targets)
    if not found:
        close = [r for t in targets if t not in ROLES for r in difflib.get_close_matches(t, ROLES, n=1)]
        hints = f"; did you mean {', '.join(close)}?" if close else ""
        example = next((n for n, m in model.named_modules() if type(m) is nn.Linear), None)
        raise InputError(f"targets {list(targets)!r} select no linear layer of {type(model).__name__}{hints} "
                         f"(roles: {', '.join(ROLES)}; or a layer name, or a pattern over qualified names"
                         + (f" such as {example!r})" if example else "; it has no nn.Linear layer)"))
    # B A has rank at most min(in, out): a higher rank only adds parameters (rank 100000 on a
    # width-32 model trains 51 M of them), so it is refused before the adapters are made.
    name, parent, attr, parts = min(found, key=lambda f: _full_rank(getattr(f[1], f[2]), f[3]))
    layer = getattr(parent, attr)
    if rank > _full_rank(layer, parts):
        per = f" per projection of its {parts} packed ones" if parts > 1 else ""
        raise InputError(f"rank must be at most {_full_rank(layer, parts)}, the smaller side of layer {name} "
                         f"({layer.in_features} inputs, {layer.out_features // parts} outputs{per}); got {rank}")
    for name, parent, attr, parts in found:
        setattr(parent, attr, LoRALinear(getattr(parent, attr), rank, alpha, dropout, parts))
    return [name for name, *_ in found]


def lora_layers(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def is_adapter_key(key: str) -> bool:
    """Whether a ``state_dict`` key is a LoRA adapter's (``...q_proj.lora_A``)."""
    return key.rsplit(".", 1)[-1] in ADAPTER_NAMES


def mark_only_lora_trainable(model: nn.Module, keep: Iterable[str] = ()) -> int:
    """Freeze every parameter but the adapters and those under the module names ``keep``
    (the classifier head); returns the number of trainable parameters."""
    keep = tuple(keep)
    trainable = 0
    for name, p in model.named_parameters():
        on = is_adapter_key(name) or any(name.startswith(k + ".") for k in keep)
        p.requires_grad_(on)
        trainable += p.numel() if on else 0
    return trainable


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` of ``model`` by the plain ``nn.Linear`` it equals
    in eval mode (:meth:`LoRALinear.merged`), in place; returns ``model``."""
    for name, layer in lora_layers(model):
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, layer.merged())
    return model
