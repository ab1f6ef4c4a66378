"""The source ``file``: labelled texts of one's own in a CSV, TSV or JSON Lines file.

``data.train`` holds the columns ``data.text_column`` and ``data.label_column``; any
number of classes, labels as strings or integers (the classes are the distinct labels,
sorted). ``data.val`` and ``data.test`` name files of the same kind; without them
``data.val_size`` and ``data.test_size`` of the training rows are held out (stratified,
``data.seed``). Cross-validation (``data.protocol=cv10``) folds the training file's rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, Sequence

import torch

from ...errors import InputError
from ..kinds.labelled_texts import Labelled, TextSource, TextSourceConfig, TextSplits, check_labelled_file, class_indices
from ..source import register_source
from ..splits import stratified_split
from ..readers.tables import LabelledTexts, read_labelled_texts

__all__ = ["TextFileConfig", "TextFile"]


@dataclass
class TextFileConfig(TextSourceConfig):
    changeable: ClassVar[tuple[str, ...]] = TextSourceConfig.changeable + ("format", "skip_bad_rows")

    name: str = "file"
    train: str | None = None  # the labelled training texts (CSV, TSV, JSONL)
    val: str | None = None  # validation texts (default: val_size of train)
    test: str | None = None  # test texts (default: test_size of train)
    # without data.val / data.test: rows of train held out, a count or a fraction below 1
    val_size: float = field(default=0.1, metadata={"min": 0.0})
    test_size: float = field(default=0.1, metadata={"min": 0.0})
    text_column: str = "text"  # the column (JSONL: key) of the texts
    label_column: str = "label"  # the column of the labels
    format: Literal["auto", "csv", "tsv", "jsonl"] = "auto"  # auto: by extension
    skip_bad_rows: bool = False  # skip rows without text or label (counted)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_held_out(("val_size", "test_size"), "rows")


@register_source
class TextFile(TextSource):
    name = "file"
    config_class = TextFileConfig
    summary = "labelled texts of one's own: a CSV, TSV or JSON Lines file (data.train, optional data.val/test)"

    def _read(self, config: TextFileConfig, path: str | Path) -> LabelledTexts:
        return read_labelled_texts(path, config.text_column, config.label_column, format=config.format,
                                   skip_bad_rows=config.skip_bad_rows, max_line_chars=config.max_line_chars)

    def check(self, config: TextFileConfig) -> None:
        if not config.train:
            raise InputError("data.train must name a CSV, TSV or JSON Lines file of labelled texts when data.name is "
                             "'file' (for example data.train=reviews.csv)")

    def load(self, config: TextFileConfig) -> TextSplits:
        self.check(config)
        parts = {key: self._read(config, path) for key, path in
                 (("train", config.train), ("val", config.val), ("test", config.test)) if path}
        classes = parts["train"].label_names()
        named = {key: Labelled(part.texts, class_indices(part, classes)) for key, part in parts.items()}
        pool = named["train"]
        train = torch.arange(len(pool))
        targets = torch.as_tensor(pool.labels)
        if "test" in named:
            test = named["test"]
        else:
            keep, held = stratified_split(targets[train], config.test_size, config.seed, "data.test_size")
            if held is None:
                raise InputError("data.test_size must be above 0 when no data.test file is given")
            test, train = pool.take(train[held].tolist()), train[keep]
        if "val" in named:
            dev: Labelled | None = named["val"]
        else:
            keep, held = stratified_split(targets[train], config.val_size, config.seed)
            dev = None if held is None else pool.take(train[held].tolist())
            train = train[keep]
        skipped = sum(p.skipped for p in parts.values())
        counts = torch.bincount(torch.as_tensor(sum((p.labels for p in named.values()), [])),
                                minlength=len(classes)).tolist()
        shown = ", ".join(f"{c} {n}" for c, n in list(zip(classes, counts))[:8])
        notes = [f"data: skipped {skipped} rows without a text or a label (data.skip_bad_rows)"] if skipped else []
        notes.append(f"data: {sum(counts)} texts, {len(classes)} classes ({shown}{' ...' if len(classes) > 8 else ''})")
        return TextSplits(pool.take(train.tolist()), dev, test, classes, notes, skipped, pool=pool)

    def read_labelled(self, config: TextFileConfig, path: str | Path, classes: Sequence[str]) -> Labelled:
        check_labelled_file(path)
        part = self._read(config, path)
        return Labelled(part.texts, class_indices(part, classes))

    def describe(self, config: TextFileConfig) -> str:
        return Path(config.train or "").name
