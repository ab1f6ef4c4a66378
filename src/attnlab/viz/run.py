"""Attention pictures of a finished run: its task runs the model on a few inputs under
:func:`~attnlab.attention.capture_attention` and hands back views
(:mod:`attnlab.run.views`); this module draws each view by its type.

=====================  ========================================================  ==========================
view                   pictures (one set per input)                              files
=====================  ========================================================  ==========================
TextAttention          per layer: every head's token-to-token heatmap, the mean  ``NN_layerL.png``
ImageAttention (ViT)   rollout and the last layer's class-token attention per    ``NN_vit.png``
                       head, over the image
PixelAttention         per block: where the query pixels look, per head          ``NN_botnet_blockK.png``
(BoTNet)
AlignmentAttention     cross-attention (source x generated tokens), heads        ``NN_alignment.png``
(translation)          averaged, one panel per decoder layer
=====================  ========================================================  ==========================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from ..engine.device import select_device
from ..errors import InputError
from ..tasks import (AlignmentAttention, ImageAttention, PixelAttention, TextAttention, TrainedRun, load_run)
from .attention import alignment_figure, attention_rollout, image_attention_figure, pixel_query_figure, token_heatmaps

__all__ = ["visualize_run", "draw_views"]


def _check_queries(queries: Sequence[Sequence[int]] | None) -> list[tuple[int, int]] | None:
    if queries is None:
        return None
    out = []
    for q in queries:
        if (not isinstance(q, (tuple, list)) or len(q) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in q)):
            raise InputError(f"queries must be (row, col) pairs of integers; got {q!r}")
        out.append((int(q[0]), int(q[1])))
    if not out:
        raise InputError("queries must hold at least one (row, col) pair, or be None; got none")
    return out


def _image_maps(view: ImageAttention) -> tuple[torch.Tensor, list[str], str]:
    """The ViT maps to draw over the image: the rollout through all layers and the last
    layer's heads, as seen by what the head reads (the class token, or all patches)."""
    rollout = attention_rollout([w[None] for w in view.layers])[0]  # (N, N)
    last = view.layers[-1].float()
    p = view.prefix
    if view.pooling == "token":  # the class token is what the head reads
        roll, heads, who = rollout[0, p:], last[:, 0, p:], "class token"
    else:  # mean pooling reads every patch token alike
        roll, heads, who = rollout[p:, p:].mean(0), last[:, p:, p:].mean(1), "mean of the patch queries"
    maps = torch.cat([roll[None], heads]).reshape(-1, *view.grid)
    titles = ["rollout (all layers)"] + [f"last layer, head {h}" for h in range(heads.shape[0])]
    return maps, titles, who


def draw_views(views: Sequence[Any], out: Path) -> list[Path]:
    """Draw each view of a task's :meth:`~attnlab.tasks.Task.attention_views` into
    ``out``; returns the PNGs written, in order."""
    paths = []
    for i, view in enumerate(views):
        if isinstance(view, TextAttention):
            for layer, (name, w) in enumerate(view.layers):
                paths.append(token_heatmaps(w, view.tokens, view.tokens, out / f"{i:02d}_layer{layer}.png",
                                            title=f"{view.title}\nlayer {layer} ({name})"))
        elif isinstance(view, AlignmentAttention):
            paths.append(alignment_figure(view.layers, view.source_tokens, view.target_tokens,
                                          out / f"{i:02d}_alignment.png",
                                          layer_names=[f"decoder layer {j}" for j in range(len(view.layers))],
                                          title=view.title))
        elif isinstance(view, ImageAttention):
            maps, titles, who = _image_maps(view)
            paths.append(image_attention_figure(view.image, maps, titles, out / f"{i:02d}_vit.png",
                                                title=f"{view.title}; attention of the {who}"))
        elif isinstance(view, PixelAttention):
            for k, (name, w, size) in enumerate(view.blocks):
                paths.append(pixel_query_figure(view.image, w, size, view.queries,
                                                out / f"{i:02d}_botnet_block{k}.png",
                                                title=f"{view.title}; BoT block {k} ({name}), {size[0]}x{size[1]} map"))
        else:
            raise InputError(f"draw_views cannot draw a {type(view).__name__}; it draws the views of "
                             f"attnlab.run.views")
    return paths


def visualize_run(run_dir: str | Path | TrainedRun, inputs: Sequence[Any] | None = None,
                  out_dir: str | Path | None = None, *, max_inputs: int = 2, checkpoint: str = "auto",
                  device: str = "cpu", queries: Sequence[Sequence[int]] | None = None) -> list[Path]:
    """Draw the attention of a finished run's model on a few inputs; returns the PNGs written.

    Args:
        run_dir: a run directory written by ``attnlab train`` (a cross-validation run:
            one of its ``fold_<k>`` folders), or a loaded :class:`~attnlab.tasks.TrainedRun`.
        inputs: what the run's task takes (texts, image file paths); ``None``: the first
            ``max_inputs`` examples of the run's test set (which may need the data
            directory of the run's recipe, or ``ATTNLAB_DATA_DIR``).
        out_dir: where the PNGs go (default ``run_dir/visualize``; files of the same
            name are replaced).
        max_inputs: how many test examples when ``inputs`` is None.
        checkpoint: ``"auto"``, ``"best"``, ``"last"``, ``"averaged"`` or a checkpoint folder.
        device: ``"cpu"`` (default), ``"cuda"``, ... or ``"auto"``.
        queries: BoTNet runs only: ``(row, col)`` pixels of the input image (as the model
            sees it, e.g. 32x32 for CIFAR-10) whose attention to draw; default the centre
            and two pixels on the diagonal.

    Raises:
        InputError (a ValueError): not a run directory, an attention kind that forms no
            weights (the efficient kinds), a model with nothing to draw, bad ``inputs`` or
            ``queries``.
    """
    if not isinstance(max_inputs, int) or isinstance(max_inputs, bool) or max_inputs < 1:
        raise InputError(f"max_inputs must be a positive integer; got {max_inputs!r}")
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
        if not inputs:
            raise InputError("inputs must hold at least one text or image file (None: the run's test examples)")
    checked = _check_queries(queries)
    run = run_dir if isinstance(run_dir, TrainedRun) else load_run(run_dir, checkpoint)
    run.model.to(select_device(device))
    try:
        views = run.task.attention_views(run, inputs, max_inputs=max_inputs, queries=checked)
    finally:
        run.model.cpu()
    out = Path(out_dir) if out_dir is not None else run.run_dir / "visualize"
    return draw_views(views, out)
