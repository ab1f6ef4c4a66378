"""What every task does with a run directory: check it, write the config, train with
the engine, test, write ``results.json``; and read a finished run back."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
import yaml
from torch import nn

from ..engine import distributed
from ..engine.checkpoint import latest_checkpoint, load_checkpoint, resolve_checkpoint
from ..engine.config import from_dict
from ..engine.device import select_device
from ..engine.trainer import IGNORE_INDEX, Trainer, flatten_tokens
from ..io import atomic_write_bytes
from ..models import count_parameters
from ..recipes import Recipe


def prepare_run_dir(recipe: Recipe, run_dir: Path, resume: bool) -> bool:
    """Create ``run_dir`` and write ``config.yaml``; returns whether it holds a checkpoint.

    A folder that already holds a run is refused unless ``resume``, before anything in
    it is touched. Under torchrun, rank 0 alone writes and every rank gets the answer.
    """
    main = distributed.is_main()
    has_checkpoint = distributed.broadcast_object(main and latest_checkpoint(run_dir / "checkpoints") is not None)
    if has_checkpoint and not resume:
        raise ValueError(f"--run-dir {run_dir} already holds checkpoints of a run; pass --resume to continue it, "
                         f"or choose another --run-dir")
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(run_dir / "config.yaml", yaml.safe_dump(asdict(recipe), sort_keys=False).encode())
    return has_checkpoint


def train_and_test(recipe: Recipe, run_dir: Path, build_model: Callable[[], nn.Module], train_set: Any,
                   eval_set: Any, test_set: Any, *, resume: bool, has_checkpoint: bool, log: Callable[[str], None],
                   extra: dict[str, Any] | None = None, report: bool = True) -> dict[str, Any]:
    """Train on ``train_set`` (evaluating on ``eval_set`` during training), then test on
    ``test_set`` and write ``results.json`` and (with ``report``) ``report.html``.
    ``build_model`` runs after seeding, so the initial weights are a function of
    ``train.seed``. A task that adds to ``results.json`` afterwards passes
    ``report=False`` and calls :func:`write_report_safely` itself."""
    torch.manual_seed(recipe.train.seed)
    model = build_model()
    trainer = Trainer(model, train_set, recipe.train, eval_data=eval_set, run_dir=run_dir, log=log)
    if resume and has_checkpoint:
        trainer.resume()
    elif resume:
        log(f"--resume: {run_dir} has no complete checkpoint yet; starting from step 0")
    start = time.perf_counter()
    fit = trainer.fit()
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


def read_recipe(run_dir: str | Path) -> Recipe:
    """The resolved recipe a run directory was trained with."""
    config = Path(run_dir) / "config.yaml"
    if not config.is_file():
        raise ValueError(f"run_dir must be an attnlab run directory with config.yaml; {run_dir} has none")
    return from_dict(Recipe, yaml.safe_load(config.read_text()) or {})


def load_weights(run_dir: str | Path, model: nn.Module, checkpoint: str = "auto") -> Path:
    """Load a run's checkpoint into ``model`` (EMA weights when the run kept them) and
    return its folder. ``checkpoint``: ``"best"``, ``"last"``, ``"averaged"``, a folder,
    or ``"auto"`` (averaged weights when the run has them, else best, else last)."""
    root = Path(run_dir) / "checkpoints"
    if checkpoint == "auto":
        checkpoint = next((n for n in ("averaged", "best") if (root / n).is_dir()), "last")
    folder = resolve_checkpoint(root, checkpoint)
    weights, state = load_checkpoint(folder)
    model.load_state_dict(state.get("ema") or weights)
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

