"""Text classification on MR (movie-review polarity): a tokenizer trained on the training
part, an attention classifier trained by the engine, tested once.

Protocols (``data.protocol``):

* ``"split"``: a fixed stratified 80/10/10 split; the dev part is evaluated during
  training and picks ``checkpoints/best``, with which the test part is evaluated once,
  at the end.
* ``"cv10"``: the standard MR protocol (Kim, 2014): 10 stratified folds; each fold is a
  complete run in ``fold_<k>/`` (its own tokenizer, trained on its nine training folds)
  tested on the held-out fold with its final weights (no model selection). The top
  ``results.json`` holds the mean and standard deviation of the ten test accuracies.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch

from ..attention.capture import capture_attention
from ..data.mr import load_mr, mr_folds, mr_split
from ..data.text import SentimentDataset
from ..data.tokenize import TextTokenizer, shorten
from ..engine import distributed
from ..engine.device import select_device
from ..engine.trainer import evaluate_model
from ..errors import InputError
from ..io import read_json_mapping
from .base import DataConfig, ModelConfig, Recipe, Task, TrainedRun, check_texts, register_task
from .image_classification import predict_labels, spread
from .runs import checkpoint_label, fit_run, load_run, load_weights, open_run, test_run, write_results
from .views import ClassifierPredictions, LabelPrediction, TokenAttention

__all__ = ["TextConfig", "TextDataConfig", "TextClassificationRecipe", "TextClassification", "build_tokenizer",
           "CLASSES"]

CLASSES = ("negative", "positive")  # label 0, label 1


@dataclass
class TextConfig:
    """Tokenization of a text task."""

    tokenizer: Literal["wordpiece", "bpe"] = "wordpiece"
    vocab_size: int = field(default=8000, metadata={"min": 263})
    lowercase: bool = True
    min_frequency: int = field(default=1, metadata={"min": 0})
    max_length: int = field(default=64, metadata={"min": 3})  # tokens per text, special tokens included
    tokenizer_file: str | None = None  # a tokenizer.json to use instead of training one


@dataclass
class TextDataConfig(DataConfig):
    name: Literal["mr"] = "mr"
    # "split": a fixed 80/10/10 split (dev picks checkpoints/best, test once); "cv10": 10 stratified folds.
    protocol: Literal["split", "cv10"] = "split"
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the split and the folds


@dataclass
class TextClassificationRecipe(Recipe):
    task: str = "text_classification"
    data: TextDataConfig = field(default_factory=TextDataConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig("sentiment_transformer_small"))
    text: TextConfig = field(default_factory=TextConfig)


def build_tokenizer(text: TextConfig, texts: Sequence[str]) -> TextTokenizer:
    """``text.tokenizer_file``, or a tokenizer of ``text``'s kind trained on ``texts``."""
    if text.tokenizer_file:
        return TextTokenizer.load(text.tokenizer_file)
    return TextTokenizer.train(texts, text.tokenizer, text.vocab_size, lowercase=text.lowercase,
                               min_frequency=text.min_frequency)


def _fold_of(run_dir: Path) -> int:
    k = run_dir.name.removeprefix("fold_")
    if not k.isdigit() or not 0 <= int(k) < 10:
        raise InputError(f"run_dir of a cross-validation run must be a fold_<k> folder; got {run_dir}")
    return int(k)


def _test_indices(recipe: TextClassificationRecipe, run_dir: Path, labels: list[int]) -> list[int]:
    """The sentences a run was tested on: the split's test part, or a fold's held-out fold."""
    if recipe.data.protocol == "split":
        return mr_split(labels, seed=recipe.data.seed)[2]
    return mr_folds(labels, 10, seed=recipe.data.seed)[_fold_of(run_dir)][1]


@register_task
class TextClassification(Task):
    name = "text_classification"
    recipe_class = TextClassificationRecipe
    summary = "classify sentences: MR movie-review polarity (fixed split or 10-fold cross-validation)"
    inputs = "texts"
    sample_unit = "sentences"
    fixed_on_resume = ("task", "data.name", "data.protocol", "data.seed", "model", "text", "train.optimizer")
    legacy_keys = ("translate", "data.augment", "data.source", "data.target", "text.joint_vocab")

    def model_options(self, recipe: Recipe, info: TextTokenizer | None = None) -> dict[str, Any]:
        vocab = info.vocab_size if info is not None else recipe.text.vocab_size
        return {"vocab_size": vocab, "num_classes": len(CLASSES), "max_len": recipe.text.max_length}

    def describe(self, recipe: Recipe) -> str:
        return "10-fold cross-validation" if recipe.data.protocol == "cv10" else "text classification, fixed split"

    # ------------------------------------------------------------------ training
    def train(self, recipe: Recipe, run_dir: str | Path, *, resume: bool = False, allow_changes: bool = False,
              log: Callable[[str], None] = print) -> dict[str, Any]:
        run_dir = Path(run_dir)
        texts, labels = load_mr(recipe.data.data_dir)
        if recipe.data.protocol == "split":
            train_idx, dev_idx, test_idx = mr_split(labels, seed=recipe.data.seed)
            with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, log=log) as resume_from:
                return self._train_one(recipe, run_dir, texts, labels, train_idx, dev_idx, test_idx, resume_from, log)
        # config.yaml and the lock at the top too; the folds hold the checkpoints
        with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, checkpoints=False, log=log):
            start = time.perf_counter()
            folds = []
            for k, (train_idx, test_idx) in enumerate(mr_folds(labels, 10, seed=recipe.data.seed)):
                fold_dir = run_dir / f"fold_{k}"
                done = fold_dir / "results.json"
                if resume and done.is_file() and not allow_changes:  # a finished fold of an interrupted run
                    folds.append(read_json_mapping(done))
                    continue
                log(f"fold {k + 1}/10: {len(train_idx)} training, {len(test_idx)} test sentences")
                with open_run(recipe, fold_dir, resume=resume and fold_dir.is_dir(), allow_changes=allow_changes,
                              log=log) as resume_from:
                    folds.append(self._train_one(recipe, fold_dir, texts, labels, train_idx, None, test_idx,
                                                 resume_from, log))
                log(f"fold {k + 1}/10: test accuracy {100 * folds[-1]['test_accuracy']:.2f}%")
            accuracies = [f["test_accuracy"] for f in folds]
            results = {
                "protocol": "cv10", "test_accuracy": statistics.mean(accuracies),
                "test_accuracy_std": statistics.stdev(accuracies), "fold_accuracies": accuracies,
                "test_checkpoint": "last (of each fold)", "params": folds[0]["params"], "model": recipe.model.name,
                "train_seconds": sum(f["train_seconds"] for f in folds),
                "samples_per_s": statistics.mean(f["samples_per_s"] for f in folds),
                "steps": folds[0]["steps"], "wall_seconds": time.perf_counter() - start, "classes": list(CLASSES),
            }
            write_results(run_dir, results)
            return results

    def _train_one(self, recipe: Recipe, run_dir: Path, texts: list[str], labels: list[int], train_idx: list[int],
                   dev_idx: list[int] | None, test_idx: list[int], resume_from: Path | None,
                   log: Callable[[str], None]) -> dict[str, Any]:
        pick = lambda idx: ([texts[i] for i in idx], [labels[i] for i in idx])  # noqa: E731
        tokenizer_path = run_dir / "tokenizer.json"
        if tokenizer_path.is_file():  # a resumed run: its weights belong to this vocabulary
            tokenizer = TextTokenizer.load(tokenizer_path)
        else:
            tokenizer = build_tokenizer(recipe.text, pick(train_idx)[0])
            if distributed.is_main():
                tokenizer.save(tokenizer_path)
        length = recipe.text.max_length
        train = SentimentDataset(*pick(train_idx), tokenizer, length)
        test = SentimentDataset(*pick(test_idx), tokenizer, length)
        dev = SentimentDataset(*pick(dev_idx), tokenizer, length) if dev_idx is not None else None
        build = lambda: self.build_model(recipe, tokenizer)  # noqa: E731
        results = fit_run(recipe, run_dir, build, train, dev, resume_from=resume_from, log=log)
        tested, _ = test_run(recipe, run_dir, build, test)
        results = {**tested, **results, "classes": list(CLASSES), "train_size": len(train),
                   "dev_size": len(dev) if dev is not None else 0, "test_size": len(test),
                   "vocab_size": tokenizer.vocab_size}
        write_results(run_dir, results)
        return results

    # ------------------------------------------------------------------ a finished run
    def sub_runs(self, run_dir: Path) -> list[Path]:
        return [run_dir / f"fold_{k}" for k in range(10) if (run_dir / f"fold_{k}" / "checkpoints").is_dir()] \
            if (run_dir / "fold_0").is_dir() and not (run_dir / "checkpoints").is_dir() else []

    def load(self, run_dir: Path, recipe: Recipe, checkpoint: str = "auto") -> TrainedRun:
        if not (run_dir / "tokenizer.json").is_file():
            hint = " (a cross-validation run: load one of its fold_<k> folders)" if (run_dir / "fold_0").is_dir() else ""
            raise InputError(f"run_dir must hold the run's tokenizer.json; {run_dir} has none{hint}")
        tokenizer = TextTokenizer.load(run_dir / "tokenizer.json")
        model = self.build_model(recipe, tokenizer)
        folder = load_weights(run_dir, model, checkpoint)
        return TrainedRun(self, run_dir, recipe, model.eval(), folder, classes=list(CLASSES), tokenizer=tokenizer)

    def _test_set(self, run: TrainedRun) -> SentimentDataset:
        texts, labels = load_mr(run.recipe.data.data_dir)
        idx = _test_indices(run.recipe, run.run_dir, labels)
        return SentimentDataset([texts[i] for i in idx], [labels[i] for i in idx], run.tokenizer,
                                run.recipe.text.max_length)

    def evaluate(self, run: TrainedRun, *, device: str = "auto") -> dict[str, Any]:
        cfg = run.recipe.train
        res = evaluate_model(run.model, self._test_set(run), batch_size=cfg.batch_size, device=device,
                             precision=cfg.precision)
        return {"test_accuracy": res["accuracy"], "test_loss": res["loss"], "test_samples": res["samples"]}

    @torch.no_grad()
    def predict(self, run: TrainedRun, inputs: Sequence[str], *, top_k: int = 1,
                batch_size: int = 256) -> list[LabelPrediction]:
        """``inputs``: texts, classified in batches of ``batch_size``."""
        out: list[LabelPrediction] = []
        for start in range(0, len(inputs), batch_size):
            chunk = list(inputs[start : start + batch_size])
            batch = run.tokenizer.encode(chunk, max_length=run.recipe.text.max_length)
            device = run.device
            probs = run.model(batch["input_ids"].to(device), batch["attention_mask"].to(device)).float().softmax(-1).cpu()
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
            out += [LabelPrediction(text, [(run.classes[i], p) for p, i in zip(ps.tolist(), ix.tolist())])
                    for text, ps, ix in zip(chunk, top.values, top.indices)]
        return out

    def report_items(self, run_dir: Path, *, device: str = "auto") -> list[Any]:
        """The test sentences' predictions; for a cross-validation run, the ten folds
        pooled: every sentence predicted once, by the fold that held it out."""
        folders = self.sub_runs(run_dir)
        if not folders:
            if (run_dir / "fold_0").is_dir() and not (run_dir / "checkpoints").is_dir():
                raise InputError(f"run_dir must hold trained folds; {run_dir} has no fold_<k>/checkpoints yet")
            folders = [run_dir]
        out = ClassifierPredictions(list(CLASSES), [], [], [], "")
        for folder in folders:
            run = load_run(folder)
            test = self._test_set(run)
            true, pred, prob = predict_labels(run.model, test, select_device(device))
            out.true += true
            out.pred += pred
            out.prob += prob
            if not out.examples:  # the first fold's: its sentences come first in the pooled lists
                out.shown = spread(len(test), 12)
                out.examples = [test.texts[i] for i in out.shown]
                out.weights = checkpoint_label(run.checkpoint)
        if len(folders) > 1:
            out.weights = f"the tested checkpoint of each of the {len(folders)} folds, each on its held-out fold"
        return [out]

    @torch.no_grad()
    def attention_views(self, run: TrainedRun, inputs: Sequence[Any] | None, *, max_inputs: int = 2,
                        queries: Sequence[tuple[int, int]] | None = None) -> list[Any]:
        model = run.model
        if queries is not None:
            raise InputError(f"queries (--query) choose BoTNet query pixels; run {run.run_dir} is a "
                             f"{self.name} run")
        if model.config.depth == 0:
            raise InputError(f"run {run.run_dir} cannot be visualized: its classifier has no attention layers "
                             f"(depth=0)")
        texts = check_texts(inputs, self.name) if inputs is not None else self._test_set(run).texts[:max_inputs]
        views = []
        for text in texts:
            batch = run.tokenizer.encode([text], max_length=run.recipe.text.max_length)  # one text: no padding
            device = next(model.parameters()).device
            with capture_attention(model, cpu=True) as maps:
                probs = model(batch["input_ids"].to(device), batch["attention_mask"].to(device)).float().softmax(-1)[0]
            p, c = probs.max(0)
            layers = [(name, calls[0][0]) for name, calls in maps.items() if calls]
            views.append(TokenAttention(f'"{shorten(text)}" -> {run.classes[int(c)]} ({float(p):.2f})',
                                        run.tokenizer.readable_tokens(batch["input_ids"][0]), layers))
        return views

