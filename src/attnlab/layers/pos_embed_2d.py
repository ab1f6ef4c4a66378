"""Position information for 2-D token grids: fixed sin-cos tables, resizing of learned
grids, and a learned relative position bias."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["sincos_2d", "resample_pos_embed", "RelativePositionBias2d", "LearnedPosEmbed2d"]


def sincos_2d(grid: tuple[int, int], dim: int, temperature: float = 10000.0) -> Tensor:
    """``(H*W, dim)`` fixed 2-D sin-cos embedding: half of the features encode the row,
    half the column (as in MoCo v3 / "Simple ViT"). ``dim`` must be divisible by 4."""
    if dim % 4 != 0:
        raise InputError(f"embed_dim must be divisible by 4 for 2-D sin-cos positions; got {dim}")
    h, w = grid
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    y = y.flatten()[:, None] * omega[None, :]
    x = x.flatten()[:, None] * omega[None, :]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)


def resample_pos_embed(
    pos_embed: Tensor, new_grid: tuple[int, int], old_grid: tuple[int, int] | None = None, num_prefix_tokens: int = 1,
    mode: str = "bicubic",
) -> Tensor:
    """Resize a learned ``(1, prefix + H*W, E)`` position grid to ``new_grid``; the prefix
    (class token) embeddings are kept as they are. ``old_grid`` defaults to a square."""
    n = pos_embed.shape[1] - num_prefix_tokens
    if old_grid is None:
        side = int(round(n**0.5))
        if side * side != n:
            raise InputError(f"cannot infer a square grid from {n} position embeddings; pass old_grid")
        old_grid = (side, side)
    if old_grid[0] * old_grid[1] != n:
        raise InputError(f"old_grid {old_grid} does not match {n} position embeddings")
    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    e = grid.shape[-1]
    grid = grid.reshape(1, old_grid[0], old_grid[1], e).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=tuple(new_grid), mode=mode, align_corners=False, antialias=True)
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, e).to(pos_embed.dtype)
    return torch.cat([prefix, grid], dim=1)


class LearnedPosEmbed2d(nn.Module):
    """Factorized learned 2-D positions (the ViT paper's "2-D" variant, appendix D.4): a
    learned row embedding and a learned column embedding of ``E / 2`` each, concatenated,
    so token ``(i, j)`` gets ``[row_i, col_j]``. ``grid`` -> ``(1, H*W, E)`` in row-major
    order; another grid than the one built for interpolates each table linearly."""

    def __init__(self, grid: tuple[int, int], dim: int) -> None:
        super().__init__()
        if dim % 2:
            raise InputError(f"learned 2-D positions split the width in two halves; embed_dim {dim} is odd")
        self.grid = tuple(grid)
        self.rows = nn.Parameter(torch.zeros(grid[0], dim // 2))
        self.cols = nn.Parameter(torch.zeros(grid[1], dim // 2))
        nn.init.trunc_normal_(self.rows, std=0.02)
        nn.init.trunc_normal_(self.cols, std=0.02)

    @staticmethod
    def _resize(table: Tensor, n: int) -> Tensor:
        if table.shape[0] == n:
            return table
        return F.interpolate(table.t()[None], size=n, mode="linear", align_corners=False)[0].t()

    def forward(self, grid: tuple[int, int]) -> Tensor:
        h, w = grid
        rows, cols = self._resize(self.rows, h), self._resize(self.cols, w)
        pos = torch.cat([rows[:, None].expand(h, w, -1), cols[None].expand(h, w, -1)], dim=-1)
        return pos.reshape(1, h * w, -1)


class RelativePositionBias2d(nn.Module):
    """A learned bias per head for each 2-D offset between tokens (as in BEiT), returned
    as an additive attention mask ``(1, heads, N, N)``.

    With a class token, three more learned entries cover class->patch, patch->class and
    class->class. The table has ``(2H-1)(2W-1) (+3)`` rows.

    ``init="normal"``: small random entries (BEiT's); ``"local"``: head ``i`` starts at
    ``-distance / 2**i``, an ALiBi-like penalty on the Euclidean offset, so that the first
    head attends to its neighbours, like a convolution, and the last almost everywhere
    (the locality prior of ConViT, d'Ascoli et al., 2021, as a learned bias the model can undo).
    """

    def __init__(self, grid: tuple[int, int], num_heads: int, class_token: bool = True, init: str = "normal") -> None:
        super().__init__()
        if init not in ("normal", "local"):
            raise InputError(f"init must be 'normal' or 'local'; got {init!r}")
        self.grid, self.num_heads, self.class_token = tuple(grid), num_heads, class_token
        h, w = grid
        n_rel = (2 * h - 1) * (2 * w - 1)
        self.table = nn.Parameter(torch.zeros(n_rel + (3 if class_token else 0), num_heads))
        nn.init.trunc_normal_(self.table, std=0.02)
        if init == "local":
            dy, dx = torch.meshgrid(torch.arange(1 - h, h), torch.arange(1 - w, w), indexing="ij")
            slopes = 2.0 ** -torch.arange(num_heads, dtype=torch.float32)
            with torch.no_grad():
                self.table[:n_rel] = -torch.hypot(dy.float(), dx.float()).flatten()[:, None] * slopes
        coords = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")).flatten(1)  # (2, N)
        rel = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
        index = (rel[0] + h - 1) * (2 * w - 1) + (rel[1] + w - 1)
        if class_token:
            n = h * w
            full = torch.empty(n + 1, n + 1, dtype=torch.long)
            full[1:, 1:] = index
            full[0, 1:] = n_rel  # class -> patch
            full[1:, 0] = n_rel + 1  # patch -> class
            full[0, 0] = n_rel + 2
            index = full
        self.register_buffer("index", index, persistent=False)

    def forward(self) -> Tensor:
        n = self.index.shape[0]
        return self.table[self.index.view(-1)].view(n, n, self.num_heads).permute(2, 0, 1).unsqueeze(0)
