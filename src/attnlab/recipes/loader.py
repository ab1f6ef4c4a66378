"""The recipe loader: a shipped recipe or a user's YAML file, with command-line overrides,
as its task's typed :class:`~attnlab.tasks.Recipe`, checked before any work (unknown keys
with did-you-mean suggestions, types, ranges, the model's options); and every key of a
recipe with its type, default and help (:func:`recipe_keys`)."""

from __future__ import annotations

import dataclasses
import inspect
import typing
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from ..engine.config import ConfigError, apply_overrides, parse_override
from ..errors import yaml_problem
from ..formats.hf.load import is_pretrained
from ..suggest import did_you_mean
from ..tasks import Recipe, get_task, model_label, recipe_from_dict
from . import _shipped

__all__ = ["Recipe", "load_recipe", "read_recipe_file", "recipe_keys"]


def read_recipe_file(name_or_path: str) -> tuple[dict[str, Any], str]:
    """``(data, source)``: a shipped recipe by name, or a YAML file by path, as plain data.
    A file that is missing, unreadable, not YAML (its line and column named) or not a
    mapping is a :class:`ConfigError`."""
    shipped = _shipped()
    if name_or_path in shipped:
        text, source = shipped[name_or_path].read_text(), f"recipe {name_or_path}"
    elif Path(name_or_path).is_file():
        source = str(name_or_path)
        try:
            text = Path(name_or_path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"recipe file {name_or_path} cannot be read: {exc}") from None
    else:
        raise ConfigError(f"unknown recipe {name_or_path!r} (neither a shipped recipe nor a file)"
                          + did_you_mean(name_or_path, shipped, "recipes"))
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML {yaml_problem(exc)}") from None
    if data is None:
        raise ConfigError(f"{source} is empty; a recipe needs at least its task and model")
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must be a YAML mapping of settings; got {type(data).__name__}")
    return data, source


def load_recipe(name_or_path: str, overrides: typing.Sequence[str] = ()) -> Recipe:
    """A shipped recipe by name, or a YAML file by path, with ``key.sub=value`` overrides,
    as its task's recipe class; checked before it is returned."""
    data, source = read_recipe_file(name_or_path)
    data, overrides = _packaged(data, overrides)
    merged = _yield_to_source(data, _yield_to_folder(data, overrides, source), overrides)
    recipe = recipe_from_dict(merged, source)
    own = data.get("model")
    named = isinstance(own, dict) and own.get("checkpoint") is not None
    if not named and recipe.model.checkpoint and is_pretrained(recipe.model.checkpoint) and \
            merged.get("description") == data.get("description"):
        # the file's description was written for the model the folder replaced: say what trains
        recipe.description = f"{model_label(recipe.model)}, trained with the settings of {source}"
    return recipe


def _yield_to_folder(data: dict[str, Any], overrides: typing.Sequence[str], source: str) -> dict[str, Any]:
    """``data`` with ``overrides`` applied. When the overrides make ``model.checkpoint`` a
    Hugging Face folder that the file does not name itself (``attnlab train lm-text
    model.checkpoint=gpt2/``), the file's values of the keys that the folder decides (its
    task's ``folder_keys``: a shipped recipe's model and tokenizer, for training from
    scratch) are left out, and an override of one of them is refused, naming it (but
    ``model.name`` and ``model.options``, which the task checks against the folder's)."""
    merged = apply_overrides(data, overrides)
    model = merged.get("model")
    checkpoint = model.get("checkpoint") if isinstance(model, dict) else None
    name = merged.get("task", "image_classification")
    if not isinstance(checkpoint, str) or not isinstance(name, str) or not is_pretrained(checkpoint):
        return merged
    try:
        task = get_task(name)
    except ConfigError:
        return merged  # recipe_from_dict says what is wrong with it
    own = data.get("model")
    if not task.folder_keys or (isinstance(own, dict) and own.get("checkpoint") is not None):
        return merged
    for text in overrides:
        path, value = parse_override(text)
        for key in task.folder_keys:
            parts = key.split(".")
            if parts[0] == "model":
                continue
            inside = path[: len(parts)] == parts
            holds = parts[: len(path)] == path and _holds(value, parts[len(path):])  # text={tokenizer: bpe}
            if inside or holds:
                raise ConfigError(f"{source}: {key} must be left out with model.checkpoint={checkpoint}: a Hugging "
                                  f"Face folder decides it (its own model and tokenizer are the run's); got {text!r}")
    own_data = yaml.safe_load(yaml.safe_dump(data))
    for key in task.folder_keys:
        *path, last = key.split(".")
        node: Any = own_data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            if key in ("model.name", "model.options"):
                node[last] = "" if last == "name" else {}
            else:
                del node[last]
    return apply_overrides(own_data, overrides)


def _packaged(data: dict[str, Any], overrides: typing.Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``data`` and ``overrides`` with a ``model.checkpoint`` that names a packaged model
    (``all-minilm-l6-v2``: :mod:`attnlab.formats.packaged`) replaced by its path."""
    from ..formats.packaged import resolve_packaged

    model = data.get("model")
    replaced = any(text.partition("=")[0] in ("model.checkpoint", "model") for text in overrides)
    if isinstance(model, dict) and isinstance(model.get("checkpoint"), str) and not replaced:
        data = {**data, "model": {**model, "checkpoint": resolve_packaged(model["checkpoint"])}}
    out = []
    for text in overrides:
        key, sep, value = text.partition("=")
        out.append(f"{key}={resolve_packaged(value)}" if sep and key == "model.checkpoint" else text)
    return data, out


def _yield_to_source(data: dict[str, Any], merged: dict[str, Any], overrides: typing.Sequence[str]) -> dict[str, Any]:
    """``merged`` without the file's ``data`` keys that only its own source takes, when the
    overrides name another source (``attnlab train text-classification data.name=mr`` on a
    recipe that reads files: its ``data.format``, ``data.train``, ... are left out), said in one
    line (a warning). A key the command line gives stays, and is checked as any other."""
    own, new = data.get("data"), merged.get("data")
    if not isinstance(own, dict) or not isinstance(new, dict):
        return merged
    given, named = set(), False
    for text in overrides:
        path, value = parse_override(text)
        if path[0] != "data":
            continue
        if len(path) == 1:  # the whole section given: nothing of the file's is left
            return merged
        named = named or path == ["data", "name"]
        given.add(path[1])
    if not named or own.get("name") == new.get("name"):
        return merged
    try:
        task = get_task(merged.get("task", "image_classification"))
        section = typing.get_type_hints(task.recipe_class).get("data")
        takes = {f.name for f in dataclasses.fields(section.config_class_for({"name": new["name"]}))}
        before = own.get("name") or section.config_class_for({}).name
    except (ConfigError, AttributeError, TypeError):
        return merged  # an unknown task or source: recipe_from_dict names it
    dropped = [key for key in own if key not in takes and key not in given and key in new]
    if dropped:
        warnings.warn(f"data.name={new['name']} replaces the recipe's data.name={before}: left out "
                      f"{', '.join('data.' + k for k in dropped)}, which data.name={new['name']} does not take",
                      stacklevel=3)
        merged = {**merged, "data": {k: v for k, v in new.items() if k not in dropped}}
    return merged


def _holds(value: Any, path: list[str]) -> bool:
    """Whether the mapping ``value`` has the nested key ``path``."""
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def _comments(cls: type) -> dict[str, str]:
    """The help of each field of a dataclass: the ``# ...`` comment after it in the source,
    else the comment lines just above it."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# ").strip())
            continue
        head, _, comment = line.partition("  # ")
        name = head.strip().split(":", 1)[0]
        if ":" in head and name.isidentifier():
            text = comment.strip() or " ".join(above)
            if text:
                out[name] = text
        above = []
    return out


def _type_name(tp: Any) -> str:
    text = str(tp).replace("typing.", "")
    return tp.__name__ if isinstance(tp, type) else text


def recipe_keys(recipe: Recipe) -> list[tuple[str, str, Any, Any, str]]:
    """``(key, type, default, value, help)`` for every key of ``recipe``'s class, dotted,
    in reading order; ``model.options`` gives the model's own configuration fields when
    the model's builder takes a configuration dataclass."""
    rows: list[tuple[str, str, Any, Any, str]] = []

    def walk(obj: Any, cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        comments: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            if dataclasses.is_dataclass(klass):
                comments.update(_comments(klass))
        for f in dataclasses.fields(cls):
            key, value = f"{prefix}{f.name}", getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, type(value), key + ".")
                continue
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = None
            rows.append((key, _type_name(hints[f.name]), default, value, comments.get(f.name, "")))

    walk(recipe, type(recipe), "")
    own = get_task(recipe.task).key_help
    rows = [(key, tp, default, value, own.get(key, help_)) for key, tp, default, value, help_ in rows]
    return [r for r in rows if r[0] != "model.options"] + _model_option_rows(recipe)


def _model_option_rows(recipe: Recipe) -> list[tuple[str, str, Any, Any, str]]:
    """``model.options.<field>`` rows from the model's configuration dataclass (built on the
    meta device): the default is the registered model's, the value the recipe's. A recipe
    whose model is a checkpoint's (no ``model.name``) has one row: the folder decides."""
    if not recipe.model.name:
        return [("model.options", "dict", {}, recipe.model.options,
                 "overrides of the configuration model.checkpoint brings (the folder decides the model)")]
    task = get_task(recipe.task)
    with torch.device("meta"):
        chosen = task.build_model(recipe)
        plain = task.build_model(dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, options={})))
    config = getattr(chosen, "config", None)
    if not dataclasses.is_dataclass(config):
        return [("model.options", "dict", {}, recipe.model.options, "overrides of the model's configuration")]
    hints = typing.get_type_hints(type(config))
    comments = _comments(type(config))
    return [(f"model.options.{f.name}", _type_name(hints[f.name]), getattr(plain.config, f.name),
             getattr(config, f.name), comments.get(f.name, "")) for f in dataclasses.fields(config)]

