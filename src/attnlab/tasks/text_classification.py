"""Text classification: a tokenizer trained on the training part, an attention
classifier trained by the engine, tested once.

Data: any source of labelled texts (``data.name``: the built-in ``mr``, a ``file`` of
one's own, or a source one registers; see :mod:`attnlab.data.kinds.labelled_texts` and
:mod:`attnlab.data.sources.text_files`), with its protocol (``data.protocol``):

* ``"split"``: the source's fixed split; the dev part is evaluated during training and
  picks ``checkpoints/best``, with which the test part is evaluated once, at the end.
* ``"cv10"``: the standard MR protocol (Kim, 2014): 10 stratified folds; each fold is a
  complete run in ``fold_<k>/`` (its own tokenizer, trained on its nine training folds)
  tested on the held-out fold with its final weights (no model selection). The top
  ``results.json`` holds the mean and standard deviation of the ten test accuracies.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch import nn

from ..attention.capture import capture_attention
from ..data.kinds.labelled_texts import Labelled, TextSource, TextSourceConfig, TextSplits
from ..data.source import source_of
from ..data.batches.texts import SentimentDataset
from ..data.tokenizers.text import TextTokenizer, shorten
from ..engine import distributed
from ..engine.checkpoint import checkpoint_label
from ..engine.config import ConfigError
from ..engine.device import autocast, select_device
from ..engine.trainer import evaluate_model
from ..errors import AttentionUnavailable, InputError
from ..run.recipe import ModelConfig, Recipe
from ..run.task import Prepared, Preprocessing, Task, check_texts, register_task
from ..run.trained import TrainedRun
from .classify import check_label_options, predict_labels, read_classes, spread, top_labels, write_classes
from .text import TextConfig, build_tokenizer
from ..run.views import ClassifierPredictions, LabelPrediction, TextAttention

__all__ = ["TextClassificationRecipe", "TextClassification"]

TOKENIZER = "tokenizer.json"


@dataclass
class TextClassificationRecipe(Recipe):
    task: str = "text_classification"
    data: TextSourceConfig = field(default_factory=TextSourceConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("sentiment_transformer_small"))
    text: TextConfig = field(default_factory=TextConfig)


class TextInfo(NamedTuple):
    """What a text classification run learns from its data: the model's options come from it."""

    tokenizer: TextTokenizer
    classes: list[str]


def _source(recipe: Recipe) -> TextSource:
    return source_of(recipe.data)


def _fold_of(run_dir: Path) -> int:
    k = run_dir.name.removeprefix("fold_")
    if not k.isdigit() or not 0 <= int(k) < 10:
        raise InputError(f"run_dir of a cross-validation run must be a fold_<k> folder; got {run_dir}")
    return int(k)


def _tested_part(recipe: Recipe, run_dir: Path) -> Labelled:
    """The texts a run was tested on: the split's test part, or a fold's held-out fold."""
    splits = _source(recipe).load(recipe.data)
    if recipe.data.protocol == "split":
        return splits.test
    return splits.folds(recipe.data.seed)[_fold_of(run_dir)][1]


@register_task
class TextClassification(Task):
    name = "text_classification"
    recipe_class = TextClassificationRecipe
    summary = "classify texts: MR movie-review polarity, or a CSV/TSV/JSONL file of one's own"
    inputs = "texts"
    sample_unit = "sentences"
    fixed_on_resume = ("task", "model", "text", "train.optimizer")
    legacy_keys = ("translate", "data.augment", "data.source", "data.target", "text.joint_vocab")

    def model_options(self, recipe: Recipe, info: TextInfo | None = None) -> dict[str, Any]:
        """``vocab_size`` and ``num_classes`` from the data (``None``: the recipe's vocabulary
        size and the source's classes, or 2 for a file whose labels are not read yet), and
        ``max_len``."""
        if info is None:
            known = _source(recipe).known_classes(recipe.data)
            vocab, classes = recipe.text.vocab_size, len(known) if known is not None else 2
        else:
            vocab, classes = info.tokenizer.vocab_size, len(info.classes)
        return {"vocab_size": vocab, "num_classes": classes, "max_len": recipe.text.max_length}

    def check(self, recipe: Recipe) -> nn.Module | None:
        """The base checks, and ``text.max_length`` within the positions of a model that has a
        fixed number of them (a pretrained encoder's)."""
        model = super().check(recipe)  # built once, on the meta device
        if model is None:
            return None
        longest = getattr(getattr(model, "config", None), "longest", None)
        if longest is not None and recipe.text.max_length > longest:
            raise ConfigError(f"text.max_length must be at most {longest}, the positions of model "
                              f"{recipe.model.name!r}; got {recipe.text.max_length}")
        return model

    def describe(self, recipe: Recipe) -> str:
        return (f"{_source(recipe).describe(recipe.data)}, "
                + ("10-fold cross-validation" if recipe.data.protocol == "cv10" else "fixed split"))

    # ------------------------------------------------------------------ training
    def folds(self, recipe: Recipe, data: TextSplits) -> list[tuple[str, Any, str]] | None:
        if recipe.data.protocol == "split":
            return None
        return [(f"fold_{k}", TextSplits(train, None, test, data.classes), f"{len(train)} training, {len(test)} test "
                 f"sentences") for k, (train, test) in enumerate(data.folds(recipe.data.seed))]

    def combine(self, recipe: Recipe, results: list[dict[str, Any]]) -> dict[str, Any]:
        accuracies = [f["test_accuracy"] for f in results]
        return {"protocol": "cv10", "test_accuracy": statistics.mean(accuracies),
                "test_accuracy_std": statistics.stdev(accuracies), "fold_accuracies": accuracies,
                "test_checkpoint": "last (of each fold)", "params": results[0]["params"], "model": recipe.model.name,
                "train_seconds": sum(f["train_seconds"] for f in results),
                "samples_per_s": statistics.mean(f["samples_per_s"] for f in results),
                "steps": results[0]["steps"], "classes": results[0]["classes"]}

    def prepare(self, recipe: Recipe, run_dir: Path, data: TextSplits, log: Callable[[str], None]) -> Prepared:
        write_classes(run_dir, data.classes)
        tokenizer_path = run_dir / TOKENIZER
        if tokenizer_path.is_file():  # a resumed run: its weights belong to this vocabulary
            tokenizer = TextTokenizer.load(tokenizer_path)
        else:
            tokenizer = build_tokenizer(recipe.text, data.train.texts, recipe.model.checkpoint)
            if distributed.is_main():
                tokenizer.save(tokenizer_path)
        length = recipe.text.max_length
        make = lambda part: SentimentDataset(part.texts, part.labels, tokenizer, length)  # noqa: E731
        return Prepared(make(data.train), make(data.val) if data.val is not None else None, make(data.test),
                        TextInfo(tokenizer, data.classes), data.classes,
                        {"train_size": len(data.train), "dev_size": len(data.val) if data.val is not None else 0,
                         "test_size": len(data.test), "vocab_size": tokenizer.vocab_size})

    # ------------------------------------------------------------------ a finished run
    def sub_runs(self, run_dir: Path) -> list[Path]:
        return [run_dir / f"fold_{k}" for k in range(10) if (run_dir / f"fold_{k}" / "checkpoints").is_dir()] \
            if (run_dir / "fold_0").is_dir() and not (run_dir / "checkpoints").is_dir() else []

    def preprocessing(self, run_dir: Path, recipe: Recipe) -> Preprocessing:
        if not (run_dir / TOKENIZER).is_file():
            hint = " (a cross-validation run: load one of its fold_<k> folders)" if (run_dir / "fold_0").is_dir() else ""
            raise InputError(f"run_dir must hold the run's {TOKENIZER}; {run_dir} has none{hint}")
        tokenizer = TextTokenizer.load(run_dir / TOKENIZER)
        classes = read_classes(run_dir, _source(recipe).known_classes(recipe.data))  # (older MR runs: none)
        return Preprocessing(TextInfo(tokenizer, classes), classes, tokenizer=tokenizer)

    def _test_set(self, run: TrainedRun) -> SentimentDataset:
        part = _tested_part(run.recipe, run.run_dir)
        return SentimentDataset(part.texts, part.labels, run.tokenizer, run.recipe.text.max_length)

    def _file_set(self, run: TrainedRun, path: str | Path) -> SentimentDataset:
        """A labelled file of one's own, read as the run's source reads one, as the run's classes."""
        part = _source(run.recipe).read_labelled(run.recipe.data, path, run.classes)
        return SentimentDataset(part.texts, part.labels, run.tokenizer, run.recipe.text.max_length)

    def evaluate(self, run: TrainedRun, *, device: str = "auto", data: str | Path | None = None) -> dict[str, Any]:
        """The test set's metrics, or (``data``) those of a labelled CSV/TSV/JSONL file with the
        run's text and label columns."""
        cfg = run.recipe.train
        test = self._test_set(run) if data is None else self._file_set(run, data)
        res = evaluate_model(run.model, test, batch_size=cfg.batch_size, device=device, precision=run.precision)
        return {"test_accuracy": res["accuracy"], "test_loss": res["loss"], "test_samples": res["samples"]}

    @torch.no_grad()
    def predict(self, run: TrainedRun, inputs: Sequence[str], *, top_k: int = 1,
                batch_size: int = 256) -> list[LabelPrediction]:
        """``inputs``: texts, classified in batches of ``batch_size``."""
        check_label_options(top_k, batch_size)
        inputs = check_texts(inputs, self.name)
        out: list[LabelPrediction] = []
        for start in range(0, len(inputs), batch_size):
            chunk = list(inputs[start : start + batch_size])
            batch = run.tokenizer.encode(chunk, max_length=run.recipe.text.max_length,
                                         length_hint=_read_as_trained(run))
            with autocast(run.device, run.precision):
                logits = run.model(batch["input_ids"].to(run.device), batch["attention_mask"].to(run.device))
            out += top_labels(logits, run.classes, chunk, top_k)
        return out

    def report_items(self, runs: Sequence[TrainedRun], *, device: str = "auto") -> list[Any]:
        """The test sentences' predictions; for a cross-validation run, the ten folds
        pooled: every sentence predicted once, by the fold that held it out."""
        out = ClassifierPredictions([], [], [], [], "")
        for run in runs:
            out.classes = run.classes
            test = self._test_set(run)
            true, pred, prob = predict_labels(run.model, test, select_device(device), precision=run.precision)
            out.true += true
            out.pred += pred
            out.prob += prob
            if not out.examples:  # the first fold's: its sentences come first in the pooled lists
                out.shown = spread(len(test), 12)
                out.examples = [test.texts[i] for i in out.shown]
                out.weights = checkpoint_label(run.checkpoint)
        if len(runs) > 1:
            out.weights = f"the tested checkpoint of each of the {len(runs)} folds, each on its held-out fold"
        return [out]

    @torch.no_grad()
    def attention_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                        queries: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        model = run.model
        if queries is not None:
            raise InputError(f"queries (--query) choose BoTNet query pixels; run {run.run_dir} is a "
                             f"{self.name} run")
        if model.config.depth == 0:
            raise AttentionUnavailable(f"run {run.run_dir} cannot be visualized: its classifier has no attention "
                                       f"layers (depth=0)", reason="it has no attention layers (depth=0)",
                                       instead="Train it with model.options.depth=1 or more to see its attention.")
        texts = check_texts(inputs, self.name) if inputs is not None else self._test_set(run).texts[:max_inputs]
        views = []
        for text in texts:
            batch = run.tokenizer.encode([text], max_length=run.recipe.text.max_length,  # one text: no padding
                                         length_hint=_read_as_trained(run))
            device = next(model.parameters()).device
            with capture_attention(model, cpu=True) as maps:
                probs = model(batch["input_ids"].to(device), batch["attention_mask"].to(device)).float().softmax(-1)[0]
            p, c = probs.max(0)
            layers = [(name, calls[0][0]) for name, calls in maps.items() if calls]
            views.append(TextAttention(f'"{shorten(text)}" -> {run.classes[int(c)]} ({float(p):.2f})',
                                        run.tokenizer.readable_tokens(batch["input_ids"][0]), layers))
        return views


def _read_as_trained(run: TrainedRun) -> str:
    """What a prediction's truncation warning says: the run's model reads what it trained on."""
    n = run.recipe.text.max_length
    return f"the run was trained with text.max_length={n}: its model reads the first {n} tokens of each text"
