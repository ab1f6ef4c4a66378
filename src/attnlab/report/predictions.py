"""What a finished run predicts on its test set: the predictions of a classifier (for
its confusion matrix and a few examples) and a translation run's sample translations.

Runs are loaded with the tasks' own code (``load_run``, ``build_data``,
``held_out_set``), so the report sees exactly the test set and weights that ``attnlab
eval`` sees. This module sits above ``tasks`` (as the command does); the tasks import
it only inside a function, after training.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError

__all__ = ["ClassifierPredictions", "classifier_predictions", "confusion_png", "image_samples_png",
           "translation_samples", "is_cross_validation"]


@dataclass
class ClassifierPredictions:
    """Labels of every test sample: ``true``, ``pred`` and the probability of ``pred``.

    ``examples`` holds a few test inputs as shown to a person (``uint8`` ``(C, H, W)``
    tensors for images, strings for texts), those at the indices ``shown``: evenly
    spaced, so that a test set sorted by class shows every class. ``weights`` says which
    checkpoint(s) predicted.
    """

    classes: list[str]
    true: list[int]
    pred: list[int]
    prob: list[float]
    weights: str
    examples: list[Any] = field(default_factory=list)
    shown: list[int] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return sum(t == p for t, p in zip(self.true, self.pred)) / max(len(self.true), 1)


def is_cross_validation(run_dir: Path) -> bool:
    """The top folder of a 10-fold run: the folds hold the weights, it holds none."""
    return (run_dir / "fold_0").is_dir() and not (run_dir / "checkpoints").is_dir()


@torch.no_grad()
def _predict(model: torch.nn.Module, data: Any, device: torch.device, batch_size: int = 256):
    """``(true, pred, prob)`` over a data set with ``get_batch`` (as the trainer reads it)."""
    model.to(device).eval()
    true, pred, prob = [], [], []
    for start in range(0, len(data), batch_size):
        x, y = data.get_batch(list(range(start, min(start + batch_size, len(data)))))
        x = {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)
        p, i = (model(**x) if isinstance(x, dict) else model(x)).float().softmax(-1).max(-1)
        true += y.tolist()
        pred += i.cpu().tolist()
        prob += p.cpu().tolist()
    return true, pred, prob


def _spread(n: int, count: int) -> list[int]:
    """``count`` indices evenly spaced over ``range(n)`` (all of them when ``n <= count``)."""
    return list(range(n)) if n <= count else [round(i * (n - 1) / (count - 1)) for i in range(count)]


def _step(folder: Path) -> str:
    import json

    manifest = folder / "manifest.json"
    step = json.loads(manifest.read_text()).get("step") if manifest.is_file() else None
    return f"checkpoint {folder.name}" + (f" (step {step})" if step is not None else "")


def classifier_predictions(run_dir: str | Path, checkpoint: str = "last", device: str = "auto",
                           examples: int = 12) -> ClassifierPredictions:
    """Predictions of an image or sentiment run on its whole test set.

    ``checkpoint="last"``: the final weights, those ``results.json``'s ``test_accuracy``
    was measured with, so the matrix and the table agree. A cross-validation's top folder
    pools the ten folds: every sentence predicted once, by the fold that held it out.
    """
    from ..engine.device import select_device
    from ..tasks.common import read_recipe

    run_dir = Path(run_dir)
    recipe = read_recipe(run_dir)
    device_ = select_device(device)
    if recipe.task == "image_classification":
        from ..tasks import image_classification as ic

        recipe, model, folder = ic.load_run(run_dir, checkpoint)
        test = ic.build_data(recipe)[1]
        true, pred, prob = _predict(model, test, device_)
        shown = _spread(len(test), examples)
        return ClassifierPredictions(list(ic.DATA_INFO[recipe.data.name]["classes"]), true, pred, prob,
                                     _step(folder), [test.ds[i][0] for i in shown], shown)
    if recipe.task != "sentiment":
        raise InputError(f"run_dir must be a classification run; {run_dir} is a {recipe.task!r} run")
    from ..tasks import sentiment

    folds = [run_dir / f"fold_{k}" for k in range(10) if (run_dir / f"fold_{k}" / "checkpoints").is_dir()]
    folders = folds if is_cross_validation(run_dir) else [run_dir]
    if not folders:
        raise InputError(f"run_dir must hold trained folds; {run_dir} has no fold_<k>/checkpoints yet")
    out = ClassifierPredictions(list(sentiment.CLASSES), [], [], [], "")
    for folder in folders:
        recipe, tokenizer, model, weights = sentiment.load_run(folder, checkpoint)
        test = sentiment.held_out_set(folder, recipe, tokenizer)
        true, pred, prob = _predict(model, test, device_)
        out.true += true
        out.pred += pred
        out.prob += prob
        if not out.examples:  # the first fold's: its sentences come first in the pooled lists
            out.shown = _spread(len(test), examples)
            out.examples = [test.texts[i] for i in out.shown]
            out.weights = _step(weights)
    if len(folders) > 1:
        out.weights = f"the {checkpoint} checkpoint of each of the {len(folders)} folds, each on its held-out fold"
    return out


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


def translation_samples(run_dir: str | Path, count: int = 8) -> list[tuple[str, str, str]]:
    """``(source, reference, hypothesis)`` for the first test sentences, the hypotheses
    read from the run's ``translations.test.txt`` (nothing is translated again)."""
    from ..data.multi30k import load_multi30k
    from ..tasks.common import read_recipe

    run_dir = Path(run_dir)
    recipe = read_recipe(run_dir)
    path = run_dir / "translations.test.txt"
    if not path.is_file():
        raise InputError(f"run_dir must hold translations.test.txt (written at the end of training); "
                         f"{run_dir} has none")
    hyps = path.read_text(encoding="utf-8").splitlines()
    pairs = load_multi30k("test", recipe.data.data_dir, recipe.data.source, recipe.data.target)
    return [(s, r, h) for (s, r), h in zip(pairs[:count], hyps[:count])]
