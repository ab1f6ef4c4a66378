"""Figures of a task's predictions on its test set (:class:`~attnlab.tasks.ClassifierPredictions`):
the confusion matrix and a grid of sample images with their true and predicted labels."""

from __future__ import annotations

import io

from ..errors import InputError
from ..tasks import ClassifierPredictions

__all__ = ["confusion_png", "image_samples_png"]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def confusion_png(p: ClassifierPredictions) -> bytes:
    """The confusion matrix with class names and counts: rows true, columns predicted."""
    from matplotlib.figure import Figure
    from sklearn.metrics import confusion_matrix

    n = len(p.classes)
    matrix = confusion_matrix(p.true, p.pred, labels=list(range(n)))
    size = max(4.5, 0.45 * n + 2.2)
    fig = Figure(figsize=(size + 1.0, size))
    ax = fig.subplots()
    image = ax.imshow(matrix, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(n), p.classes, rotation=45 if max(map(len, p.classes)) > 3 else 0, ha="right"
                  if max(map(len, p.classes)) > 3 else "center", fontsize=10)
    ax.set_yticks(range(n), p.classes, fontsize=10)
    ax.set_xlabel("predicted class", fontsize=11)
    ax.set_ylabel("true class", fontsize=11)
    ax.set_title(f"{len(p.true):,} test samples, accuracy {100 * p.accuracy:.2f}%", fontsize=12)
    top = matrix.max() if matrix.size else 0
    for i in range(n):
        for j in range(n):
            ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=9 if n <= 10 else 7,
                    color="white" if matrix[i, j] > top / 2 else "black")
    fig.tight_layout()
    return _png(fig)


def image_samples_png(p: ClassifierPredictions) -> bytes:
    """The test images of ``p.shown`` with their true and predicted classes (mistakes in red)."""
    from matplotlib.figure import Figure

    count = len(p.examples)
    if not count:
        raise InputError("image_samples_png needs predictions with examples; got none")
    cols = min(6, count)
    rows = (count + cols - 1) // cols
    fig = Figure(figsize=(1.9 * cols, 2.2 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.axis("off")
        if k >= count:
            continue
        image = p.examples[k].permute(1, 2, 0).numpy()
        grey = image.shape[-1] == 1
        ax.imshow(image[..., 0] if grey else image, cmap="gray" if grey else None, vmin=0, vmax=255,
                  interpolation="nearest")
        i = p.shown[k]
        t, q = p.classes[p.true[i]], p.classes[p.pred[i]]
        ax.set_title(f"true {t}\npredicted {q} ({p.prob[i]:.2f})", fontsize=9,
                     color="black" if t == q else "#c00000")
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=1 - 0.55 / (2.2 * rows), wspace=0.25,
                        hspace=0.55)  # fixed margins: tight_layout over a dozen axes costs most of a second
    return _png(fig)
