"""Text classification: a tokenizer trained on the training part, an attention
classifier trained by the engine, tested once.

Data (``data.name``):

* ``mr``: MR movie-review polarity (negative, positive), 10,662 sentences.
* ``file``: a CSV, TSV or JSON Lines file of one's own (``data.train``), with the
  columns ``data.text_column`` and ``data.label_column``; any number of classes, labels
  as strings or integers (the classes are the distinct labels, sorted). ``data.val`` and
  ``data.test`` name files of the same kind; without them ``data.val_size`` and
  ``data.test_size`` of the training rows are held out (stratified, ``data.seed``).

Protocols (``data.protocol``):

* ``"split"``: MR's fixed stratified 80/10/10 split, or a file's parts; the dev part is
  evaluated during training and picks ``checkpoints/best``, with which the test part is
  evaluated once, at the end.
* ``"cv10"``: the standard MR protocol (Kim, 2014): 10 stratified folds; each fold is a
  complete run in ``fold_<k>/`` (its own tokenizer, trained on its nine training folds)
  tested on the held-out fold with its final weights (no model selection). The top
  ``results.json`` holds the mean and standard deviation of the ten test accuracies.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple, Sequence

import torch

from ..attention.capture import capture_attention
from ..data.mr import load_mr, mr_folds, mr_split
from ..data.tables import read_labelled_texts
from ..data.text import MAX_LINE_CHARS, SentimentDataset
from ..data.tokenize import TextTokenizer, shorten
from ..engine import distributed
from ..engine.device import autocast, select_device
from ..engine.trainer import evaluate_model
from ..errors import InputError
from ..io import atomic_write_bytes, read_json_mapping
from .base import DataConfig, ModelConfig, Recipe, Task, TrainedRun, check_texts, register_task
from .image_classification import predict_labels, spread
from .splits import stratified_split
from .runs import checkpoint_label, fit_run, load_run, load_weights, open_run, test_run, write_results
from .views import ClassifierPredictions, LabelPrediction, TextAttention

__all__ = ["TextConfig", "TextDataConfig", "TextClassificationRecipe", "TextClassification", "build_tokenizer",
           "CLASSES"]

CLASSES = ("negative", "positive")  # MR: label 0, label 1
CLASSES_FILE = "classes.json"
FILE = {"only": ("file",)}  # a data key that applies to data.name=file alone


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
    name: Literal["mr", "file"] = "mr"
    # "split": a fixed split (dev picks checkpoints/best, test once); "cv10": 10 stratified folds.
    protocol: Literal["split", "cv10"] = "split"
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the split and the folds
    train: str | None = field(default=None, metadata=FILE)  # file: the labelled training texts (CSV, TSV, JSONL)
    val: str | None = field(default=None, metadata=FILE)  # file: validation texts (default: val_size of train)
    test: str | None = field(default=None, metadata=FILE)  # file: test texts (default: test_size of train)
    # file without data.val / data.test: rows of train held out, a count or a fraction below 1
    val_size: float = field(default=0.1, metadata={"min": 0.0, **FILE})
    test_size: float = field(default=0.1, metadata={"min": 0.0, **FILE})
    text_column: str = field(default="text", metadata=FILE)  # file: the column (JSONL: key) of the texts
    label_column: str = field(default="label", metadata=FILE)  # file: the column of the labels
    format: Literal["auto", "csv", "tsv", "jsonl"] = field(default="auto", metadata=FILE)  # auto: by extension
    skip_bad_rows: bool = field(default=False, metadata=FILE)  # file: skip rows without text or label (counted)
    # the longest line (and CSV field) read, in characters: a longer one is refused before it is held in memory
    max_line_chars: int = field(default=MAX_LINE_CHARS, metadata={"min": 1})

    def __post_init__(self) -> None:
        self.check_held_out(("val_size", "test_size"), "rows")
        self.check_applies()


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


@dataclass
class Corpus:
    """A text classification data set as one list: ``texts``, ``labels`` (class indices into
    ``classes``), the fixed ``split`` ``(train, dev or None, test)`` of row indices, and
    the rows ``pool`` that cross-validation folds over."""

    texts: list[str]
    labels: list[int]
    classes: list[str]
    split: tuple[list[int], list[int] | None, list[int]]
    pool: list[int]
    skipped: int = 0


class TextInfo(NamedTuple):
    """What a text classification run learns from its data: the model's options come from it."""

    tokenizer: TextTokenizer
    classes: list[str]


def _read(path: str, data: TextDataConfig) -> Any:
    return read_labelled_texts(path, data.text_column, data.label_column, format=data.format,
                               skip_bad_rows=data.skip_bad_rows, max_line_chars=data.max_line_chars)


def _indices(part: Any, classes: list[str], path: Any) -> list[int]:
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(part.labels) - set(index))
    if unknown:
        raise InputError(f"{path} has labels the training data lacks: {', '.join(map(repr, unknown[:5]))}"
                         f"{' ...' if len(unknown) > 5 else ''}; the classes are {', '.join(classes)}")
    return [index[label] for label in part.labels]


def load_corpus(data: TextDataConfig) -> Corpus:
    """The texts of ``data`` (MR, or one's own files), with the split and folds a run uses:
    a pure function of the recipe, so that evaluation finds the same test rows."""
    if data.name == "mr":
        texts, labels = load_mr(data.data_dir, max_line_chars=data.max_line_chars)
        return Corpus(texts, labels, list(CLASSES), mr_split(labels, seed=data.seed), list(range(len(texts))))
    if not data.train:
        raise InputError("data.train must name a CSV, TSV or JSON Lines file of labelled texts when data.name is "
                         "'file' (for example data.train=reviews.csv)")
    parts = {key: _read(path, data) for key, path in (("train", data.train), ("val", data.val), ("test", data.test))
             if path}
    classes = parts["train"].label_names()
    texts: list[str] = []
    labels: list[int] = []
    rows: dict[str, list[int]] = {}
    for key, part in parts.items():
        rows[key] = list(range(len(texts), len(texts) + len(part)))
        texts += part.texts
        labels += _indices(part, classes, part.path)
    train = torch.as_tensor(rows["train"])
    targets = torch.as_tensor(labels)
    if "test" in rows:
        test = rows["test"]
    else:
        keep, held = stratified_split(targets[train], data.test_size, data.seed, "data.test_size")
        if held is None:
            raise InputError("data.test_size must be above 0 when no data.test file is given")
        test, train = train[held].tolist(), train[keep]
    if "val" in rows:
        dev: list[int] | None = rows["val"]
    else:
        keep, held = stratified_split(targets[train], data.val_size, data.seed)
        dev = None if held is None else train[held].tolist()
        train = train[keep]
    return Corpus(texts, labels, classes, (train.tolist(), dev, test), rows["train"],
                  sum(p.skipped for p in parts.values()))


def _folds(corpus: Corpus, seed: int) -> list[tuple[list[int], list[int]]]:
    """The 10 stratified folds over the corpus's pool, as row indices."""
    pool = corpus.pool
    return [([pool[i] for i in tr], [pool[i] for i in te])
            for tr, te in mr_folds([corpus.labels[i] for i in pool], 10, seed=seed)]


def _test_indices(recipe: TextClassificationRecipe, run_dir: Path, corpus: Corpus) -> list[int]:
    """The rows a run was tested on: the split's test part, or a fold's held-out fold."""
    if recipe.data.protocol == "split":
        return corpus.split[2]
    return _folds(corpus, recipe.data.seed)[_fold_of(run_dir)][1]


@register_task
class TextClassification(Task):
    name = "text_classification"
    recipe_class = TextClassificationRecipe
    summary = "classify texts: MR movie-review polarity, or a CSV/TSV/JSONL file of one's own"
    inputs = "texts"
    sample_unit = "sentences"
    fixed_on_resume = ("task", "data.name", "data.protocol", "data.seed", "data.train", "data.val", "data.test",
                       "data.val_size", "data.test_size", "data.text_column", "data.label_column", "model", "text",
                       "train.optimizer")
    legacy_keys = ("translate", "data.augment", "data.source", "data.target", "text.joint_vocab")

    def model_options(self, recipe: Recipe, info: TextInfo | None = None) -> dict[str, Any]:
        """``vocab_size`` and ``num_classes`` from the data (``None``: the recipe's vocabulary
        size and, for a file whose labels are not read yet, 2 classes), and ``max_len``."""
        if info is None:
            vocab, classes = recipe.text.vocab_size, len(CLASSES)
        else:
            vocab, classes = info.tokenizer.vocab_size, len(info.classes)
        return {"vocab_size": vocab, "num_classes": classes, "max_len": recipe.text.max_length}

    def describe(self, recipe: Recipe) -> str:
        where = "MR" if recipe.data.name == "mr" else Path(recipe.data.train or "").name
        return f"{where}, " + ("10-fold cross-validation" if recipe.data.protocol == "cv10" else "fixed split")

    # ------------------------------------------------------------------ training
    def train(self, recipe: Recipe, run_dir: str | Path, *, resume: bool = False, allow_changes: bool = False,
              log: Callable[[str], None] = print) -> dict[str, Any]:
        run_dir = Path(run_dir)
        corpus = load_corpus(recipe.data)  # before a run directory is made: a bad file is named at once
        if corpus.skipped:
            log(f"data: skipped {corpus.skipped} rows without a text or a label (data.skip_bad_rows)")
        if recipe.data.name == "file":
            counts = torch.bincount(torch.as_tensor(corpus.labels), minlength=len(corpus.classes)).tolist()
            shown = ", ".join(f"{c} {n}" for c, n in list(zip(corpus.classes, counts))[:8])
            log(f"data: {len(corpus.texts)} texts, {len(corpus.classes)} classes ({shown}"
                f"{' ...' if len(corpus.classes) > 8 else ''})")
        if recipe.data.protocol == "split":
            train_idx, dev_idx, test_idx = corpus.split
            with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, log=log) as resume_from:
                return self._train_one(recipe, run_dir, corpus, train_idx, dev_idx, test_idx, resume_from, log)
        # config.yaml and the lock at the top too; the folds hold the checkpoints
        with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, checkpoints=False, log=log):
            start = time.perf_counter()
            folds = []
            for k, (train_idx, test_idx) in enumerate(_folds(corpus, recipe.data.seed)):
                fold_dir = run_dir / f"fold_{k}"
                done = fold_dir / "results.json"
                if resume and done.is_file() and not allow_changes:  # a finished fold of an interrupted run
                    folds.append(read_json_mapping(done))
                    continue
                log(f"fold {k + 1}/10: {len(train_idx)} training, {len(test_idx)} test sentences")
                with open_run(recipe, fold_dir, resume=resume and fold_dir.is_dir(), allow_changes=allow_changes,
                              log=log, parent=run_dir) as resume_from:
                    folds.append(self._train_one(recipe, fold_dir, corpus, train_idx, None, test_idx,
                                                 resume_from, log))
                log(f"fold {k + 1}/10: test accuracy {100 * folds[-1]['test_accuracy']:.2f}%")
            accuracies = [f["test_accuracy"] for f in folds]
            results = {
                "protocol": "cv10", "test_accuracy": statistics.mean(accuracies),
                "test_accuracy_std": statistics.stdev(accuracies), "fold_accuracies": accuracies,
                "test_checkpoint": "last (of each fold)", "params": folds[0]["params"], "model": recipe.model.name,
                "train_seconds": sum(f["train_seconds"] for f in folds),
                "samples_per_s": statistics.mean(f["samples_per_s"] for f in folds),
                "steps": folds[0]["steps"], "wall_seconds": time.perf_counter() - start, "classes": corpus.classes,
            }
            write_results(run_dir, results)
            return results

    def _train_one(self, recipe: Recipe, run_dir: Path, corpus: Corpus, train_idx: list[int],
                   dev_idx: list[int] | None, test_idx: list[int], resume_from: Path | None,
                   log: Callable[[str], None]) -> dict[str, Any]:
        pick = lambda idx: ([corpus.texts[i] for i in idx], [corpus.labels[i] for i in idx])  # noqa: E731
        if distributed.is_main():
            atomic_write_bytes(run_dir / CLASSES_FILE, json.dumps({"classes": corpus.classes}, indent=1).encode())
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
        build = lambda: self.build_model(recipe, TextInfo(tokenizer, corpus.classes))  # noqa: E731
        results = fit_run(recipe, run_dir, build, train, dev, resume_from=resume_from, log=log,
                          classes=corpus.classes)
        tested, _ = test_run(recipe, run_dir, build, test)
        results = {**tested, **results, "classes": corpus.classes, "train_size": len(train),
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
        if (run_dir / CLASSES_FILE).is_file():
            classes = read_json_mapping(run_dir / CLASSES_FILE).get("classes")
            if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
                raise InputError(f"{run_dir / CLASSES_FILE} must hold {{\"classes\": [names]}}; got {classes!r}")
        elif recipe.data.name == "mr":  # runs of older attnlab
            classes = list(CLASSES)
        else:
            raise InputError(f"run_dir must hold {CLASSES_FILE} (the class names); {run_dir} has none")
        model = self.build_model(recipe, TextInfo(tokenizer, classes))
        folder = load_weights(run_dir, model, checkpoint)
        return TrainedRun(self, run_dir, recipe, model.eval(), folder, classes=classes, tokenizer=tokenizer)

    def _test_set(self, run: TrainedRun) -> SentimentDataset:
        corpus = load_corpus(run.recipe.data)
        idx = _test_indices(run.recipe, run.run_dir, corpus)
        return SentimentDataset([corpus.texts[i] for i in idx], [corpus.labels[i] for i in idx], run.tokenizer,
                                run.recipe.text.max_length)

    def _file_set(self, run: TrainedRun, path: str | Path) -> SentimentDataset:
        """A labelled file of one's own, read with the run's column names, as the run's classes."""
        part = _read(str(path), run.recipe.data)
        return SentimentDataset(part.texts, _indices(part, run.classes, part.path), run.tokenizer,
                                run.recipe.text.max_length)

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
        out: list[LabelPrediction] = []
        for start in range(0, len(inputs), batch_size):
            chunk = list(inputs[start : start + batch_size])
            batch = run.tokenizer.encode(chunk, max_length=run.recipe.text.max_length,
                                         length_hint=_read_as_trained(run))
            device = run.device
            with autocast(device, run.precision):
                logits = run.model(batch["input_ids"].to(device), batch["attention_mask"].to(device))
            probs = logits.float().softmax(-1).cpu()
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
        out = ClassifierPredictions([], [], [], [], "")
        for folder in folders:
            run = load_run(folder)
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
