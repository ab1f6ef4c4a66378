"""Run directories written by attnlab before the task interface and the one vocabulary
still load: their config.yaml carried every task's sections, named the text task
"sentiment" and used torch's and other names for model options (dropout, d_model, ...)."""

import torch
import yaml

from attnlab.tasks.text_classification import TextInfo
from attnlab.data.tokenizers.text import TextTokenizer
from attnlab.engine.checkpoint import save_checkpoint
from attnlab.tasks import get_task, load_run, read_recipe

OLD_SECTIONS = {
    "text": {"tokenizer": "wordpiece", "vocab_size": 300, "lowercase": True, "min_frequency": 1, "max_length": 32,
             "tokenizer_file": None, "joint_vocab": True},
    "translate": {"num_beams": 4, "length_penalty": 1.0, "batch_size": 64, "average_checkpoints": 0,
                  "checkpoint": "auto"},
}
OLD_TRAIN = {"steps": 4, "batch_size": 32, "optimizer": "adamw", "lr": 0.001, "warmup_steps": 1, "grad_clip": 1.0,
             "precision": "fp32", "seed": 0}


def _old_run(folder, config, model):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    save_checkpoint(folder / "checkpoints", 4, model.state_dict(), {"step": 4})
    (folder / "results.json").write_text('{"test_accuracy": 0.5, "best_accuracy": 0.6}')  # no test_checkpoint


def test_an_old_sentiment_run_loads_as_text_classification(tmp_path):
    texts = ["a gorgeous , witty movie .", "a dull mess .", "the best film of the year ."] * 5
    tok = TextTokenizer.train(texts, "wordpiece", 300, lowercase=True, min_frequency=1)
    old_options = {"embed_dim": 32, "depth": 1, "num_heads": 2, "dropout": 0.3, "attn_dropout": 0.1,
                   "embed_dropout": 0.3}
    config = {"description": "old", "task": "sentiment",
              "data": {"name": "mr", "data_dir": None, "augment": False, "protocol": "split", "seed": 0,
                       "source": "de", "target": "en"},
              "model": {"name": "sentiment_transformer_tiny", "options": old_options}, **OLD_SECTIONS,
              "train": OLD_TRAIN}
    recipe = read_recipe_of(config, tmp_path / "config")
    model = get_task("text_classification").build_model(recipe, TextInfo(tok, ["negative", "positive"]))
    _old_run(tmp_path / "mr", config, model)
    tok.save(tmp_path / "mr" / "tokenizer.json")
    run = load_run(tmp_path / "mr")
    assert run.recipe.task == "text_classification" and run.checkpoint.name == "step_000000004"  # old runs tested last
    assert run.recipe.model.options == {"embed_dim": 32, "depth": 1, "num_heads": 2, "drop_rate": 0.3,
                                        "attn_drop_rate": 0.1, "pos_drop_rate": 0.3}
    assert not hasattr(run.recipe, "translate")
    for a, b in zip(run.model.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    [p] = run.predict(["a gorgeous movie ."])
    assert p.labels[0][0] in ("negative", "positive")


def test_an_old_translation_run_loads_with_todays_option_names(tmp_path):
    old_options = {"d_model": 32, "nhead": 4, "num_encoder_layers": 1, "num_decoder_layers": 1,
                   "dim_feedforward": 64, "dropout": 0.1}
    config = {"task": "translation", "data": {"name": "multi30k", "augment": False, "protocol": "split", "seed": 0,
                                              "source": "de", "target": "en"},
              "model": {"name": "transformer_tiny", "options": old_options}, **OLD_SECTIONS, "train": OLD_TRAIN}
    recipe = read_recipe_of(config, tmp_path / "config")
    assert recipe.model.options == {"embed_dim": 32, "num_heads": 4, "encoder_depth": 1, "decoder_depth": 1,
                                    "mlp_ratio": 2.0, "drop_rate": 0.1}
    assert recipe.model.options["mlp_ratio"] * 32 == 64


def test_an_old_image_run_keeps_its_data_without_a_validation_split(tmp_path):
    config = {"task": "image_classification",
              "data": {"name": "digits", "data_dir": None, "augment": False, "protocol": "split", "seed": 0,
                       "source": "de", "target": "en"},
              "model": {"name": "vit_digits_patch2", "options": {"depth": 1}}, **OLD_SECTIONS, "train": OLD_TRAIN}
    recipe = read_recipe_of(config, tmp_path / "config")
    assert recipe.data.val_size == 0  # trained on all 1,437 training images, as then
    model = get_task(recipe.task).build_model(recipe)
    _old_run(tmp_path / "digits", config, model)
    assert load_run(tmp_path / "digits").evaluate()["test_samples"] == 360


def read_recipe_of(config, folder):
    """The recipe attnlab reads from a run directory holding ``config``."""
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return read_recipe(folder)
