"""Sentence pairs, the data of translation: the keys every pair source has, and the
built-in source ``multi30k``. A pair source gives
:class:`~attnlab.data.source.Splits` of ``(source sentence, target sentence)`` lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...errors import InputError
from ..readers.multi30k import MULTI30K_LANGUAGES, load_multi30k
from ..readers.parallel import MAX_LINE_CHARS, load_parallel, read_pairs_tsv
from ..source import Source, SourceConfig, Splits, register_source

__all__ = ["PairSourceConfig", "Multi30kConfig", "PairSource", "Multi30k", "Pairs"]

Pairs = list[tuple[str, str]]


@dataclass
class PairSourceConfig(SourceConfig):
    """The ``data`` keys of every sentence-pair source."""

    kind: ClassVar[str] = "sentence_pairs"
    changeable: ClassVar[tuple[str, ...]] = ("data_dir", "max_line_chars")

    name: str = "multi30k"
    source: str = "de"  # language code of the source (multi30k: de, en, fr or cs; files: any, e.g. the extension)
    target: str = "en"  # language code of the target
    # the longest line read, in characters: a longer one is refused before it is held in memory
    max_line_chars: int = field(default=MAX_LINE_CHARS, metadata={"min": 1})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.source == self.target:
            raise InputError(f"data.source and data.target must differ; got {self.source!r} for both")


class PairSource(Source):
    """A source of sentence pairs: :meth:`load` gives :class:`Splits` of pair lists."""

    kind = "sentence_pairs"
    config_class = PairSourceConfig
    test_name: ClassVar[str] = "the test set"  # how logs and reports name the test part

    def load(self, config: Any) -> Splits[Pairs]:
        raise NotImplementedError

    def read_pairs(self, config: Any, path: str | Path) -> Pairs:
        """Sentence pairs of one's own for ``attnlab eval --data``: a TSV file of
        ``source<TAB>target`` lines, or a folder holding ``test.SRC`` and ``test.TGT`` for
        the run's language codes."""
        path = Path(path)
        if path.is_dir():
            return load_parallel(path, "test", config.source, config.target, max_line_chars=config.max_line_chars)
        return read_pairs_tsv(path, max_line_chars=config.max_line_chars)


@dataclass
class Multi30kConfig(PairSourceConfig):
    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("source", "target"):
            if getattr(self, key) not in MULTI30K_LANGUAGES:
                raise InputError(f"data.{key} must be one of {', '.join(map(repr, MULTI30K_LANGUAGES))} for "
                                 f"multi30k; got {getattr(self, key)!r}")


@register_source
class Multi30k(PairSource):
    name = "multi30k"
    config_class = Multi30kConfig
    summary = "Multi30k task 1: image captions in de, en, fr, cs (29,000 training pairs)"
    test_name = "test_2016_flickr"

    def split(self, config: Multi30kConfig, split: str) -> Pairs:
        return load_multi30k(split, config.data_dir, config.source, config.target,
                             max_line_chars=config.max_line_chars)

    def load(self, config: Multi30kConfig) -> Splits[Pairs]:
        return Splits(*(self.split(config, name) for name in ("train", "val", "test")))

    def load_test(self, config: Multi30kConfig) -> Pairs:
        return self.split(config, "test")

    def describe(self, config: Multi30kConfig) -> str:
        return f"Multi30k {config.source}-{config.target}"
