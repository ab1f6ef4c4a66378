"""What a language-model run refuses, each in one line that says what to do: an image folder given
as its text, text too short for a window (its test part, ``eval --data``), a prompt with
characters its char vocabulary lacks, a named pipe in a folder of texts. Never "a bug in
attnlab", never a traceback."""

from __future__ import annotations

import os

import pytest

import attnlab
from attnlab.cli import main
from attnlab.errors import InputError

from conftest import make_folder
from refusals import one_line


LM = ["model.options.depth=1", "model.options.embed_dim=32", "model.options.num_heads=2",
      "model.options.mlp_hidden_dim=64", "text.context=32", "text.tokenizer=char", "train.steps=2",
      "train.batch_size=8", "train.warmup_steps=1", "train.eval_every=2", "train.checkpoint_every=2",
      "train.log_every=0", "train.progress=false", "train.tensorboard=false", "train.precision=fp32",
      "generate.max_new_tokens=4"]


STORY = "".join(f"the {w} sat on the mat and looked at the {v}.\n" for w in ("cat", "dog", "owl", "fox") * 10
                for v in ("moon", "sun"))


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A character language model trained for two steps on a small story."""
    tmp = tmp_path_factory.mktemp("lm")
    (tmp / "story.txt").write_text(STORY, encoding="utf-8")
    run = tmp / "run"
    assert main(["train", "lm-text", f"data.path={tmp / 'story.txt'}", *LM, "--run-dir", str(run)]) == 0
    return run


# ---------------------------------------------------------------------------- eval --data, an image folder


def test_an_image_folder_given_to_a_language_model_says_which_text_it_needs(lm_run, tmp_path, capsys):
    photos = make_folder(tmp_path / "photos", per_class=2)
    assert main(["eval", str(lm_run), "--data", str(photos)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("attnlab eval: error: --data ") and "must be a .txt file, a folder of .txt files" in line
    assert "language model run" in line and f"{photos} is a folder of images (" in line


# ---------------------------------------------------------------------------- text too short


def test_a_test_part_too_short_names_the_part_the_file_the_key_and_the_context(tmp_path, capsys):
    text = tmp_path / "story.txt"
    text.write_text(STORY, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", "lm-text", f"data.path={text}", "data.test_size=1", "data.val_size=0", *LM,
                 "--run-dir", str(run)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"attnlab train: error: the test part of data.path={text} (data.test_size=1) gives "
                           f"1 token (1 character); a language model needs at least 2 tokens")
    assert "text.context=32" in line
    assert not run.exists()


def test_eval_data_too_short_names_the_file_and_the_context(lm_run, tmp_path, capsys):
    (tmp_path / "one.txt").write_text("t", encoding="utf-8")
    assert main(["eval", str(lm_run), "--data", str(tmp_path / "one.txt")]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"--data {tmp_path / 'one.txt'} gives 1 token (1 character)" in line and "text.context=32" in line


# ---------------------------------------------------------------------------- a char vocabulary


def test_a_prompt_outside_a_runs_char_vocabulary_says_what_the_user_can_do(lm_run, capsys):
    assert main(["predict", str(lm_run), "the cat in Zürich"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "outside this char tokenizer's" in line and "'ü' (U+00FC)" in line
    assert "learned from its training text" in line and "text.tokenizer=byte or text.tokenizer=bpe" in line
    assert "unk=True" not in line  # a Python argument that no recipe key sets
    with pytest.raises(InputError, match=r"text\.tokenizer=byte") as info:
        attnlab.load_run(lm_run).predict(["Zürich"])
    assert "unk=True" not in str(info.value)


# ---------------------------------------------------------------------------- what a path is


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX's")
def test_a_named_pipe_in_a_data_folder_is_named_as_one(tmp_path, capsys):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("the cat sat on the mat\n" * 50)
    os.mkfifo(texts / "b.txt")  # opened, it would wait for a writer forever
    assert main(["train", "lm-text", f"data.path={texts}", *LM, "--run-dir", str(tmp_path / "run")]) == 2
    assert one_line(capsys.readouterr().err).endswith(f"{texts / 'b.txt'} is a named pipe (FIFO), not a regular file; "
                                                      f"a text file was expected")
    (texts / "c.txt").symlink_to(tmp_path / "gone.txt")
    from attnlab.data.paths import not_a_file

    assert not_a_file(texts / "c.txt") == "is a broken symbolic link"
    assert not_a_file(texts) == "is a folder, not a regular file" and not_a_file(tmp_path / "no") == "does not exist"
