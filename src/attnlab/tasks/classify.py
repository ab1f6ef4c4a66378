"""What the classification tasks share: their class names beside the weights, their
predictions on a data set and on new inputs, and the test inputs a report shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..engine import distributed
from ..engine.trainer import predict_batches
from ..errors import InputError
from ..io import atomic_write_bytes, read_json_mapping
from ..run.views import LabelPrediction

__all__ = ["CLASSES_FILE", "write_classes", "read_classes", "predict_labels", "check_label_options", "top_labels",
           "spread"]

CLASSES_FILE = "classes.json"


def write_classes(run_dir: Path, classes: Sequence[str]) -> None:
    """``classes.json`` beside the weights (rank 0 alone), written atomically."""
    if distributed.is_main():
        atomic_write_bytes(run_dir / CLASSES_FILE, json.dumps({"classes": list(classes)}, indent=1).encode())


def read_classes(run_dir: Path, known: list[str] | None = None) -> list[str]:
    """A run's class names: its ``classes.json``, or for a run of an older attnlab that has
    none, ``known`` (the classes its source fixes)."""
    path = run_dir / CLASSES_FILE
    if path.is_file():
        classes = read_json_mapping(path).get("classes")
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise InputError(f"{path} must hold {{\"classes\": [names]}}; got {classes!r}")
        return classes
    if known is not None:
        return list(known)
    raise InputError(f"run_dir must hold {CLASSES_FILE} (the class names); {run_dir} has none")


def predict_labels(model: nn.Module, data: Any, device: torch.device, batch_size: int = 256, *,
                   precision: str = "fp32", channels_last: bool = False) -> tuple[list[int], list[int], list[float]]:
    """``(true, pred, prob)`` over a data set as the trainer reads it, in the precision and
    memory format the run was evaluated in (so they agree with its figures)."""
    true, pred, prob = [], [], []
    for logits, y in predict_batches(model, data, batch_size=batch_size, device=device, precision=precision,
                                     channels_last=channels_last):
        p, i = logits.softmax(-1).max(-1)
        true += y.tolist()
        pred += i.cpu().tolist()
        prob += p.cpu().tolist()
    return true, pred, prob


def check_label_options(top_k: Any, batch_size: Any) -> None:
    """A classifier's ``predict`` options, checked before any work: positive integers."""
    for name, value in (("top_k", top_k), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            what = "labels per input, most probable first" if name == "top_k" else "inputs per batch"
            raise InputError(f"{name} must be a positive integer ({what}); got {value!r}")


def top_labels(logits: Tensor, classes: Sequence[str], names: Sequence[str], top_k: int) -> list[LabelPrediction]:
    """One :class:`LabelPrediction` per row of ``logits``, named by ``names``, with its
    ``top_k`` classes, most probable first."""
    check_label_options(top_k, 1)
    probs = logits.float().softmax(-1).cpu()
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [LabelPrediction(name, [(classes[i], p) for p, i in zip(ps.tolist(), ix.tolist())])
            for name, ps, ix in zip(names, top.values, top.indices)]


def spread(n: int, count: int) -> list[int]:
    """``count`` indices evenly spaced over ``range(n)`` (all of them when ``n <= count``)."""
    return list(range(n)) if n <= count else [round(i * (n - 1) / (count - 1)) for i in range(count)]
