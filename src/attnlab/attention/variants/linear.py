"""Linear (kernelized) attention: Katharopoulos et al., "Transformers are RNNs", 2020.

Softmax's ``exp(q · k)`` is replaced by a kernel ``phi(q) · phi(k)`` with a positive
feature map ``phi``; for one head, with ``A_ij = phi(q_i) · phi(k_j)``::

    out_i = sum_j A_ij v_j / (sum_j A_ij + eps)
          = phi(q_i)ᵀ (sum_j phi(k_j) v_jᵀ) / (phi(q_i)ᵀ sum_j phi(k_j) + eps)

The second form costs ``O(n·M·D)`` (``M`` features, ``D`` value size) instead of ``O(n²)``.
Here ``phi(x) = elu(x) + 1``, so ``M = D``.

Causal attention sums only over ``j <= i``: :func:`kernel_attention` splits the sequence
into chunks of ``C`` positions, uses the explicit masked ``(C, C)`` kernel matrix within a
chunk and the state ``S = sum phi(k) vᵀ`` ``(M, D)`` and ``z = sum phi(k)`` of all earlier
chunks across chunks. Exact, ``O(n·C·M + n·M·D)`` time; besides the inputs it keeps one
``(M, D)`` state per chunk (``n/C · M · D`` numbers per head, about the size of ``q`` for
``C = M = D = 64``) and ``(C, C)`` blocks, never an ``(n, n)`` matrix.

Padded keys (``key_padding_mask`` ``True``) get ``phi(k) = 0`` and ``v = 0``, so they add
nothing to any sum; a query whose keys are all padded gets ``0 / eps = 0``. Half-precision
inputs are computed in float32 (sums of ``n`` terms overflow float16) and cast back.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import InputError
from ..contract import Option
from ..registry import register_attention
from .base import PLAIN_TOKEN_OPTIONS, TokenAttention

__all__ = ["LinearAttention", "kernel_attention", "elu_feature_map", "elu_linear_attention"]


def _compute_dtype(t: Tensor) -> torch.dtype:
    """float32 for half / bfloat16 inputs, the input's dtype otherwise (float64 stays)."""
    return torch.promote_types(t.dtype, torch.float32)


def elu_feature_map(x: Tensor) -> Tensor:
    """``phi(x) = elu(x) + 1`` (positive), in float32 at least."""
    return F.elu(x.to(_compute_dtype(x))).add_(1.0)  # in place: elu's backward needs its input, not its output


def kernel_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None,
                     is_causal: bool = False, eps: float = 1e-6, chunk: int = 64) -> Tensor:
    """Normalised kernel attention ``out_i = sum_j A_ij v_j / (sum_j A_ij + eps)``, ``A_ij = phi_q_i · phi_k_j``.

    Args:
        phi_q: ``(B, H, L, M)`` query features (non-negative).
        phi_k: ``(B, H, L, M)`` key features (non-negative).
        v: ``(B, H, L, D)`` values.
        key_padding_mask: ``(B, L)`` bool, ``True`` = padding, or ``None``.
        is_causal: sum only over ``j <= i`` (self-attention, queries and keys aligned).
        eps: added to the normaliser.
        chunk: chunk length ``C`` of the causal computation (see the module docstring).

    Returns:
        ``(B, H, L, D)`` in ``v``'s dtype, computed in float32 at least.
    """
    if chunk <= 0:
        raise InputError(f"chunk must be positive; got {chunk}")
    out_dtype = v.dtype
    ct = torch.promote_types(_compute_dtype(v), torch.promote_types(phi_q.dtype, phi_k.dtype))
    phi_q, phi_k, v = phi_q.to(ct), phi_k.to(ct), v.to(ct)
    if key_padding_mask is None and not is_causal:
        return _KernelAttention.apply(phi_q, phi_k, v, eps, False).to(out_dtype)
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :, None]
        phi_k = phi_k.masked_fill(pad, 0.0)  # masked_fill, not a product: no 0 * inf
        v = v.masked_fill(pad, 0.0)
    # A column of ones appended to v carries the normaliser through the same products:
    # phi_q (phi_kᵀ [v, 1]) = [numerator, denominator], one matmul instead of two.
    d = v.shape[-1]
    v1 = F.pad(v, (0, 1), value=1.0)  # (B, H, L, D + 1)
    if not is_causal:
        out = phi_q @ (phi_k.transpose(-2, -1) @ v1)  # (B, H, L, D + 1); the state is (M, D + 1)
        return (out[..., :d] / (out[..., d:] + eps)).to(out_dtype)

    b, h, n, m = phi_q.shape
    c = max(min(chunk, n), 1)  # an empty sequence is zero chunks of 1
    nc = math.ceil(n / c)
    extra = nc * c - n
    if extra:  # zero features: padding positions add nothing and get 0 / eps = 0
        phi_q, phi_k, v1 = (F.pad(t, (0, 0, 0, extra)) for t in (phi_q, phi_k, v1))
    qc = phi_q.reshape(b, h, nc, c, m)
    kc = phi_k.reshape(b, h, nc, c, m)
    vc = v1.reshape(b, h, nc, c, d + 1)
    # State of all earlier chunks: exclusive prefix sums over the chunk axis.
    kv = kc.transpose(-2, -1) @ vc  # (B, H, nc, M, D + 1), one chunk's sum phi(k) [v, 1]ᵀ
    s_prev = torch.cat([torch.zeros_like(kv[:, :, :1]), kv[:, :, :-1].cumsum(dim=2)], dim=2)
    # Within a chunk: the explicit lower-triangular kernel matrix.
    tri = torch.ones(c, c, dtype=torch.bool, device=v.device).tril()
    a = (qc @ kc.transpose(-2, -1)).masked_fill(~tri, 0.0)  # (B, H, nc, C, C)
    out = qc @ s_prev + a @ vc  # (B, H, nc, C, D + 1)
    out = out[..., :d] / (out[..., d:] + eps)
    return out.reshape(b, h, nc * c, d)[:, :, :n].to(out_dtype)


class _KernelAttention(torch.autograd.Function):
    """Non-causal, unmasked normalised kernel attention with a hand-written backward:
    ``out = (phi_q (phi_kᵀ v)) / (phi_q sum(phi_k) + eps)``.

    With ``elu=True`` it takes raw ``q, k`` and applies ``phi = elu(x) + 1`` itself.
    Autograd's version of the same lines recomputes ``exp`` for elu's derivative and goes
    through the division in several passes; here the derivative of ``phi`` is read off
    ``phi`` itself (1 where ``x > 0``, ``exp(x) = phi`` elsewhere: ``min(phi, 1)``) and each
    gradient is one matmul and at most two passes.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, eps: float, elu: bool) -> Tensor:  # type: ignore[override]
        pq, pk = (F.elu(q).add_(1.0), F.elu(k).add_(1.0)) if elu else (q, k)  # (..., L, M)
        s = pk.transpose(-2, -1) @ v  # (..., M, D)
        z = pk.sum(dim=-2).unsqueeze(-1)  # (..., M, 1)
        den = (pq @ z).add_(eps)  # (..., L, 1)
        out = (pq @ s).div_(den)  # (..., L, D)
        ctx.elu = elu
        ctx.save_for_backward(pq, pk, v, s, z, den, out)
        return out

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:  # type: ignore[override]
        pq, pk, v, s, z, den, out = ctx.saved_tensors
        dnum = g / den  # (L, D)
        dden = -(dnum * out).sum(dim=-1, keepdim=True)  # (L, 1): d out / d den = -out / den
        ds = pq.transpose(-2, -1) @ dnum  # (M, D)
        dz = pq.transpose(-2, -1) @ dden  # (M, 1)
        dpq = (dnum @ s.transpose(-2, -1)).addcmul_(dden, z.transpose(-2, -1))  # (L, M)
        dpk = (v @ ds.transpose(-2, -1)).add_(dz.transpose(-2, -1))  # (L, M)
        dv = pk @ ds  # (L, D)
        if ctx.elu:
            dpq, dpk = dpq.mul_(pq.clamp(max=1.0)), dpk.mul_(pk.clamp(max=1.0))
        return dpq, dpk, dv, None, None


def elu_linear_attention(q: Tensor, k: Tensor, v: Tensor, eps: float = 1e-6) -> Tensor:
    """``kernel_attention(elu_feature_map(q), elu_feature_map(k), v)`` without masks, not
    causal: the fast path of the ``"linear"`` kind. ``(B, H, L, M)`` q, k and ``(B, H, L, D)``
    v -> ``(B, H, L, D)``, computed in float32 at least."""
    ct = torch.promote_types(_compute_dtype(v), torch.promote_types(q.dtype, k.dtype))
    return _KernelAttention.apply(q.to(ct), k.to(ct), v.to(ct), eps, True).to(v.dtype)


LINEAR_OPTIONS = PLAIN_TOKEN_OPTIONS.extend(Option("eps", float, 1e-6, "added to the normaliser", low=0, low_open=True))


@register_attention("linear", options=LINEAR_OPTIONS, takes_positions=True, causal=True, padding=True,
                    lora_roles=("attention",),
                    summary="linear attention with the elu + 1 feature map, linear in time")
class LinearAttention(TokenAttention):
    """Linear attention with ``phi(x) = elu(x) + 1`` (Katharopoulos et al., 2020).

    Args:
        embed_dim: as exact self-attention.
        num_heads: as exact self-attention.
        bias: as exact self-attention.
        dropout: accepted so that a model can pass its ``attn_dropout`` unchanged, but
            **unused**: linear attention never forms attention weights to drop.
        eps: added to the normaliser ``phi(q_i) · sum_j phi(k_j)``.

    The causal chunk length is the attribute ``chunk_size`` (default 64); it changes
    speed and memory, not the result.
    """

    kind = "linear"
    chunk_size = 64

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 eps: float = 1e-6) -> None:
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias)
        if not eps > 0:
            raise InputError(f"{self.kind}: eps must be positive; got {eps}")
        self.eps = eps

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        if key_padding_mask is None and not is_causal:
            return elu_linear_attention(q, k, v, self.eps)
        return kernel_attention(elu_feature_map(q), elu_feature_map(k), v, key_padding_mask, is_causal,
                                self.eps, self.chunk_size)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", eps={self.eps}"
