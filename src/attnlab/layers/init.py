"""Initialisations of attention weights, and GPT-2's and BERT's of whole models."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["mimetic_init_", "normal_init_", "skip_init"]


_INITS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
          "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


@contextmanager
def skip_init() -> Iterator[None]:
    """Build modules without drawing their initial weights (``torch.nn.init``'s functions do
    nothing inside), for a model whose every weight is loaded next, strictly. Drawing a
    model's initial weights was most of its load from a GGUF file: work that loading
    overwrites."""
    saved = {name: getattr(nn.init, name) for name in _INITS}

    def nothing(tensor: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return tensor

    try:
        for name in _INITS:
            setattr(nn.init, name, nothing)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


@torch.no_grad()
def normal_init_(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2's and BERT's initialisation of one module, for ``model.apply``: the weights of
    linear and embedding layers normal with ``std``, their biases zero, an embedding's
    padding row zero."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            module.weight[module.padding_idx].zero_()


@torch.no_grad()
def mimetic_init_(in_proj_weight: Tensor, out_proj_weight: Tensor, num_heads: int, *,
                  qk: tuple[float, float] = (0.7, 0.7), vo: tuple[float, float] = (0.4, 0.4)) -> None:
    """Mimetic initialisation of one self-attention layer (Trockman and Kolter, 2023), in place.

    Pre-trained ViTs have ``W_q W_k^T`` close to a positive multiple of the identity in every
    head (a token attends to tokens like itself: with position embeddings, its neighbours)
    and ``W_v W_o`` close to a negative one. This sets, with ``Z`` standard normal over
    ``sqrt(d)`` (``d`` the width, ``k = d / num_heads``):

    - each head's ``W_q W_k^T`` to the best rank-``k`` approximation of ``qk[0] Z + qk[1] I``;
    - ``W_v W_o`` (all heads together, full rank) to ``vo[0] Z' - vo[1] I``,

    splitting each product into its two factors by SVD (the square roots of the singular
    values on both sides). The paper's defaults for vision are ``(0.7, 0.7)`` and ``(0.4, 0.4)``.
    ``in_proj_weight``: ``(3d, d)``, the packed ``[q; k; v]`` rows of a ``nn.Linear``;
    ``out_proj_weight``: ``(d, d)``. Random draws use torch's global generator (seeded runs
    stay reproducible)."""
    d = out_proj_weight.shape[0]
    if in_proj_weight.shape != (3 * d, d) or out_proj_weight.shape != (d, d):
        raise InputError(f"mimetic_init_ needs in_proj_weight (3d, d) and out_proj_weight (d, d); got "
                         f"{tuple(in_proj_weight.shape)} and {tuple(out_proj_weight.shape)}")
    if num_heads <= 0 or d % num_heads:
        raise InputError(f"num_heads must divide the width {d}; got {num_heads}")
    k = d // num_heads
    eye = torch.eye(d)

    def target(alpha: float, beta: float) -> tuple[Tensor, Tensor, Tensor]:
        u, s, vt = torch.linalg.svd(alpha * torch.randn(d, d) / math.sqrt(d) + beta * eye)
        return u, s.sqrt(), vt

    for h in range(num_heads):
        u, r, vt = target(*qk)
        rows = slice(h * k, (h + 1) * k)
        # q = x W_q^T in nn.Linear's layout, so the weight rows are the factors' columns.
        in_proj_weight[rows] = (u[:, :k] * r[:k]).T.to(in_proj_weight)
        in_proj_weight[d:][rows] = (vt[:k].T * r[:k]).T.to(in_proj_weight)
    u, r, vt = target(vo[0], -vo[1])
    in_proj_weight[2 * d:] = (u * r).T.to(in_proj_weight)  # W_v = U sqrt(S)
    out_proj_weight.copy_((r[:, None] * vt).T)  # W_o = sqrt(S) V^T, so that W_v W_o = U S V^T
