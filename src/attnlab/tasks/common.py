"""What every task does with a run directory: check it, lock it, write the config,
train with the engine, test, write ``results.json``; and read a finished run back.

A run directory is never overwritten by another run: :func:`open_run` holds its lock
for the whole training, refuses a new run in a folder that holds one, and on
``--resume`` compares the recipe with the run's own before anything is written. A
change that the run cannot continue with (task, data, model, tokenizer, optimizer) is
refused; another one (more steps, another learning rate) only with ``allow_changes``,
and it is recorded in ``config.changes.yaml`` beside the untouched ``config.yaml``.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from ..engine import distributed
from ..engine.checkpoint import checkpoint_step, load_checkpoint, load_weights_into, resolve_checkpoint
from ..engine.config import ConfigError, from_dict
from ..engine.device import select_device
from ..engine.rundir import RunDirError, RunLock, inspect_run_dir, make_run_dir
from ..engine.trainer import IGNORE_INDEX, Trainer, flatten_tokens
from ..errors import InputError
from ..io import atomic_write_bytes, read_yaml_mapping
from ..models import count_parameters
from ..recipes import Recipe

CONFIG, CHANGES = "config.yaml", "config.changes.yaml"
# Keys whose change leaves a run's weights, data or tokenizer meaningless to continue.
FIXED_ON_RESUME = ("task", "data.name", "data.protocol", "data.seed", "data.source", "data.target", "model",
                   "text", "train.optimizer")
# Keys that do not change what is trained: they may differ on resume without --allow-changes.
FREE_ON_RESUME = ("description", "train.device", "train.progress", "train.progress_seconds")


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
    a, b = _flatten(asdict(old)), _flatten(asdict(new))
    return {k: (a.get(k, _UNSET), b.get(k, _UNSET)) for k in sorted(a.keys() | b.keys()) if a.get(k, _UNSET) != b.get(k, _UNSET)}


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


def read_config(run_dir: Path) -> dict[str, Any]:
    """``config.yaml`` with every change of ``config.changes.yaml`` applied, in order."""
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
        raise InputError(f"{path} is damaged: expected a list of {{step, time, changed: {{key: {{from, to}}}}}} records")
    return records


def read_recipe(run_dir: str | Path) -> Recipe:
    """The resolved recipe a run directory trains with: its ``config.yaml`` and the
    changes recorded on resume. ``ValueError`` naming the file when it is missing,
    empty or not a valid recipe."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG).exists():
        raise InputError(f"run_dir must be an attnlab run directory with {CONFIG}; {run_dir} has none")
    data = read_config(run_dir)
    try:
        return from_dict(Recipe, data)
    except ValueError as exc:
        raise InputError(f"{run_dir / CONFIG} is not a valid recipe: {exc}") from None


def _record_changes(run_dir: Path, changes: dict[str, tuple[Any, Any]], step: int) -> None:
    path = run_dir / CHANGES
    records = _read_changes(run_dir)
    records.append({"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "changed": {k: {"from": a, "to": b} for k, (a, b) in changes.items()}})
    atomic_write_bytes(path, yaml.safe_dump(records, sort_keys=False).encode())


def _resume_changes(recipe: Recipe, run_dir: Path, allow_changes: bool) -> dict[str, tuple[Any, Any]]:
    """How ``recipe`` differs from the run's own; refused when the run cannot continue with it."""
    changes = recipe_changes(read_recipe(run_dir), recipe)
    fixed = {k: v for k, v in changes.items() if _matches(k, FIXED_ON_RESUME)}
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


def _claim(recipe: Recipe, run_dir: Path, resume: bool, allow_changes: bool, checkpoints: bool,
           lock: RunLock, log: Callable[[str], None]) -> Path | None:
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
    has_config = (run_dir / CONFIG).exists()
    if state.holds_run and not resume:
        raise RunDirError(f"--run-dir {run_dir} already holds a run ({state.summary()}); pass --resume to "
                          f"continue it, or choose another --run-dir")
    if state.holds_run and not has_config:
        raise RunDirError(f"--resume: {run_dir} holds files of a run ({state.summary()}) but no {CONFIG} to say "
                          f"how it was trained; choose another --run-dir")
    changes = _resume_changes(recipe, run_dir, allow_changes) if has_config else {}
    if checkpoints and has_config and state.valid is None and (
            state.damaged or {"results.json", "checkpoints/best"} & set(state.files)):
        raise RunDirError(f"--resume: {run_dir} has no valid checkpoint to continue from ({state.summary()}), and "
                          f"starting again from step 0 would overwrite the run. Move the damaged checkpoints "
                          f"away to start over deliberately, or train into another --run-dir")
    if not has_config:
        atomic_write_bytes(run_dir / CONFIG, yaml.safe_dump(asdict(recipe), sort_keys=False).encode())
    if changes:
        _record_changes(run_dir, changes, 0 if state.valid is None else checkpoint_step(state.valid))
        log(f"--resume: continuing with {_show(changes)} (recorded in {run_dir / CHANGES})")
    if not (checkpoints and resume):
        return None
    for folder, why in state.damaged:
        log(f"warning: skipping damaged checkpoint {folder.name}: {why}; it is left in place")
    if state.valid is None:
        log(f"--resume: {run_dir} has no complete checkpoint yet; starting from step 0")
    return state.valid


@contextmanager
def open_run(recipe: Recipe, run_dir: str | Path, *, resume: bool, allow_changes: bool = False,
             checkpoints: bool = True, log: Callable[[str], None] = print) -> Iterator[Path | None]:
    """``with open_run(recipe, run_dir, resume=...) as resume_from:`` train inside the block.

    Holds the run directory's lock for the block, refuses a folder that holds another
    run (or, on resume, a recipe the run cannot continue with) before anything in it is
    written, writes ``config.yaml``, and yields the checkpoint folder to resume from
    (``None``: start at step 0). ``checkpoints=False`` for a folder whose checkpoints live
    in sub-runs (cross-validation). Under torchrun, rank 0 alone checks and writes and
    every rank gets its answer (or its error)."""
    run_dir = Path(run_dir)
    lock = RunLock(run_dir)
    outcome: tuple[bool, Any] = (True, None)
    error: Exception | None = None
    existed = run_dir.exists()
    forgotten = False
    try:
        if distributed.is_main():
            try:
                outcome = (True, _claim(recipe, run_dir, resume, allow_changes, checkpoints, lock, log))
            except Exception as exc:  # noqa: BLE001  # re-raised below, once the other ranks know
                error, outcome = exc, (False, str(exc))
        ok, value = distributed.broadcast_object(outcome)
        if not ok:
            raise error if error is not None else RunDirError(value)
        claimed = not resume
        try:
            yield value
        except BaseException:
            forgotten = claimed and distributed.is_main() and _forget_unstarted_run(run_dir)
            raise
    finally:
        lock.release()
        if forgotten and not existed:
            try:
                run_dir.rmdir()  # the folder this call made, now empty
            except OSError:
                pass


def _forget_unstarted_run(run_dir: Path) -> bool:
    """A new run that failed before its first step (a bad model option, missing data):
    remove the config and tokenizers it wrote, so that the same command can be run again
    once mended. A run that logged or saved anything is kept as it is."""
    if any((run_dir / name).exists() for name in ("metrics.jsonl", "checkpoints", "results.json", "tensorboard")):
        return False
    for name in (CONFIG, "tokenizer.json", "tokenizer.src.json", "tokenizer.tgt.json"):
        (run_dir / name).unlink(missing_ok=True)
    return True


def train_and_test(recipe: Recipe, run_dir: Path, build_model: Callable[[], nn.Module], train_set: Any,
                   eval_set: Any, test_set: Any, *, resume_from: Path | None, log: Callable[[str], None],
                   extra: dict[str, Any] | None = None, report: bool = True) -> dict[str, Any]:
    """Train on ``train_set`` (evaluating on ``eval_set`` during training), then test on
    ``test_set`` and write ``results.json`` and (with ``report``) ``report.html``.
    ``build_model`` runs after seeding, so the initial weights are a function of
    ``train.seed``. A task that adds to ``results.json`` afterwards passes
    ``report=False`` and calls :func:`write_report_safely` itself."""
    torch.manual_seed(recipe.train.seed)
    model = build_model()
    trainer = Trainer(model, train_set, recipe.train, eval_data=eval_set, run_dir=run_dir, log=log)
    if resume_from is not None:
        trainer.resume(resume_from)
    start = time.perf_counter()
    try:
        fit = trainer.fit()
    except BaseException:
        trainer.close()
        raise
    trainer.save()
    cfg = recipe.train
    evaluated = "accuracy" in fit and cfg.eval_every and trainer.step % cfg.eval_every == 0  # the final weights
    if eval_set is not None and eval_set is not test_set and not evaluated:
        trainer.record_evaluation(trainer.evaluate(eval_set))  # the final weights compete for best too
    if eval_set is test_set and evaluated:
        test = {"loss": fit["loss"], "accuracy": fit["accuracy"]}
    else:
        test = trainer.evaluate(test_set)
        if eval_set is test_set:
            trainer.record_evaluation(test)
    trainer.close()
    results = {"test_accuracy": test["accuracy"], "test_loss": test["loss"], "best_accuracy": trainer.best,
               "params": count_parameters(model), "train_seconds": fit["train_seconds"],
               "samples_per_s": fit["samples_per_s"], "steps": fit["steps"],
               "wall_seconds": time.perf_counter() - start, "model": recipe.model.name, **(extra or {})}
    if distributed.is_main():
        atomic_write_bytes(run_dir / "results.json", json.dumps(results, indent=1).encode())
        if report:
            write_report_safely(run_dir, log)
    return results


def write_report_safely(run_dir: Path, log: Callable[[str], None]) -> None:
    """Write ``run_dir/report.html`` (main process only); a failure is one warning line in
    the log, never an exception: the trained run is worth more than its report."""
    if not distributed.is_main():
        return
    try:
        from ..report import write_run_report  # the report reads tasks: imported late, no cycle

        start = time.perf_counter()
        path = write_run_report(run_dir)
        log(f"report: {path} ({time.perf_counter() - start:.1f} s)")
    except Exception as exc:  # noqa: BLE001  # any failure: the run's files are already safe on disk
        log(f"warning: report.html not written: {type(exc).__name__}: {exc}")


def load_weights(run_dir: str | Path, model: nn.Module, checkpoint: str = "auto") -> Path:
    """Load a run's checkpoint into ``model`` (EMA weights when the run kept them) and
    return its folder. ``checkpoint``: ``"best"``, ``"last"``, ``"averaged"``, a folder,
    or ``"auto"`` (averaged weights when the run has them, else best, else last)."""
    root = Path(run_dir) / "checkpoints"
    if checkpoint == "auto":
        checkpoint = next((n for n in ("averaged", "best") if (root / n).is_dir()), "last")
    folder = resolve_checkpoint(root, checkpoint)
    weights, state = load_checkpoint(folder)
    load_weights_into(model, state.get("ema") or weights, folder)
    return folder


@torch.no_grad()
def evaluate_model(model: nn.Module, data: Any, batch_size: int = 256, device: str = "auto") -> dict[str, float]:
    """Mean loss and accuracy of ``model`` over a data set with ``get_batch`` (images:
    a tensor batch; text: a dict of named inputs), as :meth:`Trainer.evaluate`: per
    sample, or per target token for sequence outputs."""
    device_ = select_device(device)
    model.to(device_).eval()
    loss_sum, correct, count, n = 0.0, 0, 0, len(data)
    for start in range(0, n, batch_size):
        x, y = data.get_batch(list(range(start, min(start + batch_size, n))))
        x = {k: v.to(device_) for k, v in x.items()} if isinstance(x, dict) else x.to(device_)
        out, y = flatten_tokens((model(**x) if isinstance(x, dict) else model(x)).float().cpu(), y)
        real = y != IGNORE_INDEX
        loss_sum += F.cross_entropy(out, y, reduction="sum", ignore_index=IGNORE_INDEX).item()
        correct += ((out.argmax(-1) == y) & real).sum().item()
        count += int(real.sum())
    return {"accuracy": correct / count, "loss": loss_sum / count, "samples": n}

