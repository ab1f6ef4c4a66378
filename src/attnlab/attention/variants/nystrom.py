"""Nyström attention (Xiong et al., 2021, "Nyströmformer: A Nyström-Based Algorithm for
Approximating Self-Attention").

With ``m`` landmarks ``Q̃``, ``K̃`` (segment means of the queries and keys), softmax
attention is approximated as::

    out = softmax(Q K̃ᵀ) · pinv(softmax(Q̃ K̃ᵀ)) · softmax(Q̃ Kᵀ) V

(logits scaled by ``1/sqrt(D)``), which needs ``O(L · m)`` memory instead of ``O(L²)``.
``pinv`` is the paper's iterative Moore-Penrose pseudo-inverse
(:func:`iterative_pinv`, ``pinv_iters`` iterations, 6 by default).

* **Landmarks.** The sequence is padded with zeros at the end up to a multiple of
  ``num_landmarks`` and cut into ``num_landmarks`` equal segments; each landmark is the
  mean of its segment over the *real* tokens only (neither the zeros added to reach the
  multiple nor padded tokens count). A segment without a real token gives an empty
  landmark, which is masked out (its column of ``softmax(Q K̃ᵀ)`` is 0 and its row of
  ``softmax(Q̃ K̃ᵀ)`` is that of the identity), so it contributes nothing.
* **Padding.** Padded keys are masked in ``softmax(Q̃ Kᵀ)`` and excluded from the
  landmark means; the values of padded positions are zeroed before the optional
  convolution; the outputs of padded queries are set to 0. Outputs at real positions
  do not depend on what the padded positions hold.
* **Short inputs.** When ``L <= num_landmarks`` the approximation would cost as much
  as exact attention, so exact softmax attention is computed instead (with the same
  padding rules: padded keys masked, padded queries' outputs 0, and the conv residual
  when it is on).
* **Conv residual.** ``conv_kernel`` (an odd int, e.g. 33; ``None`` = off) adds the
  paper's depthwise convolution over the sequence of the values, one filter per head.
* **Causal** attention is not possible (landmarks mix every position):
  ``is_causal=True`` raises a ``ValueError``.
* **Dropout** is on the ``(L, m)`` weights ``softmax(Q K̃ᵀ)`` (on the full weights in
  the exact fallback), in training mode.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...dropout import dropout
from ...errors import InputError
from ..functional import scaled_dot_product_attention
from ..contract import Option
from ..registry import register_attention
from .base import TOKEN_OPTIONS, TokenAttention

__all__ = ["NystromAttention", "iterative_pinv"]


def iterative_pinv(a: Tensor, iters: int = 6) -> Tensor:
    """Moore-Penrose pseudo-inverse of the trailing ``(m, m)`` matrices of ``a`` by the
    iteration of Razavi et al. (2014) used in the Nyströmformer::

        Z0 = Aᵀ / (max_i Σ_j |A_ij| · max_j Σ_i |A_ij|)
        Z  <- ¼ Z (13 I - A Z (15 I - A Z (7 I - A Z)))

    The scale is computed per matrix. Converges (quickly, from a few iterations) for
    well-conditioned ``A`` such as a softmax matrix."""
    m = a.shape[-1]
    eye = torch.eye(m, dtype=a.dtype, device=a.device)
    absa = a.abs()
    scale = absa.sum(-1).amax(-1, keepdim=True) * absa.sum(-2).amax(-1, keepdim=True)  # (..., 1)
    z = a.transpose(-1, -2) / scale.unsqueeze(-1)
    for _ in range(iters):
        az = a @ z
        z = (0.25 * z) @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def _masked_softmax(logits: Tensor, blocked: Tensor | None) -> Tensor:
    """Softmax over the last axis with ``blocked`` (bool, broadcastable) positions at a
    very negative finite logit: a fully blocked row is uniform instead of NaN."""
    if blocked is not None:
        logits = logits.masked_fill(blocked, torch.finfo(logits.dtype).min)
    return torch.softmax(logits, dim=-1)


NYSTROM_OPTIONS = TOKEN_OPTIONS.extend(
    Option("num_landmarks", int, 64, "the landmark queries and keys", low=1, counts_positions=True),
    Option("pinv_iters", int, 6, "iterations of the pseudo-inverse", low=1),
    Option("conv_kernel", int, None, "an odd depthwise convolution over the values (None: none)", low=1))


@register_attention("nystrom", options=NYSTROM_OPTIONS, takes_positions=True, causal=False, padding=True,
                    lora_roles=("attention",),
                    summary="Nyströmformer: the softmax matrix approximated from landmark queries and keys")
class NystromAttention(TokenAttention):
    """Nyström self-attention; see the module docstring.

    Args:
        embed_dim: as for exact self-attention.
        num_heads: as for exact self-attention.
        dropout: as for exact self-attention.
        bias: as for exact self-attention.
        rope: rotary positions on queries and keys, as :class:`~.base.TokenAttention`.
        rope_theta: the base of the rotary wavelengths.
        num_landmarks: ``m``, the number of landmarks (segments).
        pinv_iters: iterations of :func:`iterative_pinv`.
        conv_kernel: odd kernel size of the depthwise conv residual on the values, or
            ``None`` for none.
    """

    kind = "nystrom"

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rope: bool = False, rope_theta: float = 10000.0,
                 num_landmarks: int = 64, pinv_iters: int = 6, conv_kernel: int | None = None) -> None:
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, rope=rope, rope_theta=rope_theta)
        if num_landmarks <= 0:
            raise InputError(f"{self.kind}: num_landmarks must be positive; got {num_landmarks}")
        if pinv_iters <= 0:
            raise InputError(f"{self.kind}: pinv_iters must be positive; got {pinv_iters}")
        if conv_kernel is not None and (conv_kernel <= 0 or conv_kernel % 2 == 0):
            raise InputError(f"{self.kind}: conv_kernel must be a positive odd int or None; got {conv_kernel}")
        self.check_positions(num_landmarks=num_landmarks, conv_kernel=conv_kernel or 1)  # the kernel spans positions
        self.num_landmarks, self.pinv_iters, self.conv_kernel = num_landmarks, pinv_iters, conv_kernel
        self.conv = None
        if conv_kernel is not None:
            self.conv = nn.Conv2d(num_heads, num_heads, (conv_kernel, 1), padding=(conv_kernel // 2, 0),
                                  groups=num_heads, bias=False)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        b, h, n, d = q.shape
        m = self.num_landmarks
        p = self.dropout if self.training else 0.0
        pad = None if key_padding_mask is None else key_padding_mask[:, None, :, None]  # (B, 1, L, 1)
        if pad is not None:
            v = v.masked_fill(pad, 0.0)
        if n <= m:
            out, _ = scaled_dot_product_attention(q, k, v, key_padding_mask=key_padding_mask, dropout_p=p)
        else:
            out = self._nystrom(q, k, v, key_padding_mask, p)
        if self.conv is not None and n > 0:  # (the conv refuses an empty sequence, which has no residual)
            out = out + self.conv(v)
        if pad is not None:
            out = out.masked_fill(pad, 0.0)
        return out

    def _nystrom(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, p: float) -> Tensor:
        b, h, n, d = q.shape
        m = self.num_landmarks
        dtype = q.dtype
        work = torch.promote_types(dtype, torch.float32)  # softmax and pinv in float32 at least
        q, k, v = q.to(work) / math.sqrt(d), k.to(work), v.to(work)

        # Landmarks: segment means over the real tokens.
        seg = -(-n // m)
        total = seg * m
        real = torch.ones(b, n, dtype=work, device=q.device) if key_padding_mask is None \
            else (~key_padding_mask).to(work)
        real = F.pad(real, (0, total - n))  # (B, total)
        w = real[:, None, :, None]  # (B, 1, total, 1)
        count = real.view(b, m, seg).sum(-1)  # (B, m)
        denom = count.clamp(min=1.0)[:, None, :, None]  # (B, 1, m, 1)

        def means(x: Tensor) -> Tensor:
            x = F.pad(x, (0, 0, 0, total - n)) * w
            return x.view(b, h, m, seg, d).sum(-2) / denom  # (B, H, m, D)

        q_l, k_l = means(q), means(k)
        empty = (count == 0)[:, None, None, :] if bool((count == 0).any()) else None  # (B, 1, 1, m)

        kernel1 = _masked_softmax(q @ k_l.transpose(-1, -2), empty)  # (B, H, L, m)
        kernel2 = _masked_softmax(q_l @ k_l.transpose(-1, -2), empty)  # (B, H, m, m)
        if empty is not None:  # an empty landmark's row is e_j: pinv stays block-diagonal, and
            # its column of kernel1 is 0, so the empty landmarks drop out exactly
            eye = torch.eye(m, dtype=work, device=q.device)
            kernel2 = torch.where(empty.transpose(-1, -2), eye, kernel2)
        kp = None if key_padding_mask is None else key_padding_mask[:, None, None, :]  # (B, 1, 1, L)
        kernel3 = _masked_softmax(q_l @ k.transpose(-1, -2), kp)  # (B, H, m, L)
        kernel1 = dropout(kernel1, p, p > 0)
        out = (kernel1 @ iterative_pinv(kernel2, self.pinv_iters)) @ (kernel3 @ v)
        return out.to(dtype)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", num_landmarks={self.num_landmarks}, pinv_iters={self.pinv_iters}, "
                f"conv_kernel={self.conv_kernel}")
