"""Axial attention over a feature map: attention along each row, then along each column.

Ho et al., "Axial Attention in Multidimensional Transformers", 2019. One layer is two
multi-head self-attentions in sequence, each with its own q/k/v and output projections:

    y   = out_row(attend over W within each row of qkv_row(x))
    out = out_col(attend over H within each column of qkv_col(y))

There is no residual between the two steps (the module is pure attention; the block
around it adds residuals). After both steps every pixel has received information from
every other one, at a cost of ``O(H·W·(H + W)·d)`` instead of full attention's
``O((H·W)²·d)``.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from ..functional import check_heads, scaled_dot_product_attention
from ..contract import Option, Options
from ..registry import register_attention
from .grid import check_map, grid_size

__all__ = ["AxialAttention2d", "AxialWeights"]


class AxialWeights(NamedTuple):
    """The weights of one axial attention call: ``rows`` ``(B, heads, H, W, W)`` (the pass
    along each row) and ``cols`` ``(B, heads, W, H, H)`` (the pass along each column)."""

    rows: Tensor
    cols: Tensor


AXIAL_OPTIONS = Options(
    Option("size", tuple, None, "the feature map's (H, W), checked against each input when given"),
    Option("dropout", float, 0.0, "on the attention weights, in training mode", low=0, high=1, high_open=True),
    Option("bias", bool, True, "biases of the 1 x 1 projections"))


@register_attention("axial", family="grid", options=AXIAL_OPTIONS, summary="axial attention over a feature map: along rows, then columns")
class AxialAttention2d(nn.Module):
    r"""Multi-head axial self-attention over an ``H x W`` map: rows first, then columns.

    Args:
        embed_dim: channels ``C`` of the input and output.
        num_heads: ``heads``; must divide ``embed_dim``. Head width ``D = C / heads``.
        size: ``(H, W)`` (or one int for a square map), or ``None``. The module has no
            size-dependent parameters, so any map size works; when ``size`` is given,
            inputs of another size are rejected.
        dropout: dropout on the attention weights of both steps, in training mode.
        bias: biases on the q/k/v and output projections.

    Each step has its own 1x1 q/k/v projection (``qkv_row``, ``qkv_col``) and its own
    1x1 output projection (``out_row``, ``out_col``); none is shared. Logits are
    scaled by ``1 / sqrt(D)``.

    Shapes:

    ==============  =================================================================
    ``x``           ``(B, C, H, W)``
    output          ``(B, C, H, W)``
    weights         with ``need_weights=True`` an :class:`AxialWeights` ``(rows,
                    cols)``, else ``None``; ``rows`` ``(B, heads, H, W, W)`` is
                    ``[b, head, y, x_query, x_key]``, ``cols``
                    ``(B, heads, W, H, H)`` is ``[b, head, x, y_query, y_key]``;
                    each last-axis row sums to 1
    ==============  =================================================================

    ``forward(x)`` returns ``(output, None)``, as every attention kind does;
    ``forward(x, need_weights=True)`` returns ``(output, AxialWeights(rows, cols))``: two
    passes with projections between them form no single ``HW x HW`` matrix.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        size: int | tuple[int, int] | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_heads(embed_dim, num_heads, dropout)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.size = grid_size(size, optional=True)
        self.dropout = dropout
        self.qkv_row = nn.Conv2d(embed_dim, 3 * embed_dim, 1, bias=bias)
        self.out_row = nn.Conv2d(embed_dim, embed_dim, 1, bias=bias)
        self.qkv_col = nn.Conv2d(embed_dim, 3 * embed_dim, 1, bias=bias)
        self.out_col = nn.Conv2d(embed_dim, embed_dim, 1, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # std embed_dim^-1/2 keeps every projection's output at the input's scale.
        for conv in (self.qkv_row, self.out_row, self.qkv_col, self.out_col):
            nn.init.normal_(conv.weight, std=self.embed_dim**-0.5)
            if conv.bias is not None:
                nn.init.zeros_(conv.bias)

    def _check_input(self, x: Tensor) -> None:
        check_map(x, self.embed_dim, self.size)

    def _attend_rows(
        self, x: Tensor, qkv: nn.Conv2d, out_proj: nn.Conv2d, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Attention along the last axis of ``x`` ``(B, C, A, L)``: each of the ``A`` lines
        of length ``L`` is a separate sequence. Returns ``(B, C, A, L)`` and weights
        ``(B, heads, A, L, L)`` or ``None``."""
        b, c, a, l = x.shape
        n, d = self.num_heads, self.head_dim
        # (B, 3C, A, L) -> (B, 3, n, D, A, L) -> three (B, n*A, L, D): lines batched with heads
        q, k, v = qkv(x).reshape(b, 3, n, d, a, l).permute(1, 0, 2, 4, 5, 3).reshape(3, b, n * a, l, d).unbind(0)
        out, weights = scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights
        )
        # (B, n*A, L, D) -> (B, n, D, A, L) -> channel = head * D + d
        out = out.reshape(b, n, a, l, d).permute(0, 1, 4, 2, 3).reshape(b, c, a, l)
        if weights is not None:
            weights = weights.reshape(b, n, a, l, l)
        return out_proj(out), weights

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, AxialWeights | None]:
        """``x`` ``(B, C, H, W)`` -> ``(output (B, C, H, W), AxialWeights or None)`` (see
        the class docstring for shapes)."""
        self._check_input(x)
        b, _, h, w = x.shape
        if h == 0 or w == 0:  # an empty map (which the 1x1 convs refuse): nothing to attend
            out = x.clone()  # the empty (B, C, H, W) result, on the autograd graph
            if need_weights:
                return out, AxialWeights(x.new_zeros(b, self.num_heads, h, w, w), x.new_zeros(b, self.num_heads, w, h, h))
            return out, None
        y, row_weights = self._attend_rows(x, self.qkv_row, self.out_row, need_weights)  # over W
        # Columns: swap H and W so that each column is a line, then swap back.
        out, col_weights = self._attend_rows(y.transpose(2, 3), self.qkv_col, self.out_col, need_weights)
        out = out.transpose(2, 3).contiguous()
        return out, (AxialWeights(row_weights, col_weights) if need_weights else None)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, size={self.size}, dropout={self.dropout}"
