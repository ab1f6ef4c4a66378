"""Recipes and the train command: validated before work, a complete run directory, resume."""

import json
import re
import subprocess
import sys

import pytest
import yaml

from attnlab.cli import main
from attnlab.engine.config import ConfigError
from attnlab.engine.metrics import read_metrics
from attnlab.recipes import list_recipes, load_recipe
from attnlab.tasks import read_recipe, recipe_dict
from conftest import DIGITS_WITH_VALIDATION


def test_shipped_recipes_are_listed_and_valid():
    rows = list_recipes()
    assert ("vit-digits", "image_classification") in [(name, task) for name, task, _ in rows]
    assert {task for _, task, _ in rows} == {"image_classification", "text_classification", "translation", "reverse",
                                             "language_modeling"}
    from attnlab.errors import InputError

    for name, task, _ in rows:
        try:
            recipe = load_recipe(name)
        except InputError as exc:  # a recipe of a packaged model where `make models` did not install it
            assert "is not installed" in str(exc) and "make models" in str(exc), exc
            continue
        assert recipe.task == task and recipe.train.steps > 0


def test_a_run_config_holds_only_the_keys_of_its_task(tmp_path):
    assert main(["train", "vit-digits", "train.steps=2", "model.options.depth=1", "--run-dir", str(tmp_path / "r")]) == 0
    config = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert list(config) == ["description", "task", "data", "model", "train"]  # no text.*, no translate.*
    assert set(config["data"]) == {"name", "data_dir", "augment", "val_size", "seed", "max_per_class", "crop_padding"}
    assert list(recipe_dict(load_recipe("translate-multi30k"))) == [
        "description", "task", "data", "model", "text", "translate", "train"]


@pytest.mark.parametrize("override, message", [
    ("model.options.dropout=0.1", "model 'vit_digits_patch2': unknown ViTConfig field 'dropout'; did you mean drop_rate"),
    ("model.options.depth=-1", "model 'vit_digits_patch2': depth must be a positive integer; got -1"),
    ("model.options.attention=lineer", "unknown attention 'lineer'; did you mean linear"),
    ("model.options.attention_options={windw: 4}", "unknown option 'windw' of attention 'exact'"),
    ("model.name=vit_digit_patch2", "unknown model 'vit_digit_patch2'; did you mean vit_digits_patch2"),
    ("task=sentimnt", "unknown task 'sentimnt'"),
])
def test_model_and_attention_options_are_checked_when_the_recipe_is_loaded(tmp_path, capsys, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_recipe("vit-digits", [override])
    assert main(["train", "vit-digits", override, "--run-dir", str(tmp_path / "r")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "r").exists()  # before a run directory is made


def test_attention_options_of_another_kind_are_checked_against_it():
    with pytest.raises(ConfigError, match="unknown option 'sliding_windw' of attention 'local'; did you mean sliding_window"):
        load_recipe("sentiment-mr", ["model.options.attention=local", "model.options.attention_options={sliding_windw: 4}"])
    load_recipe("sentiment-mr", ["model.options.attention=local", "model.options.attention_options={sliding_window: 4}"])


def test_recipes_command_prints_the_resolved_recipe_and_its_keys(capsys):
    assert main(["recipes", "vit-digits", "train.steps=7"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["steps"] == 7 and printed["data"]["val_size"] == 0 and "text" not in printed
    assert main(["recipes", "sentiment-mr", "--keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line.split() for line in lines if line.startswith("text.max_length "))
    assert row[1:4] == ["int", "64", "96"] and "tokens per text" in " ".join(row)
    assert any(line.startswith("model.options.embed_dim ") for line in lines)  # the model's own configuration
    assert any(line.startswith("train.warmup_steps ") and "capped" in line for line in lines)


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("task: image_classification\ntrain: {steps: 3\nmodel: x\n")
    assert main(["train", str(path), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnlab train: error: {path} is not valid YAML at line 3, column ") and err.count("\n") == 1


def test_overrides_and_errors():
    r = load_recipe("vit-digits", ["train.lr=3e-4", "model.options.depth=2"])
    assert r.train.lr == 3e-4 and r.model.options == {"drop_path_rate": 0.0, "depth": 2}
    with pytest.raises(ConfigError, match="unknown key 'train.lrr'; did you mean lr"):
        load_recipe("vit-digits", ["train.lrr=1"])
    with pytest.raises(ConfigError, match="train.steps must be >= 1; got 0"):
        load_recipe("vit-digits", ["train.steps=0"])
    with pytest.raises(ConfigError, match="unknown recipe 'vit-digit'.*did you mean vit-digits"):
        load_recipe("vit-digit")


def test_a_yaml_file_is_a_recipe(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("model: {name: vit_digits_patch2}\ntrain: {steps: 3}\n")
    assert load_recipe(str(path)).train.steps == 3


def test_train_writes_a_complete_run_directory_and_resumes(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["train", "vit-digits", *DIGITS_WITH_VALIDATION, "train.steps=6", "train.checkpoint_every=3", "train.eval_every=3",
            "train.log_every=3", "train.warmup_steps=1", "--run-dir", str(run_dir)]
    assert main(args) == 0
    assert "test accuracy" in capsys.readouterr().out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["steps"] == 6 and 0.0 <= results["test_accuracy"] <= 1.0 and results["params"] == 136_138
    assert (run_dir / "config.yaml").read_text().startswith("description:")
    assert {r["kind"] for r in read_metrics(run_dir / "metrics.jsonl")} == {"train", "eval"}
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best", "step_000000003", "step_000000006"]
    # Resume with more steps (asked for explicitly) continues from step 6; the change is recorded.
    config = (run_dir / "config.yaml").read_text()
    assert main(["train", "--run-dir", str(run_dir), "--resume", "train.steps=9", "--allow-changes"]) == 0
    assert json.loads((run_dir / "results.json").read_text())["steps"] == 9
    assert (run_dir / "config.yaml").read_text() == config  # the original is kept
    changes = yaml.safe_load((run_dir / "config.changes.yaml").read_text())
    assert [(c["step"], c["changed"]) for c in changes] == [(6, {"train.steps": {"from": 6, "to": 9}})]
    assert read_recipe(run_dir).train.steps == 9
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == sorted(set(steps))  # nothing logged twice


def test_bad_override_exits_2_before_any_work(tmp_path):
    r = subprocess.run([sys.executable, "-m", "attnlab", "train", "vit-digits", "train.precision=fp8",
                        "--run-dir", str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "train.precision must be one of 'auto', 'fp32', 'bf16', 'fp16'; got 'fp8'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x").exists()


def test_naming_another_data_source_leaves_out_the_recipes_own_source_keys_saying_which():
    import warnings

    from attnlab.recipes import load_recipe

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recipe = load_recipe("text-classification", ["data.name=mr"])
    assert recipe.data.name == "mr"
    said = [str(w.message) for w in caught if "replaces the recipe's data.name" in str(w.message)]
    assert len(said) == 1 and "data.format" in said[0] and "data.train" in said[0] and "\n" not in said[0]
    # a key given on the command line stays, and one the new source does not take is refused by name
    with pytest.raises(ConfigError, match="data.format"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_recipe("text-classification", ["data.name=mr", "data.format=csv"])
    with warnings.catch_warnings(record=True) as caught:  # the same source again: nothing left out, nothing said
        warnings.simplefilter("always")
        load_recipe("text-classification", ["data.name=file"])
    assert not [w for w in caught if "replaces" in str(w.message)]


@pytest.mark.parametrize("value", ["!foo 3", "!!python/object/apply:os.system ['echo hi']"])
def test_a_yaml_tag_in_an_override_is_one_line(value, capsys):
    from attnlab.cli import main

    assert main(["train", "vit-digits", f"train.lr={value}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read the value (at line 1, column 1: could not determine a constructor" \
        in err, err
