"""Claiming a run directory for a stretch of training: its lock, every check before the
first write (another run there, a recipe the run cannot continue with, a machine that
cannot run its recorded precision), ``config.yaml`` and the records of what changed.

A run directory is never overwritten by another run: :func:`open_run` holds its lock
for the whole training, refuses a new run in a folder that holds one, and on
``--resume`` compares the recipe with the run's own before anything is written. A
change that the run cannot continue with (the task's ``fixed_on_resume`` keys and the
data source's fixed keys) is refused; another one (more steps, another learning rate)
only with ``allow_changes``, and it is recorded in ``config.changes.yaml`` beside the
untouched ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import yaml

from ..engine import distributed
from ..engine.checkpoint import checkpoint_step
from ..engine.config import ConfigError
from ..engine.device import select_device
from ..engine.metrics import read_metrics
from ..engine.resolved import (RESOLVED, Resolution, precision_problem, read_resolutions, resolve_run,
                               write_resolutions)
from ..engine.rundir import RunDirError, RunLock, inspect_run_dir, make_run_dir
from ..io import atomic_write_bytes
from .recipe import Recipe, recipe_dict
from .task import get_task
from .files import CHANGES, CONFIG, read_changes, read_recipe, recipe_changes

__all__ = ["open_run", "check_resume", "FREE_ON_RESUME"]

# Keys that do not change what is trained: they may differ on resume without --allow-changes.
FREE_ON_RESUME = ("description", "train.device", "train.progress", "train.progress_seconds")
# What a run writes that is worth keeping: a folder holding any of these is never taken by a new run.
_KEEP = ("results.json", "checkpoints/best")


def _matches(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _show(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in changes.items())


# ----------------------------------------------------------------------------- claiming a run directory


def _record_changes(run_dir: Path, changes: dict[str, tuple[Any, Any]], step: int) -> None:
    path = run_dir / CHANGES
    records = read_changes(run_dir)
    records.append({"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "changed": {k: {"from": a, "to": b} for k, (a, b) in changes.items()}})
    atomic_write_bytes(path, yaml.safe_dump(records, sort_keys=False).encode())


def _resume_changes(recipe: Recipe, run_dir: Path, allow_changes: bool) -> dict[str, tuple[Any, Any]]:
    """How ``recipe`` differs from the run's own; refused when the run cannot continue with it."""
    changes = recipe_changes(read_recipe(run_dir), recipe)
    fixed_keys = get_task(recipe.task).fixed_on_resume + recipe.data.fixed_keys()
    fixed = {k: v for k, v in changes.items() if _matches(k, fixed_keys)}
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


def check_resume(recipe: Recipe, run_dir: str | Path, allow_changes: bool) -> None:
    """Refuses, before any work (the data read, the model built), a recipe the run in
    ``run_dir`` cannot continue with, or one that differs without ``allow_changes``: the
    same check :func:`open_run` makes again under the lock. A folder without the run's
    recipe is left to :func:`open_run` to describe."""
    run_dir = Path(run_dir)
    if (run_dir / CONFIG).is_file():
        _resume_changes(recipe, run_dir, allow_changes)


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
        if not has_config:  # a pretrained model's folder, say: files of a run's names, not a run of attnlab's
            raise RunDirError(f"--run-dir {run_dir} holds {', '.join(state.files)} but no {CONFIG}: it is not a run "
                              f"of attnlab's, and training would write over those files; choose a new or empty "
                              f"--run-dir")
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
