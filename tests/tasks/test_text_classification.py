"""Text classification on MR end to end: recipe, tokenizer in the run directory, split and
10-fold protocols, eval and predict (texts and standard input), bad input."""

import io
import json
import os
import warnings
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.recipes import load_recipe
from attnlab.tasks import load_run, read_results

from conftest import make_folder
from refusals import one_line


DATA = os.environ.get("ATTNLAB_DATA_DIR")
pytestmark = [
    pytest.mark.skipif(not DATA or not (Path(DATA) / "mr").is_dir(),
                       reason="MR absent: set ATTNLAB_DATA_DIR to a folder holding mr/ (make test does)"),
    pytest.mark.filterwarnings("ignore:.*were truncated"),  # the tiny runs cut sentences at 32 tokens on purpose
]

TINY = ["model.name=sentiment_transformer_tiny", "model.options={}", "text.vocab_size=1000", "text.max_length=32",
        "train.batch_size=32", "train.warmup_steps=1", "train.log_every=0", "train.progress=false",
        "train.tensorboard=false"]


@pytest.fixture(scope="module")
def split_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("mr") / "split"
    assert main(["train", "sentiment-mr", *TINY, "train.steps=30", "train.eval_every=15",
                 "train.checkpoint_every=15", "--run-dir", str(run)]) == 0
    return run


def test_split_run_directory(split_run):
    results = json.loads((split_run / "results.json").read_text())
    assert (results["train_size"], results["dev_size"], results["test_size"]) == (8530, 1066, 1066)
    assert results["classes"] == ["negative", "positive"] and results["steps"] == 30
    assert 0.0 <= results["test_accuracy"] <= 1.0 and results["vocab_size"] <= 1000
    assert (split_run / "tokenizer.json").is_file() and (split_run / "checkpoints" / "best").is_dir()


def test_eval_reproduces_results_json_exactly_with_the_weights_it_names(split_run, capsys):
    results = read_results(split_run)
    assert results["test_checkpoint"] == "best"  # selected on the dev part, tested once
    run = load_run(split_run)
    assert run.checkpoint.name == "best" and run.classes == ["negative", "positive"]
    res = run.evaluate()
    assert res["test_samples"] == 1066
    assert (res["test_accuracy"], res["test_loss"]) == (results["test_accuracy"], results["test_loss"])
    assert main(["eval", str(split_run)]) == 0
    out = capsys.readouterr().out
    assert f"| test accuracy | {100 * results['test_accuracy']:.2f}% |" in out and "checkpoints/best" in out


def test_predict_texts_and_standard_input(split_run, capsys, monkeypatch):
    texts = ["a gorgeous , witty , seductive movie .", "", "   ", "zzz ☃ qqq", "boring " * 200]
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # the module's marker hides truncation; here it is what is checked
        assert main(["predict", str(split_run), *texts]) == 0
    out, err = capsys.readouterr()
    warning = [line for line in err.splitlines() if "truncated" in line]  # one line, no Python source line
    assert len(warning) == 1 and warning[0].startswith("attnlab predict: warning: 1 of 3 texts")
    assert "argument 2: blank: not predicted" in err and "argument 3: blank: not predicted" in err
    lines = out.splitlines()
    assert len(lines) == len(texts) - 2  # the blank ones are reported, not classified
    for line in lines:
        label, prob = line.split("\t")[:2]
        assert label in ("negative", "positive") and 0.5 <= float(prob) <= 1.0
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(["a dull mess ."] * 600) + "\n"))
    assert main(["predict", str(split_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 600 and len(set(lines)) == 1  # batched: the same sentence gets the same answer


def test_predict_reports_a_line_that_is_not_utf8_and_classifies_the_others(split_run, capsys, monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO(b"a gorgeous movie .\n\xff\xfe broken\na dull mess .\n"))
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["predict", str(split_run)]) == 2
    out, err = capsys.readouterr()
    assert [line.split("\t")[2] for line in out.splitlines()] == ["a gorgeous movie .", "a dull mess ."]
    assert err.strip() == "attnlab: error: line 2 of standard input is not valid UTF-8 (at position 0); it was skipped"
    assert main(["predict", str(split_run), "good", b"\xff".decode("utf-8", "surrogateescape")]) == 2
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and "argument 2 is not valid UTF-8" in err and "Traceback" not in err


@pytest.mark.long  # ten trainings: `make test-long` and CI
def test_cross_validation_runs_ten_folds_and_resumes_a_missing_one(tmp_path, capsys):
    run = tmp_path / "cv"
    argv = ["train", "sentiment-mr", *TINY, "data.protocol=cv10", "train.steps=2", "train.eval_every=0",
            "train.checkpoint_every=0", "--run-dir", str(run)]
    assert main(argv) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["protocol"] == "cv10" and len(results["fold_accuracies"]) == 10
    assert "± " in capsys.readouterr().out
    sizes = [json.loads((run / f"fold_{k}" / "results.json").read_text())["test_size"] for k in range(10)]
    assert sum(sizes) == 10662 and set(sizes) <= {1066, 1067}
    # An interrupted cross-validation: fold 9 never finished. Resume redoes only fold 9.
    kept = (run / "fold_0" / "results.json").stat().st_mtime_ns
    (run / "fold_9" / "results.json").unlink()
    (run / "results.json").unlink()
    assert main(argv + ["--resume"]) == 0
    assert (run / "fold_0" / "results.json").stat().st_mtime_ns == kept
    assert json.loads((run / "results.json").read_text())["fold_accuracies"] == results["fold_accuracies"]
    with pytest.raises(ValueError, match="load one of its fold_<k> folders"):
        load_run(run)
    fold = read_results(run / "fold_3")
    assert fold["test_checkpoint"] == "last" and not (run / "fold_3" / "checkpoints" / "best").exists()  # no selection
    res = load_run(run / "fold_3").evaluate()
    assert (res["test_samples"], res["test_accuracy"]) == (sizes[3], fold["test_accuracy"])


def test_recipe_task_and_data_must_agree():
    with pytest.raises(ValueError, match="data.name must be one of 'mr', 'file', 'vader-amazon', "
                                         "'vader-tweets', 'vader-nyt'; got 'cifar10'"):
        load_recipe("sentiment-mr", ["data.name=cifar10"])


def test_python_api_predicts_labels_with_probabilities(split_run):
    run = load_run(split_run)
    [p, q] = run.predict(["a gorgeous , witty , seductive movie .", "a dull mess ."], top_k=2)
    assert p.input == "a gorgeous , witty , seductive movie ." and [label for label, _ in p.labels] in (
        ["positive", "negative"], ["negative", "positive"])
    assert sum(prob for _, prob in p.labels) == pytest.approx(1.0, abs=1e-5) and p.labels[0][1] >= p.labels[1][1]


def test_predict_skips_a_line_over_the_limit_without_reading_it_whole(split_run, capsys, monkeypatch):
    long_line = b"boring " * 2_000_000  # 14 MB on one line
    stdin = io.TextIOWrapper(io.BytesIO(b"a gorgeous movie .\n" + long_line + b"\na dull mess .\n"))
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["predict", str(split_run), "--max-line-chars", "1000", "--json"]) == 2
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines()]
    assert [r.get("input") for r in records] == ["a gorgeous movie .", None, "a dull mess ."]
    assert "is too long (more than 4,004 bytes; the limit is 1,000 characters, which --max-line-chars raises)" in \
        records[1]["error"]
    assert "line 2 of standard input is too long" in err and "Traceback" not in err
    assert main(["predict", str(split_run), "--max-line-chars", "10", "a gorgeous movie ."]) == 2
    assert "argument 1 is too long (18 characters; the limit is 10" in capsys.readouterr().err


def test_a_truncation_warning_at_predict_names_the_recipe_key(split_run, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        assert main(["predict", str(split_run), "boring " * 200]) == 0
    err = capsys.readouterr().err
    assert "the run was trained with text.max_length=32" in err and "max_length=" not in err.replace("text.max", "")


# ---------------------------------------------------------------------------- eval --data, an image folder


def test_an_image_folder_given_to_a_text_classifier_says_which_file_it_needs(text_run, tmp_path, capsys):
    photos = make_folder(tmp_path / "photos", per_class=2)
    assert main(["eval", str(text_run), "--data", str(photos)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("attnlab eval: error: --data ") and "must be a CSV, TSV or JSON Lines file" in line
    assert ".csv, .tsv, .jsonl" in line and "text classification run" in line
    assert f"{photos} is a folder of images (" in line and ".png" in line
