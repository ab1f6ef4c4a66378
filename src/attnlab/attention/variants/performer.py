"""Performer attention: FAVOR+ (Choromanski et al., "Rethinking Attention with Performers", 2021).

The softmax kernel ``exp(q · k / sqrt(D))`` is estimated without bias by positive random
features: with ``x`` scaled by ``D^-1/4`` and ``w_1 .. w_m ~ N(0, I_D)``,

    phi(x) = exp(W x - |x|² / 2) / sqrt(m),     E[phi(q) · phi(k)] = exp(q · k / sqrt(D)).

The rows of ``W`` are drawn in blocks of ``D`` mutually orthogonal rows (QR of Gaussian
matrices), each row rescaled to the norm of a Gaussian vector (chi with ``D`` degrees of
freedom), which keeps every row's marginal Gaussian and lowers the variance. ``W`` lives in
the persistent buffer ``projection`` ``(m, D)``, so a checkpoint reproduces the features.

Attention is then the normalised kernel attention of :func:`.linear.kernel_attention`
(padded keys zeroed), ``O(n·m·D)``; causal attention is :func:`favor_causal`, the same
chunked prefix sums with a causal stabiliser (below).

Stabiliser: ``exp`` overflows for large ``W x``, so, as the paper's implementation, the
exponent loses its maximum: per row for queries, over all (non-padded) keys of a sequence
and head for keys. Both are constants of the ratio ``sum_j A_ij v_j / sum_j A_ij`` and
cancel, up to the ``eps`` of the normaliser (1e-20 here: the stabilised normaliser can be
far below 1). Causal attention cannot take the key maximum over the whole sequence (later
tokens would reach position ``i`` through ``eps`` and through underflow), so
:func:`favor_causal` uses the running maximum over keys ``j <= i`` instead, rescaling the
carried prefix state when the maximum grows (as an online softmax does): exactly causal.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...errors import InputError
from ..contract import Option
from ..registry import register_attention
from .base import PLAIN_TOKEN_OPTIONS, TokenAttention
from .linear import kernel_attention

__all__ = ["PerformerAttention", "orthogonal_gaussian_projection", "favor_features", "favor_key_exponent",
           "favor_causal"]


def orthogonal_gaussian_projection(num_features: int, dim: int, generator: torch.Generator | None = None) -> Tensor:
    """``(num_features, dim)`` float32: blocks of ``dim`` orthogonal rows (the last block
    truncated), each row scaled to a chi(``dim``)-distributed norm."""
    blocks = []
    for _ in range(math.ceil(num_features / dim)):
        g = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        qm, r = torch.linalg.qr(g)
        qm = qm * torch.sign(torch.diagonal(r)).masked_fill(torch.diagonal(r) == 0, 1.0)  # Haar-distributed
        blocks.append(qm.T)  # rows orthonormal
    w = torch.cat(blocks, dim=0)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return (w * norms[:, None]).to(torch.float32)


def favor_features(x: Tensor, projection: Tensor, *, is_query: bool,
                   key_padding_mask: Tensor | None = None) -> Tensor:
    """Positive random features of ``x`` ``(B, H, L, D)`` -> ``(B, H, L, m)``, float32 at least.

    Queries are stabilised per row, keys by their maximum over the sequence and features
    (padded keys excluded, and their features set to 0).
    """
    ct = torch.promote_types(x.dtype, torch.float32)
    d = x.shape[-1]
    m = projection.shape[0]
    x = x.to(ct) * d ** -0.25
    wx = x @ projection.to(ct).T  # (B, H, L, m)
    if key_padding_mask is not None and not is_query:
        wx = wx.masked_fill(key_padding_mask[:, None, :, None], -math.inf)  # exp -> 0 below, no 0 * inf
        stab = wx.detach().amax(dim=(-2, -1), keepdim=True)
        stab = torch.where(torch.isfinite(stab), stab, torch.zeros_like(stab))  # all padded: no -inf
    else:
        stab = wx.detach().amax(dim=-1 if is_query else (-2, -1), keepdim=True)
    # exp(W x - |x|² / 2 - stab) / sqrt(m), in place on the (B, H, L, m) tensor: the largest
    # of the computation, so two passes over it instead of four. (matmul's backward needs
    # its inputs, not wx, and exp_'s needs only its result.)
    shift = (x * x).sum(dim=-1, keepdim=True) / 2 + (stab + 0.5 * math.log(m))
    return wx.sub_(shift).exp_()


def favor_key_exponent(k: Tensor, projection: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
    """Unstabilised key exponent ``W x - |x|² / 2`` (``x = k · D^-1/4``), ``-inf`` at padded keys."""
    ct = torch.promote_types(k.dtype, torch.float32)
    x = k.to(ct) * k.shape[-1] ** -0.25
    expo = x @ projection.to(ct).T - (x * x).sum(dim=-1, keepdim=True) / 2
    if key_padding_mask is not None:
        expo = expo.masked_fill(key_padding_mask[:, None, :, None], -math.inf)
    return expo


_FLOOR = -1e4  # stabiliser of a prefix with no (unpadded) key yet: any finite constant works


def favor_causal(phi_q: Tensor, expo_k: Tensor, v: Tensor, eps: float = 1e-20, chunk: int = 64) -> Tensor:
    """Causal FAVOR+ with a causal key stabiliser: query ``i`` sees keys ``j <= i`` with
    features ``exp(expo_k_j - M_i) / sqrt(m)``, ``M_i = max_{j <= i} max_r expo_k_jr``.

    ``phi_q`` ``(B, H, L, m)`` (stabilised query features), ``expo_k`` ``(B, H, L, m)``
    from :func:`favor_key_exponent`, ``v`` ``(B, H, L, D)`` -> ``(B, H, L, D)`` in ``v``'s dtype.
    Chunks of ``chunk`` positions: explicit masked ``(C, C)`` kernel within a chunk; across
    chunks a carried state ``S = sum phi(k) vᵀ``, ``z = sum phi(k)`` at the stabiliser of the
    previous chunk's end, rescaled by ``exp(M_prev - M_i) <= 1``.
    """
    if chunk <= 0:
        raise InputError(f"chunk must be positive; got {chunk}")
    out_dtype = v.dtype
    ct = torch.promote_types(torch.promote_types(v.dtype, torch.float32), phi_q.dtype)
    phi_q, expo_k, v = phi_q.to(ct), expo_k.to(ct), v.to(ct)
    b, h, n, m = phi_q.shape
    d = v.shape[-1]
    mu = expo_k.detach().amax(dim=-1)  # (B, H, L), -inf at padded keys
    mu = torch.where(torch.isfinite(mu), mu, torch.full_like(mu, _FLOOR)).clamp_min(_FLOOR)
    run_max = mu.cummax(dim=-1).values  # M_i, causal
    psi = torch.exp(expo_k - mu.unsqueeze(-1)) / math.sqrt(m)  # per-key stabilised, 0 at padding
    s = phi_q.new_zeros(b, h, m, d)
    z = phi_q.new_zeros(b, h, m)
    m_prev = phi_q.new_full((b, h), _FLOOR)
    outs = []
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        c = stop - start
        qc, pc, vc = phi_q[:, :, start:stop], psi[:, :, start:stop], v[:, :, start:stop]
        mc, muc = run_max[:, :, start:stop], mu[:, :, start:stop]  # (B, H, C)
        back = torch.exp(m_prev.unsqueeze(-1) - mc).unsqueeze(-1)  # (B, H, C, 1), <= 1
        num = (qc @ s) * back
        den = (qc @ z.unsqueeze(-1)) * back
        future = torch.ones(c, c, dtype=torch.bool, device=v.device).triu(1)
        w = torch.exp((muc.unsqueeze(-2) - mc.unsqueeze(-1)).masked_fill(future, -math.inf))  # (B, H, C, C)
        a = (qc @ pc.transpose(-2, -1)) * w
        num = num + a @ vc
        den = den + a.sum(dim=-1, keepdim=True)
        outs.append(num / (den + eps))
        # carry the state to the stabiliser at the chunk's end
        m_end = mc[:, :, -1]
        scale = torch.exp(muc - m_end.unsqueeze(-1)).unsqueeze(-1)  # (B, H, C, 1), <= 1
        pk = pc * scale
        decay = torch.exp(m_prev - m_end)
        s = s * decay[..., None, None] + pk.transpose(-2, -1) @ vc
        z = z * decay[..., None] + pk.sum(dim=-2)
        m_prev = m_end
    return torch.cat(outs, dim=2).to(out_dtype)


PERFORMER_OPTIONS = PLAIN_TOKEN_OPTIONS.extend(
    Option("num_features", int, None, "random features (None: head_dim * ln(head_dim))", low=1),
    Option("redraw", bool, False, "draw new features at each training step"),
    Option("seed", int, 0, "the features' seed"))


@register_attention("performer", options=PERFORMER_OPTIONS, takes_positions=True, causal=True, padding=True,
                    lora_roles=("attention",),
                    summary="Performer's FAVOR+: random features approximate the softmax, linear in time")
class PerformerAttention(TokenAttention):
    """FAVOR+ attention with positive orthogonal random features (Choromanski et al., 2021).

    Args:
        embed_dim: as exact self-attention.
        num_heads: as exact self-attention.
        bias: as exact self-attention.
        dropout: accepted so that a model can pass its ``attn_dropout`` unchanged, but
            **unused**: FAVOR+ never forms attention weights to drop.
        num_features: random features ``m`` per head; default
            ``round(head_dim · ln(head_dim))``, at least ``head_dim``.
        redraw: draw new features at every forward call in training mode (eval mode
            always keeps the current ones).
        seed: seed of the draws. The ``k``-th draw of a module depends only on
            ``(seed, k)``, so equal seeds give equal features; the heads share them.

    The causal chunk length is the attribute ``chunk_size`` (default 64) and the normaliser's
    epsilon the attribute ``eps`` (default 1e-20).
    """

    kind = "performer"
    chunk_size = 64
    eps = 1e-20

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 num_features: int | None = None, redraw: bool = False, seed: int = 0) -> None:
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias)
        d = self.head_dim
        if num_features is None:
            num_features = max(d, int(round(d * math.log(d))))
        if not isinstance(num_features, int) or num_features <= 0:
            raise InputError(f"{self.kind}: num_features must be a positive integer; got {num_features!r}")
        self.num_features, self.redraw, self.seed = num_features, bool(redraw), int(seed)
        self._draws = 0
        self.register_buffer("projection", self._draw(), persistent=True)

    def _draw(self) -> Tensor:
        gen = torch.Generator().manual_seed(hash((self.seed, self._draws)) & (2**63 - 1))
        return orthogonal_gaussian_projection(self.num_features, self.head_dim, gen)

    @torch.no_grad()
    def redraw_features(self) -> None:
        """Replace ``projection`` by the next draw (in place: device and dtype kept)."""
        self._draws += 1
        self.projection.copy_(self._draw())

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        if self.redraw and self.training:
            self.redraw_features()
        if q.shape[-2] == 0:  # no key to stabilise the features by, and nothing to attend
            return v.clone()  # the empty (B, H, 0, D) result, on the autograd graph
        phi_q = favor_features(q, self.projection, is_query=True)
        if is_causal:
            return favor_causal(phi_q, favor_key_exponent(k, self.projection, key_padding_mask), v,
                                self.eps, self.chunk_size)
        phi_k = favor_features(k, self.projection, is_query=False, key_padding_mask=key_padding_mask)
        return kernel_attention(phi_q, phi_k, v, key_padding_mask, False, self.eps, self.chunk_size)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", num_features={self.num_features}, redraw={self.redraw}, seed={self.seed}"
