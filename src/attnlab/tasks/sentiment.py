"""Sentence polarity on MR: tokenizer trained on the training part, an attention
classifier trained by the engine, tested on a fixed split or by 10-fold cross-validation.

Protocols (``data.protocol``):

* ``"split"``: a fixed stratified 80/10/10 split; the dev part is evaluated during
  training (and picks ``checkpoints/best``), the test part once, at the end.
* ``"cv10"``: the standard MR protocol (Kim, 2014): 10 stratified folds; each fold is a
  complete run in ``fold_<k>/`` (its own tokenizer, trained on its nine training folds)
  tested on the held-out fold, with no model selection on it. ``results.json`` holds the
  mean and standard deviation of the ten test accuracies.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ..data.mr import load_mr, mr_folds, mr_split
from ..data.text import SentimentDataset
from ..data.tokenize import TextTokenizer
from ..engine import distributed
from ..errors import InputError
from ..io import atomic_write_bytes, read_json_mapping
from ..models import create_model
from ..recipes import Recipe
from .common import evaluate_model, load_weights, open_run, read_recipe, train_and_test, write_report_safely

CLASSES = ("negative", "positive")  # label 0, label 1


def build_tokenizer(recipe: Recipe, texts: Sequence[str]) -> TextTokenizer:
    """The recipe's ``text.tokenizer_file``, or a tokenizer trained on ``texts``."""
    t = recipe.text
    if t.tokenizer_file:
        return TextTokenizer.load(t.tokenizer_file)
    return TextTokenizer.train(texts, t.tokenizer, t.vocab_size, lowercase=t.lowercase, min_frequency=t.min_frequency)


def build_model(recipe: Recipe, tokenizer: TextTokenizer) -> nn.Module:
    options = {"max_len": recipe.text.max_length, **recipe.model.options}
    return create_model(recipe.model.name, vocab_size=tokenizer.vocab_size, num_classes=len(CLASSES), **options)


def _one_run(recipe: Recipe, run_dir: Path, texts: list[str], labels: list[int], train_idx: list[int],
             eval_idx: list[int] | None, test_idx: list[int], *, resume: bool, allow_changes: bool,
             log) -> dict[str, Any]:
    with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, log=log) as resume_from:
        return _train_one(recipe, run_dir, texts, labels, train_idx, eval_idx, test_idx, resume_from, log)


def _train_one(recipe: Recipe, run_dir: Path, texts: list[str], labels: list[int], train_idx: list[int],
               eval_idx: list[int] | None, test_idx: list[int], resume_from: Path | None, log) -> dict[str, Any]:
    pick = lambda idx: ([texts[i] for i in idx], [labels[i] for i in idx])  # noqa: E731
    tokenizer_path = run_dir / "tokenizer.json"
    if tokenizer_path.is_file():
        tokenizer = TextTokenizer.load(tokenizer_path)  # the resumed weights belong to this vocabulary
    else:
        tokenizer = build_tokenizer(recipe, pick(train_idx)[0])
        if distributed.is_main():
            tokenizer.save(tokenizer_path)
    length = recipe.text.max_length
    train = SentimentDataset(*pick(train_idx), tokenizer, length)
    test = SentimentDataset(*pick(test_idx), tokenizer, length)
    dev = SentimentDataset(*pick(eval_idx), tokenizer, length) if eval_idx is not None else test
    extra = {"classes": list(CLASSES), "train_size": len(train), "dev_size": len(dev) if dev is not test else 0,
             "test_size": len(test), "vocab_size": tokenizer.vocab_size}
    # A fold's report would repeat the cross-validation's top-level one, which covers all ten folds.
    return train_and_test(recipe, run_dir, lambda: build_model(recipe, tokenizer), train, dev, test,
                          resume_from=resume_from, log=log, extra=extra,
                          report=recipe.data.protocol == "split")


def run(recipe: Recipe, run_dir: str | Path, *, resume: bool = False, allow_changes: bool = False,
        log=print) -> dict[str, Any]:
    """Train and test ``recipe`` on MR into ``run_dir``; returns ``results.json``'s content
    (see :func:`~attnlab.tasks.common.open_run` for ``resume`` and ``allow_changes``)."""
    run_dir = Path(run_dir)
    texts, labels = load_mr(recipe.data.data_dir)
    if recipe.data.protocol == "split":
        train_idx, dev_idx, test_idx = mr_split(labels, seed=recipe.data.seed)
        return _one_run(recipe, run_dir, texts, labels, train_idx, dev_idx, test_idx, resume=resume,
                        allow_changes=allow_changes, log=log)
    # config.yaml and the lock at the top too; the folds hold the checkpoints
    with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, checkpoints=False, log=log):
        start = time.perf_counter()
        folds = []
        for k, (train_idx, test_idx) in enumerate(mr_folds(labels, 10, seed=recipe.data.seed)):
            fold_dir = run_dir / f"fold_{k}"
            done = fold_dir / "results.json"
            if resume and done.is_file() and not allow_changes:  # a finished fold of an interrupted cross-validation
                folds.append(read_json_mapping(done))
                continue
            log(f"fold {k + 1}/10: {len(train_idx)} training, {len(test_idx)} test sentences")
            fold_resume = resume and fold_dir.is_dir()
            folds.append(_one_run(recipe, fold_dir, texts, labels, train_idx, None, test_idx, resume=fold_resume,
                                  allow_changes=allow_changes, log=log))
            log(f"fold {k + 1}/10: test accuracy {100 * folds[-1]['test_accuracy']:.2f}%")
        accuracies = [f["test_accuracy"] for f in folds]
        results = {
            "protocol": "cv10", "test_accuracy": statistics.mean(accuracies),
            "test_accuracy_std": statistics.stdev(accuracies),
            "fold_accuracies": accuracies, "params": folds[0]["params"], "model": recipe.model.name,
            "train_seconds": sum(f["train_seconds"] for f in folds),
            "samples_per_s": statistics.mean(f["samples_per_s"] for f in folds),
            "steps": folds[0]["steps"], "wall_seconds": time.perf_counter() - start, "classes": list(CLASSES),
        }
        if distributed.is_main():
            atomic_write_bytes(run_dir / "results.json", json.dumps(results, indent=1).encode())
            write_report_safely(run_dir, log)
        return results


# ---------------------------------------------------------------------------- a finished run


def load_run(run_dir: str | Path, checkpoint: str = "auto") -> tuple[Recipe, TextTokenizer, nn.Module, Path]:
    """``(recipe, tokenizer, model in eval mode, checkpoint folder)`` of a sentiment run
    (for a cross-validation run: one of its ``fold_<k>`` folders)."""
    run_dir = Path(run_dir)
    recipe = read_recipe(run_dir)
    if not (run_dir / "tokenizer.json").is_file():
        hint = " (a cross-validation run: use one of its fold_<k> folders)" if (run_dir / "fold_0").is_dir() else ""
        raise InputError(f"run_dir must hold the run's tokenizer.json; {run_dir} has none{hint}")
    tokenizer = TextTokenizer.load(run_dir / "tokenizer.json")
    model = build_model(recipe, tokenizer)
    folder = load_weights(run_dir, model, checkpoint)
    return recipe, tokenizer, model.eval(), folder


def held_out_set(run_dir: str | Path, recipe: Recipe, tokenizer: TextTokenizer) -> SentimentDataset:
    """The sentences a run was tested on: the split's test part, or a fold folder's held-out fold."""
    run_dir = Path(run_dir)
    texts, labels = load_mr(recipe.data.data_dir)
    if recipe.data.protocol == "split":
        test_idx = mr_split(labels, seed=recipe.data.seed)[2]
    else:
        k = run_dir.name.removeprefix("fold_")
        if not k.isdigit() or not 0 <= int(k) < 10:
            raise InputError(f"run_dir of a cross-validation run must be a fold_<k> folder; got {run_dir}")
        test_idx = mr_folds(labels, 10, seed=recipe.data.seed)[int(k)][1]
    return SentimentDataset([texts[i] for i in test_idx], [labels[i] for i in test_idx], tokenizer,
                            recipe.text.max_length)


def evaluate_run(run_dir: str | Path, checkpoint: str = "auto", batch_size: int = 256,
                 device: str = "auto") -> dict[str, Any]:
    """Test loss and accuracy of a run's checkpoint on the sentences it was tested on
    (the split's test part, or a fold folder's held-out fold)."""
    recipe, tokenizer, model, folder = load_run(run_dir, checkpoint)
    test = held_out_set(run_dir, recipe, tokenizer)
    return {**evaluate_model(model, test, batch_size, device), "checkpoint": str(folder)}


@torch.no_grad()
def predict_texts(run_dir: str | Path, texts: Sequence[str], checkpoint: str = "auto",
                  batch_size: int = 256) -> list[tuple[str, float]]:
    """``(label, probability)`` for each text, in batches of ``batch_size``."""
    recipe, tokenizer, model, _ = load_run(run_dir, checkpoint)
    out: list[tuple[str, float]] = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer.encode(list(texts[start : start + batch_size]), max_length=recipe.text.max_length)
        probs = model(batch["input_ids"], batch["attention_mask"]).float().softmax(-1)
        p, i = probs.max(-1)
        out.extend((CLASSES[int(c)], float(q)) for q, c in zip(p, i))
    return out
