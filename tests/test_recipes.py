"""Recipes and the train command: validated before work, a complete run directory, resume."""

import json
import subprocess
import sys

import pytest
import yaml

from attnlab.cli import main
from attnlab.engine.config import ConfigError
from attnlab.engine.metrics import read_metrics
from attnlab.recipes import list_recipes, load_recipe
from attnlab.tasks.common import read_recipe


def test_shipped_recipes_are_listed_and_valid():
    names = [name for name, _ in list_recipes()]
    assert "vit-digits" in names
    for name in names:
        assert load_recipe(name).train.steps > 0


def test_overrides_and_errors():
    r = load_recipe("vit-digits", ["train.lr=3e-4", "model.options.depth=2"])
    assert r.train.lr == 3e-4 and r.model.options == {"drop_path_rate": 0.1, "depth": 2}
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
    args = ["train", "vit-digits", "train.steps=6", "train.checkpoint_every=3", "train.eval_every=3",
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
    assert r.returncode == 2 and "train.precision must be one of 'fp32', 'bf16', 'fp16'; got 'fp8'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "x").exists()
