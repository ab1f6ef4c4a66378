"""The catalogue of exercises, one module per tutorial, in the order of the tutorials.

Each module lists its :class:`~attnlab.exercises.checking.Exercise` objects: the name
``<tutorial>-<n>``, both languages' texts, the reference (attnlab's own function where it
has one), the case generator, the typical mistakes and the tolerances."""

from __future__ import annotations

from ..checking import Exercise
from . import attention, cnn, data, efficient, inside, lm, norms, transformer, vit

__all__ = ["EXERCISES", "TUTORIALS", "BY_NAME"]

# tutorial key -> (page file stem, English title, Chinese title)
TUTORIALS: dict[str, tuple[str, str, str]] = {
    "attention": ("attention", "Attention from scratch", "从零实现注意力机制"),
    "norms": ("norms", "BatchNorm and LayerNorm in attention", "注意力中的 BatchNorm 与 LayerNorm"),
    "transformer": ("transformer", "The Transformer", "Transformer"),
    "vit": ("vit", "The Vision Transformer", "Vision Transformer（ViT）"),
    "cnn": ("cnn-attention", "Attention in CNNs", "CNN 中的注意力"),
    "efficient": ("efficient", "Efficient attention", "高效注意力"),
    "lm": ("language-models", "Language models", "语言模型"),
    "data": ("own-data", "Training on your own data", "用自己的数据训练"),
    "inside": ("inside", "Looking inside a trained model", "看看训练好的模型内部"),
}

EXERCISES: list[Exercise] = [*attention.EXERCISES, *norms.EXERCISES, *transformer.EXERCISES, *vit.EXERCISES,
                              *cnn.EXERCISES, *efficient.EXERCISES, *lm.EXERCISES, *data.EXERCISES,
                              *inside.EXERCISES]
BY_NAME: dict[str, Exercise] = {ex.name: ex for ex in EXERCISES}
