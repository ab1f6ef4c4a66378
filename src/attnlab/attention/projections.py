"""The projections every self-attention kind of attnlab shares, by Llama's names: ``q_proj``,
``k_proj``, ``v_proj`` (``E -> heads * D``) and ``o_proj`` (``heads * D -> E``), so that a
model's checkpoint keys do not change when its attention kind does, and Hugging Face's
decoders load by renaming alone.

Checkpoints of earlier attnlab versions packed the first three in one ``in_proj`` ``(3E, E)``
and called the last ``out_proj`` (torch's names). :func:`upgrade_packed_projections` reads
them as today's: each ``in_proj`` tensor (weight, bias, and a LoRA adapter's ``lora_A``
``(3r, E)`` and ``lora_B`` ``(3E, r)``) is cut into its three equal blocks of rows, in the
order query, key, value; ``out_proj`` is renamed. The self-attention kinds register it as a
``load_state_dict`` pre-hook, so ``model.load_state_dict(old_weights)`` works as it did, and
:func:`upgrade_weights` applies it to a whole model's state dict before keys are compared.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..weight_rules import Rule, apply_map

__all__ = ["UpgradesPackedProjections", "init_torch_style", "upgrade_packed_projections", "upgrade_weights",
           "PACKED_PROJECTIONS"]

# The older names, as rules of attnlab.weight_rules: each tensor under them (weight, bias, a LoRA
# adapter's lora_A and lora_B) split into three equal blocks of rows, or renamed.
PACKED_PROJECTIONS: list[Rule] = [("in_proj", ("q_proj", "k_proj", "v_proj"), "split"), ("out_proj", "o_proj", "")]


def upgrade_packed_projections(state: dict[str, Tensor], prefix: str) -> None:
    """Rewrite, in place, the packed ``{prefix}in_proj.*`` and ``{prefix}out_proj.*`` entries
    of ``state`` as ``{prefix}q_proj.*``, ``k_proj``, ``v_proj`` and ``o_proj``
    (:data:`PACKED_PROJECTIONS`, for every tensor the module has under those names)."""
    rules: list[Rule] = []
    for old, new, how in PACKED_PROJECTIONS:
        for key in [k for k in state if k.startswith(f"{prefix}{old}.")]:
            rest = key[len(prefix) + len(old):]
            rules.append((key, tuple(f"{prefix}{n}{rest}" for n in new) if isinstance(new, tuple)
                          else f"{prefix}{new}{rest}", how))
    if rules:
        converted, _, _ = apply_map({key: state.pop(key) for key, _, _ in rules}, rules)
        state.update(converted)


class UpgradesPackedProjections:
    """Mixin of the self-attention kinds: ``upgrade_state_dict(state, prefix)`` reads the
    packed projections of earlier versions (the method the engine calls on every module
    before comparing a checkpoint's keys), and ``load_state_dict`` does it too (a pre-hook,
    registered by :meth:`register_upgrade` in ``__init__``)."""

    def upgrade_state_dict(self, state: dict[str, Tensor], prefix: str) -> None:
        upgrade_packed_projections(state, prefix)

    def register_upgrade(self) -> None:
        self.register_load_state_dict_pre_hook(_pre_hook)  # type: ignore[attr-defined]


def _pre_hook(module: nn.Module, state: dict[str, Tensor], prefix: str, *args: Any) -> None:
    upgrade_packed_projections(state, prefix)


def upgrade_weights(model: nn.Module, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` for ``model`` as its modules read it today (each module's
    ``upgrade_state_dict``; a copy): for the code that compares keys before loading."""
    state = dict(state)
    for name, module in model.named_modules():
        upgrade = getattr(module, "upgrade_state_dict", None)
        if callable(upgrade):
            upgrade(state, f"{name}." if name else "")
    return state


def init_torch_style(q: nn.Linear, k: nn.Linear, v: nn.Linear, o: nn.Linear) -> None:
    """torch's ``nn.MultiheadAttention`` initialisation, which attnlab's exact attention has
    always had: Xavier-uniform over the query, key and value rows taken together as one
    ``(3E, E)`` matrix, zero biases (the output weight keeps ``nn.Linear``'s). Drawn as one
    matrix, it gives the weights the packed ``in_proj`` of earlier versions had for a seed."""
    with torch.no_grad():
        packed = torch.empty(q.out_features + k.out_features + v.out_features, q.in_features,
                             dtype=q.weight.dtype, device=q.weight.device)
        nn.init.xavier_uniform_(packed)
        for layer, part in zip((q, k, v), packed.split([q.out_features, k.out_features, v.out_features])):
            layer.weight.copy_(part)
        for layer in (q, k, v, o):
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
