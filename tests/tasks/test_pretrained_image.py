"""Fine-tuning an image classifier from a Hugging Face ViT folder through the recipes: its
model becomes the run's at the data's image size (the position grid resampled), and the
run predicts, draws its attention and loads without the folder."""

import shutil

import pytest
import torch
import yaml

import attnlab
from attnlab.cli import main
from attnlab.formats.hf.load import read_hf

from conftest import make_folder  # a folder of images of every kind, made by the tests

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")


def test_fine_tuning_a_vit_folder_at_another_image_size(tmp_path, capsys):
    folder = tmp_path / "vit"
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64, num_labels=5)
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    images = make_folder(tmp_path / "images", 8)
    run_dir = tmp_path / "run"
    assert main(["train", "image-folder-pretrained", f"data.root={images}", f"model.checkpoint={folder}",
                 "data.img_size=32", "train.steps=4", "train.batch_size=8", "train.warmup_steps=1",
                 "train.eval_every=2", "train.checkpoint_every=2", "train.log_every=0", "train.progress=false",
                 "train.tensorboard=false", "train.precision=fp32", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"initial weights: {folder}; its classifier head does not fit" in out  # 5 labels there, 3 classes here
    config_yaml = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config_yaml["model"]["name"] == "vit_base_patch16_224"
    assert config_yaml["model"]["options"]["embed_dim"] == 32 and "img_size" not in config_yaml["model"]["options"]
    shutil.rmtree(folder)
    run = attnlab.load_run(run_dir)
    assert run.model.pos_embed.shape == (1, 1 + 8 * 8, 32)  # a 4x4 grid resampled to 8x8 for 32x32 images
    [pred] = run.predict([torch.full((3, 32, 32), 200, dtype=torch.uint8)])
    assert pred.label in ("blue", "green", "red")
    assert main(["visualize", str(run_dir), "--out", str(tmp_path / "maps")]) == 0


def test_the_vit_folders_weights_are_the_starting_point(tmp_path):
    folder = tmp_path / "vit"
    config = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    transformers.ViTModel(config).save_pretrained(folder)
    from attnlab.recipes import load_recipe
    from attnlab.tasks import get_task
    from attnlab.run.skeleton import init_weights

    recipe = load_recipe("image-folder-pretrained", ["data.root=x", f"model.checkpoint={folder}", "data.img_size=16"])
    model = get_task("image_classification").build_model(recipe, ["a", "b"])
    fresh = init_weights(model, folder)
    assert sorted(fresh) == ["head.bias", "head.weight"]  # ViTModel has no classifier: the head starts fresh
    weights = read_hf(folder)[2]
    for name, value in model.state_dict().items():
        if not name.startswith("head."):
            assert torch.equal(value, weights[name]), name
