"""Stand-alone self-attention: each pixel attends to the ``k x k`` window around it.

Ramachandran et al., "Stand-Alone Self-Attention in Vision Models", 2019, Eq. 2-3. For
query pixel ``(i, j)`` and key pixel ``(a, b)`` in its window ``N_k(i, j)``, one head
computes

    y_ij = sum_{(a, b) in N_k(i, j)} softmax_ab(q_ij · (k_ab + r_{a-i, b-j}) / sqrt(D)) v_ab

where ``r_{a-i, b-j} = concat(r^row[a-i], r^col[b-j])``: the first ``D // 2`` channels of
the head carry a learned embedding of the row offset, the other ``D - D // 2`` one of
the column offset (``k`` entries each, offsets ``-k//2 .. k//2``). Windows are
zero-padded at the borders, and the padded positions are masked out, not attended.

Keys and values are gathered with ``F.unfold`` into ``(B, heads, H*W, k*k, D)``, so
memory and time are ``O(H·W·k²·d)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...errors import InputError
from ..functional import check_heads, scaled_dot_product_attention
from ..contract import Option, Options
from ..registry import register_attention
from .grid import check_map, grid_size

__all__ = ["StandAloneSelfAttention2d"]


STANDALONE2D_OPTIONS = Options(
    Option("size", tuple, None, "the feature map's (H, W), checked against each input when given"),
    Option("kernel_size", int, 7, "the side of each query's window, odd", low=1),
    Option("dropout", float, 0.0, "on the attention weights, in training mode", low=0, high=1, high_open=True),
    Option("bias", bool, True, "biases of the 1 x 1 projections"))


@register_attention("standalone2d", family="grid", options=STANDALONE2D_OPTIONS,
                    summary="stand-alone self-attention over k x k windows of a feature map, with relative positions")
class StandAloneSelfAttention2d(nn.Module):
    r"""Multi-head local self-attention over ``k x k`` windows, with relative positions.

    Args:
        embed_dim: channels ``C`` of the input and output.
        num_heads: ``heads``; must divide ``embed_dim``. Head width ``D = C / heads``.
        size: ``(H, W)`` (or one int for a square map), or ``None``. No parameter
            depends on the map size, so any size works; when ``size`` is given, inputs
            of another size are rejected.
        kernel_size: ``k``, the window side; an odd positive integer. The window is
            centred on the query pixel; ``k >= 2 * max(H, W) - 1`` covers the whole map.
        dropout: dropout on the attention weights, in training mode.
        bias: biases on the q/k/v projection (the paper has none).

    Parameters: ``qkv`` (a 1x1 conv to ``3 * embed_dim``); ``rel_rows`` ``(heads, k, D // 2)``
    and ``rel_cols`` ``(heads, k, D - D // 2)``, indexed by offset ``+ k // 2``. Each
    head has its own embeddings (the paper's ``r`` has ``d_out`` channels, split into
    heads like the keys).

    Shapes:

    ==============  =================================================================
    ``x``           ``(B, C, H, W)``
    output          ``(B, C, H, W)``: the heads' outputs concatenated channel-wise
                    (``channel = head * D + d``); there is no output projection,
                    as in the paper, where the layer replaces a convolution
    weights         ``(B, heads, H*W, k*k)`` with ``need_weights=True``, else ``None``: query
                    pixels in row-major order (``i = y * W + x``), window positions
                    in row-major order (``(dy + k//2) * k + (dx + k//2)``); positions
                    outside the map have weight 0, each row sums to 1
    ==============  =================================================================

    ``forward(x)`` returns ``(output, None)``, as every attention kind does;
    ``forward(x, need_weights=True)`` returns ``(output, weights)``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        size: int | tuple[int, int] | None = None,
        kernel_size: int = 7,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_heads(embed_dim, num_heads, dropout)
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size <= 0 or kernel_size % 2 == 0:
            raise InputError(f"kernel_size must be an odd positive integer; got {kernel_size!r}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.size = grid_size(size, optional=True)
        self.kernel_size = kernel_size
        self.dropout = dropout
        d_rows = self.head_dim // 2
        self.qkv = nn.Conv2d(embed_dim, 3 * embed_dim, 1, bias=bias)
        self.rel_rows = nn.Parameter(torch.empty(num_heads, kernel_size, d_rows))
        self.rel_cols = nn.Parameter(torch.empty(num_heads, kernel_size, self.head_dim - d_rows))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # As relpos2d: q, k, v at the input's scale, and q·r about as large as q·k.
        nn.init.normal_(self.qkv.weight, std=self.embed_dim**-0.5)
        if self.qkv.bias is not None:
            nn.init.zeros_(self.qkv.bias)
        nn.init.normal_(self.rel_rows, std=self.head_dim**-0.5)
        nn.init.normal_(self.rel_cols, std=self.head_dim**-0.5)

    def _check_input(self, x: Tensor) -> None:
        check_map(x, self.embed_dim, self.size)

    def _windows(self, t: Tensor) -> Tensor:
        """``(B, C, H, W)`` -> ``(B, heads, H*W, k*k, D)``: each pixel's zero-padded window."""
        b, _, h, w = t.shape
        k = self.kernel_size
        cols = F.unfold(t, kernel_size=k, padding=k // 2)  # (B, C*k*k, H*W), channel-major
        return cols.reshape(b, self.num_heads, self.head_dim, k * k, h * w).permute(0, 1, 4, 3, 2)

    def position_logits(self, q: Tensor) -> Tensor:
        """``q_ij · r_{a-i, b-j}`` for every window position.

        ``q``: ``(B, heads, H*W, D)`` -> ``(B, heads, H*W, k*k)``.
        """
        d_rows = self.rel_rows.shape[-1]
        logits_r = torch.einsum("bnld,nkd->bnlk", q[..., :d_rows], self.rel_rows)  # over row offset
        logits_c = torch.einsum("bnld,nkd->bnlk", q[..., d_rows:], self.rel_cols)  # over column offset
        return (logits_r[..., :, None] + logits_c[..., None, :]).flatten(-2)  # window row-major

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``x`` ``(B, C, H, W)`` -> ``(output (B, C, H, W), weights or None)`` (see the
        class docstring for shapes)."""
        self._check_input(x)
        b, c, h, w = x.shape
        n, d, k = self.num_heads, self.head_dim, self.kernel_size
        if h == 0 or w == 0:  # an empty map (which the 1x1 conv refuses): nothing to attend
            out = x.clone()  # the empty (B, C, H, W) result, on the autograd graph
            return out, (x.new_zeros(b, n, 0, k * k) if need_weights else None)
        q, kk, v = self.qkv(x).chunk(3, dim=1)  # three (B, C, H, W)
        q = q.reshape(b, n, d, h * w).transpose(-1, -2) * (1.0 / math.sqrt(d))  # (B, n, HW, D), scaled once
        keys, values = self._windows(kk), self._windows(v)  # (B, n, HW, k*k, D)
        # Window positions outside the map: True = blocked. (1, 1, HW, k*k)
        inside = F.unfold(x.new_ones(1, 1, h, w), kernel_size=k, padding=k // 2)  # (1, k*k, HW)
        mask = self.position_logits(q).masked_fill((inside == 0).transpose(1, 2)[:, None], -math.inf)
        # One query per batch entry: (B, n*HW, 1, D) against its own (B, n*HW, k*k, D).
        out, weights = scaled_dot_product_attention(
            q.reshape(b, n * h * w, 1, d),
            keys.reshape(b, n * h * w, k * k, d),
            values.reshape(b, n * h * w, k * k, d),
            attn_mask=mask.reshape(b, n * h * w, 1, k * k),
            dropout_p=self.dropout if self.training else 0.0,
            scale=1.0,
            need_weights=need_weights,
        )
        out = out.reshape(b, n, h * w, d).transpose(-1, -2).reshape(b, c, h, w)  # channel = head * D + d
        return out, (weights.reshape(b, n, h * w, k * k) if need_weights else None)  # type: ignore[union-attr]

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, size={self.size}, "
            f"kernel_size={self.kernel_size}, dropout={self.dropout}"
        )
