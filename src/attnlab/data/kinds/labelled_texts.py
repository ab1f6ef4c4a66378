"""Labelled texts, the data of text classification: the keys every text source has, the
splits a source gives (:class:`TextSplits`: texts with class indices, and the rows that
cross-validation folds over), and the built-in source ``mr``.

Protocols (``data.protocol``):

* ``"split"``: a fixed split (MR's stratified 80/10/10, or a file's parts); the dev part
  picks ``checkpoints/best``, the test part is evaluated once, at the end.
* ``"cv10"``: the standard MR protocol (Kim, 2014): 10 stratified folds of the source's
  :attr:`TextSplits.pool`, each a complete run tested on its held-out fold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Sequence

from ...errors import InputError
from ..readers.mr import load_mr, mr_folds, mr_split
from ..paths import folder_contents
from ..source import Source, SourceConfig, Splits, get_source, list_sources, register_source
from ..readers.tables import LabelledTexts, read_labelled_texts
from ..readers.text import MAX_LINE_CHARS

__all__ = ["TextSourceConfig", "Labelled", "TextSplits", "TextSource", "MR", "MR_CLASSES", "class_indices",
           "check_labelled_file"]

MR_CLASSES = ("negative", "positive")  # MR: label 0, label 1


@dataclass
class TextSourceConfig(SourceConfig):
    """The ``data`` keys of every labelled-text source."""

    kind: ClassVar[str] = "labelled_texts"
    changeable: ClassVar[tuple[str, ...]] = ("data_dir", "max_line_chars")

    name: str = "mr"
    # "split": a fixed split (dev picks checkpoints/best, test once); "cv10": 10 stratified folds.
    protocol: Literal["split", "cv10"] = "split"
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the split and the folds
    # the longest line (and CSV field) read, in characters: a longer one is refused before it is held in memory
    max_line_chars: int = field(default=MAX_LINE_CHARS, metadata={"min": 1})


@dataclass
class Labelled:
    """Texts and their class indices (into the splits' ``classes``)."""

    texts: list[str]
    labels: list[int]

    def take(self, rows: Sequence[int]) -> "Labelled":
        return Labelled([self.texts[i] for i in rows], [self.labels[i] for i in rows])

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class TextSplits(Splits[Labelled]):
    """:class:`~attnlab.data.source.Splits` of labelled texts, with the ``pool`` of rows
    that cross-validation folds over (the training data before any hold-out)."""

    pool: Labelled | None = None

    def folds(self, seed: int, k: int = 10) -> list[tuple[Labelled, Labelled]]:
        """The ``k`` stratified ``(train, test)`` folds of :attr:`pool`."""
        if self.pool is None:
            raise InputError("data.protocol=cv10 needs a source that gives the rows to fold over; this one gives none")
        return [(self.pool.take(tr), self.pool.take(te)) for tr, te in mr_folds(self.pool.labels, k, seed=seed)]


def class_indices(part: LabelledTexts, classes: Sequence[str]) -> list[int]:
    """The labels of ``part`` as indices into ``classes``; a label outside them is an error
    naming the file."""
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(part.labels) - set(index))
    if unknown:
        raise InputError(f"{part.path} has labels the training data lacks: {', '.join(map(repr, unknown[:5]))}"
                         f"{' ...' if len(unknown) > 5 else ''}; the classes are {', '.join(classes)}")
    return [index[label] for label in part.labels]


def check_labelled_file(path: str | Path) -> None:
    """Refuse a folder given as ``attnlab eval --data`` to a text classifier, saying what it
    holds (an image folder, most likely): the run reads one file of labelled texts."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"--data (data= in Python) must be a CSV, TSV or JSON Lines file of labelled texts (.csv, "
                         f".tsv, .jsonl, optionally .gz) for a text classification run; {path} is "
                         f"{folder_contents(path)}")


class TextSource(Source):
    """A source of labelled texts: :meth:`load` gives :class:`TextSplits`."""

    kind = "labelled_texts"
    config_class = TextSourceConfig

    def load(self, config: Any) -> TextSplits:
        raise NotImplementedError

    def read_labelled(self, config: Any, path: str | Path, classes: Sequence[str]) -> Labelled:
        """A labelled file of one's own (CSV, TSV, JSON Lines with ``text`` and ``label``
        columns) as a run with ``classes`` reads it (``attnlab eval --data``); or, where no
        such file exists, the test part of the registered source ``path`` names
        (``--data vader-amazon``), its classes matched to ``classes`` by name."""
        if isinstance(path, str) and not Path(path).expanduser().exists() and path in {
                s.name for s in list_sources(self.kind)}:
            return _source_test_part(get_source(path, self.kind), config, classes)
        check_labelled_file(path)
        part = read_labelled_texts(path, max_line_chars=config.max_line_chars)
        return Labelled(part.texts, class_indices(part, classes))


def _source_test_part(source: Source, config: Any, classes: Sequence[str]) -> Labelled:
    """The test part of ``source`` (read from the data directory of ``config``, a run's
    ``data``), its labels mapped to ``classes`` by name."""
    own = source.config_class(name=source.name, data_dir=config.data_dir, max_line_chars=config.max_line_chars)
    splits = source.load(own)
    missing = sorted(set(splits.classes or ()) - set(classes))
    if splits.classes is None or missing:
        raise InputError(f"--data {source.name} has the classes {', '.join(splits.classes or ['(none)'])}; the run "
                         f"knows {', '.join(classes)}")
    index = [list(classes).index(c) for c in splits.classes]
    return Labelled(splits.test.texts, [index[y] for y in splits.test.labels])


@register_source
class MR(TextSource):
    name = "mr"
    summary = "MR movie-review polarity (negative, positive), 10,662 sentences"

    def load(self, config: TextSourceConfig) -> TextSplits:
        texts, labels = load_mr(config.data_dir, max_line_chars=config.max_line_chars)
        rows = Labelled(texts, labels)
        train, dev, test = mr_split(labels, seed=config.seed)
        return TextSplits(rows.take(train), rows.take(dev), rows.take(test), list(MR_CLASSES), pool=rows)

    def known_classes(self, config: Any) -> list[str]:
        return list(MR_CLASSES)

    def describe(self, config: Any) -> str:
        return "MR"
