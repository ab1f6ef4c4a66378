"""VADER's rated sentences of other domains (attnlab.data.readers.vader): read from vaderSentiment's
source archive where they lie, polar ones kept, a test set only; a run of MR evaluated on them
with ``attnlab eval RUN --data vader-amazon``; a damaged archive or file named."""

import io
import os
import tarfile
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.data.readers.vader import VADER_FILE, _ratings, load_vader, vader_archive
from attnlab.errors import InputError

DATA = os.environ.get("ATTNLAB_DATA_DIR")


def _archive() -> Path | None:
    try:
        return vader_archive()
    except FileNotFoundError:
        return None


needs_vader = pytest.mark.skipif(_archive() is None, reason="vaderSentiment's source archive absent: make models "
                                 "downloads it into .venv/share/attnlab (or attnlab data download vader)")


@needs_vader
def test_the_three_sets_keep_the_polar_sentences_of_mr_classes():
    sizes = {}
    for domain in ("amazon", "tweets", "nyt"):
        rows, neutral = load_vader(domain)
        sizes[domain] = (len(rows), neutral, sum(rows.labels))
    # counts of the published files: mean ratings beyond +-0.5 kept
    assert sizes == {"amazon": (2943, 765, 1725), "tweets": (3362, 838, 2300), "nyt": (2788, 2402, 1100)}
    rows, neutral = load_vader("amazon", neutral=0.0)
    assert len(rows) + neutral == 3708 and neutral == 98  # ratings of exactly 0
    rows, _ = load_vader("tweets")
    assert rows.labels[0] == 1 and rows.texts[0].startswith("Somehow I was blessed")


def test_a_rating_file_that_is_not_three_fields_is_named_with_its_line():
    assert _ratings(b"1\t2.5\tgood\r\n2\t-1\tbad\r\n\r\n", "f") == [(2.5, "good"), (-1.0, "bad")]
    for bad in (b"1\t2.5\n", b"1\tnan\tx\n", b"1\t9\tx\n", b"1\t1\t \n", b"1\tabc\tx\n"):
        with pytest.raises(InputError, match=r"f line 1: expected an id, a mean rating in \[-4, 4\]"):
            _ratings(b"" + bad, "f")


def test_an_archive_that_is_not_vaders_is_refused_and_a_missing_one_names_the_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="attnlab data download vader"):
        _missing(tmp_path)
    (tmp_path / "vader").mkdir()
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as archive:
        info = tarfile.TarInfo("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"abc"))
    (tmp_path / "vader" / VADER_FILE).write_bytes(data.getvalue())
    with pytest.raises(InputError, match="is not the vaderSentiment 3.3.2 source archive"):
        load_vader("amazon", tmp_path)
    with pytest.raises(InputError, match="domain must be one of amazon, tweets, nyt; got 'imdb'"):
        load_vader("imdb", tmp_path)


def _missing(root: Path) -> None:
    """``vader_archive`` of a data directory without it, where the environment has none either."""
    import sys
    from unittest import mock

    with mock.patch.object(sys, "prefix", str(root / "no-env")):
        vader_archive(root)


def test_training_on_a_test_set_alone_is_refused_in_one_line(capsys):
    assert main(["train", "sentiment-mr", "data.name=vader-tweets", "--run-dir", "/nonexistent/run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "data.name=vader-tweets is a test set alone" in err and "attnlab eval RUN --data vader-tweets" in err
    assert len(err.splitlines()) == 1


@needs_vader
@pytest.mark.skipif(not DATA or not (Path(DATA) / "mr").is_dir(), reason="MR absent: set ATTNLAB_DATA_DIR")
@pytest.mark.filterwarnings("ignore:.*were truncated")
def test_a_run_of_mr_is_evaluated_on_amazon_reviews_by_name(tmp_path, capsys, monkeypatch):
    run = tmp_path / "mr"
    assert main(["train", "sentiment-mr", "model.name=sentiment_transformer_tiny", "model.options={}",
                 "text.vocab_size=500", "text.max_length=16", "train.steps=2", "train.eval_every=0",
                 "train.checkpoint_every=0", "train.progress=false", "train.tensorboard=false", "--run-dir",
                 str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--data", "vader-amazon"]) == 0
    out = capsys.readouterr().out
    assert "data: vader-amazon" in out and "| test samples | 2,943 |" in out
    # a file of that name in the working folder is the user's, read as a file
    monkeypatch.chdir(tmp_path)
    Path("vader-amazon").mkdir()
    assert main(["eval", str(run), "--data", "vader-amazon"]) == 2
    assert "must be a CSV, TSV or JSON Lines file" in capsys.readouterr().err
