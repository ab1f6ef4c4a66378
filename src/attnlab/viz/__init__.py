"""Pictures of what attention looks at.

* :mod:`attnlab.viz.attention`: plotting functions on tensors (token heatmaps, attention
  rollout, maps over an image, translation alignments), each writing one PNG atomically.
* :mod:`attnlab.viz.run`: :func:`visualize_run`, the pictures of a finished run
  (``attnlab visualize RUN_DIR``), and :func:`draw_views`, which draws the attention
  views any task returns.
* :mod:`attnlab.viz.explorer`: :func:`explore`, every head of every layer in one
  interactive page that opens from the disk (``attnlab explore TARGET``).
"""

from .attention import (
    alignment_figure,
    attention_rollout,
    image_attention_figure,
    pixel_query_figure,
    save_figure,
    token_heatmaps,
)
from .explorer import Exploration, explore
from .run import draw_views, visualize_run

__all__ = [
    "attention_rollout",
    "token_heatmaps",
    "image_attention_figure",
    "pixel_query_figure",
    "alignment_figure",
    "save_figure",
    "visualize_run",
    "draw_views",
    "explore",
    "Exploration",
]
