"""A run directory as users meet it: TensorBoard events, best and last checkpoints,
'attnlab eval' and 'attnlab predict', CIFAR-10 recipes wired to image folders."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.cli import main
from attnlab.data import load_digits_dataset
from attnlab.data.readers.images import CIFAR10_CLASSES
from attnlab.engine.checkpoint import CheckpointError, resolve_checkpoint, save_named_checkpoint
from attnlab.engine.metrics import read_metrics
from attnlab.recipes import load_recipe
from attnlab.data.source import source_of
from attnlab.tasks import load_run
from conftest import DIGITS_WITH_VALIDATION

TINY = [*DIGITS_WITH_VALIDATION, "train.steps=8", "train.warmup_steps=1", "train.batch_size=32", "train.eval_every=4",
        "train.checkpoint_every=4", "train.log_every=2", "model.options.depth=1"]


def build_data(recipe):
    """``(train, validation, test)`` of the recipe's data source."""
    splits = source_of(recipe.data).load(recipe.data)
    return splits.train, splits.val, splits.test


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "digits"
    assert main(["train", "vit-digits", *TINY, "--run-dir", str(folder)]) == 0
    return folder


def test_tensorboard_events_hold_the_logged_scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/lr", "train/samples_per_s", "eval/accuracy", "eval/loss"} <= set(tags)
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 4, 6, 8]  # step 1, then every log_every
    logged = {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"}
    for e in events.Scalars("train/loss"):
        assert e.value == pytest.approx(logged[e.step], rel=1e-6)


def test_best_checkpoint_holds_the_best_evaluation(run_dir):
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    best = max(evals, key=lambda r: r["accuracy"])
    folder = resolve_checkpoint(run_dir / "checkpoints", "best")
    assert json.loads((folder / "manifest.json").read_text())["step"] == best["step"]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["best_val_accuracy"] == best["accuracy"]  # picked on the validation images, never the test set
    assert (results["train_size"], results["val_size"], results["test_size"]) == (1293, 144, 360)
    assert results["test_checkpoint"] == "best" and results["classes"] == [str(d) for d in range(10)]
    assert resolve_checkpoint(run_dir / "checkpoints", "last").name == "step_000000008"


def test_eval_with_no_options_reproduces_results_json_exactly(run_dir, capsys):
    results = json.loads((run_dir / "results.json").read_text())
    assert main(["eval", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"| test accuracy | {100 * results['test_accuracy']:.2f}% |" in out and "| test samples | 360 |" in out
    assert f"checkpoint: {run_dir / 'checkpoints' / 'best'}" in out
    res = load_run(run_dir).evaluate()
    assert (res["test_accuracy"], res["test_loss"]) == (results["test_accuracy"], results["test_loss"])


def test_predict_command_classifies_image_files(run_dir, tmp_path, capsys):
    test = load_digits_dataset("test")
    files = []
    for i in range(4):
        path = tmp_path / f"digit{i}.png"
        Image.fromarray(test.images[i, 0].numpy()).save(path)
        files.append(str(path))
    assert main(["predict", str(run_dir), *files, "--checkpoint", "last", "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    # The files hold exactly the test images: the printed label is the model's argmax on them.
    model = load_run(run_dir, "last").model
    from attnlab.data.transforms.images import digits_transforms

    with torch.no_grad():
        probs = model(digits_transforms(train=False)(test.images[:4])).softmax(-1)
    for line, p, f in zip(lines, probs, files):
        label, prob, *_, name = line.split("\t")  # label, probability, second label and probability, file
        assert name == f
        assert int(label) == int(p.argmax()) and float(prob) == pytest.approx(float(p.max()), abs=1e-3)


@pytest.mark.parametrize("argv, message", [
    (["predict", "RUN", "/no/such.png"], "FILE '/no/such.png' does not exist"),
    (["eval", "/", "--checkpoint", "last"], "run_dir must be an attnlab run directory"),
    (["eval", "RUN", "--checkpoint", "nope"], "no 'nope' checkpoint"),
])
def test_eval_and_predict_errors_exit_2(run_dir, capsys, argv, message):
    argv = [str(run_dir) if a == "RUN" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_text_file_is_not_an_image(run_dir, tmp_path, capsys):
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    assert main(["predict", str(run_dir), str(bad)]) == 2
    assert "is not a readable image" in capsys.readouterr().err


def test_named_checkpoint_survives_a_crash_between_renames(tmp_path):
    weights = {"w": torch.arange(4.0)}
    save_named_checkpoint(tmp_path, "best", 1, weights, {"step": 1})
    save_named_checkpoint(tmp_path, "best", 2, {"w": torch.ones(4)}, {"step": 2})
    assert json.loads((resolve_checkpoint(tmp_path, "best") / "manifest.json").read_text())["step"] == 2
    # A crash after "best" was moved aside but before the new one took its place:
    (tmp_path / "best").rename(tmp_path / ".best.old")
    assert resolve_checkpoint(tmp_path, "best").name == ".best.old"
    (tmp_path / ".best.old" / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        resolve_checkpoint(tmp_path, "best")


def test_a_recipe_shortened_below_its_warmup_trains_with_the_warmup_capped(tmp_path, capsys):
    assert load_recipe("vit-digits", ["train.steps=10"]).train.warmup_steps == 100  # the recipe's, kept as given
    assert main(["train", "vit-digits", "train.steps=3", "model.options.depth=1", "--run-dir", str(tmp_path / "r")]) == 0
    assert "note: train.warmup_steps=100 is longer than train.steps=3; the warm-up is capped at 3 steps" in \
        capsys.readouterr().out


@pytest.mark.parametrize("recipe", ["attncnn-cifar10", "botnet-cifar10", "vit-cifar10", "resnet-cifar10", "cct-cifar10",
                                    "cct-fast-cifar10"])
def test_cifar10_recipes_train_from_an_image_folder(tiny_cifar, tmp_path, recipe):
    run = tmp_path / "run"
    argv = ["train", recipe, f"data.data_dir={tiny_cifar}", "data.val_size=10", "train.steps=2",
            "train.warmup_steps=1", "train.batch_size=8", "train.eval_every=0", "train.checkpoint_every=0",
            "--run-dir", str(run)]
    assert main(argv) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 2 and results["classes"] == list(CIFAR10_CLASSES)
    assert (results["train_size"], results["val_size"]) == (30, 10)
    assert load_run(run).evaluate()["test_samples"] == 20


def test_max_per_class_caps_the_built_in_sets_too(tiny_cifar):
    recipe = load_recipe("attncnn-cifar10", [f"data.data_dir={tiny_cifar}", "data.val_size=10", "data.max_per_class=2"])
    train, val, _ = build_data(recipe)
    assert len(val) == 10 and len(train) == 20  # 3 per class after the split, capped at 2
    assert torch.bincount(train.ds.targets[train.indices]).tolist() == [2] * 10


def test_batched_fetch_equals_one_image_at_a_time(tiny_cifar):
    recipe = load_recipe("attncnn-cifar10", [f"data.data_dir={tiny_cifar}", "data.val_size=10"])
    _, val, test = build_data(recipe)
    assert sorted(val.ds.targets[val.indices].tolist()) == list(range(10))  # stratified: one image per class
    x, y = test.get_batch([3, 0, 7])
    for row, i in enumerate([3, 0, 7]):
        xi, yi = test[i]
        assert torch.equal(x[row], xi) and int(y[row]) == yi


def test_a_second_run_into_the_same_folder_is_refused_and_resume_of_nothing_starts_fresh(run_dir, tmp_path, capsys):
    before = (run_dir / "config.yaml").read_text()
    assert main(["train", "vit-digits", *TINY, "--run-dir", str(run_dir)]) == 2
    assert "already holds a run (config.yaml, results.json" in capsys.readouterr().err
    assert (run_dir / "config.yaml").read_text() == before  # nothing was touched
    fresh = tmp_path / "fresh"
    assert main(["train", "vit-digits", *TINY, "train.steps=2", "--run-dir", str(fresh), "--resume"]) == 0
    assert "no complete checkpoint yet; starting from step 0" in capsys.readouterr().out
    assert json.loads((fresh / "results.json").read_text())["steps"] == 2


# ---------------------------------------------------------------------------- a damaged config.yaml


@pytest.mark.parametrize("content, message", [
    ("", "config.yaml is empty"),
    ("   \n", "config.yaml is empty"),
    ("task: [unclosed", "config.yaml is not valid YAML"),
    ("- a list\n", "config.yaml must hold a YAML mapping of settings; got list"),
    ("train: {lr: fast}\n", "config.yaml is not a valid recipe: train.lr must be a number; got 'fast'"),
    (b"\xff\xfe", "config.yaml is not UTF-8 text"),
])
def test_a_bad_config_yaml_is_named_not_taken_for_the_default_recipe(digits_run, tmp_path, capsys, content, message):
    run = digits_run
    config = run / "config.yaml"
    config.write_bytes(content if isinstance(content, bytes) else content.encode())
    for argv in (["eval", str(run)], ["report", str(run)], ["train", "--run-dir", str(run), "--resume"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and str(config) in err and "Traceback" not in err, (argv, err)
