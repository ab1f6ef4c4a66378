"""Multi-head attention with ``torch.nn.MultiheadAttention``'s constructor: the exact attention
(:class:`~attnlab.attention.exact.GroupedQueryAttention`, the ``"exact"`` kind) built from
torch's arguments, for self- and cross-attention alike.

There is one exact attention in attnlab. :class:`MultiHeadAttention` is that module, made
from torch's arguments (``kdim`` and ``vdim`` for keys and values of other widths, ``device``
and ``dtype``) and from a torch module (:meth:`MultiHeadAttention.from_torch`, equal to it
with the same weights); ``SelfAttention`` and ``CrossAttention`` are its older names. Its
parameters are the exact kind's ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``; state dicts
with torch's packed ``in_proj`` and ``out_proj`` (this module's before it became the exact
kind) load as they are (:mod:`~attnlab.attention.projections`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import InputError
from .cache import DecodingCache
from .exact import GroupedQueryAttention

__all__ = ["MultiHeadAttention", "SelfAttention", "CrossAttention"]


class MultiHeadAttention(GroupedQueryAttention):
    r"""Multi-head attention (Vaswani et al., 2017), batch-first, from torch's arguments.

    ``out = W_o · concat_h softmax(q_h k_hᵀ / sqrt(D) + mask) v_h`` with ``D = E / H``.

    Args:
        embed_dim: model width ``E`` (query features and output features).
        num_heads: ``H``; must divide ``embed_dim``.
        dropout: dropout on the attention weights, in training mode.
        bias: add biases to the four projections.
        kdim: feature size of the key input (default ``embed_dim``).
        vdim: feature size of the value input (default ``embed_dim``).
        device: where the parameters are made (default: torch's default device).
        dtype: the parameters' type (default: torch's default type).
        **options: the exact kind's other options (``rope``, ``alibi``, ``num_kv_heads``, ...).

    ``forward(query, key=None, value=None, *, key_padding_mask, attn_mask, is_causal,
    need_weights, average_attn_weights, cache)`` as torch's (``key`` None or ``query`` itself:
    self-attention), returning ``(output (B, Lq, E), weights or None)``: see
    :class:`~attnlab.attention.exact.GroupedQueryAttention`.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, **options: object) -> None:
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, **options)
        for name, size in (("kdim", kdim), ("vdim", vdim)):
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
                raise InputError(f"{name} must be a positive number of features or None; got {size!r}")
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        if (self.kdim, self.vdim) != (embed_dim, embed_dim):
            # keys and values of other widths (torch's separate q/k/v weights): each drawn on its own, as torch does
            self.k_proj = nn.Linear(self.kdim, self.k_proj.out_features, bias=bias)
            self.v_proj = nn.Linear(self.vdim, self.v_proj.out_features, bias=bias)
            with torch.no_grad():
                for layer in (self.q_proj, self.k_proj, self.v_proj):
                    nn.init.xavier_uniform_(layer.weight)
                    if layer.bias is not None:
                        nn.init.zeros_(layer.bias)
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> "MultiHeadAttention":
        """An equal module from a ``torch.nn.MultiheadAttention`` (weights copied).

        attnlab is always batch-first; ``module.batch_first`` does not change the weights.
        """
        if module.bias_k is not None or module.add_zero_attn:
            raise InputError("from_torch: add_bias_kv and add_zero_attn are not supported")
        p = module.in_proj_weight if module.in_proj_weight is not None else module.q_proj_weight
        new = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=module.in_proj_bias is not None,
                  kdim=module.kdim, vdim=module.vdim, device=p.device, dtype=p.dtype)
        src = module.state_dict()
        state: dict[str, Tensor] = {}
        if "in_proj_weight" in src:  # torch packs exactly when kdim == vdim == embed_dim
            state["in_proj.weight"] = src["in_proj_weight"]
        else:
            for name in "qkv":
                state[f"{name}_proj.weight"] = src[f"{name}_proj_weight"]
        if "in_proj_bias" in src:
            for name, part in zip("qkv", src["in_proj_bias"].chunk(3)):
                state[f"{name}_proj.bias"] = part
        for key in ("weight", "bias"):
            if f"out_proj.{key}" in src:
                state[f"out_proj.{key}"] = src[f"out_proj.{key}"]
        new.load_state_dict(state)  # the packed names upgraded on loading (attnlab.attention.projections)
        return new.train(module.training)

    def extra_repr(self) -> str:
        s = super().extra_repr()
        if (self.kdim, self.vdim) != (self.embed_dim, self.embed_dim):
            s += f", kdim={self.kdim}, vdim={self.vdim}"
        return s


SelfAttention = MultiHeadAttention  # its older name as self-attention, m(x)


class CrossAttention(MultiHeadAttention):
    """:class:`MultiHeadAttention` that always attends to another sequence: ``m(x, context)``,
    ``context`` None only once a static cache holds its keys and values."""

    def forward(self, x: Tensor, context: Tensor | None = None, value: Tensor | None = None, *,  # type: ignore[override]
                key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None, is_causal: bool = False,
                need_weights: bool = False, average_attn_weights: bool = True,
                cache: DecodingCache | None = None) -> tuple[Tensor, Tensor | None]:
        return self._cross(x, context, value, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                           is_causal=is_causal, need_weights=need_weights, average_attn_weights=average_attn_weights,
                           cache=cache)
