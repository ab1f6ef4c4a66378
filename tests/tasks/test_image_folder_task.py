"""Your own images: any folder layout, size and mode; splits, skipping, streaming, runs you can load and call."""

import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import attnlab
from attnlab.cli import main
from attnlab.data.readers.images import ImageFolder, decode_image
from attnlab.errors import InputError
from attnlab.recipes import load_recipe
from attnlab.data.source import source_of

from conftest import COLOURS, make_folder, photo  # a folder of images of every kind, made by the tests

def image_folder_splits(data):
    """``(classes, train, validation, test)`` of the folder source."""
    splits = source_of(data).load(data)
    return splits.classes, splits.train, splits.val, splits.test


def build_data(recipe):
    """``(train, validation, test)`` of the recipe's source."""
    splits = source_of(recipe.data).load(recipe.data)
    return splits.train, splits.val, splits.test


def recipe(root, *overrides):
    return load_recipe("image-folder", [f"data.root={root}", "data.img_size=16", "model.options.widths=[8,16,16]",
                                        "model.options.stem_width=8", *overrides])


# ----------------------------------------------------------------------------- decoding


def test_every_mode_becomes_rgb_or_grey_at_the_size_asked(tmp_path):
    rgb = photo((200, 30, 30), 30, 40, 0)
    sixteen = Image.fromarray(np.arange(30 * 40, dtype=np.uint16).reshape(30, 40) * 50)
    assert sixteen.mode.startswith("I;16")
    cases = {"RGB": Image.fromarray(rgb), "L": Image.fromarray(rgb).convert("L"),
             "RGBA": Image.fromarray(rgb).convert("RGBA"), "P": Image.fromarray(rgb).convert("P"),
             "I;16": sixteen, "CMYK": Image.fromarray(rgb).convert("CMYK")}
    for name, im in cases.items():
        for mode, channels in (("RGB", 3), ("L", 1)):
            out = decode_image(im, mode, 16, "crop")
            assert out.shape == (channels, 16, 16) and out.dtype == np.uint8, name
    # 16-bit grey is scaled, not clipped to white: 59,950 of 65,535 is 233 of 255
    grey = decode_image(sixteen, "L", None)
    assert grey.max() == round(59950 * 255 / 65535) and grey.min() == 0 and 100 < grey.mean() < 130


def test_exif_rotation_is_applied(tmp_path):
    wide = np.zeros((10, 30, 3), np.uint8)
    wide[:, :10] = 255  # a white left third
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to view"
    Image.fromarray(wide).save(buf, format="JPEG", exif=exif, quality=100)
    im = Image.open(io.BytesIO(buf.getvalue()))
    out = decode_image(im, "L", 30, "squash")
    assert out.shape == (1, 30, 30)
    assert out[0, :8].mean() > 200 and out[0, -8:].mean() < 50  # the white third is now on top


def test_crop_keeps_the_centre_squash_keeps_everything():
    im = np.zeros((10, 30, 3), np.uint8)
    im[:, :10] = 255  # only the left third is white: outside the centre square
    cropped = decode_image(Image.fromarray(im), "L", 10, "crop")
    squashed = decode_image(Image.fromarray(im), "L", 10, "squash")
    assert cropped.max() < 30 and squashed[0, :, 0].min() > 200


# ----------------------------------------------------------------------------- splits and layouts


def test_one_folder_is_split_into_train_val_test_deterministically(tmp_path):
    root = make_folder(tmp_path / "imgs")
    classes, train, val, test = image_folder_splits(recipe(root, "data.val_size=6", "data.test_size=6").data)
    assert classes == ["blue", "green", "red"]
    assert (len(train), len(val), len(test)) == (24, 6, 6)
    assert sorted(test.targets.tolist()) == [0, 0, 1, 1, 2, 2]  # stratified
    idx = [set(d.indices.tolist()) for d in (train, val, test)]
    assert not (idx[0] & idx[1] or idx[0] & idx[2] or idx[1] & idx[2])
    again = image_folder_splits(recipe(root, "data.val_size=6", "data.test_size=6").data)
    assert torch.equal(again[3].indices, test.indices)
    x, y = train.get_batch([0, 1, 2])
    assert x.shape == (3, 3, 16, 16) and x.dtype == torch.float32


def test_a_link_to_its_own_folder_puts_no_image_in_two_splits(tmp_path):
    import os

    root = make_folder(tmp_path / "imgs")
    os.symlink(".", root / "blue" / "self")  # os.walk followed it 40 levels deep
    os.symlink("..", root / "red" / "up")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        classes, train, val, test = image_folder_splits(recipe(root, "data.val_size=6", "data.test_size=6").data)
    assert (len(train), len(val), len(test)) == (24, 6, 6)
    files = [{os.path.realpath(d.ds.samples[int(i)][0]) for i in d.indices} for d in (train, val, test)]
    assert [len(f) for f in files] == [24, 6, 6] and len(files[0] | files[1] | files[2]) == 36


def test_sibling_train_val_test_folders_are_used_as_they_are(tmp_path):
    make_folder(tmp_path / "d" / "train", 6)
    make_folder(tmp_path / "d" / "val", 2)
    make_folder(tmp_path / "d" / "test", 3, {"red": COLOURS["red"], "blue": COLOURS["blue"]})  # lacks green: fine
    classes, train, val, test = image_folder_splits(recipe(tmp_path / "d").data)
    assert (len(train), len(val), len(test)) == (18, 6, 6)
    assert sorted(set(test.targets.tolist())) == [classes.index("blue"), classes.index("red")]


def test_a_test_class_the_training_data_lacks_is_an_error(tmp_path):
    make_folder(tmp_path / "d" / "train", 4, {"red": COLOURS["red"], "blue": COLOURS["blue"]})
    make_folder(tmp_path / "d" / "test", 2)
    with pytest.raises(InputError, match="class folders that .* lacks: green"):
        image_folder_splits(recipe(tmp_path / "d").data)
    classes, _, _, test = image_folder_splits(recipe(tmp_path / "d", "data.classes=[red,blue]").data)
    assert classes == ["red", "blue"] and len(test) == 4  # the classes asked for: green's folder is left out


def test_classes_subset_and_max_per_class(tmp_path):
    root = make_folder(tmp_path / "imgs", 20)
    classes, train, _, _ = image_folder_splits(recipe(root, "data.classes=[red,blue]", "data.max_per_class=5").data)
    assert classes == ["red", "blue"]
    assert torch.bincount(train.targets).tolist() == [5, 5]


def test_bad_and_foreign_files_are_skipped_with_one_line_each(tmp_path):
    root = make_folder(tmp_path / "imgs")
    (root / "red" / "notes.txt").write_text("not an image")
    (root / "red" / "Thumbs.db").write_bytes(b"\0\1")
    for i in range(3):
        (root / "blue" / f"broken{i}.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        classes, train, val, test = image_folder_splits(recipe(root).data)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert any("skipping 3 image files that cannot be decoded" in m and "broken0.jpg" in m for m in messages)
    assert any("skipping 2 files" in m and "notes.txt" in m for m in messages)
    assert len(train) + len(val) + len(test) == 36


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "found no class folders"),
    (lambda p: make_folder(p, 3, {"only": (1, 2, 3)}), "at least 2 class folders .* has only 'only'"),
    (lambda p: (p / "a").mkdir(parents=True) or (p / "b").mkdir(), "every class folder must hold images"),
])
def test_a_folder_no_classifier_can_learn_from_is_one_clear_error(tmp_path, make, message):
    root = tmp_path / "imgs"
    make(root)
    with pytest.raises(InputError, match=message):
        image_folder_splits(recipe(root).data)


def test_streaming_reads_the_same_batches_as_the_cache(tmp_path):
    root = make_folder(tmp_path / "imgs")
    cached = build_data(recipe(root, "data.cache=memory"))
    streamed = build_data(recipe(root, "data.cache=stream"))
    assert streamed[0].ds.images is None and isinstance(cached[0].ds.images, torch.Tensor)
    for a, b in zip(cached[1:], streamed[1:]):  # validation and test: no random augmentation
        xa, ya = a.get_batch(list(range(len(a))))
        xb, yb = b.get_batch(list(range(len(b))))
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    auto = build_data(recipe(root, "data.cache_mb=0.001"))  # 36 images of 16x16x3 do not fit 1 KB
    assert auto[0].ds.images is None


def test_a_damaged_file_found_only_while_streaming_is_replaced_not_fatal(tmp_path):
    root = make_folder(tmp_path / "imgs", 2)
    good = io.BytesIO()
    Image.fromarray(photo((1, 2, 3), 64, 64, 0)).save(good, format="PNG")
    (root / "red" / "cut.png").write_bytes(good.getvalue()[:200])  # the header reads, the pixels do not
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = ImageFolder(root, on_error="skip", cache=False, size=8)
        index = [Path(p).name for p, _ in ds.samples].index("cut.png")
        with pytest.warns(UserWarning, match="cut.png cannot be decoded"):
            image, _ = ds[index]
    assert image.shape == (3, 8, 8)


def test_folder_only_keys_are_refused_for_built_in_data_and_left_out_of_their_config():
    with pytest.raises(InputError, match="data.img_size applies to data.name=folder"):
        load_recipe("vit-digits", ["data.img_size=64"])
    from attnlab.tasks import recipe_dict
    assert "img_size" not in recipe_dict(load_recipe("vit-digits"))["data"]
    assert recipe_dict(recipe("photos"))["data"]["img_size"] == 16


# ----------------------------------------------------------------------------- a run, end to end


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("folder_run")
    root = make_folder(tmp / "imgs", 10)
    run_dir = tmp / "run"
    assert main(["train", "image-folder", f"data.root={root}", "data.img_size=16", "model.options.widths=[8,16,16]",
                 "model.options.stem_width=8", "train.steps=6", "train.batch_size=8", "train.eval_every=3",
                 "train.checkpoint_every=3", "train.log_every=0", "train.progress=false", "--run-dir",
                 str(run_dir)]) == 0
    return root, run_dir


def test_a_folder_run_loads_in_python_and_predicts_paths_pil_images_and_tensors(folder_run):
    root, run_dir = folder_run
    assert json.loads((run_dir / "classes.json").read_text()) == {"classes": ["blue", "green", "red"]}
    run = attnlab.load_run(run_dir)
    assert run.classes == ["blue", "green", "red"] and run.image.size == (16, 16) and run.image.resize == "crop"
    path = root / "red" / "0.png"
    pil = Image.open(path)
    tensor = torch.from_numpy(np.array(pil.convert("RGB"))).permute(2, 0, 1).contiguous()
    by_path, by_pil, by_tensor = run.predict([str(path), pil, tensor], top_k=3)
    assert by_path.labels == by_pil.labels == by_tensor.labels
    assert [label for label, _ in by_path.labels] == sorted(run.classes, key=lambda c: -dict(by_path.labels)[c])
    assert sum(p for _, p in by_path.labels) == pytest.approx(1.0, abs=1e-5)
    assert by_pil.input == "image 1" and by_path.input == str(path)
    with pytest.raises(InputError, match="wrap one input in a list"):
        run.predict(str(path))
    with pytest.raises(InputError, match="uint8"):
        run.predict([tensor.float()])


def test_eval_reproduces_results_and_takes_a_folder_of_ones_own(folder_run, capsys):
    root, run_dir = folder_run
    results = json.loads((run_dir / "results.json").read_text())
    assert attnlab.load_run(run_dir).evaluate() == {
        "test_accuracy": results["test_accuracy"], "test_loss": results["test_loss"],
        "test_samples": results["test_size"]}
    assert main(["eval", str(run_dir), "--data", str(root)]) == 0
    assert "| test samples | 30 |" in capsys.readouterr().out
    other = make_folder(root.parent / "other", 1, {"purple": (1, 2, 3)})
    assert main(["eval", str(run_dir), "--data", str(other)]) == 2
    assert "class folders the run was not trained on: purple" in capsys.readouterr().err


def test_predict_reads_standard_input_reports_blank_and_bad_lines_and_writes_json(folder_run, capsys, monkeypatch):
    root, run_dir = folder_run
    lines = f"{root / 'red' / '0.png'}\n\n{root / 'nope.png'}\n{root / 'blue' / '1.png'}\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    assert main(["predict", str(run_dir), "--json", "--top-k", "2"]) == 2  # a missing file is an error
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines()]
    assert [r.get("error") for r in records] == [None, "blank input", records[2]["error"], None]
    assert "does not exist" in records[2]["error"]
    assert records[0]["label"] == records[0]["top_k"][0]["label"] and len(records[0]["top_k"]) == 2
    assert "line 2 of standard input: blank: not predicted" in err
    assert "line 3 of standard input: error: FILE" in err


def test_export_command_writes_an_onnx_file_that_matches_pytorch(folder_run, tmp_path, capsys):
    pytest.importorskip("onnxruntime", reason="the [export] extra is not installed (make test installs it)")
    root, run_dir = folder_run
    assert main(["export", str(run_dir), "--out", str(tmp_path / "photos.onnx")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "photos.onnx").is_file() and (tmp_path / "photos.preprocessing.json").is_file()
    difference = float(out.rsplit(":", 1)[1])
    assert difference <= 1e-4
    spec = json.loads((tmp_path / "photos.preprocessing.json").read_text())
    assert spec["classes"] == ["blue", "green", "red"] and spec["inputs"][0]["name"] == "image"


def test_a_run_trained_with_the_python_trainer_becomes_a_full_run_directory(tmp_path, capsys):
    from attnlab.engine import Trainer
    from attnlab.tasks import finish_run, get_task

    root = make_folder(tmp_path / "imgs", 8)
    r = recipe(root, "train.steps=4", "train.batch_size=8", "train.log_every=0", "train.progress=false")
    classes, train, val, test = image_folder_splits(r.data)
    model = get_task(r.task).build_model(r, classes)
    trainer = Trainer(model, train, r.train, eval_data=val, run_dir=tmp_path / "mine", log=lambda _: None)
    trainer.fit()
    trainer.save()
    results = finish_run(tmp_path / "mine", r, classes=classes, test_data=test)
    assert results["test_samples"] == len(test) and results["classes"] == classes
    run = attnlab.load_run(tmp_path / "mine")
    assert run.evaluate()["test_accuracy"] == results["test_accuracy"]  # the recipe finds the same test images
    image = root / "red" / "1.png"
    [p] = run.predict([str(image)], top_k=3)
    assert main(["predict", str(tmp_path / "mine"), str(image), "--top-k", "3"]) == 0
    line = capsys.readouterr().out.strip().split("\t")
    assert line[0] == p.label and float(line[1]) == pytest.approx(p.prob, abs=1e-3)
    assert main(["report", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "report.html").is_file()
    with pytest.raises(InputError, match="has no checkpoints/"):
        finish_run(tmp_path / "empty", r, classes=classes)


def test_the_attention_pictures_name_each_test_image_by_its_own_label(tmp_path):
    root = make_folder(tmp_path / "imgs", 10)  # one folder: the test images are held out of it
    run_dir = tmp_path / "run"
    assert main(["train", "image-folder", f"data.root={root}", "data.img_size=8", "model.name=vit_digits_patch2",
                 "model.options={}", "train.steps=1", "train.batch_size=8", "train.eval_every=0", "train.log_every=0",
                 "train.progress=false", "train.tensorboard=false", "--run-dir", str(run_dir)]) == 0
    run = attnlab.load_run(run_dir)
    views = run.task.attention_views(run, None, max_inputs=3)
    test = source_of(run.recipe.data).load_test(run.recipe.data)
    labels = [run.classes[int(y)] for y in test.targets[:3]]
    assert labels == ["blue", "green", "red"]  # one held-out image per class
    assert [view.title.split(" -> ")[0] for view in views] == [f"test image {k}, label {c}" for k, c in enumerate(labels)]
