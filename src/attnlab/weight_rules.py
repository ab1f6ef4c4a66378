"""Weights under other names, in one declarative style for every source (the Hugging Face
families of :mod:`attnlab.formats.hf.tables`, timm's ViT of :mod:`attnlab.models.checkpoint`,
``torch.nn.Transformer`` in :mod:`attnlab.models.transformer`, and the packed projections of
attnlab's own older runs in :mod:`attnlab.attention.projections`): a table of rules
``(theirs, ours, how)``.

* ``{i}`` in a name stands for each layer (:func:`expand`).
* A name without ``.weight``/``.bias`` moves both, those the checkpoint has; a full name
  (``cls_token``) moves that tensor.
* ``how``: ``""`` as it is; ``"T"`` transposed (GPT-2's ``Conv1D`` stores ``(in, out)``);
  ``"+1"`` plus one (Gemma stores a norm's weight minus one); ``"split"`` one packed tensor
  cut along its rows into ``ours`` (a tuple), each as many rows as the model's (equal parts
  when no model is given); ``"T split"`` both; ``"join"`` the tensors ``theirs`` (a tuple)
  packed into one (the inverse of a split).

:func:`apply_map` returns what it converted, where each came from (for messages in the
checkpoint's own names) and what no rule took; :func:`their_name` the checkpoint's name of one
of attnlab's (for messages).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from .errors import InputError, shape_str

__all__ = ["Rule", "expand", "apply_map", "invert_map", "their_name"]

Rule = tuple[Any, Any, str]


def _name(name: Any, i: int | None) -> Any:
    if isinstance(name, tuple):
        return tuple(_name(n, i) for n in name)
    return name if i is None else name.replace("{i}", str(i))


def expand(rules: list[Rule], depth: int) -> list[Rule]:
    """``rules`` with each ``{i}`` rule repeated for layers ``0 .. depth - 1``."""
    out: list[Rule] = []
    for theirs, ours, how in rules:
        first = theirs if isinstance(theirs, str) else theirs[0]
        for i in (range(depth) if "{i}" in first else (None,)):
            out.append((_name(theirs, i), _name(ours, i), how))
    return out


def apply_map(state: dict[str, Tensor], rules: list[Rule], expected: dict[str, Tensor] | None = None,
              ) -> tuple[dict[str, Tensor], dict[str, str], dict[str, Tensor]]:
    """``(tensors in attnlab's names, attnlab's name -> the checkpoint's, what no rule took)``
    of ``state`` under ``rules`` (expanded). ``expected``: the model's tensors, which size a
    split's parts; a packed tensor with a part missing is an error naming it."""
    state, out, source = dict(state), {}, {}
    for theirs, ours, how in rules:
        names = (theirs,) if isinstance(theirs, str) else theirs
        whole = all(n in state for n in names)
        for suffix in ("",) if whole else (".weight", ".bias"):
            keys = [n + suffix for n in names]
            targets = [ours + suffix] if isinstance(ours, str) else [o + suffix for o in ours]
            for target in targets:
                source[target] = keys[0] if len(keys) == 1 else " + ".join(keys)
            present = [k for k in keys if k in state]
            if len(present) < len(keys):
                if present:  # a part of a packed tensor
                    absent = next(k for k in keys if k not in state)
                    raise InputError(f"the checkpoint lacks {absent}, which {targets[0]} packs with "
                                     f"{', '.join(present)}")
                continue
            tensors = [state.pop(k) for k in keys]
            t = torch.cat(tensors) if how == "join" else tensors[0]
            if how.startswith("T") and suffix != ".bias":
                t = t.t()
            if how == "+1":
                t = t + 1
            if not how.endswith("split"):
                out[targets[0]] = t
                continue
            sizes = [expected[o].shape[0] if expected is not None and o in expected else -1 for o in targets]
            if (-1 in sizes or sum(sizes) != t.shape[0]) and t.shape[0] % len(targets) == 0:
                sizes = [t.shape[0] // len(targets)] * len(targets)  # the shapes' check then names the config key
            if sum(sizes) != t.shape[0]:
                raise InputError(f"{keys[0]} has shape {shape_str(t)}, which does not split into "
                                 f"{', '.join(targets)} of {sizes} rows")
            for target, part in zip(targets, t.split(sizes)):
                out[target] = part
    return out, source, state


def their_name(key: str, rules: list[Rule]) -> str:
    """The checkpoint's name of attnlab's tensor ``key`` under ``rules`` (``{i}`` matching any
    layer): the packed tensor a split part comes from, the first of a join; ``key`` itself
    when no rule makes it."""
    for theirs, ours, _ in rules:
        names = (theirs,) if isinstance(theirs, str) else theirs
        for target in (ours,) if isinstance(ours, str) else ours:
            found = re.fullmatch(re.escape(target).replace(re.escape("{i}"), r"(\d+)") + r"(\..*)?", key)
            if found:
                layer, suffix = (found.group(1), found.group(2)) if "{i}" in target else (None, found.group(1))
                return _name(names[0], None if layer is None else int(layer)) + (suffix or "")
    return key


def invert_map(state: dict[str, Tensor], rules: list[Rule]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(tensors in the checkpoint's names, what no rule took)`` of attnlab's ``state`` under
    ``rules`` (expanded): :func:`apply_map` backwards, so that a model goes out under the
    names and layouts it came in with. ``"T"`` transposes back, ``"+1"`` takes the one off
    again, a ``"split"`` joins its parts into the packed tensor."""
    state, out = dict(state), {}
    for theirs, ours, how in rules:
        if how == "join":
            raise InputError(f"rule {theirs} -> {ours}: a join is read, never written back")
        targets = (ours,) if isinstance(ours, str) else ours
        whole = all(t in state for t in targets)
        for suffix in ("",) if whole else (".weight", ".bias"):
            keys = [t + suffix for t in targets]
            present = [k for k in keys if k in state]
            if len(present) < len(keys):
                if present:
                    raise InputError(f"the model lacks {next(k for k in keys if k not in state)}, which "
                                     f"{theirs + suffix} packs with {', '.join(present)}")
                continue
            parts = [state.pop(k) for k in keys]
            t = torch.cat(parts) if how.endswith("split") else parts[0]
            if how.startswith("T") and suffix != ".bias":
                t = t.t()
            if how == "+1":
                t = t - 1
            out[theirs + suffix] = t.contiguous()
    return out, state
