"""Sentences of other domains than movies, rated by people: the evaluation sets of VADER
(Hutto & Gilbert, 2014), to measure how a sentiment classifier trained on MR's movie reviews
carries over to product reviews, tweets and newspaper editorials.

The sets ship in the source distribution of the ``vaderSentiment`` package on the Python
package registry (``vaderSentiment-3.3.2.tar.gz``, MIT licence), as
``additional_resources/hutto_ICWSM_2014.tar.gz``: each sentence with the mean of 20 people's
ratings from -4 (extremely negative) to +4 (extremely positive). ``make models`` downloads
the file into ``.venv/share/attnlab/``; ``attnlab data download vader`` into the data
directory. The archive is read where it lies, nothing extracted.

Three sources, test sets only (a model is trained elsewhere and evaluated on them with
``attnlab eval RUN --data vader-amazon``):

====================  ===========================================  ==========  ==========
source                sentences                                    kept (0.5)  ratings
====================  ===========================================  ==========  ==========
``vader-amazon``      sentences of Amazon product reviews          2,943       3,708
``vader-tweets``      tweets                                       3,362       4,200
``vader-nyt``         sentences of New York Times editorials      2,788       5,190
====================  ===========================================  ==========  ==========

A sentence whose mean rating lies within ``data.neutral`` of 0 (default 0.5) has no clear
polarity and is left out; the others are ``negative`` or ``positive``, MR's two classes.
The set of movie-review sentences is not offered: its sentences are MR's own.
"""

from __future__ import annotations

import io
import math
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...errors import InputError
from ...io import sha256_file
from ..kinds.labelled_texts import MR_CLASSES, Labelled, TextSource, TextSourceConfig, TextSplits
from ..paths import data_dir, require
from ..source import register_source

__all__ = ["VADER_FILE", "VADER_SHA256", "VaderConfig", "load_vader", "vader_archive"]

VADER_FILE = "vaderSentiment-3.3.2.tar.gz"
VADER_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
VADER_BYTES = 2_466_783
_INNER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
_INNER_BYTES = 4 << 20  # the inner archive is 1.6 MB
_MEMBER_BYTES = 2 << 20  # the largest ratings file is 1.4 MB
DOMAINS = {"amazon": "amazonReviewSnippets_GroundTruth.txt", "tweets": "tweets_GroundTruth.txt",
           "nyt": "nytEditorialSnippets_GroundTruth.txt"}


@dataclass
class VaderConfig(TextSourceConfig):
    """The ``data`` keys of the VADER sets."""

    name: str = "vader-amazon"
    # sentences whose mean rating (-4..4) lies within this of 0 are left out as neutral
    neutral: float = field(default=0.5, metadata={"min": 0.0, "max": 3.9})


def vader_archive(root: str | Path | None = None) -> Path:
    """The ``vaderSentiment`` source archive: ``DIR/vader/`` (``attnlab data download
    vader``), else the one ``make models`` put beside the environment's packages."""
    return require([data_dir(root) / "vader" / VADER_FILE, Path(sys.prefix) / "share" / "attnlab" / VADER_FILE],
                   "vader", data_dir(root))


def _member(archive: tarfile.TarFile, name: str, limit: int, where: Path) -> bytes:
    try:
        info = archive.getmember(name)
    except KeyError:
        raise InputError(f"{where} holds no {name}: not the vaderSentiment 3.3.2 source archive") from None
    if not info.isfile() or info.size > limit:
        raise InputError(f"{where}: {name} is not a file of at most {limit:,} bytes (size {info.size:,})")
    handle = archive.extractfile(info)
    assert handle is not None  # a regular file, checked above
    return handle.read(limit + 1)


def _ratings(raw: bytes, where: str) -> list[tuple[float, str]]:
    rows = []
    for number, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        try:
            score = float(fields[1])
        except (IndexError, ValueError):
            score = math.nan
        if len(fields) != 3 or not -4.0 <= score <= 4.0 or not fields[2].strip():
            raise InputError(f"{where} line {number}: expected an id, a mean rating in [-4, 4] and a sentence "
                             f"separated by tabs; got {line[:80]!r}")
        rows.append((score, fields[2].strip()))
    return rows


def load_vader(domain: str, root: str | Path | None = None, neutral: float = 0.5) -> tuple[Labelled, int]:
    """The sentences of ``domain`` (``amazon``, ``tweets``, ``nyt``) whose mean rating lies
    more than ``neutral`` from 0, labelled 0 (negative) or 1 (positive), in file order;
    and how many were left out as neutral."""
    if domain not in DOMAINS:
        raise InputError(f"domain must be one of {', '.join(DOMAINS)}; got {domain!r}")
    path = vader_archive(root)
    if path.stat().st_size != VADER_BYTES or sha256_file(path) != VADER_SHA256:
        raise InputError(f"{path} is not the vaderSentiment 3.3.2 source archive (sha256 {VADER_SHA256[:12]}...,"
                         f" {VADER_BYTES:,} bytes); download it again: attnlab data download vader")
    with tarfile.open(path, "r:gz") as outer:
        inner = _member(outer, _INNER, _INNER_BYTES, path)
    with tarfile.open(fileobj=io.BytesIO(inner), mode="r:gz") as archive:
        raw = _member(archive, f"hutto_ICWSM_2014/{DOMAINS[domain]}", _MEMBER_BYTES, path)
    rows = _ratings(raw, f"{path}:{DOMAINS[domain]}")
    kept = [(text, int(score > 0)) for score, text in rows if abs(score) > neutral]
    return Labelled([t for t, _ in kept], [y for _, y in kept]), len(rows) - len(kept)


class _Vader(TextSource):
    config_class = VaderConfig
    test_only = True
    domain: ClassVar[str]

    def check(self, config: Any) -> None:
        vader_archive(config.data_dir)

    def load(self, config: VaderConfig) -> TextSplits:
        if config.protocol != "split":
            raise InputError(f"data.protocol must be split for data.name={self.name} (a test set alone); "
                             f"got {config.protocol!r}")
        rows, neutral = load_vader(self.domain, config.data_dir, config.neutral)
        notes = [f"{self.name}: {len(rows):,} sentences, {neutral:,} within {config.neutral} of a neutral rating "
                 f"left out"]
        return TextSplits(None, None, rows, list(MR_CLASSES), notes)

    def known_classes(self, config: Any) -> list[str]:
        return list(MR_CLASSES)

    def describe(self, config: Any) -> str:
        return f"VADER {self.domain}"


@register_source
class VaderAmazon(_Vader):
    name = "vader-amazon"
    domain = "amazon"
    summary = "sentences of Amazon product reviews rated by 20 people (VADER, 2014), a test set: 2,943 polar ones"


@register_source
class VaderTweets(_Vader):
    name = "vader-tweets"
    domain = "tweets"
    summary = "tweets rated by 20 people (VADER, 2014), a test set: 3,362 polar ones"


@register_source
class VaderNYT(_Vader):
    name = "vader-nyt"
    domain = "nyt"
    summary = "sentences of New York Times editorials rated by 20 people (VADER, 2014), a test set: 2,788 polar ones"
