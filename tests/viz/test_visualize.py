"""Attention pictures: rollout arithmetic, the plotting functions (real pictures, written
atomically), visualize_run on tiny run directories of each family, and 'attnlab visualize'."""

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import attnlab

from attnlab.tasks.text_classification import TextInfo
from attnlab.cli import main
from attnlab.data.tokenizers.text import TextTokenizer
from attnlab.engine.checkpoint import save_checkpoint
from attnlab.tasks import get_task, recipe_dict
from attnlab.recipes import load_recipe
from attnlab.viz import (
    alignment_figure,
    attention_rollout,
    image_attention_figure,
    pixel_query_figure,
    token_heatmaps,
    visualize_run,
)

SENTENCES = ["a gorgeous , witty , seductive movie .", "a dull , lifeless mess .", "the plot is thin but fun .",
             "ein mann fährt fahrrad .", "zwei hunde spielen im schnee .", "a man rides a bike .",
             "two dogs play in the snow ."]


def assert_picture(path: Path, min_width: int = 400) -> None:
    """A real picture: wide enough, and more than flat colour (many grey levels)."""
    path = Path(path)
    assert path.is_file() and path.suffix == ".png"
    with Image.open(path) as im:
        assert im.width > min_width and im.height > 200
        levels = len(np.unique(np.asarray(im.convert("L"))))
    assert levels > 20, f"{path.name}: only {levels} grey levels"
    assert not list(path.parent.glob(".*.tmp")), "a temporary file was left behind"


def softmax_maps(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).mul(2).softmax(-1)


# ----------------------------------------------------------------------------- rollout
def test_rollout_adds_the_residual_and_multiplies_through_layers():
    uniform = torch.full((1, 2, 2), 0.5)  # one head, two tokens
    one = attention_rollout([uniform])
    assert torch.allclose(one, torch.tensor([[0.75, 0.25], [0.25, 0.75]]))
    two = attention_rollout([uniform, uniform])
    assert torch.allclose(two, one @ one)
    heads = torch.stack([torch.eye(2), torch.tensor([[0.0, 1.0], [1.0, 0.0]])])  # heads are averaged first
    assert torch.allclose(attention_rollout([heads]), one)


def test_rollout_keeps_batch_dimensions_and_rows_sum_to_one():
    maps = [softmax_maps(3, 4, 6, 6) for _ in range(5)]
    r = attention_rollout(maps)
    assert r.shape == (3, 6, 6)
    assert torch.allclose(r.sum(-1), torch.ones(3, 6), atol=1e-5)
    with pytest.raises(ValueError, match=r"maps\[1\] has 5 tokens but maps\[0\] has 6"):
        attention_rollout([maps[0], softmax_maps(3, 4, 5, 5)])
    with pytest.raises(ValueError, match="maps must hold one attention tensor per layer"):
        attention_rollout([])


# ----------------------------------------------------------------------------- plots
def test_token_heatmaps_draw_every_head_and_the_mean(tmp_path):
    labels = ["[CLS]", "a", "gorgeous", ",", "witty", "movie", ".", "[SEP]"]
    path = token_heatmaps(softmax_maps(4, 8, 8), labels, labels, tmp_path / "t.png", title="layer 0")
    assert_picture(path, min_width=800)
    with pytest.raises(ValueError, match="query_labels and key_labels must have 8 and 8 entries"):
        token_heatmaps(softmax_maps(4, 8, 8), labels[:3], labels, tmp_path / "bad.png")


def test_token_labels_with_newlines_are_drawn_escaped_with_no_missing_glyph(tmp_path):
    import warnings

    from attnlab.viz.attention import visible

    assert [visible(t) for t in ("\n", "a\tb", "é中", "\x07")] == ["\\n", "a\\tb", "é中", "\\x07"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        token_heatmaps(torch.rand(2, 3, 3).softmax(-1), ["R", "\n", "O"], ["R", "\n", "O"], tmp_path / "nl.png")
    assert not [w for w in caught if "Glyph" in str(w.message)]


def test_image_overlays_and_pixel_queries(tmp_path):
    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    maps = torch.rand(4, 4, 4)
    path = image_attention_figure(image, maps, ["rollout", "head 0", "head 1", "head 2"], tmp_path / "vit.png")
    assert_picture(path)
    grey = torch.randint(0, 256, (1, 8, 8), dtype=torch.uint8)
    assert_picture(image_attention_figure(grey, torch.rand(2, 4, 4), ["a", "b"], tmp_path / "digits.png"))
    path = pixel_query_figure(image, softmax_maps(2, 16, 16), (4, 4), [(16, 16), (3, 30)], tmp_path / "bot.png")
    assert_picture(path)
    with pytest.raises(ValueError, match=r"queries: \(32, 0\) lies outside the 32x32 image"):
        pixel_query_figure(image, softmax_maps(2, 16, 16), (4, 4), [(32, 0)], tmp_path / "x.png")


def test_alignment_figure(tmp_path):
    src, tgt = ["ein", "mann", "fährt", "fahrrad", ".", "[EOS]"], ["a", "man", "rides", "a", "bike", ".", "[EOS]"]
    path = alignment_figure([softmax_maps(4, 7, 6), softmax_maps(7, 6)], src, tgt, tmp_path / "align.png")
    assert_picture(path)
    with pytest.raises(ValueError, match=r"layers\[0\] must have shape"):
        alignment_figure([softmax_maps(4, 6, 7)], src, tgt, tmp_path / "bad.png")


# ----------------------------------------------------------------------------- runs
def make_run(folder: Path, recipe_name: str, overrides: list[str], build) -> Path:
    """A finished-looking run directory: config.yaml and one checkpoint of ``build(recipe)``."""
    recipe = load_recipe(recipe_name, overrides)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(recipe_dict(recipe), sort_keys=False))
    torch.manual_seed(0)
    model = build(recipe, folder)
    save_checkpoint(folder / "checkpoints", 1, model.state_dict(), {"step": 1})
    (folder / "results.json").write_text('{"steps": 1}')  # finished: load_run has no warning to give
    return folder


def image_model(recipe, folder):
    return get_task(recipe.task).build_model(recipe)


@pytest.fixture
def image_files(tmp_path):
    files = []
    for i in range(2):
        y, x = np.mgrid[0:32, 0:32]
        rgb = np.stack([x * 8, y * 8, (x + y) * 4 + 40 * i], -1).clip(0, 255).astype(np.uint8)
        files.append(tmp_path / f"img{i}.png")
        Image.fromarray(rgb).save(files[-1])
    return [str(f) for f in files]


def test_vit_run_on_its_test_digits(tmp_path):
    run = make_run(tmp_path / "vit", "vit-digits", ["model.options.depth=2"], image_model)
    paths = visualize_run(run, max_inputs=2)
    assert [p.name for p in paths] == ["00_vit.png", "01_vit.png"]
    assert all(p.parent == run / "visualize" for p in paths)
    for p in paths:
        assert_picture(p)


def test_botnet_run_with_image_files_and_query_pixels(tmp_path, image_files):
    options = "model.options={layers: [1, 1, 1, 2], widths: [8, 8, 8, 8], stem_width: 8}"
    run = make_run(tmp_path / "bot", "botnet-cifar10", [options], image_model)
    paths = visualize_run(run, image_files[:1], tmp_path / "out", queries=[(5, 7), (20, 30)])
    assert [p.name for p in paths] == ["00_botnet_block0.png", "00_botnet_block1.png"]
    for p in paths:
        assert_picture(p)
    with pytest.raises(ValueError, match=r"queries: \(40, 0\) lies outside the 32x32 image"):
        visualize_run(run, image_files[:1], tmp_path / "out", queries=[(40, 0)])


def sentiment_model(recipe, folder):
    tok = TextTokenizer.train(SENTENCES, "wordpiece", 300, lowercase=True, min_frequency=1)
    tok.save(folder / "tokenizer.json")
    return get_task(recipe.task).build_model(recipe, TextInfo(tok, ["negative", "positive"]))


def test_sentiment_run_draws_one_picture_per_layer(tmp_path):
    overrides = ["model.name=sentiment_transformer_tiny", "model.options={depth: 2}", "text.max_length=32"]
    run = make_run(tmp_path / "mr", "sentiment-mr", overrides, sentiment_model)
    paths = visualize_run(run, ["a gorgeous , witty movie .", "a dull mess ."])
    assert [p.name for p in paths] == ["00_layer0.png", "00_layer1.png", "01_layer0.png", "01_layer1.png"]
    for p in paths:
        assert_picture(p)


def translation_model(recipe, folder):
    tok = TextTokenizer.train(SENTENCES, "bpe", 300, min_frequency=1)
    tok.save(folder / "tokenizer.json")
    return get_task(recipe.task).build_model(recipe, (tok, tok))


def test_translation_run_draws_the_alignment_of_the_beam_search_output(tmp_path):
    overrides = ["model.name=transformer_tiny", "text.joint_vocab=true", "text.max_length=32", "translate.num_beams=2",
                 "model.options={embed_dim: 32, num_heads: 4, encoder_depth: 1, decoder_depth: 2, "
                 "mlp_ratio: 2.0}"]
    run = make_run(tmp_path / "mt", "translate-multi30k", overrides, translation_model)
    paths = visualize_run(run, ["Ein Mann fährt Fahrrad."])
    assert [p.name for p in paths] == ["00_alignment.png"]
    assert_picture(paths[0])


# ----------------------------------------------------------------------------- refusals
def test_an_efficient_attention_run_cannot_be_visualized(tmp_path, capsys):
    run = make_run(tmp_path / "lin", "vit-digits", ["model.options.depth=1", "model.options.attention=linear"],
                   image_model)
    with pytest.raises(ValueError, match=r"the model's attention never forms an n x n weight matrix: "
                                         r"blocks.0.attn \(LinearAttention\)"):
        visualize_run(run)
    assert main(["visualize", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "capture_attention has nothing to record" in err[0]


def test_cli_writes_and_prints_the_pictures(tmp_path, image_files, capsys):
    options = "model.options={layers: [1, 1, 1, 1], widths: [8, 8, 8, 8], stem_width: 8}"
    run = make_run(tmp_path / "bot", "botnet-cifar10", [options], image_model)
    out = tmp_path / "pics"
    assert main(["visualize", str(run), "--input", *image_files, "--out", str(out), "--query", "3,4"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "00_botnet_block0.png"), str(out / "01_botnet_block0.png")]
    for p in printed:
        assert_picture(Path(p))


@pytest.mark.parametrize("query, message", [("1,x", "--query takes ROW,COL"), ("1", "--query takes ROW,COL"),
                                             ("99,0", "lies outside the 32x32 image")])
def test_cli_bad_query_exits_2_with_one_line(tmp_path, image_files, capsys, query, message):
    options = "model.options={layers: [1, 1, 1, 1], widths: [8, 8, 8, 8], stem_width: 8}"
    run = make_run(tmp_path / "bot", "botnet-cifar10", [options], image_model)
    assert main(["visualize", str(run), "--input", image_files[0], "--query", query]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_cli_missing_run_dir_and_query_on_a_vit_exit_2(tmp_path, capsys):
    assert main(["visualize", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    run = make_run(tmp_path / "vit", "vit-digits", ["model.options.depth=1"], image_model)
    assert main(["visualize", str(run), "--query", "1,1"]) == 2
    assert "query pixels of a model with 2-D attention (BoTNet)" in capsys.readouterr().err


def test_a_family_says_how_its_attention_is_drawn():
    from torch import nn

    from attnlab.models.maps import PixelMaps, attention_maps_adapter, register_attention_maps
    from attnlab.models.vit import VisionTransformer

    class MyViT(VisionTransformer):  # a subclass draws as its family does
        pass

    vit = attnlab.create_model("vit_digits_patch2", depth=1, embed_dim=32, num_heads=2).eval()
    assert attention_maps_adapter(MyViT(vit.config)) is attention_maps_adapter(vit) is not None
    logits, maps = attention_maps_adapter(vit)(vit, torch.randn(2, 1, 8, 8))
    assert logits.shape == (2, 10) and maps.grid == (4, 4) and maps.prefix == 1
    assert [tuple(w.shape) for w in maps.layers] == [(2, 2, 17, 17)]

    class Mine(nn.Module):
        pass

    assert attention_maps_adapter(Mine()) is None

    @register_attention_maps(Mine)
    def _mine(model, x):
        return x.sum((1, 2, 3))[:, None], PixelMaps([])

    assert attention_maps_adapter(Mine()) is _mine


def test_a_run_whose_family_draws_no_attention_says_which_do(tmp_path, capsys):
    run = make_run(tmp_path / "res", "resnet-cifar10", ["model.options={layers: [1, 1, 1, 1], widths: [8, 8, 8, 8], "
                                                         "stem_width: 8}"], image_model)
    assert main(["visualize", str(run)]) == 2
    err = capsys.readouterr().err
    assert "cannot be visualized" in err and "BoTNet" in err and "VisionTransformer" in err and "Traceback" not in err
