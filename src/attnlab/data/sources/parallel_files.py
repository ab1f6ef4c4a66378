"""The source ``files``: a folder ``data.root`` of parallel files of one's own.

One sentence per line, line ``i`` of one the translation of line ``i`` of the other:
``train.SRC`` and ``train.TGT`` for the language codes ``data.source`` and ``data.target``
(any codes; each file may be gzipped, ``train.de.gz``), or a ``train.tsv`` of
``source<TAB>target`` lines. ``val`` and ``test`` files alike are used when present; else
``data.val_size`` and ``data.test_size`` of the training pairs are held out (at random,
``data.seed``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ...errors import InputError
from ..readers.parallel import find_parallel, load_parallel
from ..kinds.sentence_pairs import PairSource, PairSourceConfig, Pairs
from ..source import Splits, register_source
from ..splits import random_held_out

__all__ = ["ParallelFilesConfig", "ParallelFiles"]


@dataclass
class ParallelFilesConfig(PairSourceConfig):
    changeable: ClassVar[tuple[str, ...]] = PairSourceConfig.changeable + ("skip_blank",)

    name: str = "files"
    root: str | None = None  # the folder of train.SRC/train.TGT (or train.tsv)
    # without val / test files: training pairs held out, a count or a fraction below 1
    val_size: float = field(default=0.05, metadata={"min": 0.0})
    test_size: float = field(default=0.05, metadata={"min": 0.0})
    seed: int = field(default=0, metadata={"min": 0, "max": 2**32 - 1})  # of the held-out pairs
    skip_blank: bool = False  # drop pairs with a blank side (else an error)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_held_out(("val_size", "test_size"), "pairs")


@register_source
class ParallelFiles(PairSource):
    name = "files"
    config_class = ParallelFilesConfig
    summary = "parallel files of one's own: data.root/train.SRC and train.TGT (or train.tsv), optional val/test"

    def check(self, config: ParallelFilesConfig) -> None:
        if not config.root:
            raise InputError("data.root must name a folder of parallel files (train.SRC and train.TGT, or train.tsv) "
                             "when data.name is 'files'")
        root = Path(config.root).expanduser()
        if not root.is_dir():
            raise InputError(f"data.root must be a folder of parallel files; {root} "
                             f"{'is a file' if root.exists() else 'does not exist'}")

    def load(self, config: ParallelFilesConfig) -> Splits[Pairs]:
        self.check(config)
        root = Path(config.root).expanduser()
        read = {"skip_blank": config.skip_blank, "max_line_chars": config.max_line_chars}
        parts = {"train": load_parallel(root, "train", config.source, config.target, **read)}
        for name in ("val", "test"):
            try:
                find_parallel(root, name, config.source, config.target)
            except FileNotFoundError:
                continue
            parts[name] = load_parallel(root, name, config.source, config.target, **read)
        skipped = sum(p.skipped for p in parts.values())
        train: Pairs = parts["train"]
        if "test" not in parts:
            keep, held = random_held_out(len(train), config.test_size, config.seed, "data.test_size", "training pairs")
            parts["test"], train = [train[i] for i in held], [train[i] for i in keep]
        if "val" not in parts:
            keep, held = random_held_out(len(train), config.val_size, config.seed + 1, "data.val_size",
                                         "training pairs")
            parts["val"], train = [train[i] for i in held], [train[i] for i in keep]
        note = (f"data: {len(train)} training, {len(parts['val'])} validation, {len(parts['test'])} test pairs "
                f"({config.source} -> {config.target})" + (f"; {skipped} pairs with a blank side skipped" if skipped
                                                           else ""))
        return Splits(train, parts["val"], parts["test"], notes=[note], skipped=skipped)

    def describe(self, config: ParallelFilesConfig) -> str:
        return f"{Path(config.root or '').name} {config.source}-{config.target}"
