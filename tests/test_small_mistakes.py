"""Small mistakes a user makes, each answered by one line that says what to do: a base URL
that is not a URL, an export into a file's "folder" or onto a full disk, a file or a step
number given to load_run, top_k out of range, a tensor given as a text, token ids outside
the vocabulary, an image folder given to a text run, text too short for a language model,
a prompt with characters a char vocabulary lacks. Never "a bug in attnlab", never a
traceback; the key words: the argument (its command-line name there), the value, what
was expected."""

from __future__ import annotations

import csv
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.data import CharTokenizer
from attnlab.data.batches.lm import LMDataset
from attnlab.errors import InputError

from conftest import make_folder

BUG = "bug in attnlab"
LM = ["model.options.depth=1", "model.options.embed_dim=32", "model.options.num_heads=2",
      "model.options.mlp_hidden_dim=64", "text.context=32", "text.tokenizer=char", "train.steps=2",
      "train.batch_size=8", "train.warmup_steps=1", "train.eval_every=2", "train.checkpoint_every=2",
      "train.log_every=0", "train.progress=false", "train.tensorboard=false", "train.precision=fp32",
      "generate.max_new_tokens=4"]
STORY = "".join(f"the {w} sat on the mat and looked at the {v}.\n" for w in ("cat", "dog", "owl", "fox") * 10
                for v in ("moon", "sun"))


def one_line(err: str) -> str:
    """The one line of a refusal on stderr (asserting that there is one, and no traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and BUG not in err, err
    return lines[0]


def _cli(*args: str, fsize: int | None = None) -> subprocess.CompletedProcess:
    """``attnlab ARGS`` in a child process whose files are capped at ``fsize`` bytes."""
    limit = f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))\n" if fsize else ""
    code = f"{limit}import sys\nfrom attnlab.cli import main\nsys.exit(main({list(args)!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A text classifier of two classes trained for two steps on a CSV of one's own."""
    tmp = tmp_path_factory.mktemp("texts")
    rng = random.Random(0)
    with open(tmp / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for label, words in {"sports": "goal match team score win", "weather": "rain sun cloud storm wind"}.items():
            for _ in range(20):
                w.writerow([" ".join(rng.choice(words.split()) for _ in range(5)), label])
    run = tmp / "run"
    assert main(["train", "text-classification", f"data.train={tmp / 't.csv'}", "text.vocab_size=300",
                 "model.options.embed_dim=32", "model.options.depth=1", "model.options.num_heads=2", "train.steps=2",
                 "train.warmup_steps=1", "train.batch_size=8", "train.progress=false", "train.tensorboard=false",
                 "--run-dir", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A character language model trained for two steps on a small story."""
    tmp = tmp_path_factory.mktemp("lm")
    (tmp / "story.txt").write_text(STORY, encoding="utf-8")
    run = tmp / "run"
    assert main(["train", "lm-text", f"data.path={tmp / 'story.txt'}", *LM, "--run-dir", str(run)]) == 0
    return run


# ---------------------------------------------------------------------------- 1. data download --base-url


@pytest.mark.parametrize("url", ["nota url", "ftp://mirror.example.org/data", "http://", "http://127.0.0.1:port",
                                 "/srv/mirror"])
def test_a_base_url_that_is_not_a_url_is_refused_naming_base_url(tmp_path, capsys, url):
    data = tmp_path / "data"
    assert main(["data", "download", "mr", "--data-dir", str(data), "--base-url", url]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("attnlab data: error: --base-url must be an http://, https:// or file:// URL")
    assert repr(url) in line
    assert not data.exists()  # refused before anything was made
    with pytest.raises(InputError, match=r"^base_url must be an http://, https:// or file:// URL .*got "):
        attnlab.data.download.download("mr", data, base_url=url, progress=None)
    assert not data.exists()


# ---------------------------------------------------------------------------- 2. export --out


def test_an_export_below_a_file_is_refused_naming_out_before_any_work(digits_run, tmp_path, capsys):
    existing = tmp_path / "existing.onnx"
    existing.write_bytes(b"an earlier export")
    for out in (existing / "sub.onnx", existing / "a" / "b"):
        # a run that does not exist: the --out check comes first, before the run is loaded
        assert main(["export", str(tmp_path / "no-run"), "--out", str(out)]) == 2
        line = one_line(capsys.readouterr().err)
        assert f"--out {out}: {existing} is a file, not a folder" in line and "choose another --out" in line
        assert main(["export", str(digits_run), "--out", str(out)]) == 2
        one_line(capsys.readouterr().err)
    assert existing.read_bytes() == b"an earlier export" and sorted(p.name for p in tmp_path.iterdir()) == \
        ["existing.onnx", "run"]
    (tmp_path / "folder.onnx").mkdir()
    assert main(["export", str(digits_run), "--out", str(tmp_path / "folder.onnx")]) == 2
    assert f"--out {tmp_path / 'folder.onnx'} is a folder; give a .onnx file" in one_line(capsys.readouterr().err)


def test_an_export_onto_a_full_disk_leaves_no_file_and_keeps_an_earlier_export(text_run, tmp_path):
    out = tmp_path / "export" / "model.pt"
    done = _cli("export", str(text_run), "--format", "torchscript", "--out", str(out), fsize=20_000)
    assert done.returncode == 1, done.stderr
    line = one_line(done.stderr)
    assert line.startswith(f"attnlab export: error: could not write {out} (") and "File too large" in line
    # the tokenizer (a few KB) and the preprocessing.json would fit: none of the three files is left, nor a
    # temporary one
    assert not out.parent.exists() or not list(out.parent.iterdir())
    assert _cli("export", str(text_run), "--format", "torchscript", "--out", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    assert sorted(before) == ["model.preprocessing.json", "model.pt", "model.tokenizer.json"]
    done = _cli("export", str(text_run), "--format", "torchscript", "--out", str(out), "--force", fsize=20_000)
    assert done.returncode == 1 and "could not write" in one_line(done.stderr)
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before  # the earlier export, whole


# ---------------------------------------------------------------------------- 3. load_run


def test_load_run_of_a_file_says_it_is_a_file(tmp_path, capsys):
    table = tmp_path / "scores.csv"
    table.write_text("text,label\ngood,1\n")
    with pytest.raises(InputError, match=r"run_dir must be a run directory; .*scores\.csv is a file, not a run "
                                         r"directory"):
        attnlab.load_run(table)
    assert main(["eval", str(table)]) == 2
    assert "scores.csv is a file, not a run directory" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("checkpoint, shown", [(None, "None"), (123, "123"), (2.5, "2.5"), ([], "list"), ("", "''")])
def test_load_run_refuses_a_checkpoint_that_is_neither_a_name_nor_a_folder(digits_run, checkpoint, shown):
    with pytest.raises(InputError, match=r"^checkpoint must be one of 'auto', 'best', 'last', 'averaged' or a "
                                         r"checkpoint folder \(a str or a path\); got " + shown) as info:
        attnlab.load_run(digits_run, checkpoint=checkpoint)
    if checkpoint == 123:
        assert "give its name: 'step_000000123'" in str(info.value)
    assert attnlab.load_run(digits_run, checkpoint="step_000000004").checkpoint.name == "step_000000004"
    assert attnlab.load_run(digits_run, checkpoint=digits_run / "checkpoints" / "best").checkpoint.name == "best"


# ---------------------------------------------------------------------------- 4. predict


@pytest.mark.parametrize("top_k", [-1, 0, True, 1.5, "3"])
def test_top_k_must_be_a_positive_integer(digits_run, text_run, top_k):
    image = torch.zeros(1, 8, 8, dtype=torch.uint8)
    for run, inputs in ((attnlab.load_run(digits_run), [image]), (attnlab.load_run(text_run), ["goal match"])):
        with pytest.raises(InputError, match=rf"^top_k must be a positive integer .*; got {top_k!r}$"):
            run.predict(inputs, top_k=top_k)
        with pytest.raises(InputError, match=r"^batch_size must be a positive integer"):
            run.predict(inputs, batch_size=0)
        assert len(run.predict(inputs, top_k=50)[0].labels) == len(run.classes)  # more than there are: all


def test_a_tensor_given_to_a_text_run_is_named_by_its_index_and_type_not_printed(text_run):
    run = attnlab.load_run(text_run)
    with pytest.raises(InputError) as info:
        run.predict(["goal match", torch.zeros(1000)])
    message = str(info.value)
    assert message.startswith("inputs[1] must be a text (str) for a text_classification run; got Tensor")
    assert "tensor(" not in message and "0., 0." not in message and len(message) < 200


# ---------------------------------------------------------------------------- 5. token ids outside the vocabulary


@pytest.mark.parametrize("name, options, call, message", [
    ("llama_tiny", {}, lambda m: m(torch.tensor([[1, 2, 256]])),
     r"input_ids must be token ids in \[0, 256\) \(vocab_size=256, the model's vocabulary\); got 256"),
    ("gpt_tiny", {"vocab_size": 100}, lambda m: m(torch.tensor([[1, -3, 2]])),
     r"input_ids must be token ids in \[0, 100\) \(vocab_size=100, the model's vocabulary\); got -3"),
    ("bert_tiny", {"num_classes": 2, "vocab_size": 1000}, lambda m: m(torch.tensor([[1, 5000, 3]])),
     r"input_ids must be token ids in \[0, 1000\) \(vocab_size=1000, .*got 5000"),
    ("bert_tiny", {"num_classes": 2, "vocab_size": 1000},
     lambda m: m(torch.tensor([[1, 2, 3]]), token_type_ids=torch.tensor([[0, 1, 2]])),
     r"token_type_ids must be token ids in \[0, 2\) \(type_vocab_size=2, .*got 2"),
    ("sentiment_transformer_small", {"vocab_size": 100}, lambda m: m(torch.tensor([[1, 2, 100]])),
     r"input_ids must be token ids in \[0, 100\) \(vocab_size=100, .*got 100"),
    ("transformer_tiny", {"src_vocab_size": 50, "tgt_vocab_size": 60, "share_embeddings": False},
     lambda m: m(torch.tensor([[5, 50]]), torch.tensor([[1, 2]])),
     r"src must be token ids in \[0, 50\) \(src_vocab_size=50, .*got 50"),
    ("transformer_tiny", {"src_vocab_size": 50, "tgt_vocab_size": 60, "share_embeddings": False},
     lambda m: m(torch.tensor([[5, 7]]), torch.tensor([[1, 60]])),
     r"tgt must be token ids in \[0, 60\) \(tgt_vocab_size=60, .*got 60"),
    ("gru_attention_tiny", {}, lambda m: m.generate(torch.tensor([[5, 1000]])),
     r"src must be token ids in \[0, 1000\) \(src_vocab_size=1000, .*got 1000"),
])
@pytest.mark.parametrize("grad", [False, True])
def test_token_ids_outside_the_vocabulary_are_named_with_the_vocabulary_size(name, options, call, message, grad):
    model = attnlab.create_model(name, **options).train(grad)
    with torch.set_grad_enabled(grad), pytest.raises(InputError, match=message):  # on CPU, training steps too
        call(model)


def test_the_token_id_check_costs_one_reduction_not_a_copy():
    from attnlab.models.token_ids import check_token_ids

    check_token_ids(torch.randint(0, 10, (4, 7)), 10)  # in range: nothing
    check_token_ids(torch.zeros(0, 3, dtype=torch.long), 1)  # empty: nothing to check
    check_token_ids(torch.full((2, 2), 99, device="meta"), 10)  # no values to read: not checked
    with pytest.raises(InputError, match=r"ids must be token ids in \[0, 10\) .*got 10"):
        check_token_ids(torch.tensor([[0, 10]]), 10, "ids")


# ---------------------------------------------------------------------------- 6. eval --data, an image folder


def test_an_image_folder_given_to_a_text_classifier_says_which_file_it_needs(text_run, tmp_path, capsys):
    photos = make_folder(tmp_path / "photos", per_class=2)
    assert main(["eval", str(text_run), "--data", str(photos)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("attnlab eval: error: --data ") and "must be a CSV, TSV or JSON Lines file" in line
    assert ".csv, .tsv, .jsonl" in line and "text classification run" in line
    assert f"{photos} is a folder of images (" in line and ".png" in line


def test_an_image_folder_given_to_a_language_model_says_which_text_it_needs(lm_run, tmp_path, capsys):
    photos = make_folder(tmp_path / "photos", per_class=2)
    assert main(["eval", str(lm_run), "--data", str(photos)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("attnlab eval: error: --data ") and "must be a .txt file, a folder of .txt files" in line
    assert "language model run" in line and f"{photos} is a folder of images (" in line


# ---------------------------------------------------------------------------- 7. text too short


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


def test_lm_dataset_too_short_names_what_it_is_told_and_the_context():
    tok = CharTokenizer.train("abc")
    with pytest.raises(InputError, match=r"^the test part of data\.path=story\.txt gives 1 token \(1 character\); "
                                         r".*windows of text\.context=8 tokens"):
        LMDataset(["a"], tok, 8, name="the test part of data.path=story.txt")
    with pytest.raises(InputError, match=r"^documents must give at least 2 tokens .*context=8 tokens.*they give 1 "
                                         r"token \(1 character\)"):
        LMDataset(["a"], tok, 8)


# ---------------------------------------------------------------------------- 8. a char vocabulary


def test_a_prompt_outside_a_runs_char_vocabulary_says_what_the_user_can_do(lm_run, capsys):
    assert main(["predict", str(lm_run), "the cat in Zürich"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "outside this char tokenizer's" in line and "'ü' (U+00FC)" in line
    assert "learned from its training text" in line and "text.tokenizer=byte or text.tokenizer=bpe" in line
    assert "unk=True" not in line  # a Python argument that no recipe key sets
    with pytest.raises(InputError, match=r"text\.tokenizer=byte") as info:
        attnlab.load_run(lm_run).predict(["Zürich"])
    assert "unk=True" not in str(info.value)


def test_a_char_tokenizer_built_in_python_still_suggests_unk():
    with pytest.raises(InputError, match=r"train it on text that holds it, or with unk=True"):
        CharTokenizer.train("hello").encode("hé")
    with pytest.raises(InputError, match=r"^text holds 1 character .*; my advice$"):
        CharTokenizer.train("hello", advice="my advice").encode("hé")


# ---------------------------------------------------------------------------- what a path is, and numbers past int64


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


def test_a_count_past_64_bits_is_refused_naming_its_key(capsys):
    assert main(["train", "vit-digits", "train.steps=1000000000000000000000"]) == 2
    assert "train.steps must be a whole number of 64 bits" in one_line(capsys.readouterr().err)
