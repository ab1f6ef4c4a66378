"""BoTNet's multi-head self-attention over a feature map, with 2-D relative positions.

Srinivas et al., "Bottleneck Transformers for Visual Recognition", 2021, Fig. 4. For
query pixel ``i = (y_i, x_i)`` and key pixel ``j = (y_j, x_j)`` of one head:

    logit_ij = (q_i · k_j + q_i · (r^h[y_j - y_i] + r^w[x_j - x_i])) / sqrt(D)

``r^h`` is a learned ``(2H - 1, D)`` table over height offsets and ``r^w`` a ``(2W - 1, D)``
table over width offsets, shared by the heads. Splitting the offset into a height and a
width part keeps the tables at ``O(H + W)`` entries instead of ``O(H·W)``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import InputError
from ..functional import check_heads, scaled_dot_product_attention
from ..contract import Option, Options
from ..registry import register_attention
from .grid import grid_size

__all__ = ["RelPosSelfAttention2d"]


def _offsets(n: int) -> Tensor:
    """``(n, n)`` table index of offset ``b - a`` at ``[a, b]``: ``b - a + n - 1``, in ``[0, 2n-2]``."""
    pos = torch.arange(n)
    return pos[None, :] - pos[:, None] + n - 1


def _resized(table: Tensor, length: int) -> Tensor:
    """A ``(2n - 1, D)`` offset table resized to ``(length, D)``, offsets spread evenly
    from the most negative to the most positive (linear interpolation)."""
    if table.shape[0] == 1 or length == 1:
        return table[table.shape[0] // 2 :][:1].expand(length, -1)
    return F.interpolate(table.t()[None], size=length, mode="linear", align_corners=True)[0].t()


RELPOS2D_OPTIONS = Options(
    Option("size", tuple, None, "the feature map's (H, W), which sizes the relative positions", required=True),
    Option("dropout", float, 0.0, "on the attention weights, in training mode", low=0, high=1, high_open=True),
    Option("bias", bool, False, "biases of the 1 x 1 projections"))


@register_attention("relpos2d", family="grid", options=RELPOS2D_OPTIONS, forms_weights=True,
                    summary="BoTNet's multi-head self-attention over a feature map with 2-D relative positions")
class RelPosSelfAttention2d(nn.Module):
    r"""Multi-head self-attention over an ``H x W`` map with 2-D relative position logits.

    Args:
        embed_dim: channels ``C`` of the input and output.
        num_heads: ``heads``; must divide ``embed_dim``. Head width ``D = C / heads``.
        size: ``(H, W)`` (or one int for a square map): the map the relative tables are
            made for, spanning exactly its offsets. Another map size works too: the tables
            are resized to its offsets by linear interpolation (as timm and BEiT resize
            relative position tables), so a model trained at one resolution evaluates
            at another.
        dropout: dropout on the attention weights, in training mode.
        bias: biases on the q/k/v projections (the paper has none).

    Shapes:

    ==============  =================================================================
    ``x``           ``(B, C, H, W)``
    output          ``(B, C, H, W)``: the heads' outputs concatenated channel-wise
                    (``channel = head * D + d``); there is no output projection,
                    as in the paper, where the block's 1x1 conv follows
    weights         ``(B, heads, H*W, H*W)`` with ``need_weights=True``, else ``None``;
                    pixels in row-major order (``i = y * W + x``), each row sums to 1
    ==============  =================================================================

    ``forward(x)`` returns ``(output, None)``, as every attention kind does;
    ``forward(x, need_weights=True)`` returns ``(output, weights)`` and computes the
    softmax explicitly, otherwise torch's fused
    ``scaled_dot_product_attention`` runs with the position logits as an additive mask
    (except inside :func:`~attnlab.attention.capture_attention`, which records the weights).
    """

    # A recorder of the weights, set on an instance by capture_attention only.
    _attn_capture: Callable[[Tensor], None] | None = None

    def __init__(
        self, embed_dim: int, num_heads: int, *, size: int | tuple[int, int], dropout: float = 0.0, bias: bool = False
    ) -> None:
        super().__init__()
        check_heads(embed_dim, num_heads, dropout)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.size = grid_size(size)
        self.dropout = dropout
        h, w = self.size
        self.qkv = nn.Conv2d(embed_dim, 3 * embed_dim, 1, bias=bias)
        self.rel_height = nn.Parameter(torch.empty(2 * h - 1, self.head_dim))
        self.rel_width = nn.Parameter(torch.empty(2 * w - 1, self.head_dim))
        # Relative -> absolute: [y_i, y_j] -> row of rel_height for offset y_j - y_i.
        self.register_buffer("height_index", _offsets(h), persistent=False)
        self.register_buffer("width_index", _offsets(w), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # std embed_dim^-1/2 keeps q, k, v at the input's scale; std D^-1/2 makes q·r about as
        # large as q·k at the start, so neither logit term dominates.
        nn.init.normal_(self.qkv.weight, std=self.embed_dim**-0.5)
        if self.qkv.bias is not None:
            nn.init.zeros_(self.qkv.bias)
        nn.init.normal_(self.rel_height, std=self.head_dim**-0.5)
        nn.init.normal_(self.rel_width, std=self.head_dim**-0.5)

    def tables(self, size: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """``(r^h, r^w)`` gathered for a map of ``size``: ``(H, H, D)`` and ``(W, W, D)``,
        ``[a, b]`` holding the row of offset ``b - a``; from the learned tables, resized
        when ``size`` is not the one they were made for."""
        h, w = size
        if (h, w) == self.size:
            return self.rel_height[self.height_index], self.rel_width[self.width_index]
        device = self.rel_height.device
        return (_resized(self.rel_height, 2 * h - 1)[_offsets(h).to(device)],
                _resized(self.rel_width, 2 * w - 1)[_offsets(w).to(device)])

    def position_logits(self, q: Tensor, size: tuple[int, int] | None = None) -> Tensor:
        """Content-position logits ``q_i · (r^h[y_j - y_i] + r^w[x_j - x_i])``.

        ``q``: ``(B, heads, H*W, D)`` -> ``(B, heads, H*W, H*W)``, for a map of ``size``
        (default: the one the tables were made for).
        """
        b, n, _, d = q.shape
        h, w = size or self.size
        q = q.reshape(b, n, h, w, d)
        rh, rw = self.tables((h, w))  # [y_i, y_j] -> r^h[y_j - y_i], [x_i, x_j] -> r^w[x_j - x_i]
        logits_h = torch.einsum("bnyxd,yjd->bnyxj", q, rh)  # (B, n, H, W, H): over y_j
        logits_w = torch.einsum("bnyxd,xjd->bnyxj", q, rw)  # (B, n, H, W, W): over x_j
        # Key j = (y_j, x_j) gets the sum of its row term and its column term.
        return (logits_h[..., :, None] + logits_w[..., None, :]).reshape(b, n, h * w, h * w)

    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.embed_dim or x.shape[2] < 1 or x.shape[3] < 1:
            raise InputError(
                f"x must have shape (B, {self.embed_dim}, H, W) with H, W >= 1 (channels embed_dim={self.embed_dim}); "
                f"got ({', '.join(map(str, x.shape))})"
            )

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``x`` ``(B, C, H, W)`` -> ``(output (B, C, H, W), weights or None)`` (see the
        class docstring for shapes)."""
        self._check_input(x)
        b, c, h, w = x.shape
        n, d = self.num_heads, self.head_dim
        # (B, 3C, H, W) -> three (B, heads, H*W, D)
        q, k, v = self.qkv(x).reshape(b, 3, n, d, h * w).transpose(-1, -2).unbind(1)
        q = q * (1.0 / math.sqrt(d))  # scaled once, for both logit terms
        pos = self.position_logits(q, (h, w))
        capture = self._attn_capture  # set only inside capture_attention
        out, weights = scaled_dot_product_attention(
            q, k, v, attn_mask=pos, dropout_p=self.dropout if self.training else 0.0, scale=1.0,
            need_weights=need_weights or capture is not None,
        )
        if capture is not None:
            capture(weights)  # (B, heads, H*W, H*W)
        out = out.transpose(-1, -2).reshape(b, c, h, w)  # (B, heads, D, HW) -> channel = head * D + d
        return out, (weights if need_weights else None)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, size={self.size}, dropout={self.dropout}"
