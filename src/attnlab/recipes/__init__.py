"""Training recipes: the YAML files shipped with attnlab, and the loader that turns one
(or a user's own file) into its task's typed :class:`~attnlab.tasks.Recipe`.

    recipe = load_recipe("vit-digits", ["train.lr=1e-3"])   # a shipped name, or a path to a YAML file
    recipe_keys(recipe)                                      # every key: type, default, value, help

The ``task:`` key picks the recipe's class, so a recipe holds only the keys of its task
and model; unknown keys, wrong types, values out of range and ``model.options`` that the
model does not take are errors that name the key (with did-you-mean suggestions),
before any work starts.
"""

from __future__ import annotations

import importlib
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # what the loader holds, for type checkers and the API reference (griffe reads this block)
    from .loader import Recipe, load_recipe, read_recipe_file, recipe_keys

__all__ = ["Recipe", "list_recipes", "load_recipe", "read_recipe_file", "recipe_keys"]

# The loader (and with it torch and every task) is imported when first used: `attnlab recipes`
# lists the shipped files without it.
_LOADER = ("Recipe", "load_recipe", "read_recipe_file", "recipe_keys")


def __getattr__(name: str) -> Any:
    if name in _LOADER:
        return getattr(importlib.import_module(".loader", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _shipped() -> dict[str, Any]:
    folder = resources.files(__name__)
    return {p.name[: -len(".yaml")]: p for p in folder.iterdir() if p.name.endswith(".yaml")}


def list_recipes() -> list[tuple[str, str, str]]:
    """``(name, task, description)`` of every shipped recipe."""
    rows = []
    for name, path in sorted(_shipped().items()):
        data = yaml.safe_load(path.read_text())
        rows.append((name, data.get("task", "image_classification"), data.get("description", "")))
    return rows
