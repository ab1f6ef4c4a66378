"""What every task does with a run directory: claim it, write the config, train with the
engine, test once, write ``results.json``; and read a finished run back.

A run directory is never overwritten by another run: :func:`open_run` holds its lock
for the whole training, refuses a new run in a folder that holds one, and on
``--resume`` compares the recipe with the run's own before anything is written. A
change that the run cannot continue with (the task's ``fixed_on_resume`` keys: task,
data, model, tokenizer, optimizer) is refused; another one (more steps, another learning
rate) only with ``allow_changes``, and it is recorded in ``config.changes.yaml`` beside
the untouched ``config.yaml``.

One meaning of "test": model selection ("best") uses a validation split, never the test
set; the test set is evaluated once, at the end, with the weights ``results.json`` names
in ``test_checkpoint``, and :meth:`TrainedRun.evaluate` recomputes the same figures.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
import yaml
from torch import nn

from ..engine import distributed
from ..engine.checkpoint import checkpoint_step, load_checkpoint, load_weights_into, resolve_checkpoint
from ..engine.config import ConfigError
from ..engine.device import select_device
from ..engine.metrics import read_metrics
from ..engine.resolved import (RESOLVED, Resolution, precision_problem, read_resolutions, resolve_run, run_precision,
                               write_resolutions)
from ..engine.rundir import RunDirError, RunLock, inspect_run_dir, make_run_dir
from ..data.tokenize import TextTokenizer
from ..engine.trainer import TrainConfig, Trainer, evaluate_model
from ..errors import InputError
from ..io import atomic_write_bytes, read_json_mapping, read_state_dict, read_yaml_mapping
from ..models import count_parameters
from ..models.checkpoint import classifier_name, load_pretrained
from .base import ModelConfig, Recipe, TrainedRun, get_task, recipe_dict, recipe_from_dict

__all__ = ["CONFIG", "CHANGES", "RESULTS", "open_run", "fit_run", "test_run", "finish_run", "write_results", "read_config", "read_recipe",
           "read_results", "recipe_changes", "load_run", "load_weights", "resolve_weights", "checkpoint_label"]

CONFIG = "config.yaml"
"""A run's resolved recipe, every default filled in; written once, never rewritten."""
CHANGES = "config.changes.yaml"
"""The settings changed on a resume with ``--allow-changes``, each with the step it took effect."""
RESULTS = "results.json"
"""A run's results: test figures, parameters, time, throughput, precision, classes."""
# Keys that do not change what is trained: they may differ on resume without --allow-changes.
FREE_ON_RESUME = ("description", "train.device", "train.progress", "train.progress_seconds")
# What a run writes that is worth keeping: a folder holding any of these is never taken by a new run.
_KEEP = ("results.json", "checkpoints/best")


def _matches(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-3}}`` -> ``{"train.lr": 1e-3}`` (lists stay whole)."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


_UNSET = "(unset)"


def recipe_changes(old: Recipe, new: Recipe) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old value, new value)}`` where two recipes differ."""
    a, b = _flatten(recipe_dict(old)), _flatten(recipe_dict(new))
    return {k: (a.get(k, _UNSET), b.get(k, _UNSET)) for k in sorted(a.keys() | b.keys())
            if a.get(k, _UNSET) != b.get(k, _UNSET)}


def _show(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in changes.items())


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    for part in path:
        data = data.setdefault(part, {})
    if value == _UNSET:
        data.pop(last, None)
    else:
        data[last] = value


# ----------------------------------------------------------------------------- reading a run


def read_config(run_dir: str | Path) -> dict[str, Any]:
    """``config.yaml`` with every change of ``config.changes.yaml`` applied, in order."""
    run_dir = Path(run_dir)
    data = read_yaml_mapping(run_dir / CONFIG)
    for record in _read_changes(run_dir):
        for key, change in record["changed"].items():
            _set_dotted(data, key, change["to"])
    return data


def _read_changes(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``config.changes.yaml`` (none when the run was never changed)."""
    path = run_dir / CHANGES
    if not path.exists():
        return []
    try:
        records = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"{path} cannot be read: {exc}") from None
    if not isinstance(records, list) or not all(
            isinstance(r, dict) and isinstance(r.get("changed"), dict)
            and all(isinstance(c, dict) and "to" in c for c in r["changed"].values()) for r in records):
        raise InputError(f"{path} is damaged: expected a list of {{step, time, changed: {{key: {{from, to}}}}}} "
                         f"records")
    return records


def read_recipe(run_dir: str | Path) -> Recipe:
    """The resolved recipe a run directory trains with: its ``config.yaml`` and the
    changes recorded on resume. ``InputError`` naming the file when it is missing,
    empty or not a valid recipe. A run of an older attnlab loads too (its task's old
    name and the sections of other tasks that it carried are converted)."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).exists():
        raise InputError(f"run_dir must be an attnlab run directory with {CONFIG}; {run_dir} has none")
    try:
        return recipe_from_dict(read_config(run_dir), legacy=True)
    except InputError as exc:
        raise InputError(f"{run_dir / CONFIG} is not a valid recipe: {exc}") from None


def read_results(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's ``results.json``; ``None`` while the run has not finished."""
    path = Path(run_dir) / RESULTS
    return read_json_mapping(path) if path.exists() else None


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
        raise InputError(f"run_dir must be a run directory; {run_dir} does not exist")
    recipe = read_recipe(run_dir)
    run = get_task(recipe.task).load(run_dir, recipe, checkpoint)
    run.model.to(select_device(device))
    if not (run_dir / RESULTS).is_file():
        warnings.warn(UnfinishedRunWarning(
            f"{run_dir} is a run that has not finished (no {RESULTS}): loaded {checkpoint_label(run.checkpoint)} of "
            f"train.steps={recipe.train.steps}; continue it with: attnlab train --run-dir {run_dir} --resume"),
            stacklevel=2)
    return run


class UnfinishedRunWarning(UserWarning):
    """:func:`load_run` loaded a run that has not finished training (it has no results)."""


def resolve_weights(run_dir: Path, checkpoint: str = "auto") -> str:
    """``"auto"`` -> the checkpoint ``results.json`` was tested with (``test_checkpoint``),
    else the first of averaged, best, last that the run has; other names pass through."""
    if checkpoint != "auto":
        return checkpoint
    results = read_results(run_dir) if (run_dir / RESULTS).is_file() else None
    if results is not None:
        # Runs of attnlab before test_checkpoint: translations named bleu_checkpoint, the rest tested "last".
        named = results.get("test_checkpoint", results.get("bleu_checkpoint", "last"))
        if isinstance(named, str) and ((run_dir / "checkpoints" / named).is_dir() or named == "last"):
            return named
    return next((n for n in ("averaged", "best") if (run_dir / "checkpoints" / n).is_dir()), "last")


def checkpoint_label(folder: Path) -> str:
    """``checkpoint best (step 1200)``: which weights, for captions."""
    manifest = folder / "manifest.json"
    step = read_json_mapping(manifest).get("step") if manifest.is_file() else None
    return f"checkpoint {folder.name}" + (f" (step {step})" if step is not None else "")


def load_weights(run_dir: str | Path, model: nn.Module, checkpoint: str = "auto") -> Path:
    """Load a run's checkpoint into ``model`` (EMA weights when the run kept them) and
    return its folder; see :func:`resolve_weights` for ``checkpoint``."""
    run_dir = Path(run_dir)
    folder = resolve_checkpoint(run_dir / "checkpoints", resolve_weights(run_dir, checkpoint))
    weights, state = load_checkpoint(folder)
    load_weights_into(model, state.get("ema") or weights, folder)
    return folder


# ----------------------------------------------------------------------------- claiming a run directory


def _record_changes(run_dir: Path, changes: dict[str, tuple[Any, Any]], step: int) -> None:
    path = run_dir / CHANGES
    records = _read_changes(run_dir)
    records.append({"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "changed": {k: {"from": a, "to": b} for k, (a, b) in changes.items()}})
    atomic_write_bytes(path, yaml.safe_dump(records, sort_keys=False).encode())


def _resume_changes(recipe: Recipe, run_dir: Path, allow_changes: bool) -> dict[str, tuple[Any, Any]]:
    """How ``recipe`` differs from the run's own; refused when the run cannot continue with it."""
    changes = recipe_changes(read_recipe(run_dir), recipe)
    fixed = {k: v for k, v in changes.items() if _matches(k, get_task(recipe.task).fixed_on_resume)}
    if fixed:
        raise RunDirError(f"--resume: the recipe differs from the run's in {_show(fixed)}; the run cannot continue "
                          f"with that (its weights, data and tokenizer belong to the old values). Resume without "
                          f"these overrides, or train into another --run-dir")
    flagged = {k: v for k, v in changes.items() if not _matches(k, FREE_ON_RESUME)}
    if flagged and not allow_changes:
        raise RunDirError(f"--resume: the recipe differs from the run's in {_show(flagged)}; pass --allow-changes to "
                          f"continue with the new values (recorded in {CHANGES}), or resume with the run's own "
                          f"recipe: attnlab train --run-dir {run_dir} --resume")
    return changes


def _resolutions(recipe: Recipe, run_dir: Path, device: torch.device, step: int, allow_changes: bool,
                 parent: Path | None, log: Callable[[str], None]) -> list[Resolution] | None:
    """The run's records of what ``auto`` became (:mod:`attnlab.engine.resolved`) when this
    stretch of training adds one (``None``: the recorded ones stand): a new run (a sub-run
    takes its ``parent``'s), another precision asked, or a machine that cannot run the
    recorded precision, which is refused unless ``allow_changes``."""
    asked = recipe.train.precision
    records = read_resolutions(run_dir)
    if not records:
        inherited = read_resolutions(parent) if parent is not None else []
        if inherited and asked == inherited[-1].asked and precision_problem(inherited[-1].precision, device) is None:
            first = dataclasses.replace(inherited[-1], step=step, why=f"{inherited[-1].why}; as {parent} resolved it")
        else:
            first = resolve_run(asked, device, step)
        if asked == "auto":
            log(f"precision auto: {first.precision} ({first.why}; recorded in {run_dir / RESOLVED})")
        return [first]
    last = records[-1]
    if asked != "auto":
        if asked == last.precision:
            return None
        return records + [resolve_run(asked, device, step)]  # a precision changed with --allow-changes
    problem = precision_problem(last.precision, device)
    if problem is None:
        log(f"precision auto: {last.precision}, as the run resolved it on {last.machine} ({run_dir / RESOLVED})")
        if last.threads != torch.get_num_threads():
            log(f"note: the run trained with {last.threads} threads, this process has {torch.get_num_threads()}: "
                f"float sums may differ in their last bits from an uninterrupted run")
        return None
    if not allow_changes:
        raise RunDirError(f"--resume: {run_dir} trains in {last.precision} (precision auto chose it on "
                          f"{last.machine}; recorded in {RESOLVED}), and {problem}. Resume on a machine that runs "
                          f"{last.precision}, or pass --allow-changes to continue in what precision auto chooses "
                          f"here (recorded in {RESOLVED}: the run then mixes two precisions)")
    new = resolve_run(asked, device, step)
    log(f"--resume: {problem}; continuing in {new.precision} from step {step} (recorded in {run_dir / RESOLVED})")
    return records + [new]


def train_config(recipe: Recipe, run_dir: Path) -> TrainConfig:
    """``recipe.train`` with its precision as the run resolved it (``resolved.json``)."""
    precision = run_precision(run_dir)
    if precision is None or precision == recipe.train.precision:
        return recipe.train
    return dataclasses.replace(recipe.train, precision=precision)


def _claim(recipe: Recipe, run_dir: Path, resume: bool, allow_changes: bool, checkpoints: bool,
           lock: RunLock, log: Callable[[str], None], parent: Path | None = None) -> Path | None:
    """Check ``run_dir`` for this training, then write its config; returns the checkpoint to
    resume from. Every refusal comes before the first write."""
    device = select_device(recipe.train.device)  # a device this machine lacks: refused before anything is written
    if recipe.train.precision == "fp16" and device.type != "cuda":
        raise ConfigError(f"train.precision 'fp16' needs a CUDA device (a gradient scaler); got {device.type}; "
                          f"use bf16")
    make_run_dir(run_dir)
    lock.acquire()
    if lock.took_over:
        log(f"note: {lock.path} was left by a training that has ended ({lock.took_over}); taking it over")
    state = inspect_run_dir(run_dir)
    keeps = state.valid or state.damaged or any(f in state.files for f in _KEEP) or any(
        f.startswith("fold_") for f in state.files)
    has_config = (run_dir / CONFIG).exists()
    if state.holds_run and not resume:
        if keeps:
            raise RunDirError(f"--run-dir {run_dir} already holds a run ({state.summary()}); pass --resume to "
                              f"continue it, or choose another --run-dir")
        # A run that never saved a checkpoint: nothing in it can be continued or evaluated.
        log(f"note: {run_dir} holds a run that never saved a checkpoint ({state.summary()}); starting over in it")
        _forget(run_dir)
        has_config = False
    if state.holds_run and resume and not has_config:
        raise RunDirError(f"--resume: {run_dir} holds files of a run ({state.summary()}) but no {CONFIG} to say "
                          f"how it was trained; choose another --run-dir")
    changes = _resume_changes(recipe, run_dir, allow_changes) if has_config else {}
    if checkpoints and has_config and state.valid is None and keeps:
        raise RunDirError(f"--resume: {run_dir} has no valid checkpoint to continue from ({state.summary()}), and "
                          f"starting again from step 0 would overwrite the run. Move the damaged checkpoints "
                          f"away to start over deliberately, or train into another --run-dir")
    if resume:
        read_metrics(run_dir / "metrics.jsonl")  # a damaged log is named before the resume writes anything
    step = checkpoint_step(state.valid) if resume and checkpoints and state.valid is not None else 0
    if step > recipe.train.steps:
        raise RunDirError(f"--resume: train.steps={recipe.train.steps} is fewer than the {step} steps {run_dir} has "
                          f"trained (checkpoint {state.valid.name}); give train.steps={step} or more, or train a "
                          f"shorter run into another --run-dir")
    resolutions = _resolutions(recipe, run_dir, device, step, allow_changes, parent, log)
    if not has_config:
        atomic_write_bytes(run_dir / CONFIG, yaml.safe_dump(recipe_dict(recipe), sort_keys=False).encode())
    if resolutions is not None:
        write_resolutions(run_dir, resolutions)
    if changes:
        _record_changes(run_dir, changes, 0 if state.valid is None else checkpoint_step(state.valid))
        log(f"--resume: continuing with {_show(changes)} (recorded in {run_dir / CHANGES})")
    if not (checkpoints and resume):
        return None
    cfg = recipe.train
    for folder, why in state.damaged:
        n = checkpoint_step(folder)
        saved_again = n > step and (n == cfg.steps or (cfg.checkpoint_every and n % cfg.checkpoint_every == 0))
        fate = (f"the resumed run will replace it when it saves step {n} (move it away first to keep it)"
                if saved_again else "it is left in place (delete it once you no longer need it)")
        log(f"warning: skipping damaged checkpoint {folder.name}: {why}; resuming from step {step}, and {fate}")
    if state.valid is None:
        log(f"--resume: {run_dir} has no complete checkpoint yet; starting from step 0")
    return state.valid


@contextmanager
def open_run(recipe: Recipe, run_dir: str | Path, *, resume: bool, allow_changes: bool = False,
             checkpoints: bool = True, log: Callable[[str], None] = print,
             parent: str | Path | None = None) -> Iterator[Path | None]:
    """``with open_run(recipe, run_dir, resume=...) as resume_from:`` train inside the block.

    Holds the run directory's lock for the block, refuses a folder that holds another
    run (or, on resume, a recipe the run cannot continue with) before anything in it is
    written, writes ``config.yaml``, and yields the checkpoint folder to resume from
    (``None``: start at step 0). ``checkpoints=False`` for a folder whose checkpoints live
    in sub-runs (cross-validation). Under torchrun, rank 0 alone checks and writes and
    every rank gets its answer (or its error). A new run that fails before its first
    checkpoint leaves no half-made run directory behind. What ``auto`` becomes on this
    machine (``train.precision``) is decided here once and recorded in ``resolved.json``
    (a sub-run, such as a fold, takes the one of its ``parent`` run)."""
    run_dir = Path(run_dir)
    lock = RunLock(run_dir)
    outcome: tuple[bool, Any] = (True, None)
    error: Exception | None = None
    existed = run_dir.exists()
    forgotten = False
    try:
        if distributed.is_main():
            try:
                outcome = (True, _claim(recipe, run_dir, resume, allow_changes, checkpoints, lock, log,
                                        None if parent is None else Path(parent)))
            except Exception as exc:  # noqa: BLE001  # re-raised below, once the other ranks know
                error, outcome = exc, (False, str(exc))
        ok, value = distributed.broadcast_object(outcome)
        if not ok:
            raise error if error is not None else RunDirError(value)
        try:
            yield value
        except BaseException:
            if not resume and distributed.is_main():
                forgotten = _forget(run_dir)
            raise
    finally:
        lock.release()
        if forgotten and not existed:
            try:
                run_dir.rmdir()  # the folder this call made, now empty
            except OSError:
                pass


def _forget(run_dir: Path) -> bool:
    """Remove what a new run that never saved a checkpoint wrote (config, tokenizers,
    metrics, events, pictures), so that the same command can run again once mended. A
    run with a checkpoint or results is kept as it is (``False``)."""
    state = inspect_run_dir(run_dir)
    if state.valid or state.damaged or any(f in state.files for f in _KEEP):
        return False
    for name in state.files:
        path = run_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return True


# ----------------------------------------------------------------------------- training and testing


def init_weights(model: nn.Module, source: str | Path, classes: Sequence[str] | None = None) -> list[str]:
    """Load the weights of ``source`` (a state-dict file, timm's layout or attnlab's, or a
    run directory: the weights its test figures came from) into ``model`` for fine-tuning;
    returns the classifier keys left fresh: the number of classes differs, or (a run
    directory with ``classes.json``) their names do, given ``classes``."""
    path = Path(source).expanduser()
    if path.is_dir():
        folder = resolve_checkpoint(path / "checkpoints", resolve_weights(path))
        weights, state = load_checkpoint(folder)
        theirs = read_json_mapping(path / "classes.json").get("classes") if (path / "classes.json").is_file() else None
        other = classes is not None and theirs is not None and list(theirs) != list(classes)
        return load_pretrained(model, state.get("ema") or weights, folder, new_head=other)
    return load_pretrained(model, read_state_dict(path), path)


def fine_tuning(model: nn.Module, config: ModelConfig) -> dict[str, float] | None:
    """Apply ``model.freeze_backbone`` (everything but the classifier stops learning) and
    return the ``lr_scales`` of ``model.backbone_lr_scale`` for the trainer."""
    if not config.freeze_backbone and config.backbone_lr_scale == 1.0:
        return None
    head = classifier_name(model)
    if head is None:
        raise InputError(f"model.freeze_backbone and model.backbone_lr_scale need a model with a classifier head "
                         f"('head' or 'fc'); {type(model).__name__} has none")
    if config.freeze_backbone:
        for name, p in model.named_parameters():
            if not name.startswith(head + "."):
                p.requires_grad_(False)
    return {"": config.backbone_lr_scale, head: 1.0}


def fit_run(recipe: Recipe, run_dir: Path, build_model: Callable[[], nn.Module], train_set: Any, val_set: Any, *,
        resume_from: Path | None, log: Callable[[str], None], classes: Sequence[str] | None = None) -> dict[str, Any]:
    """Train on ``train_set``, evaluating on the validation set ``val_set`` (``None``:
    none) every ``train.eval_every`` steps and at the end, which keeps ``checkpoints/best``.
    ``build_model`` runs after seeding, so the initial weights are a function of
    ``train.seed``. ``model.checkpoint`` initializes it (``classes``: the run's class names,
    which decide whether a source run's head fits). Returns the training figures of
    ``results.json``."""
    torch.manual_seed(recipe.train.seed)
    model = build_model()
    if resume_from is None and recipe.model.checkpoint:
        fresh = init_weights(model, recipe.model.checkpoint, classes)
        log(f"initial weights: {recipe.model.checkpoint}"
            + (f"; its classifier head does not fit this task's classes and is replaced ({', '.join(fresh)} start "
               f"fresh)" if fresh else ""))
    lr_scales = fine_tuning(model, recipe.model)
    trainer = Trainer(model, train_set, train_config(recipe, run_dir), eval_data=val_set, run_dir=run_dir, log=log,
                      lr_scales=lr_scales)
    if resume_from is not None:
        trainer.resume(resume_from)
    start = time.perf_counter()
    try:
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
            "train_seconds": out["train_seconds"], "samples_per_s": out["samples_per_s"], "steps": out["steps"],
            "fit_wall_seconds": time.perf_counter() - start, "model": recipe.model.name,
            "precision": out["precision"]}


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


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    """``results.json`` (rank 0 alone), written atomically."""
    if distributed.is_main():
        atomic_write_bytes(run_dir / RESULTS, json.dumps(results, indent=1).encode())
