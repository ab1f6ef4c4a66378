"""Fine-tuning: weights from another run or a state-dict file, a new head when the classes differ, freezing, rates."""

import pytest
import torch
from safetensors.torch import save_file

from attnlab.cli import main
from attnlab.engine.optim import build_optimizer, param_groups
from attnlab.errors import InputError
from attnlab.models import create_model
from attnlab.models.checkpoint import load_pretrained
from attnlab.recipes import load_recipe
from attnlab.tasks import load_run
from attnlab.run.skeleton import fine_tuning, init_weights

from conftest import COLOURS, make_folder  # a folder of images of every kind, made by the tests

SMALL = ["data.img_size=16", "model.options.widths=[8,16,16]", "model.options.stem_width=8", "train.batch_size=8",
         "train.log_every=0", "train.progress=false", "train.eval_every=3", "train.checkpoint_every=3"]


def test_lr_scales_give_the_backbone_its_own_rate_and_frozen_parameters_no_group():
    model = create_model("vit_digits_patch2", depth=1)
    groups = param_groups(model, 0.05, {"": 0.1, "head": 1.0})
    assert [g["lr_scale"] for g in groups] == [1.0, 1.0, 0.1, 0.1]
    head = {id(p) for p in model.head.parameters()}
    assert {id(p) for g in groups[:2] for p in g["params"]} == head
    opt = build_optimizer(model, "adamw", 1e-3, 0.05, lr_scales={"": 0.1, "head": 1.0})
    assert sorted({g["lr"] for g in opt.param_groups}) == [pytest.approx(1e-4), pytest.approx(1e-3)]
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("head."))
    assert sum(len(g["params"]) for g in param_groups(model, 0.05)) == 2
    assert len(param_groups(model, 0.05)) == 2  # without scales: the two groups as ever


def test_a_head_for_other_classes_is_replaced_and_everything_else_must_fit(tmp_path):
    source = create_model("attention_cnn_fast", num_classes=5, widths=[8, 16, 16], stem_width=8)
    target = create_model("attention_cnn_fast", num_classes=3, widths=[8, 16, 16], stem_width=8)
    save_file(source.state_dict(), tmp_path / "w.safetensors")
    fresh = init_weights(target, tmp_path / "w.safetensors")
    assert fresh == ["head.weight"]  # this head has no bias
    for (name, a), b in zip(target.state_dict().items(), source.state_dict().values()):
        if not name.startswith("head."):
            assert torch.equal(a, b), name
    wider = create_model("attention_cnn_fast", num_classes=3, widths=[8, 16, 32], stem_width=8)
    with pytest.raises(InputError, match=r"does not fit FastAttentionCNN: shape mismatches: .*\(16, 16, 3, 3\)"):
        load_pretrained(wider, source.state_dict(), "w.safetensors")


def test_freezing_keeps_the_backbone_and_needs_a_head():
    model = create_model("resnet18_cifar", num_classes=3)
    recipe = load_recipe("image-folder", ["data.root=x", "model.name=resnet18_cifar", "model.checkpoint=" + __file__,
                                          "model.freeze_backbone=true"])
    assert fine_tuning(model, recipe.model) == {"": 1.0, "fc": 1.0}
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["fc.weight", "fc.bias"]
    model.train()  # what the trainer calls: the frozen BatchNorm layers stay in eval mode, the rest trains
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and not any(m.training for m in norms) and model.training
    stats = [m.running_mean.clone() for m in norms]
    model(torch.randn(4, 3, 32, 32) * 5 + 3)  # data far from the statistics
    assert all(torch.equal(m.running_mean, s) for m, s in zip(norms, stats))
    assert list(model.state_dict()) == list(create_model("resnet18_cifar", num_classes=3).state_dict())


def test_recipe_errors_come_before_a_run_directory(tmp_path, capsys):
    with pytest.raises(InputError, match="model.checkpoint must be .* is missing"):
        load_recipe("image-folder", ["data.root=x", "model.checkpoint=/no/such/run"])
    with pytest.raises(InputError, match="model.freeze_backbone needs model.checkpoint"):
        load_recipe("image-folder", ["data.root=x", "model.freeze_backbone=true"])
    with pytest.raises(InputError, match="backbone_lr_scale must be"):
        load_recipe("image-folder", ["data.root=x", "model.backbone_lr_scale=0"])


@pytest.mark.parametrize("source_classes", [4, 3])  # another count, or as many classes under other names
def test_fine_tuning_from_a_run_of_other_classes_through_the_command(tmp_path, capsys, source_classes):
    colours = {"cyan": (0, 200, 200), "magenta": (200, 0, 200), "yellow": (200, 200, 0), "grey": (120, 120, 120)}
    source_data = make_folder(tmp_path / "src", 8, dict(list(colours.items())[:source_classes]))
    target_data = make_folder(tmp_path / "dst", 8, COLOURS)
    source, target = tmp_path / "source", tmp_path / "target"
    assert main(["train", "image-folder", f"data.root={source_data}", *SMALL, "train.steps=6",
                 "--run-dir", str(source)]) == 0
    capsys.readouterr()
    assert main(["train", "image-folder", f"data.root={target_data}", *SMALL, "train.steps=3",
                 f"model.checkpoint={source}", "model.freeze_backbone=true", "--run-dir", str(target)]) == 0
    out = capsys.readouterr().out
    assert f"initial weights: {source}; its classifier head does not fit this task's classes and is replaced" in out
    before, after = load_run(source).model.state_dict(), load_run(target).model.state_dict()
    for name, value in after.items():
        if name.startswith("head."):
            assert value.shape[0] == 3
        else:  # the backbone's weights and its BatchNorm statistics, as the source left them
            assert torch.equal(value, before[name]), name
    assert load_run(target).classes == ["blue", "green", "red"]
