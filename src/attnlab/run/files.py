"""The files of a run directory, read and written: ``config.yaml`` with the changes of
``config.changes.yaml`` applied, ``results.json``, the checkpoint a name stands for and
the training settings the run resolved (``resolved.json``)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import yaml

from ..engine import distributed
from ..engine.resolved import run_precision
from ..engine.trainer import TrainConfig
from ..errors import InputError, yaml_problem
from ..io import atomic_write_bytes, read_json_mapping, read_yaml_mapping
from .recipe import Recipe, recipe_dict
from .task import recipe_from_dict

__all__ = ["CONFIG", "CHANGES", "RESULTS", "CHECKPOINT_NAMES", "check_checkpoint", "read_config", "read_changes",
           "read_recipe", "read_results", "recipe_changes", "resolve_weights", "train_config", "write_results"]

CONFIG = "config.yaml"
"""A run's resolved recipe, every default filled in; written once, never rewritten."""
CHANGES = "config.changes.yaml"
"""The settings changed on a resume with ``--allow-changes``, each with the step it took effect."""
RESULTS = "results.json"
"""A run's results: test figures, parameters, time, throughput, precision, classes."""
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
    for record in read_changes(run_dir):
        for key, change in record["changed"].items():
            _set_dotted(data, key, change["to"])
    return data


def read_changes(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``config.changes.yaml`` (none when the run was never changed)."""
    path = run_dir / CHANGES
    if not path.exists():
        return []
    try:
        records = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise InputError(f"{path} cannot be read: {yaml_problem(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
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


CHECKPOINT_NAMES = ("auto", "best", "last", "averaged")
"""The checkpoint names of a run that :func:`resolve_weights` takes, besides a checkpoint folder."""


def check_checkpoint(checkpoint: Any) -> str:
    """``checkpoint`` as a str, or an :class:`InputError` naming the accepted values when it is
    neither a name nor a path (``None``, a step number, ...)."""
    if isinstance(checkpoint, os.PathLike):
        checkpoint = os.fspath(checkpoint)
    if isinstance(checkpoint, str) and checkpoint.strip():
        return checkpoint
    got = repr(checkpoint) if isinstance(checkpoint, (str, int, float, type(None))) else type(checkpoint).__name__
    hint = (f" (for the checkpoint of a step, give its name: 'step_{checkpoint:09d}')"
            if isinstance(checkpoint, int) and not isinstance(checkpoint, bool) and checkpoint >= 0 else "")
    raise InputError(f"checkpoint must be one of {', '.join(map(repr, CHECKPOINT_NAMES))} or a checkpoint folder "
                     f"(a str or a path); got {got}{hint}")


def resolve_weights(run_dir: Path, checkpoint: str = "auto") -> str:
    """``"auto"`` -> the checkpoint ``results.json`` was tested with (``test_checkpoint``),
    else the first of averaged, best, last that the run has; other names pass through
    (see :func:`check_checkpoint`)."""
    checkpoint = check_checkpoint(checkpoint)
    if checkpoint != "auto":
        return checkpoint
    results = read_results(run_dir) if (run_dir / RESULTS).is_file() else None
    if results is not None:
        # Runs of attnlab before test_checkpoint: translations named bleu_checkpoint, the rest tested "last".
        named = results.get("test_checkpoint", results.get("bleu_checkpoint", "last"))
        if isinstance(named, str) and ((run_dir / "checkpoints" / named).is_dir() or named == "last"):
            return named
    return next((n for n in ("averaged", "best") if (run_dir / "checkpoints" / n).is_dir()), "last")


def train_config(recipe: Recipe, run_dir: Path) -> TrainConfig:
    """``recipe.train`` with its precision as the run resolved it (``resolved.json``)."""
    precision = run_precision(run_dir)
    if precision is None or precision == recipe.train.precision:
        return recipe.train
    return dataclasses.replace(recipe.train, precision=precision)


def write_results(run_dir: Path, results: dict[str, Any]) -> None:
    """``results.json`` (rank 0 alone), written atomically."""
    if distributed.is_main():
        atomic_write_bytes(run_dir / RESULTS, json.dumps(results, indent=1).encode())
