"""Positions given inside the attention instead of added to its input: rotary embeddings
(queries and keys rotated by their positions, :mod:`~attnlab.attention.rotary`) or ALiBi
(a per-head distance penalty on the logits, :mod:`~attnlab.attention.alibi`).

The kinds that take them (``exact`` multi-head self-attention and ``gqa``) set them up
here, the same way, as ``module.rotary`` (a :class:`RotaryEmbedding` or ``None``) and
``module.alibi_slopes`` (a buffer ``(H,)`` or ``None``); neither is saved in a
``state_dict``, so a model's checkpoint keys do not depend on its positions.
"""

from __future__ import annotations

from torch import nn

from ..errors import InputError
from .alibi import alibi_slopes
from .rotary import RotaryEmbedding

__all__ = ["init_inner_positions", "inner_positions_repr"]


def init_inner_positions(module: nn.Module, head_dim: int, num_heads: int, *, rope: bool, rope_theta: float,
                         alibi: bool, rope_scaling: dict | None = None, partial_rotary: float = 1.0,
                         max_len: int | None = None) -> None:
    """Give ``module`` its ``rotary`` and ``alibi_slopes`` (each ``None`` when not asked for);
    ``rope_scaling``, ``partial_rotary`` and ``max_len`` as :class:`RotaryEmbedding` takes them."""
    if rope and alibi:
        raise InputError("rope and alibi are two ways to give positions; choose one")
    if not rope and (rope_scaling is not None or partial_rotary != 1.0):
        raise InputError("rope_scaling and partial_rotary are options of rotary positions; rope is off")
    extra: dict = {}
    if rope_scaling is not None:  # only when asked: the plain table is the common case
        extra.update(scaling=rope_scaling, max_len=max_len)
    if partial_rotary != 1.0:
        extra["fraction"] = partial_rotary
    module.rotary = RotaryEmbedding(head_dim, rope_theta, **extra) if rope else None
    if alibi:
        module.register_buffer("alibi_slopes", alibi_slopes(num_heads), persistent=False)
    else:
        module.alibi_slopes = None


def inner_positions_repr(module: nn.Module) -> list[str]:
    """The positions' part of ``extra_repr``."""
    parts = []
    if module.rotary is not None:
        parts.append(f"rope_theta={module.rotary.theta:g}")
    if module.alibi_slopes is not None:
        parts.append("alibi")
    return parts
