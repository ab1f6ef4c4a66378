"""Names that are true: the banner, the run's config.yaml and the explorer name the model that
trains (a folder's family and size, not the recipe's placeholder), and the help of a recipe's
keys says what each key does in that recipe's task."""

import yaml
import pytest

from attnlab.cli import main
from attnlab.recipes import list_recipes, load_recipe, recipe_keys
from attnlab.tasks import get_task, model_label

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

from test_lm_from_folder import model_folder, overrides  # noqa: E402


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return model_folder("llama", tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    from test_lm_from_folder import CORPUS

    path = tmp_path_factory.mktemp("text") / "my.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


def test_a_folder_model_is_named_by_its_family_size_and_folder(llama_folder, text_file):
    recipe = load_recipe("lm-text", overrides(llama_folder, text_file))
    assert recipe.model.name == "llama_tiny"  # what config.yaml rebuilds it as
    assert model_label(recipe.model) == f"llama of 2 layers of width 32 from {llama_folder}"
    # the recipe's own description was of its own 4-layer model: it gives way to what trains
    assert recipe.description == f"llama of 2 layers of width 32 from {llama_folder}, trained with the settings of recipe lm-text"
    assert "4 layers of width 128" not in recipe.description
    # a description given on the command line stays
    mine = load_recipe("lm-text", [*overrides(llama_folder, text_file), "description=my own"])
    assert mine.description == "my own"


def test_a_registered_model_is_named_by_its_name():
    assert model_label(load_recipe("vit-digits").model) == "vit_digits_patch2"


def test_the_banner_config_report_and_explorer_of_a_fine_tuning_name_the_folder_model(llama_folder, text_file,
                                                                                    tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "lm-text", *overrides(llama_folder, text_file, "train.steps=2", "train.eval_every=1",
                                                "generate.max_new_tokens=2"), "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    banner = out.splitlines()[0]
    assert banner.startswith(f"attnlab train lm-text: llama of 2 layers of width 32 from {llama_folder} on text")
    assert "llama_tiny on" not in out
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["description"].startswith("llama of 2 layers of width 32") and config["model"]["name"] == "llama_tiny"
    report = (run / "report.html").read_text()
    assert f"llama of 2 layers of width 32 from {llama_folder} on text" in report and "llama_tiny on" not in report
    assert main(["explore", str(run), "the quick", "--new-tokens", "1", "--out", str(tmp_path / "page.html")]) == 0
    page = (tmp_path / "page.html").read_text()
    assert f"(model llama of 2 layers of width 32 from {llama_folder})" in page and "(model llama_tiny)" not in page


@pytest.mark.parametrize("name", [name for name, _, _ in list_recipes()])
def test_no_key_of_a_task_without_a_classifier_is_described_as_training_one(name):
    recipe = load_recipe(name)
    task = get_task(recipe.task)
    rows = {key: help_ for key, _, _, _, help_ in recipe_keys(recipe)}
    if task.outputs == "text":
        for key in ("model.freeze_backbone", "model.lora", "model.checkpoint", "model.backbone_lr_scale"):
            assert "classifier head alone" not in rows[key] and "BERT" not in rows[key], (key, rows[key])
    else:
        assert "classifier head" in rows["model.freeze_backbone"]
    assert "early_stop" not in rows or "validation" in rows["train.early_stop"]


def test_freezing_a_language_model_whose_head_is_its_embedding_is_refused(tmp_path, text_file):
    from attnlab.errors import InputError
    from attnlab.models import create_model
    from attnlab.run.recipe import ModelConfig
    from attnlab.run.weights import fine_tuning

    model = create_model("gpt_tiny", vocab_size=64, tie_embeddings=True)
    with pytest.raises(InputError, match="model.freeze_backbone=true would train nothing"):
        fine_tuning(model, ModelConfig(name="gpt_tiny", checkpoint="x", freeze_backbone=True), classifier=False)
    untied = create_model("gpt_tiny", vocab_size=64, tie_embeddings=False)
    fine_tuning(untied, ModelConfig(name="gpt_tiny", checkpoint="x", freeze_backbone=True), classifier=False)
    assert [n for n, p in untied.named_parameters() if p.requires_grad] == ["head.weight"]
