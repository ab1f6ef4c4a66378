"""What every task does with a run directory: the one training skeleton (:func:`train`:
read the data, claim the run directory, fit with the engine, test once, write
``results.json``), and a finished run read back as one object (:func:`load_run`).

One meaning of "test": model selection ("best") uses a validation split, never the test
set; the test set is evaluated once, at the end, with the weights ``results.json`` names
in ``test_checkpoint``, and :meth:`TrainedRun.evaluate` recomputes the same figures.
The files of a run are read and written by :mod:`.run_files`; the run directory is
claimed by :mod:`.claim`.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import yaml
from torch import nn

from ..data.source import Splits
from ..data.tokenizers.text import TextTokenizer
from ..engine import distributed
from ..engine.checkpoint import checkpoint_base, checkpoint_label
from ..engine.device import select_device
from ..engine.rundir import RunLock
from ..engine.sharding import is_sharded, whole_copy
from ..engine.trainer import Trainer, evaluate_model
from ..errors import InputError
from ..io import atomic_write_bytes, read_json_mapping
from ..models import count_parameters
from .recipe import Recipe, recipe_dict, require_model
from .task import Prepared, Task, get_task, recipe_from_dict
from .trained import TrainedRun
from .claim import check_resume, open_run
from .files import (CHANGES, CONFIG, RESULTS, check_checkpoint, read_config, read_recipe, read_results,
                        recipe_changes, resolve_weights, train_config, write_results)
from .weights import base_reference, fine_tuning, init_weights, load_base, load_weights

__all__ = ["CONFIG", "CHANGES", "RESULTS", "train", "open_run", "fit_run", "test_run", "finish_run", "write_results",
           "read_config", "read_recipe", "read_results", "recipe_changes", "load_run", "report_items", "load_weights",
           "resolve_weights", "checkpoint_label", "UnfinishedRunWarning", "preflight", "PREFLIGHT_SAMPLES"]


def load_run(run_dir: str | Path, checkpoint: str = "auto", *, device: str = "cpu") -> TrainedRun:
    """A finished run as one object: its recipe, its task, its model (in eval mode, on
    ``device``: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``auto``) with the weights of
    ``checkpoint``, its preprocessing and class names::

        run = attnlab.load_run("runs/photos")
        run.predict(["cat.jpg", PIL.Image.open("dog.png")], top_k=3)   # [LabelPrediction(input, labels), ...]

    ``checkpoint``: ``"auto"`` (the weights its test figures in ``results.json`` come
    from; else averaged > best > last), ``"best"``, ``"last"``, ``"averaged"`` or a
    checkpoint folder. For a cross-validation run, load one of its ``fold_<k>`` folders."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "is a file, not a run directory" if run_dir.exists() else "does not exist"
        raise InputError(f"run_dir must be a run directory; {run_dir} {what}")
    checkpoint = check_checkpoint(checkpoint)  # before the model is built
    recipe = read_recipe(run_dir)
    task = get_task(recipe.task)
    pre = task.preprocessing(run_dir, recipe)
    model = task.build_model(recipe, pre.info)  # built once: the recipe was checked when the run trained
    folder = load_weights(run_dir, model, checkpoint)
    run = TrainedRun(task, run_dir, recipe, model.eval(), folder, classes=pre.classes, tokenizer=pre.tokenizer,
                     target_tokenizer=pre.target_tokenizer, image=pre.image)
    run.model.to(select_device(device))
    if not (run_dir / RESULTS).is_file():
        warnings.warn(UnfinishedRunWarning(
            f"{run_dir} is a run that has not finished (no {RESULTS}): loaded {checkpoint_label(run.checkpoint)} of "
            f"train.steps={recipe.train.steps}; continue it with: attnlab train --run-dir {run_dir} --resume"),
            stacklevel=2)
    return run


def report_items(run_dir: str | Path | TrainedRun, *, device: str = "auto") -> list[Any]:
    """What a run's task shows in its report (:meth:`Task.report_items`), given the run
    loaded (``run_dir`` may be the loaded run itself), or its sub-runs (the folds of a
    cross-validation)."""
    if isinstance(run_dir, TrainedRun):
        return run_dir.task.report_items([run_dir], device=device)
    run_dir = Path(run_dir)
    task = get_task(read_recipe(run_dir).task)
    return task.report_items([load_run(folder, device=device) for folder in task.sub_runs(run_dir) or [run_dir]],
                             device=device)


class UnfinishedRunWarning(UserWarning):
    """:func:`load_run` loaded a run that has not finished training (it has no results)."""


# ----------------------------------------------------------------------------- training and testing


def check_batch_fits(train_set: Any, batch_size: int, world: int) -> None:
    """Refuse, naming ``train.batch_size`` and the largest that fits, a training set of fewer
    samples than one global batch (``batch_size`` a process, ``world`` processes); a data set
    says what its samples are with ``sample_note`` (a language model's windows of
    ``text.context`` tokens)."""
    size = len(train_set)
    if size >= batch_size * world:
        return
    what = getattr(train_set, "sample_note", "samples")
    processes = f" x {world} processes" if world > 1 else ""
    fits = size // world
    advice = (f"give train.batch_size={fits} or less, or more data" if fits else
              f"give it more data{' or fewer processes' if world > 1 else ''}")
    raise InputError(f"train.batch_size={batch_size}{processes}: the training data has {size:,} samples ({what}), "
                     f"fewer than one batch; {advice}")


def fit_run(recipe: Recipe, run_dir: Path, build_model: Callable[[], nn.Module], train_set: Any, val_set: Any, *,
        resume_from: Path | None, log: Callable[[str], None], classes: Sequence[str] | None = None,
        before_first_step: Callable[[nn.Module, torch.device, str], None] | None = None) -> dict[str, Any]:
    """Train on ``train_set``, evaluating on the validation set ``val_set`` (``None``:
    none) every ``train.eval_every`` steps and at the end, which keeps ``checkpoints/best``.
    ``build_model`` runs after seeding, so the initial weights are a function of
    ``train.seed``. ``model.checkpoint`` initializes it (``classes``: the run's class names,
    which decide whether a source run's head fits). ``before_first_step(model, device,
    precision)`` runs once the trainer holds the model and before it trains (the skeleton's
    :func:`preflight`). Returns the training figures of ``results.json``. A training set of
    fewer samples than one batch is refused before the model is built, saying what fits."""
    check_batch_fits(train_set, recipe.train.batch_size, distributed.world_size())
    torch.manual_seed(recipe.train.seed)
    model = build_model()
    base = None
    if recipe.model.lora is not None:  # checkpoints keep the adapters and the head; the rest is model.checkpoint's
        assert recipe.model.checkpoint is not None  # Task.check
        base = base_reference(recipe.model.checkpoint)
        if resume_from is not None:  # the adapters go back on the weights they were trained on, checked
            recorded = checkpoint_base(resume_from)
            load_base(model, recorded if recorded is not None else base, resume_from)
    if resume_from is None and recipe.model.checkpoint:
        convert, inputs = recipe.model.convert_attention, []
        if convert is not None and convert.to == "latent" and convert.calibrate:
            inputs = get_task(recipe.task).calibration_inputs(train_set, convert.calibrate)
        fresh = init_weights(model, recipe.model.checkpoint, classes, convert, inputs)
        log(f"initial weights: {recipe.model.checkpoint}"
            + (f"; its classifier head does not fit this task's classes and is replaced ({', '.join(fresh)} start "
               f"fresh)" if fresh else ""))
    lr_scales = fine_tuning(model, recipe.model, log, classifier=get_task(recipe.task).outputs == "labels")
    trainer = Trainer(model, train_set, train_config(recipe, run_dir), eval_data=val_set, run_dir=run_dir, log=log,
                      lr_scales=lr_scales, base=base)
    if resume_from is not None:
        trainer.resume(resume_from)
    start = time.perf_counter()
    try:
        if before_first_step is not None:
            before_first_step(model, trainer.device, trainer.precision)
        out = trainer.fit()
        trainer.save()
        cfg = recipe.train
        evaluated = "accuracy" in out and cfg.eval_every and trainer.step % cfg.eval_every == 0  # the final weights
        if val_set is not None and not evaluated:
            trainer.record_evaluation(trainer.evaluate(val_set))  # the final weights compete for best too
    finally:
        trainer.close()
    distributed.barrier()  # checkpoints/best is complete before any rank reads it
    return {"best_val_accuracy": trainer.best, "params": count_parameters(model),
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "train_seconds": out["train_seconds"], "samples_per_s": out["samples_per_s"], "steps": out["steps"],
            "fit_wall_seconds": time.perf_counter() - start, "model": recipe.model.name,
            "precision": out["precision"], **({"stopped": out["stopped"]} if out["stopped"] else {})}


def test_run(recipe: Recipe, run_dir: Path, build_model: Callable[[], nn.Module], test_set: Any,
         checkpoint: str = "auto") -> tuple[dict[str, Any], nn.Module]:
    """Evaluate the test set once, with the weights of ``checkpoint`` (``"auto"``: best
    on validation when the run kept one, else last), exactly as ``attnlab eval`` does.
    Returns ``({test_accuracy, test_loss, test_checkpoint, test_samples}, model)``."""
    which = checkpoint if checkpoint != "auto" else ("best" if (run_dir / "checkpoints" / "best").is_dir() else "last")
    model = build_model()
    load_weights(run_dir, model, which)
    cfg = train_config(recipe, run_dir)
    res = evaluate_model(model, test_set, batch_size=cfg.batch_size, device=distributed.local_device(cfg.device),
                         precision=cfg.precision, channels_last=cfg.channels_last)
    return {"test_accuracy": res["accuracy"], "test_loss": res["loss"], "test_checkpoint": which,
            "test_samples": res["samples"]}, model


def finish_run(run_dir: str | Path, recipe: Recipe, *, classes: Sequence[str] | None = None,
               tokenizer: TextTokenizer | None = None, target_tokenizer: TextTokenizer | None = None,
               test_data: Any = None, evaluate: bool = True, checkpoint: str = "auto") -> dict[str, Any]:
    """Make the folder a :class:`~attnlab.engine.trainer.Trainer` trained into (its
    ``checkpoints/`` and ``metrics.jsonl``) a full run directory, which ``load_run`` and
    every command (``predict``, ``eval``, ``report``, ``visualize``, ``export``) accept:
    ``config.yaml`` from ``recipe`` (whose ``model`` must describe the trained model),
    the preprocessing (``classes``, ``tokenizer``; ``target_tokenizer`` for translation) and
    ``results.json``, with the test figures of ``test_data`` (a data set as the trainer
    reads it), or of the recipe's own test set (``evaluate``), for the weights of
    ``checkpoint``. Returns the results. ``attnlab report RUN_DIR`` then writes its report::

        trainer = Trainer(model, train, recipe.train, run_dir="runs/mine"); trainer.fit(); trainer.save()
        finish_run("runs/mine", recipe, classes=classes, test_data=test)
    """
    run_dir = Path(run_dir)
    if not (run_dir / "checkpoints").is_dir():
        raise InputError(f"run_dir must hold the checkpoints a Trainer wrote (Trainer(..., run_dir=...), "
                         f"trainer.save()); {run_dir} has no checkpoints/")
    recipe = recipe_from_dict(recipe_dict(recipe))  # checked as a recipe file would be
    task = get_task(recipe.task)
    with RunLock(run_dir):
        atomic_write_bytes(run_dir / CONFIG, yaml.safe_dump(recipe_dict(recipe), sort_keys=False).encode())
        task.save_preprocessing(run_dir, recipe, classes=classes, tokenizer=tokenizer,
                                target_tokenizer=target_tokenizer)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnfinishedRunWarning)  # its results are what this call writes
            run = load_run(run_dir, checkpoint)
        results: dict[str, Any] = {"model": recipe.model.name, "params": count_parameters(run.model),
                                   "test_checkpoint": checkpoint if checkpoint != "auto" else run.checkpoint.name}
        if classes is not None:
            results["classes"] = list(classes)
        if test_data is not None:
            cfg = recipe.train
            res = evaluate_model(run.model, test_data, batch_size=cfg.batch_size, precision=run.precision,
                                 channels_last=cfg.channels_last)
            results.update(test_accuracy=res["accuracy"], test_loss=res["loss"], test_samples=res["samples"])
        elif evaluate:
            results.update(run.evaluate())
        write_results(run_dir, results)
    return results


# ----------------------------------------------------------------------------- the training skeleton


def train(recipe: Recipe, run_dir: str | Path, *, resume: bool = False, allow_changes: bool = False,
          log: Callable[[str], None] = print,
          finish: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train ``recipe`` into ``run_dir`` and return what it writes to ``results.json``: the
    one skeleton of every task, whose steps the task fills in (see :class:`Task`)::

        data = task.read_data(recipe)          # before the run directory is made
        with open_run(recipe, run_dir):        # claimed, config.yaml written, resume checked
            prepared = task.prepare(...)       # preprocessing written (or read back), data sets
            fit_run(...)                       # the engine trains; checkpoints/best on validation
            test_run(..., task.test_weights()) # the test set, once
            task.score(...)                    # the task's own figures (BLEU, exact match)
            write_results(...)

    A task whose :meth:`Task.folds` splits the run trains each fold as a complete run in
    its own folder (a resumed run keeps the finished ones) and writes the
    :meth:`Task.combine` of their results at the top. ``finish``: called with the results (on
    rank 0 under torchrun) while the run directory is still locked, so that nothing resumes the
    run before its last file is written (the command line writes its report there)."""
    task = get_task(recipe.task)
    run_dir = Path(run_dir)
    require_model(recipe)
    if resume:  # every rank reads the same files and refuses alike, before the data is read (minutes, for some)
        check_resume(recipe, run_dir, allow_changes)
    data = task.read_data(recipe, log)
    folds = task.folds(recipe, data)
    if folds is None:
        with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, log=log) as resume_from:
            results = _train_one(task, recipe, run_dir, data, resume_from, log)
            if finish is not None and distributed.is_main():
                finish(results)
            return results
    # config.yaml and the lock at the top too; the folds hold the checkpoints
    with open_run(recipe, run_dir, resume=resume, allow_changes=allow_changes, checkpoints=False, log=log):
        start = time.perf_counter()
        results = []
        for k, (name, part, note) in enumerate(folds):
            sub = run_dir / name
            if resume and (sub / RESULTS).is_file() and not allow_changes:  # a finished fold of an interrupted run
                results.append(read_json_mapping(sub / RESULTS))
                continue
            log(f"{name} ({k + 1}/{len(folds)}): {note}")
            with open_run(recipe, sub, resume=resume and sub.is_dir(), allow_changes=allow_changes, log=log,
                          parent=run_dir) as resume_from:
                results.append(_train_one(task, recipe, sub, part, resume_from, log))
            log(f"{name} ({k + 1}/{len(folds)}): " + ", ".join(f"{key} {value}"
                                                                for key, value in task.metric_rows(results[-1])))
        combined = {**task.combine(recipe, results), "wall_seconds": time.perf_counter() - start}
        write_results(run_dir, combined)
        if finish is not None and distributed.is_main():
            finish(combined)
        return combined


def _train_one(task: Task, recipe: Recipe, run_dir: Path, data: Any, resume_from: Path | None,
               log: Callable[[str], None]) -> dict[str, Any]:
    """One run in a claimed directory: prepare, preflight, fit, test, score, write its results."""
    prepared = task.prepare(recipe, run_dir, data, log)
    if prepared.val is not None and len(prepared.val) == 0:  # a source's empty validation part: no validation
        prepared.val = None
    build = lambda: task.build_model(recipe, prepared.info)  # noqa: E731
    check = lambda model, device, precision: preflight(  # noqa: E731
        task, recipe, run_dir, model, prepared, data, device=device, precision=precision, log=log)
    fitted = fit_run(recipe, run_dir, build, prepared.train, prepared.val, resume_from=resume_from, log=log,
                     classes=prepared.classes, before_first_step=check)
    tested, model = test_run(recipe, run_dir, build, prepared.test, task.test_weights(recipe, run_dir, log))
    prepared.tested = tested
    results = {**tested, **fitted, **({"classes": prepared.classes} if prepared.classes is not None else {}),
               **prepared.facts}
    if distributed.is_main():
        results.update(task.score(recipe, run_dir, model, prepared, data, log))
    write_results(run_dir, results)
    return results


# ----------------------------------------------------------------------------- the preflight

PREFLIGHT_SAMPLES = 4  # test examples the preflight evaluates and scores


class _Head:
    """The first ``n`` items of a data set, read as the data set reads them (``get_batch``
    too); its other attributes (a language model's characters per token, the reversal
    demo's strings) are the data set's."""

    def __init__(self, data: Any, n: int) -> None:
        self.data, self.n = data, min(n, len(data))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.data[i % self.n]

    def __getattr__(self, name: str) -> Any:
        if name == "get_batch" and not hasattr(self.data, "get_batch"):
            raise AttributeError(name)
        return getattr(self.data, name)


def _head_of_splits(data: Any, n: int) -> Any:
    """``data`` with its test part cut to the first ``n`` examples, when it is a source's
    :class:`~attnlab.data.source.Splits` whose test part is a list; else ``data``."""
    if isinstance(data, Splits) and isinstance(data.test, (list, tuple)):
        return dataclasses.replace(data, test=data.test[:n])
    return data


def preflight(task: Task, recipe: Recipe, run_dir: Path, model: nn.Module, prepared: Prepared, data: Any, *,
              device: torch.device, precision: str, log: Callable[[str], None] = print,
              n: int = PREFLIGHT_SAMPLES) -> float:
    """Before the first training step, what the run does after its last one, on ``n`` test
    examples with the freshly built (or resumed) ``model``: the run's preprocessing read back
    from ``run_dir`` as a finished run reads it, the test evaluation (the engine's loss and
    accuracy; the validation part's too, on as many examples) and the task's :meth:`~Task.score` (BLEU, samples of the ``generate`` section;
    its files go to a temporary folder). A run that would fail at its end fails here, in its
    first seconds, with nothing trained to lose: an error the user can act on
    (:class:`~attnlab.errors.InputError`) is said as what the run will need after training.
    The random state and the model's mode are left as they were, so that the steps that
    follow are those of a run without it. First, :meth:`~Task.check_prepared`: the model and the
    preprocessing agree (a language model's tokenizer and embedding). Returns the seconds it took."""
    start = time.perf_counter()
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    was_training = model.training
    small = dataclasses.replace(prepared, test=_Head(prepared.test, n),
                                val=None if prepared.val is None else _Head(prepared.val, n), tested=None)
    task.check_prepared(recipe, run_dir, model, prepared, log)  # the model and the preprocessing agree (vocabulary)
    try:
        task.preprocessing(run_dir, recipe)  # what load_run reads back: tokenizers, classes
        for part in (small.test, small.val):
            if part is not None:
                evaluate_model(model, part, batch_size=recipe.train.batch_size, device=device, precision=precision,
                               channels_last=recipe.train.channels_last)
        scored = model
        if is_sharded(model):  # scoring reads weights outside the forward: rank 0 scores a whole copy
            scored = whole_copy(model, lambda: task.build_model(recipe, prepared.info))
        if distributed.is_main():
            with tempfile.TemporaryDirectory(prefix="attnlab-preflight-") as folder:
                task.score(recipe, Path(folder), scored, small, _head_of_splits(data, n), lambda _: None)
    except InputError as exc:
        raise InputError(f"the run would fail after training (checked before its first step, on {n} test "
                         f"examples): {exc}") from None
    finally:
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        model.train(was_training)
        for module in model.modules():  # weights joined for decoding: training changes them, and they take memory
            for key in [k for k in module.__dict__ if k.startswith("_fused_")]:
                del module.__dict__[key]
    seconds = time.perf_counter() - start
    log(f"preflight: the evaluation and the task's scoring ran on {small.test.n} test examples "
        f"({seconds:.1f} s)")
    return seconds
