"""Data sources: where a task's examples come from, behind one registry.

A source is an object that :func:`register_source` makes nameable in a recipe's
``data.name``. It belongs to one *kind* of data, which a task consumes: ``"images"``
(labelled images), ``"labelled_texts"``, ``"sentence_pairs"``, ``"reversal"`` (the
synthetic demo). It declares the config keys that apply to it (its
:attr:`Source.config_class`, a :class:`SourceConfig` subclass) and gives the task its
splits, what the model needs to know about the data, and how to read one more example::

    source = source_of(recipe.data)                 # the registered source that data.name names
    splits = source.load(recipe.data)               # Splits(train, val, test, classes, notes)

A user's own source subclasses its kind's base class (``ImageSource``, ``TextSource``,
``PairSource``), gives its config class, and registers from their own module, imported
with ``--import`` or the ``attnlab.plugins`` entry point, exactly as a task does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Sequence, TypeVar

from ..engine.config import ConfigError
from ..errors import InputError
from ..suggest import did_you_mean

__all__ = ["SourceConfig", "Source", "Splits", "register_source", "get_source", "source_of", "list_sources"]


@dataclass
class SourceConfig:
    """The ``data`` section of a recipe: the keys every source has. A kind of data
    subclasses it with the keys its sources share (and its default source), and a source
    with keys of its own subclasses that.

    ``changeable`` names the keys that may change on ``--resume`` (with
    ``--allow-changes``): they alter how data is read, not which examples a run learns
    from or is tested on. Every other key is fixed for the life of a run."""

    kind: ClassVar[str] = ""
    changeable: ClassVar[tuple[str, ...]] = ("data_dir",)

    name: str = ""  # a registered source of this kind (attnlab sources)
    data_dir: str | None = None  # where built-in sets live; default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab

    def __post_init__(self) -> None:
        if not self.kind:  # the data section of a task of one's own, with no registered sources
            return
        source = get_source(self.name, self.kind)
        if type(self) is not source.config_class:
            raise InputError(f"data.name={self.name!r} takes its settings as {source.config_class.__name__}; got a "
                             f"{type(self).__name__}")

    @classmethod
    def config_class_for(cls, data: dict[str, Any], where: str = "") -> type["SourceConfig"]:
        """The config class of the source that ``data["name"]`` names (the kind's default
        when absent): how a recipe's ``data`` section is read (see
        :func:`attnlab.engine.config.from_dict`). A key of another source of the kind is
        named as such."""
        if not cls.kind:
            return cls
        where = where or "data"
        default = next(f.default for f in dataclasses.fields(cls) if f.name == "name")
        name = data.get("name", default)
        if not isinstance(name, str):
            raise ConfigError(f"{where}.name must be the name of a data source; got {name!r}")
        config = get_source(name, cls.kind).config_class
        own = {f.name for f in dataclasses.fields(config)}
        for key in data:
            others = [s.name for s in list_sources(cls.kind) if key in {f.name for f in dataclasses.fields(s.config_class)}]
            if key not in own and others:
                raise ConfigError(f"{where}.{key} applies to {where}.name={'/'.join(others)}; got {where}.name={name!r} "
                                  f"with {where}.{key}={data[key]!r}")
        return config

    @classmethod
    def drop_foreign_keys(cls, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` without the keys that only other sources of the kind have: the data
        section of a run of an older attnlab, which carried every key of its task."""
        if not cls.kind or not isinstance(data.get("name", ""), str) or data.get("name", "") not in {
                s.name for s in list_sources(cls.kind)}:
            return data
        own = {f.name for f in dataclasses.fields(cls.config_class_for({"name": data["name"]} if "name" in data else {}))}
        others = {f.name for s in list_sources(cls.kind) for f in dataclasses.fields(s.config_class)}
        return {k: v for k, v in data.items() if k in own or k not in others}

    def check_held_out(self, keys: Sequence[str], unit: str) -> None:
        """Each of ``keys`` is a fraction below 1 or a whole count of ``unit``."""
        for key in keys:
            value = getattr(self, key)
            if value >= 1 and value != int(value):
                raise InputError(f"data.{key} must be a fraction below 1 or a whole count of {unit}; got {value!r}")

    def fixed_keys(self) -> tuple[str, ...]:
        """The dotted keys (``data.root``) that a resumed run cannot change."""
        return tuple(f"data.{f.name}" for f in dataclasses.fields(self) if f.name not in self.changeable)


T = TypeVar("T")


@dataclass
class Splits(Generic[T]):
    """What a source gives its task: ``train``, ``val`` (``None``: no validation split) and
    ``test`` parts, in the form its kind says (image data sets, labelled texts, sentence
    pairs); ``classes``, the label names of a labelled kind, by class index; ``notes``,
    lines for the training log (counts, skipped rows); ``skipped``, the examples left
    out as unusable (rows without a label, pairs with a blank side)."""

    train: T | None
    val: T | None
    test: T
    classes: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    skipped: int = 0


class Source:
    """One place a task's examples come from. Subclasses set :attr:`name` and
    :attr:`config_class`; the kind's base class (``kind``) says what :meth:`load` gives."""

    name: ClassVar[str]
    kind: ClassVar[str]
    config_class: ClassVar[type[SourceConfig]]
    summary: ClassVar[str] = ""  # one line for `attnlab sources`
    # a set to evaluate on alone (attnlab eval RUN --data NAME), with nothing to train on
    test_only: ClassVar[bool] = False

    def check(self, config: Any) -> None:
        """Cheap checks that come before a run directory is made (a missing folder);
        :meth:`load` makes the thorough ones."""

    def load(self, config: Any) -> Splits:
        """The train, validation and test parts of the data ``config`` describes: a pure
        function of it, so that evaluating a run later finds the same test part."""
        raise NotImplementedError

    def load_test(self, config: Any) -> Any:
        """The test part alone (evaluation, reports, pictures); by default :meth:`load`'s."""
        return self.load(config).test

    def describe(self, config: Any) -> str:
        """What the data is, in a few words (a report's subtitle, the command line)."""
        return self.name

    def known_classes(self, config: Any) -> list[str] | None:
        """The class names when they are fixed by the source itself (a built-in set),
        without reading the data; ``None`` when the data says."""
        return None

    def __repr__(self) -> str:
        return f"<data source {self.name} ({self.kind}): {self.summary}>"


_SOURCES: dict[str, Source] = {}
S = TypeVar("S", bound=type)


def register_source(cls: S) -> S:
    """Class decorator: make the :class:`Source` subclass ``cls`` nameable in a recipe's
    ``data.name``. Its ``name`` must be new; its ``config_class`` a :class:`SourceConfig`
    subclass of its kind."""
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise InputError(f"register_source takes a Source subclass; got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise InputError(f"{cls.__name__}.name must be a non-empty string; got {name!r}")
    if name in _SOURCES:
        raise InputError(f"data source {name!r} is already registered (by {type(_SOURCES[name]).__name__})")
    config = getattr(cls, "config_class", None)
    if not (isinstance(config, type) and issubclass(config, SourceConfig) and dataclasses.is_dataclass(config)):
        raise InputError(f"{cls.__name__}.config_class must be a SourceConfig dataclass; got {config!r}")
    if not getattr(cls, "kind", None) or config.kind != cls.kind:
        raise InputError(f"{cls.__name__}.config_class must be of its kind {getattr(cls, 'kind', None)!r}; "
                         f"{config.__name__} is of kind {config.kind!r}")
    _SOURCES[name] = cls()
    return cls


def get_source(name: str, kind: str | None = None) -> Source:
    """The registered source ``name`` (of ``kind``, when given), or an error that lists the
    sources of the kind and suggests the close ones."""
    known = {n: s for n, s in _SOURCES.items() if kind is None or s.kind == kind}
    if name not in known:
        other = f" ({name!r} is a source of {_SOURCES[name].kind})" if name in _SOURCES else ""
        raise ConfigError(f"data.name must be one of {', '.join(map(repr, known))}; got {name!r}{other}"
                          + did_you_mean(name, known, "close names")
                          + " (a source of your own registers when its module is imported: --import MODULE)")
    return known[name]


def source_of(config: SourceConfig) -> Source:
    """The source a recipe's ``data`` section names."""
    return get_source(config.name, config.kind)


def list_sources(kind: str | None = None) -> list[Source]:
    """The registered sources (of ``kind``), in the order they registered."""
    return [s for s in _SOURCES.values() if kind is None or s.kind == kind]
