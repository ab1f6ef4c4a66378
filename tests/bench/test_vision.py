"""attnlab bench vision: the study's variants, its resumable runs, tables and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.bench.machine import SPEED_FLAGS, machine_info
from attnlab.bench.vision import IMAGE_BUDGET, PARTS, VARIANTS, vision_markdown, write_vision_report
from attnlab.cli import main
from attnlab.recipes import load_recipe
from attnlab.tasks import get_task



def test_every_variant_is_a_valid_recipe_whose_model_builds():
    # The meta-device check of each recipe: a misspelt option would fail hours into a study.
    assert set(PARTS) == {v.part for v in VARIANTS}
    assert len({v.key for v in VARIANTS}) == len(VARIANTS)
    for v in VARIANTS:
        recipe = load_recipe(v.recipe, list(v.overrides))
        get_task(recipe.task).check(recipe)


def test_the_study_pins_what_the_recipe_it_starts_from_sets():
    # The image rows start from the vit-cifar10 recipe. Whatever that recipe says about data,
    # training or model must not leak into the study: its rows were trained with crop and
    # flip, the budget below, and the ViT options they name (defaults for the rest).
    for v in VARIANTS:
        if v.recipe == "sentiment-mr":
            continue
        recipe = load_recipe(v.recipe, [*v.overrides, *IMAGE_BUDGET])
        assert (recipe.data.augment, recipe.data.crop_padding, recipe.data.val_size) == (True, 4, 5000), v.key
        assert (recipe.train.steps, recipe.train.batch_size, recipe.train.lr) == (704, 256, 0.002), v.key
        if v.overrides[0] == "model.name=vit_cifar_patch4":  # the study's ViT: the recipe's norm must not leak in
            named = {o.split("=", 1)[0].removeprefix("model.options.") for o in v.overrides}
            options = recipe.model.options
            assert options.get("norm", "layernorm") == "layernorm" or "norm" in named, v.key
            assert options.get("norm_first", True) or "norm_first" in named, v.key
            assert options.get("class_token", True) or "class_token" in named, v.key


def _record(part, variant, seed, acc, **extra):
    return {"part": part, "variant": variant, "seed": seed, "test_accuracy": acc, "params": 1e6,
            "samples_per_s": 100.0, "train_seconds": 120.0, "peak_rss_mb": 900.0, **extra}


def test_tables_give_mean_spread_and_difference_from_the_first_row(tmp_path):
    data = {"machine": {"cpu": "test CPU", "threads": 2, "torch": "x"}, "budget": {"steps": 704, "batch_size": 256},
            "vision": [_record("norm", "LayerNorm, pre-norm (timm)", s, a) for s, a in enumerate((0.60, 0.62, 0.64))]
            + [_record("norm", "BatchNorm, pre-norm", 0, 0.65, peak_rss_mb=None)]}
    text = vision_markdown(data)
    assert "### norm: BatchNorm inside self-attention helps a ViT" in text
    assert "| LayerNorm, pre-norm (timm) | 62.00% ± 2.00 | 3 | +0.00 |" in text
    assert "| BatchNorm, pre-norm | 65.00% | 1 | +3.00 |" in text and "| n/a |" in text
    (tmp_path / "results.json").write_text(json.dumps(data))
    page = write_vision_report(tmp_path)
    assert (tmp_path / "accuracy.png").is_file() and (tmp_path / "time.png").is_file()
    assert "BatchNorm, pre-norm" in page.read_text()


def test_rows_from_two_machines_say_which_ran_where(tmp_path):
    avx512 = {"cpu": "EPYC", "cpu_flags": ["avx2", "avx512f", "avx512_bf16"], "threads": 2, "torch": "2.13"}
    avx2 = {"cpu": "EPYC", "cpu_flags": ["avx2"], "threads": 2, "torch": "2.13"}
    data = {"machine": avx2, "budget": {"steps": 704, "batch_size": 256},
            "vision": [_record("patch", "patch 4, 64 tokens (recipe)", 0, 0.56, precision="bf16"),  # no machine:
                       _record("patch", "patch 2, 256 tokens", 0, 0.60, precision="fp32", machine=avx2)]}
    text = vision_markdown(data)  # the record without one ran on the file's machine
    assert "EPYC (AVX2), 2 threads" in text and "Machines" not in text and "| bf16 |" in text
    data["vision"][0]["machine"] = avx512
    text = vision_markdown(data)
    assert "Machines: A: EPYC (AVX2, AVX512F, AVX512-BF16), 2 threads, torch 2.13; B: EPYC (AVX2)" in text
    assert "| machine, precision |" in text and "| A, bf16 |" in text and "| B, fp32 |" in text
    (tmp_path / "results.json").write_text(json.dumps(data))
    assert "EPYC (AVX2, AVX512F, AVX512-BF16)" in write_vision_report(tmp_path).read_text()


def test_the_machine_record_names_the_cpu_flags_that_set_the_speed():
    info = machine_info()
    if not Path("/proc/cpuinfo").is_file():
        pytest.skip("the CPU flags are read from /proc/cpuinfo (Linux)")
    assert set(info["cpu_flags"]) <= set(SPEED_FLAGS)
    flags = Path("/proc/cpuinfo").read_text().split()
    assert ("avx2" in info["cpu_flags"]) == ("avx2" in flags)


@pytest.mark.parametrize("argv, message", [
    (["--parts", "speed"], "--parts takes"),
    (["--seeds", "norm=0"], "--seeds takes PART=N"),
    (["--seeds", "colour=2"], "--seeds takes PART=N"),
    (["--variant", "heads/8 heads"], "got 'heads/8 heads'; did you mean heads/8 heads of 16"),
    (["--parts", "norm", "--variant", "heads/8 heads of 16"], "variant must be one of the rows of the parts"),
])
def test_cli_bench_vision_bad_input(tmp_path, capsys, argv, message):
    assert main(["bench", "vision", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


@pytest.mark.long  # a study of several trainings in child processes: `make test-long` and CI
def test_quick_study_trains_one_row_alone_then_the_rest_in_child_processes_and_resumes(tiny_cifar, tmp_path, capsys):
    out = tmp_path / "vision"
    argv = ["bench", "vision", "--quick", "--parts", "botnet", "--out", str(out), "--data-dir", str(tiny_cifar)]
    assert main([*argv, "--variant", "botnet/MHSA in the last block only"]) == 0  # one row alone
    records = json.loads((out / "results.json").read_text())["vision"]
    assert [(r["part"], r["variant"]) for r in records] == [("botnet", "MHSA in the last block only")]
    alone = records[0]
    assert main(argv) == 0  # the part's other row only: the first is kept as it was
    records = json.loads((out / "results.json").read_text())["vision"]
    assert [r["variant"] for r in records] == ["MHSA in the last block only", "MHSA in the last stage (paper)"]
    for r in records:
        assert 0 <= r["test_accuracy"] <= 1 and r["peak_rss_mb"] > 100 and r["params"] > 0
        assert (Path(r["run_dir"]) / "results.json").is_file()
    assert records[0] == alone
    for name in ("table.md", "accuracy.png", "time.png", "report.html"):
        assert (out / name).is_file()
    assert "A quick run" in (out / "table.md").read_text()
    assert main(argv) == 0  # everything done: nothing trained again
    assert json.loads((out / "results.json").read_text())["vision"] == records
    assert main(["report", str(out)]) == 0
    assert main(["bench", "vision", "--parts", "botnet", "--out", str(out)]) == 2  # a full study into a quick folder
    assert "holds a quick study" in capsys.readouterr().err


@pytest.mark.long  # a study of several trainings: `make test-long` and CI
def test_the_same_configuration_in_two_parts_is_trained_once(tiny_cifar, tmp_path):
    out = tmp_path / "vision"
    assert main(["bench", "vision", "--quick", "--parts", "regularization,pooling", "--out", str(out),
                 "--data-dir", str(tiny_cifar)]) == 0
    records = json.loads((out / "results.json").read_text())["vision"]
    assert [(r["part"], r["variant"]) for r in records] == [
        ("regularization", "DropPath 0.05 (recipe)"), ("regularization", "neither"),
        ("pooling", "class token"), ("pooling", "mean of patches")]
    assert records[2]["run_dir"] == records[0]["run_dir"]  # the study's base ViT, reused
    assert records[2]["test_accuracy"] == records[0]["test_accuracy"]
    assert len({r["run_dir"] for r in records}) == 3 and not (out / "runs" / "pooling" / "class-token-seed0").exists()


def test_a_training_the_user_can_fix_is_one_clear_error(tmp_path, capsys):
    out = tmp_path / "vision"
    assert main(["bench", "vision", "--quick", "--parts", "botnet", "--out", str(out),
                 "--data-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "botnet/MHSA in the last stage (paper) (seed 0) stopped: attnlab train: error: cifar10 data not found" in err
    assert "Traceback" not in err and "internal error" not in err
