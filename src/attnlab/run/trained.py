"""A finished run as one object (:class:`TrainedRun`): its task, recipe, model, preprocessing
and classes, with what the task does with them (``predict``, ``translate``, ``generate``,
``evaluate``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence
import torch
from torch import nn
from ..data.kinds.labelled_images import ImageSpec
from ..data.tokenizers.text import TextTokenizer
from ..engine.resolved import run_precision
from ..errors import InputError
from ..io import read_json_mapping
from .recipe import Recipe

__all__ = ["TrainedRun"]


@dataclass
class TrainedRun:
    """A finished run, loaded: everything needed to call its model on new inputs.

    ``preprocessing``: ``tokenizer`` (text tasks; the source language of a translation
    run), ``target_tokenizer`` (translation) or ``image`` (image tasks); the others are
    ``None``. ``classes``: the label names of a classifier, by class index."""

    task: "Task"
    run_dir: Path
    recipe: Recipe
    model: nn.Module
    checkpoint: Path
    classes: list[str] | None = None
    tokenizer: TextTokenizer | None = None
    target_tokenizer: TextTokenizer | None = None
    image: ImageSpec | None = None
    _precision: str | None = field(default=None, init=False, repr=False)  # read once, by `precision`

    def predict(self, inputs: Sequence[Any], **options: Any) -> list[Any]:
        """What the task predicts for ``inputs`` (see the task's :meth:`Task.predict`): for a
        classifier, :class:`~attnlab.run.views.LabelPrediction` ``(input, labels)`` with the
        ``top_k`` labels and their probabilities, best first (``.label``, ``.prob``)."""
        if isinstance(inputs, (str, Path)) or not isinstance(inputs, Sequence):
            raise InputError(f"inputs must be a list (of texts, image files, ...); got {type(inputs).__name__}: "
                             f"wrap one input in a list")
        return self.task.predict(self, inputs, **options)

    def translate(self, texts: Sequence[str], **options: Any) -> list[str]:
        """The generated texts of a run that generates text (translation): options
        ``num_beams``, ``max_length``, ``batch_size``, ``device``."""
        if self.task.outputs != "text":
            raise InputError(f"translate needs a run that generates text; {self.run_dir} is a {self.task.name} "
                             f"run: its predictions are labels: use predict")
        return [p.output for p in self.predict(texts, **options)]

    def generate(self, prompts: Sequence[str], **options: Any) -> list[str]:
        """The continuations of ``prompts`` by a run that generates text (a language model):
        options ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``, ``stop`` (a
        text or texts that end a continuation, left out of it) and ``batch_size`` (prompts of
        any lengths decoded together, left-padded)."""
        if self.task.outputs != "text":
            raise InputError(f"generate needs a run that generates text; {self.run_dir} is a {self.task.name} run: "
                             f"its predictions are labels: use predict")
        return [p.output for p in self.predict(prompts, **options)]

    @property
    def device(self) -> torch.device:
        """Where the model is."""
        return next(self.model.parameters()).device

    @property
    def precision(self) -> str:
        """The precision to evaluate in: the one the run trained its last stretch in, as it
        recorded it when it started (``resolved.json``), so that ``evaluate`` reproduces its
        figures on another machine too; for a run of an older attnlab, the recipe's, or for
        ``auto`` the one ``results.json`` names. A float16 run away from CUDA runs in float32."""
        if self._precision is None:
            asked = run_precision(self.run_dir) or self.recipe.train.precision
            results = self.run_dir / "results.json"
            if asked == "auto" and results.is_file():
                chosen = read_json_mapping(results).get("precision")
                if chosen in ("fp32", "bf16", "fp16"):
                    asked = chosen
            self._precision = asked
        if self._precision == "fp16" and self.device.type != "cuda":
            return "fp32"  # float16 autocast needs CUDA: a GPU run read on a CPU runs in float32
        return self._precision

    def evaluate(self, **options: Any) -> dict[str, Any]:
        """The test metrics of ``results.json``, recomputed with these weights."""
        return self.task.evaluate(self, **options)
