"""Pictures of attention: token heatmaps, attention rollout, maps over an image, alignments.

Each ``*_figure`` / ``token_heatmaps`` function takes tensors (any device, any float
dtype) and labels, writes one PNG and returns its path. Files are written atomically
(:func:`attnlab.io.atomic_write`: a temporary name in the same folder, then
``os.replace``), so a reader never sees half a picture. matplotlib is used through its
Agg canvas directly, without pyplot: no global backend is switched and nothing is
shown on screen.

Colours: every panel is scaled from 0 to its own maximum, and its colour bar gives the
attention values, so heads with flat and with peaked attention are both readable.
"""

from __future__ import annotations

import math
import unicodedata
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import InputError
from ..io import atomic_write

__all__ = [
    "attention_rollout",
    "token_heatmaps",
    "image_attention_figure",
    "pixel_query_figure",
    "alignment_figure",
    "save_figure",
]

DPI = 100
HEAT_CMAP = "viridis"  # token matrices
OVERLAY_CMAP = "inferno"  # maps blended over an image
MARK = "#00e5ff"  # query pixel marker: cyan stands out on inferno and on photos


# ----------------------------------------------------------------------------- figures
def _figure(width: float, height: float, *, layout: str | None = "constrained") -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def _image_grid(rows: int, cols: int, width: float, height: float, title: bool) -> tuple[Any, Any]:
    """A figure of ``rows x cols`` image panels, each with a colour bar at its right, placed
    by fixed margins instead of the constrained layout: panels without tick labels need no
    measuring, and the layout engine took most of the time of a figure of many panels, paid in
    every run's report."""
    fig = _figure(width, height, layout=None)
    grid = dict(left=0.08 / width, right=1 - 0.6 / width, bottom=0.08 / height,
                top=1 - (0.5 if title else 0.3) / height, wspace=0.4, hspace=0.25)
    return fig, fig.subplots(rows, cols, squeeze=False, gridspec_kw=grid)


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` atomically (folders created); returns the path."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise InputError(f"path must end in .png; got {str(path)!r}")
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=DPI)
    return path


def _grid(n: int, max_cols: int) -> tuple[int, int]:
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


def _numpy(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _label_size(n: int, inches: float) -> float:
    """Font size (pt) that fits ``n`` labels along ``inches``, within 4..9 pt."""
    return float(min(9.0, max(4.0, 0.8 * 72.0 * inches / max(n, 1))))


# ----------------------------------------------------------------------------- rollout
def attention_rollout(maps: Sequence[Tensor]) -> Tensor:
    """Attention rollout (Abnar & Zuidema, 2020): how much each output token draws on
    each input token through all layers.

    Per layer the heads are averaged, the identity is added (the residual connection
    carries each token's own value past the attention) and the rows renormalized to
    sum to 1; the layers are then multiplied in order: ``R = Â_L ··· Â_2 Â_1``.

    Args:
        maps: one tensor per layer, first layer first, each ``(..., H, N, N)`` (rows:
            queries, columns: keys; leading batch dimensions are kept).

    Returns:
        ``(..., N, N)`` float32: row ``i`` is the share of each input token in output
        token ``i``; rows sum to 1.
    """
    if len(maps) == 0:
        raise InputError("maps must hold one attention tensor per layer; got none")
    result: Tensor | None = None
    for i, w in enumerate(maps):
        if w.dim() < 3 or w.shape[-1] != w.shape[-2]:
            raise InputError(f"maps[{i}] must have shape (..., H, N, N); got {tuple(w.shape)}")
        if result is not None and w.shape[-1] != result.shape[-1]:
            raise InputError(f"maps[{i}] has {w.shape[-1]} tokens but maps[0] has {result.shape[-1]}")
        a = w.detach().float().mean(dim=-3)
        a = a + torch.eye(a.shape[-1], device=a.device)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    return result  # type: ignore[return-value]


# ----------------------------------------------------------------------------- tokens
def visible(label: str) -> str:
    """``label`` with its control characters written as escapes (a newline as ``\\n``), which
    a font has no glyph for: a character model's tokens are often ``"\\n"`` or ``"\\t"``."""
    return "".join(c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) == "Cc" else c
                   for c in str(label))


def _heatmap(fig: Any, ax: Any, w: np.ndarray, xlabels: Sequence[str], ylabels: Sequence[str], fonts: tuple[float, float],
             title: str, *, xlabel: str = "key", ylabel: str = "query", x_ticks: bool = True,
             y_ticks: bool = True) -> None:
    """One panel; ``x_ticks``/``y_ticks`` False: no token labels on that axis (a panel inside a
    grid, whose row or column of panels shows them)."""
    im = ax.imshow(w, cmap=HEAT_CMAP, vmin=0.0, vmax=max(float(w.max()), 1e-12), interpolation="nearest",
                   aspect="auto")
    if x_ticks:
        ax.set_xticks(range(len(xlabels)), labels=[visible(s) for s in xlabels], rotation=90, fontsize=fonts[0])
        ax.set_xlabel(xlabel, fontsize=8)
    else:
        ax.set_xticks([])
    if y_ticks:
        ax.set_yticks(range(len(ylabels)), labels=[visible(s) for s in ylabels], fontsize=fonts[1])
        ax.set_ylabel(ylabel, fontsize=8)
    else:
        ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    bar = ax.inset_axes([1.03, 0.0, 0.04, 1.0])
    fig.colorbar(im, cax=bar).ax.tick_params(labelsize=7)


def _text_inches(labels: Sequence[str], size: float) -> float:
    """Width in inches of the widest of ``labels`` at ``size`` points, as Agg draws them."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    renderer, prop = RendererAgg(10, 10, DPI), FontProperties(size=size)
    widths = [renderer.get_text_width_height_descent(visible(s), prop, ismath=False)[0] for s in labels]
    return max(widths, default=0.0) / DPI


def _heatmap_grid(rows: int, cols: int, panel: tuple[float, float], xlabels: Sequence[str], ylabels: Sequence[str],
                  title: bool) -> tuple[Any, Any, tuple[float, float]]:
    """A figure of ``rows x cols`` heatmaps of ``panel`` (width, height) inches, with room for
    the tick labels measured beforehand (the longest label, rotated below and upright to the
    left) and a colour bar beside each: ``(fig, axes, (x font, y font))``. The constrained
    layout measured every tick label of every panel on every draw, most of the time of a
    sentence's heatmaps, paid in every text run's report."""
    fonts = (_label_size(len(xlabels), panel[0]), _label_size(len(ylabels), panel[1]))
    left = _text_inches(ylabels, fonts[1]) + 0.35  # the y tick labels, the axis label, a gap
    below = _text_inches(xlabels, fonts[0]) + 0.35
    right, above = 0.8, 0.3  # the colour bar and its labels; the panel title
    width, height = cols * (left + panel[0] + right), rows * (above + panel[1] + below) + (0.4 if title else 0.0)
    grid = dict(left=left / width, right=1 - right / width, bottom=below / height,
                top=1 - (above + (0.4 if title else 0.0)) / height,
                wspace=(left + right) / panel[0], hspace=(above + below) / panel[1])
    fig = _figure(width, height, layout=None)
    return fig, fig.subplots(rows, cols, squeeze=False, gridspec_kw=grid), fonts


def token_heatmaps(weights: Tensor, query_labels: Sequence[str], key_labels: Sequence[str], path: str | Path, *,
                   title: str = "", max_cols: int = 4) -> Path:
    """One layer's attention between tokens: a heatmap per head and the head average.

    Args:
        weights: ``(H, Lq, Lk)`` (one example; rows: queries).
        query_labels: ``Lq`` token strings for the rows.
        key_labels: ``Lk`` token strings for the columns.
        path: the PNG to write.
        title: figure title (the input, the prediction, the layer).
        max_cols: panels per row.
    """
    if weights.dim() != 3:
        raise InputError(f"weights must have shape (H, Lq, Lk) for one example; got {tuple(weights.shape)}")
    h, lq, lk = weights.shape
    if len(query_labels) != lq or len(key_labels) != lk:
        raise InputError(f"query_labels and key_labels must have {lq} and {lk} entries (the shape of weights); "
                         f"got {len(query_labels)} and {len(key_labels)}")
    w = _numpy(weights)
    panels = [(f"head {i}", w[i]) for i in range(h)] + [("mean of heads", w.mean(axis=0))]
    rows, cols = _grid(len(panels), max_cols)
    size = min(7.0, max(2.6, 0.14 * max(lq, lk) + 0.6))  # inches per panel: room for a row per token
    fig, axes, fonts = _heatmap_grid(rows, cols, (size, size), key_labels, query_labels, bool(title))
    axes = axes.ravel()
    # Token labels on the left column and on each column's lowest panel alone: every panel's own took most of a
    # report's attention pictures (matplotlib makes an object per tick); the panels of a grid share their tokens.
    for k, (ax, (name, m)) in enumerate(zip(axes, panels)):
        _heatmap(fig, ax, m, key_labels, query_labels, fonts, name, x_ticks=k + cols >= len(panels),
                 y_ticks=k % cols == 0)
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def alignment_figure(layers: Sequence[Tensor], source_labels: Sequence[str], target_labels: Sequence[str],
                     path: str | Path, *, layer_names: Sequence[str] | None = None, title: str = "") -> Path:
    """Cross-attention of a translation: one panel per decoder layer, heads averaged.

    Args:
        layers: per layer ``(H, Lt, Ls)`` (heads are averaged) or ``(Lt, Ls)``: row ``t``
            is the attention of the step that produced target token ``t``.
        source_labels: ``Ls`` source tokens (x axis); target_labels: ``Lt`` generated tokens (y axis).
        layer_names: a title per panel (default ``decoder layer i``).
    """
    if len(layers) == 0:
        raise InputError("layers must hold at least one cross-attention tensor; got none")
    names = list(layer_names) if layer_names is not None else [f"decoder layer {i}" for i in range(len(layers))]
    if len(names) != len(layers):
        raise InputError(f"layer_names must have one name per layer ({len(layers)}); got {len(names)}")
    mats = []
    for i, w in enumerate(layers):
        if w.dim() == 3:
            w = w.float().mean(dim=0)
        if w.dim() != 2 or tuple(w.shape) != (len(target_labels), len(source_labels)):
            raise InputError(f"layers[{i}] must have shape (H, Lt, Ls) or (Lt, Ls) with (Lt, Ls) = "
                             f"({len(target_labels)}, {len(source_labels)}); got {tuple(layers[i].shape)}")
        mats.append(_numpy(w))
    lt, ls = len(target_labels), len(source_labels)
    width, height = min(8.0, max(2.8, 0.2 * ls + 0.6)), min(8.0, max(2.4, 0.2 * lt + 0.4))
    fig, axes, fonts = _heatmap_grid(1, len(mats), (width, height), source_labels, target_labels, bool(title))
    for ax, name, m in zip(axes.ravel(), names, mats):
        _heatmap(fig, ax, m, source_labels, target_labels, fonts, name,
                 xlabel="source token", ylabel="generated token")
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


# ----------------------------------------------------------------------------- images
def _rgb(image: Tensor) -> np.ndarray:
    """``(C, H, W)`` image (``uint8``, or float of any range) -> ``(H, W, 3)`` in [0, 1]."""
    if image.dim() != 3 or image.shape[0] not in (1, 3):
        raise InputError(f"image must have shape (C, H, W) with C = 1 or 3; got {tuple(image.shape)}")
    x = image.detach().float().cpu()
    if image.dtype == torch.uint8:
        x = x / 255.0
    else:  # a normalized tensor: stretch to [0, 1] for display
        x = (x - x.min()) / (x.max() - x.min()).clamp_min(1e-12)
    if x.shape[0] == 1:
        x = x.expand(3, -1, -1)
    return x.permute(1, 2, 0).contiguous().numpy()


def _upsample(grid: Tensor, size: tuple[int, int]) -> np.ndarray:
    """A ``(h, w)`` map over the patch/feature grid -> ``(H, W)``; nearest, so each cell
    stays one flat block (a smooth blur would suggest a resolution the model lacks)."""
    return F.interpolate(grid.detach().float().cpu()[None, None], size=size, mode="nearest")[0, 0].numpy()


def _overlay(fig: Any, ax: Any, rgb: np.ndarray, grid: Tensor, title: str, alpha: float) -> None:
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    heat = _upsample(grid, rgb.shape[:2])
    norm = Normalize(0.0, max(float(heat.max()), 1e-12))
    cmap = colormaps[OVERLAY_CMAP]
    ax.imshow((1.0 - alpha) * rgb + alpha * cmap(norm(heat))[..., :3], interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    bar = ax.inset_axes([1.04, 0.0, 0.05, 1.0])  # beside the panel, outside any layout engine
    fig.colorbar(ScalarMappable(norm, cmap), cax=bar).ax.tick_params(labelsize=7)


def image_attention_figure(image: Tensor, maps: Tensor, titles: Sequence[str], path: str | Path, *,
                           title: str = "", alpha: float = 0.6, max_cols: int = 5) -> Path:
    """The input image, then each map blended over it (a ViT's rollout and its heads).

    Args:
        image: ``(C, H, W)``, ``uint8`` or float.
        maps: ``(K, h, w)`` maps over the patch grid (upsampled to ``H x W``).
        titles: ``K`` panel titles.
        alpha: weight of the colour-mapped attention in the blend.
    """
    if maps.dim() != 3 or len(titles) != maps.shape[0]:
        raise InputError(f"maps must be (K, h, w) with one title each; got shape {tuple(maps.shape)} and "
                         f"{len(titles)} titles")
    rgb = _rgb(image)
    rows, cols = _grid(maps.shape[0] + 1, max_cols)
    fig, axes = _image_grid(rows, cols, cols * 2.9, rows * 2.7 + 0.4, bool(title))
    axes = axes.ravel()
    axes[0].imshow(rgb, interpolation="nearest")
    axes[0].set_title("input", fontsize=9)
    axes[0].set_axis_off()
    for ax, grid, name in zip(axes[1:], maps, titles):
        _overlay(fig, ax, rgb, grid, name, alpha)
    for ax in axes[maps.shape[0] + 1 :]:
        ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def pixel_query_figure(image: Tensor, weights: Tensor, map_size: tuple[int, int], queries: Sequence[tuple[int, int]],
                       path: str | Path, *, title: str = "", alpha: float = 0.6) -> Path:
    """Where chosen query pixels look, per head, over the image (BoTNet's MHSA).

    Args:
        image: ``(C, H, W)``, ``uint8`` or float.
        weights: ``(heads, h*w, h*w)``, one example, pixels of the ``h x w`` feature map
            in row-major order.
        map_size: ``(h, w)``.
        queries: ``(row, col)`` pixels of the image; each selects the feature-map cell
            that holds it. One figure row per query: the marked input, each head, the mean.
    """
    h, w = map_size
    if weights.dim() != 3 or weights.shape[1:] != (h * w, h * w):
        raise InputError(f"weights must have shape (heads, h*w, h*w) = (heads, {h * w}, {h * w}) for "
                         f"map_size={tuple(map_size)}; got {tuple(weights.shape)}")
    rgb = _rgb(image)
    H, W = rgb.shape[:2]
    if not queries:
        raise InputError("queries must name at least one (row, col) pixel; got none")
    for r, c in queries:
        if not (0 <= r < H and 0 <= c < W):
            raise InputError(f"queries: ({r}, {c}) lies outside the {H}x{W} image; need 0 <= row < {H}, 0 <= col < {W}")
    from matplotlib.patches import Rectangle

    heads = weights.shape[0]
    cols = heads + 2
    fig, axes = _image_grid(len(queries), cols, cols * 2.6, len(queries) * 2.5 + 0.4, bool(title))
    cell_h, cell_w = H / h, W / w
    for row, (r, c) in enumerate(queries):
        fr, fc = r * h // H, c * w // W
        q = weights[:, fr * w + fc].reshape(heads, h, w)
        panels = [(f"head {i}", q[i]) for i in range(heads)] + [("mean of heads", q.float().mean(dim=0))]
        axes[row, 0].imshow(rgb, interpolation="nearest")
        axes[row, 0].set_title(f"query ({r}, {c})", fontsize=9)
        axes[row, 0].set_xticks([])
        axes[row, 0].set_yticks([])
        for ax, (name, grid) in zip(axes[row, 1:], panels):
            _overlay(fig, ax, rgb, grid, name, alpha)
        for ax in axes[row]:  # the query pixel and the feature-map cell that holds it
            ax.plot([c], [r], marker="+", color=MARK, markersize=9, markeredgewidth=2)
            ax.add_patch(Rectangle((fc * cell_w - 0.5, fr * cell_h - 0.5), cell_w, cell_h, fill=False,
                                   edgecolor=MARK, linewidth=1.2))
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
