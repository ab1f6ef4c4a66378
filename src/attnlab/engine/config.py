"""Configuration as validated data: nested dataclasses filled from YAML and dotted
command-line overrides, with errors that name the key.

    cfg = from_dict(TrainRecipe, apply_overrides(yaml.safe_load(text), ["optim.lr=3e-4"]))

Unknown keys are errors that suggest the close matches; values are checked against the
field's type annotation (``int``, ``float``, ``str``, ``bool``, ``Literal[...]``,
``Optional[...]``, ``list``, ``dict``, nested dataclasses) and against bounds given in the
field's metadata: ``min``/``max`` (inclusive) and ``gt``/``lt`` (exclusive), e.g.
``field(default=0.1, metadata={"min": 0, "lt": 1})``. A float is never NaN or infinite.
A dataclass built directly in Python gets the same bound checks from
:func:`check_bounds` in its ``__post_init__``. A nested dataclass whose keys depend on
its content (a recipe's ``data`` section, whose source says which keys apply) has a
classmethod ``config_class_for(mapping, where)`` that returns the class to read it as.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from ..errors import InputError, yaml_problem
from ..suggest import did_you_mean

__all__ = ["ConfigError", "from_dict", "to_dict", "apply_overrides", "parse_override", "check_bounds"]

T = TypeVar("T")


class ConfigError(InputError):
    """A configuration key or value that does not fit its schema."""


def _check(value: Any, tp: Any, where: str) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _check(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} fits none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where} must be one of {', '.join(map(repr, args))}; got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping of {tp.__name__} fields; got {value!r}")
        return from_dict(tp, value, where)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list; got {value!r}")
        item = args[0] if args else Any
        out = [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if (origin or tp) is tuple else out
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping; got {value!r}")
        _check_finite(value, where)  # free-form options: no schema here, but never NaN or infinity
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false; got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer; got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number; got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where} must be a finite number; got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string; got {value!r}")
        return value
    raise TypeError(f"{where}: unsupported annotation {tp!r}")  # a schema bug, not user input


def from_dict(cls: type[T], data: dict[str, Any], where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, checking every key and value."""
    choose = getattr(cls, "config_class_for", None)  # a section whose keys depend on its content
    if choose is not None:
        cls = choose(data, where)
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {}
    for key, value in data.items():
        name = f"{where}.{key}" if where else key
        if key not in fields:
            raise ConfigError(f"unknown key {name!r}" + did_you_mean(key, fields, "valid keys"))
        value = _check(value, hints[key], name)
        _check_bound(value, fields[key].metadata, name)
        kwargs[key] = value
    missing = [n for n, f in fields.items() if n not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing key {(where + '.' if where else '') + missing[0]!r}")
    return cls(**kwargs)


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number; got {value!r}")
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")


_BOUNDS = {"min": (lambda v, b: v >= b, ">="), "max": (lambda v, b: v <= b, "<="),
           "gt": (lambda v, b: v > b, ">"), "lt": (lambda v, b: v < b, "<")}


def _check_bound(value: Any, meta: Any, name: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number; got {value!r}")
    if isinstance(value, int) and not -(2**63) <= value < 2**63:  # counts become torch's int64 and the clock's
        raise ConfigError(f"{name} must be a whole number of 64 bits (at most {2**63 - 1:,}); got {value:,}")
    for key, (ok, word) in _BOUNDS.items():
        if key in meta and not ok(value, meta[key]):
            raise ConfigError(f"{name} must be {word} {meta[key]}; got {value!r}")


def check_bounds(cfg: Any, where: str = "") -> None:
    """Check every number field of dataclass ``cfg`` against its metadata bounds and for
    finiteness (what :func:`from_dict` checks, for a config built directly in Python)."""
    for f in dataclasses.fields(cfg):
        _check_bound(getattr(cfg, f.name), f.metadata, f"{where}.{f.name}" if where else f.name)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, YAML-ready dict of a (nested) dataclass."""
    return dataclasses.asdict(cfg)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"optim.lr=3e-4"`` -> ``(["optim", "lr"], 0.0003)``; the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override must look like key.sub=value; got {text!r}")
    return key.split("."), _read_value(raw, text)


def _read_value(raw: str, text: str) -> Any:
    for number in (int, float):  # YAML 1.1 reads "3e-4" (no dot) as a string
        try:
            return number(raw)
        except ValueError:
            pass
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: cannot read the value ({yaml_problem(exc)})") from None


def apply_overrides(data: dict[str, Any], overrides: typing.Iterable[str]) -> dict[str, Any]:
    """A copy of ``data`` with each ``key.sub=value`` set (intermediate mappings created)."""
    out = yaml.safe_load(yaml.safe_dump(data))  # deep copy of plain data
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return out
