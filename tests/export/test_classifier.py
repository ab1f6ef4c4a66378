"""A trained classifier exported to ONNX or TorchScript gives PyTorch's logits, at batch
sizes (and text lengths) other than the ones it was captured with; its preprocessing.json
says how to feed it; what it cannot export is refused with an InputError.

The models are untrained (random weights): parity does not need training. Each ONNX
export takes a few seconds, so each model is exported once per module."""

import json
import sys
import warnings

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from attnlab.tasks.text_classification import TextInfo
from attnlab.data.tokenizers.text import TextTokenizer
from attnlab.data.transforms.images import cifar_eval_transforms, digits_transforms
from attnlab.engine.checkpoint import save_checkpoint
from attnlab.errors import InputError
from attnlab.models import create_model
from attnlab.tasks import ImageSpec, TrainedRun, get_task, load_run, recipe_dict, recipe_from_dict
from attnlab.export.classifier import export_run, verify_export

try:
    import onnxruntime
except ImportError:  # the export extra is not installed
    onnxruntime = None
needs_onnx = pytest.mark.skipif(onnxruntime is None, reason="pip install 'attnlab[export]'")

TOL = 1e-4
TEXTS = ["a gorgeous , witty movie .", "a dull , lifeless mess .", "the best film of the year .",
         "an uneven but often funny comedy .", "it is neither witty nor gorgeous , only long ."] * 3
CIFAR = {"mode": "RGB", "size": (32, 32), "transform": cifar_eval_transforms, "classes": [f"c{i}" for i in range(10)]}
DIGITS = {"mode": "L", "size": (8, 8), "transform": lambda: digits_transforms(train=False),
          "classes": [str(d) for d in range(10)]}


def image_run(folder, model_name, data, **options):
    """An untrained image classifier as a TrainedRun (what load_run gives for a run of it).
    Its BatchNorm layers get running statistics of random images, as a trained model has
    statistics of its data: with the initial ones, a CNN's logits barely depend on the image."""
    torch.manual_seed(0)
    recipe = recipe_from_dict({"task": "image_classification", "model": {"name": model_name, "options": options}})
    model = create_model(model_name, num_classes=len(data["classes"]), **options)
    spec = ImageSpec(data["mode"], data["size"], data["transform"]())
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.momentum = None  # the statistics of the one batch below
    if norms:
        channels = 1 if data["mode"] == "L" else 3
        images = torch.randint(0, 256, (16, channels, *data["size"]), dtype=torch.uint8,
                               generator=torch.Generator().manual_seed(100))
        with torch.no_grad():
            model(spec.transform(images))
    model.eval()
    return TrainedRun(get_task("image_classification"), folder, recipe, model, folder / "checkpoints" / "best",
                      classes=data["classes"], image=spec)


def assert_parity(got, expected):
    """``got`` is ``expected`` within TOL, and the inputs' logits differ by far more than TOL
    (a graph that ignored its input would not pass)."""
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= TOL
    if len(expected) > 1:
        assert np.ptp(expected, axis=0).max() > 100 * TOL


def onnx_logits(result, feed):
    session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {k: v.numpy() for k, v in feed.items()})[0]


def random_images(run, batch, seed=1):
    channels = 1 if run.image.mode == "L" else 3
    return torch.randint(0, 256, (batch, channels, *run.image.size), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))


def jit_load(path):
    with warnings.catch_warnings():  # TorchScript is deprecated in torch 2.13, and still loads
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.load.* is deprecated", category=DeprecationWarning)
        return torch.jit.load(str(path)).eval()


def pytorch_logits(run, images):
    with torch.no_grad():
        return run.model(run.image.transform(images)).numpy()


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A run directory of an untrained sentiment_transformer_small (text.max_length 32, a
    300-token vocabulary), loaded with load_run as the command line does."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("text") / "run"
    folder.mkdir()
    recipe = recipe_from_dict({"task": "text_classification", "model": {"name": "sentiment_transformer_small"},
                               "text": {"vocab_size": 300, "max_length": 32}})
    tokenizer = TextTokenizer.train(TEXTS, "wordpiece", 300, lowercase=True, min_frequency=1)
    model = get_task("text_classification").build_model(recipe, TextInfo(tokenizer, ["negative", "positive"]))
    (folder / "config.yaml").write_text(yaml.safe_dump(recipe_dict(recipe), sort_keys=False))
    tokenizer.save(folder / "tokenizer.json")
    save_checkpoint(folder / "checkpoints", 2, model.state_dict(), {"step": 2})
    return load_run(folder)


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    return image_run(tmp_path_factory.mktemp("vit"), "vit_digits_patch2", DIGITS)


@pytest.fixture(scope="module")
def vit_onnx(vit_run):
    return export_run(vit_run, vit_run.run_dir / "export" / "vit.onnx")


@pytest.fixture(scope="module")
def text_onnx(text_run, tmp_path_factory):
    return export_run(text_run, tmp_path_factory.mktemp("text_export"))


# ----------------------------------------------------------------------------- ONNX parity


@needs_onnx
@pytest.mark.parametrize("batch", [1, 5])
def test_vit_onnx_gives_pytorchs_logits_at_other_batch_sizes(vit_run, vit_onnx, batch):
    images = random_images(vit_run, batch)
    got = onnx_logits(vit_onnx, {"image": images})
    assert got.shape == (batch, 10)
    assert_parity(got, pytorch_logits(vit_run, images))


@needs_onnx
@pytest.mark.parametrize("model_name, options", [("attention_cnn_fast", {"logit_scale": 1.0}), ("botnet_cifar", {})])
def test_cifar_attention_cnns_onnx_give_pytorchs_logits_at_other_batch_sizes(tmp_path, model_name, options):
    run = image_run(tmp_path, model_name, CIFAR, **options)  # logit_scale 1: logits of order 1, not 1/9
    result = export_run(run, tmp_path / "model.onnx")  # captured with a batch of 2
    for batch in (1, 3):
        images = random_images(run, batch)
        assert_parity(onnx_logits(result, {"image": images}), pytorch_logits(run, images))


@needs_onnx
def test_image_onnx_takes_raw_uint8_pixels_with_a_free_batch_axis(vit_onnx):
    session = onnxruntime.InferenceSession(str(vit_onnx.path), providers=["CPUExecutionProvider"])
    [image] = session.get_inputs()
    [logits] = session.get_outputs()
    assert (image.name, image.type, image.shape) == ("image", "tensor(uint8)", ["batch", 1, 8, 8])
    assert (logits.name, logits.type, logits.shape) == ("logits", "tensor(float)", ["batch", 10])


@needs_onnx
def test_text_onnx_gives_pytorchs_logits_on_a_padded_batch_of_another_length(text_run, text_onnx):
    batch = text_run.tokenizer.encode(TEXTS[:4], max_length=32)  # captured at length 8; here 12, with padding
    assert batch["input_ids"].shape[1] != 8 and (batch["attention_mask"] == 0).any()
    with torch.no_grad():
        expected = text_run.model(batch["input_ids"], batch["attention_mask"]).numpy()
    got = onnx_logits(text_onnx, batch)
    assert got.shape == (4, 2)
    assert_parity(got, expected)


@needs_onnx
def test_text_onnx_reads_the_mask_padding_leaves_the_logits_alone(text_run, text_onnx):
    alone = text_run.tokenizer.encode(TEXTS[1:2])
    padded = text_run.tokenizer.encode(TEXTS[1:2], max_length=20, padding="max_length")
    a, b = onnx_logits(text_onnx, alone), onnx_logits(text_onnx, padded)
    unmasked = {"input_ids": padded["input_ids"], "attention_mask": torch.ones_like(padded["attention_mask"])}
    assert np.abs(a - b).max() <= TOL
    assert np.abs(onnx_logits(text_onnx, unmasked) - b).max() > 1e-3  # the mask is an input, not a constant


@needs_onnx
def test_text_onnx_has_free_batch_and_sequence_axes_and_int64_inputs(text_onnx):
    session = onnxruntime.InferenceSession(str(text_onnx.path), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        ("input_ids", "tensor(int64)", ["batch", "sequence"]),
        ("attention_mask", "tensor(int64)", ["batch", "sequence"])]
    assert text_onnx.input_names == ["input_ids", "attention_mask"] and text_onnx.output_names == ["logits"]


@needs_onnx
def test_verify_export_returns_the_largest_logit_difference(vit_run, vit_onnx, text_run, text_onnx):
    assert 0 <= verify_export(vit_onnx, vit_run) <= TOL  # random images, batch 3
    assert 0 <= verify_export(vit_onnx, vit_run, random_images(vit_run, 7)) <= TOL
    assert 0 <= verify_export(text_onnx, text_run, ["a witty film .", TEXTS[4]]) <= TOL


# ----------------------------------------------------------------------------- TorchScript


def test_torchscript_image_export_gives_pytorchs_logits_at_another_batch_size(tmp_path):
    run = image_run(tmp_path, "vit_digits_patch2", DIGITS)
    result = export_run(run, tmp_path / "vit.pt", "torchscript")
    module = jit_load(result.path)
    images = random_images(run, 5)
    with torch.no_grad():
        assert_parity(module(images).numpy(), pytorch_logits(run, images))
    assert verify_export(result, run) <= TOL


def test_torchscript_text_export_gives_pytorchs_logits_on_a_padded_batch(text_run, tmp_path):
    result = export_run(text_run, tmp_path / "sentiment.pt", "torchscript")
    module = jit_load(result.path)
    batch = text_run.tokenizer.encode(TEXTS[:3])
    with torch.no_grad():
        got = module(batch["input_ids"], batch["attention_mask"]).numpy()
        expected = text_run.model(batch["input_ids"], batch["attention_mask"]).numpy()
    assert_parity(got, expected)
    assert result.tokenizer == tmp_path / "sentiment.tokenizer.json"


# ----------------------------------------------------------------------------- files


@needs_onnx
def test_image_preprocessing_json_says_mode_size_and_that_normalisation_is_inside(vit_onnx):
    spec = json.loads(vit_onnx.preprocessing.read_text())
    assert vit_onnx.preprocessing.name == "vit.preprocessing.json"
    assert spec["format"] == "onnx" and spec["model_file"] == "vit.onnx" and spec["opset"] >= 18
    assert spec["inputs"] == [{"name": "image", "dtype": "uint8", "shape": ["batch", 1, 8, 8]}]
    assert spec["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}]
    assert spec["classes"] == [str(d) for d in range(10)]
    assert spec["image"]["mode"] == "L" and spec["image"]["size"] == [8, 8]
    assert spec["image"]["normalization"] == "inside the graph"
    assert "'L'" in spec["how_to_call"] and "onnxruntime.InferenceSession('vit.onnx')" in spec["how_to_call"]


@needs_onnx
def test_text_preprocessing_json_names_the_tokenizer_beside_the_model(text_onnx, text_run):
    folder = text_onnx.path.parent
    assert sorted(p.name for p in folder.iterdir()) == [  # no temporary files left
        "model.onnx", "model.preprocessing.json", "model.tokenizer.json"]
    spec = json.loads(text_onnx.preprocessing.read_text())
    assert [i["name"] for i in spec["inputs"]] == ["input_ids", "attention_mask"]
    assert all(i["dtype"] == "int64" and i["shape"] == ["batch", "sequence"] for i in spec["inputs"])
    assert spec["classes"] == ["negative", "positive"] and spec["task"] == "text_classification"
    assert spec["text"]["tokenizer"] == "model.tokenizer.json" and spec["text"]["max_length"] == 32
    assert "[CLS]" in spec["how_to_call"] and "attention_mask" in spec["how_to_call"]
    copy = TextTokenizer.load(folder / spec["text"]["tokenizer"])
    assert copy.encode(TEXTS[:2])["input_ids"].tolist() == text_run.tokenizer.encode(TEXTS[:2])["input_ids"].tolist()


def test_text_how_to_call_with_the_tokenizers_library_gives_the_runs_inputs(text_onnx, text_run):
    from tokenizers import Tokenizer

    spec = json.loads(text_onnx.preprocessing.read_text())
    text, long = spec["text"], " ".join(TEXTS)  # one text longer than max_length: truncated
    tokenizer = Tokenizer.from_file(str(text_onnx.path.parent / text["tokenizer"]))
    rows = [[text["cls_id"]] + e.ids[: text["max_length"] - 2] + [text["sep_id"]]
            for e in tokenizer.encode_batch([TEXTS[0], long], add_special_tokens=False)]
    width = max(map(len, rows))
    ids = np.array([r + [text["pad_id"]] * (width - len(r)) for r in rows], dtype=np.int64)
    mask = np.array([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=np.int64)
    with pytest.warns(UserWarning, match="truncated"):
        expected = text_run.tokenizer.encode([TEXTS[0], long], max_length=32)
    assert ids.tolist() == expected["input_ids"].tolist() and mask.tolist() == expected["attention_mask"].tolist()


# ----------------------------------------------------------------------------- refusals


def test_a_translation_run_is_refused_naming_its_task(tmp_path):
    task = get_task("translation")
    run = TrainedRun(task, tmp_path, task.recipe_class(), nn.Linear(2, 2), tmp_path)
    with pytest.raises(InputError, match=r"export covers classifiers \(image and text\).*translation"):
        export_run(run, tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_format_is_refused_with_the_choices(vit_run, tmp_path):
    with pytest.raises(InputError, match=r"format must be one of 'onnx', 'torchscript'; got 'tflite'"):
        export_run(vit_run, tmp_path, "tflite")


def test_an_out_file_of_another_format_is_refused(vit_run, tmp_path):
    with pytest.raises(InputError, match=r"out must be a \.pt file or a folder"):
        export_run(vit_run, tmp_path / "model.onnx", "torchscript")


def test_onnx_without_its_packages_says_how_to_install_them(vit_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # what `import onnxscript` sees when it is not installed
    with pytest.raises(InputError, match=r"pip install 'attnlab\[export\]'"):
        export_run(vit_run, tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []
