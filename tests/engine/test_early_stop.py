"""train.early_stop and train.max_minutes: a run ends when validation stops improving or its
time is spent, says why, and a resumed run keeps both exactly."""

import json

import pytest
import torch

from attnlab.engine.config import ConfigError
from attnlab.engine.trainer import TrainConfig, Trainer
from attnlab.recipes import load_recipe
from attnlab.tasks import train

from test_trainer import Scaled, config as base_config, digits_model


def config(**kw):
    return base_config(**{"progress": False, **kw})  # messages to the log, not to a progress bar


def scripted(trainer, accuracies):
    """Make ``trainer.evaluate`` return ``accuracies[step]``: a validation curve chosen by the test."""
    trainer.evaluate = lambda data=None, model=None: {"loss": 1.0, "accuracy": accuracies[trainer.step]}
    return trainer


def test_early_stop_counts_evaluations_without_improvement(tmp_path):
    lines = []
    # evaluations at steps 2, 4, ...: better, better, same, better, same, same -> stop after step 12
    curve = {2: 0.1, 4: 0.2, 6: 0.2, 8: 0.3, 10: 0.3, 12: 0.29, 14: 0.9}
    trainer = scripted(Trainer(digits_model(), Scaled("train"), config(steps=40, eval_every=2, early_stop=2),
                               eval_data=Scaled("test"), log=lines.append), curve)
    out = trainer.fit()
    assert trainer.step == 12 and out["steps"] == 12
    assert trainer.best == 0.3 and trainer.best_step == 8 and trainer.stale_evals == 2
    assert "train.early_stop=2" in out["stopped"] and "step 8" in out["stopped"]
    assert any(line.startswith("stopped at step 12 of 40: the validation accuracy has not improved for 2 "
                               "evaluations") for line in lines)


def test_no_early_stop_trains_every_step():
    curve = {s: 0.5 for s in range(2, 41, 2)}
    trainer = scripted(Trainer(digits_model(), Scaled("train"), config(steps=20, eval_every=2),
                               eval_data=Scaled("test")), curve)
    out = trainer.fit()
    assert trainer.step == 20 and out["stopped"] is None


def test_early_stop_without_validation_is_said_and_trains_to_the_end():
    lines = []
    trainer = Trainer(digits_model(), Scaled("train"), config(steps=3, eval_every=1, early_stop=1), log=lines.append)
    trainer.fit()
    assert trainer.step == 3
    assert any("train.early_stop=1" in line and "no validation part" in line for line in lines)
    lines.clear()
    Trainer(digits_model(), Scaled("train"), config(steps=3, early_stop=1), eval_data=Scaled("test"),
            log=lines.append)
    assert any("train.eval_every=0" in line for line in lines)


def test_resumed_run_stops_where_an_uninterrupted_one_does(tmp_path):
    curve = {2: 0.1, 4: 0.2, 6: 0.2, 8: 0.2, 10: 0.2, 12: 0.2}
    torch.manual_seed(0)
    straight = scripted(Trainer(digits_model(), Scaled("train"), config(steps=40, eval_every=2, early_stop=3),
                                eval_data=Scaled("test"), run_dir=tmp_path / "a"), curve)
    straight.fit()
    assert straight.step == 10

    torch.manual_seed(0)
    first = scripted(Trainer(digits_model(), Scaled("train"),
                             config(steps=40, eval_every=2, early_stop=3, checkpoint_every=6),
                             eval_data=Scaled("test"), run_dir=tmp_path / "b"), curve)
    first.cfg.steps = 8  # killed after step 8: the last checkpoint is step 6, one evaluation without improvement
    first.fit()
    torch.manual_seed(99)
    resumed = scripted(Trainer(digits_model(), Scaled("train"),
                               config(steps=40, eval_every=2, early_stop=3, checkpoint_every=6),
                               eval_data=Scaled("test"), run_dir=tmp_path / "b"), curve)
    resumed.resume()
    assert (resumed.step, resumed.stale_evals, resumed.best, resumed.best_step) == (6, 1, 0.2, 4)
    out = resumed.fit()
    assert resumed.step == 10 and "step 4" in out["stopped"]
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_max_minutes_ends_training_and_says_so():
    lines = []
    trainer = Trainer(digits_model(), Scaled("train"), config(steps=100_000, max_minutes=0.002), log=lines.append)
    out = trainer.fit()  # 0.12 s of training: a few steps
    assert 0 < trainer.step < 100_000
    assert "train.max_minutes=0.002" in out["stopped"]
    assert any(line.startswith(f"stopped at step {trainer.step} of 100000: the time budget is spent")
               for line in lines)


def test_max_minutes_counts_the_time_of_earlier_sessions(tmp_path):
    first = Trainer(digits_model(), Scaled("train"), config(steps=4), run_dir=tmp_path)
    first.fit()
    first.save()
    spent = first.train_seconds
    # the same run resumed with a budget its first session already used up: no step more
    resumed = Trainer(digits_model(), Scaled("train"), config(steps=8, max_minutes=spent / 120), run_dir=tmp_path)
    resumed.resume()
    out = resumed.fit()
    assert resumed.step == 4 and "time budget" in out["stopped"]
    # with room left it trains on
    again = Trainer(digits_model(), Scaled("train"), config(steps=8, max_minutes=60.0), run_dir=tmp_path)
    again.resume()
    assert again.fit()["stopped"] is None and again.step == 8


@pytest.mark.parametrize("key, value, expected", [("early_stop", 0, ">= 1"), ("max_minutes", 0, "> 0"),
                                                  ("max_minutes", -1.5, "> 0")])
def test_bad_budgets_are_refused_by_key(key, value, expected):
    with pytest.raises(ConfigError, match=f"train.{key} must be {expected}"):
        load_recipe("image-folder", [f"train.{key}={value}"])


def test_own_data_recipes_stop_early_by_default():
    for name in ("image-folder", "image-folder-pretrained", "text-classification", "text-classification-pretrained",
                 "translation-files", "lm-text"):
        recipe = load_recipe(name)
        assert recipe.train.early_stop and recipe.train.max_minutes and recipe.train.eval_every, name
    assert TrainConfig().early_stop is None and TrainConfig().max_minutes is None


def test_a_recipe_run_records_why_it_stopped(tmp_path):
    rows = ["text,label"] + [f"{'good fine great' if i % 2 else 'bad awful poor'} film {i},{'pos' if i % 2 else 'neg'}"
                             for i in range(80)]
    (tmp_path / "texts.csv").write_text("\n".join(rows) + "\n")
    recipe = load_recipe("text-classification", [f"data.train={tmp_path / 'texts.csv'}", "train.steps=50",
                                                  "train.batch_size=8", "train.eval_every=2", "train.early_stop=1",
                                                  "train.lr=1e-12", "train.warmup_steps=0", "train.checkpoint_every=0",
                                                  "train.log_every=0", "train.tensorboard=false",
                                                  "train.progress=false", "text.vocab_size=300",
                                                  "model.options.embed_dim=16", "model.options.depth=1",
                                                  "model.options.num_heads=2"])
    lines = []
    results = train(recipe, tmp_path / "run", log=lines.append)
    # a learning rate of 1e-12 changes nothing: the second evaluation is no better than the first
    assert results["steps"] == 4 and "train.early_stop=1" in results["stopped"]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["stopped"] == results["stopped"]
    assert any(line.startswith("stopped at step 4 of 50") for line in lines)
