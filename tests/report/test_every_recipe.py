"""Every shipped recipe's model, trained for two steps on data cut to a few examples, writes a
report whose every section says something true: no exception text (a class name, "Error:",
a traceback) in the page. A model that forms no attention weights, or whose attention has no
drawing, says so in a sentence naming the model and what to train instead.

The recipes' own data: folders, files and corpora the test makes (image-folder, text-
classification, translation-files, lm-text, the pretrained folders), the built-in sets cut
to a few examples of the real data in ATTNLAB_DATA_DIR (CIFAR-10, MR, Multi30k, Tiny
Shakespeare; scikit-learn's digits are offline)."""

from __future__ import annotations

import gzip
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.recipes import list_recipes

from conftest import make_folder

DATA = os.environ.get("ATTNLAB_DATA_DIR")
pytestmark = pytest.mark.filterwarnings("ignore:.*were truncated", "ignore:capture_attention records no weights")

# What a run of every recipe shares: two steps, nothing evaluated on the way, float32, small batches.
QUICK = ["train.steps=2", "train.batch_size=8", "train.warmup_steps=1", "train.eval_every=0", "train.early_stop=null",
         "train.log_every=1", "train.checkpoint_every=0", "train.progress=false", "train.tensorboard=false",
         "train.precision=fp32"]
CIFAR = ["data.val_size=0"]  # a CIFAR-10 of 4 training images a class: none held out
MULTI30K = ["text.vocab_size=300", "text.min_frequency=1", "text.max_length=24", "translate.average_checkpoints=0",
            "translate.num_beams=2"]
# Exception text: a class name of Python's or attnlab's, "Error:", a traceback.
EXCEPTION_TEXT = re.compile(r"Traceback|Error:|\b\w*(Error|Exception)\b|File \"")


def _cifar(data):
    return [f"data.data_dir={data['cifar']}", *CIFAR]


def _multi30k(data):
    return [f"data.data_dir={data['multi30k']}", *MULTI30K]


# Each recipe's data and sizes, from ``data`` (the fixture's folders and files, made on first use).
OVERRIDES = {
    "attncnn-cifar10": _cifar,
    "botnet-cifar10": _cifar,
    "cct-cifar10": _cifar,
    "cct-fast-cifar10": _cifar,
    "resnet-cifar10": _cifar,
    "vit-cifar10": _cifar,
    "vit-digits": lambda data: ["data.val_size=0.1"],
    "demo-reverse": lambda data: ["data.train_size=64", "data.test_size=8"],
    "image-folder": lambda data: [f"data.root={data['photos']}", "data.img_size=16"],
    "image-folder-pretrained": lambda data: [f"data.root={data['photos']}", "data.img_size=16",
                                             f"model.checkpoint={data['vit']}"],
    "lm-shakespeare-char": lambda data: [f"data.data_dir={data['shakespeare']}", "text.context=32",
                                         "generate.max_new_tokens=8"],
    "lm-shakespeare-pretrained": lambda data: [f"data.data_dir={data['shakespeare']}",
                                               f"model.checkpoint={data['llama']}", "text.context=32",
                                               "generate.max_new_tokens=8"],
    "lm-text": lambda data: [f"data.path={data['text']}", "text.vocab_size=300", "text.context=32",
                             "generate.max_new_tokens=8"],
    "sentiment-mr": lambda data: [f"data.data_dir={data['mr']}", "text.vocab_size=300", "text.max_length=32"],
    "text-classification": lambda data: [f"data.train={data['reviews']}", "text.vocab_size=300",
                                         "text.max_length=32"],
    "sentiment-mr-pretrained": lambda data: [f"data.data_dir={data['mr']}", f"model.checkpoint={data['bert']}",
                                             "text.max_length=32"],
    "text-classification-pretrained": lambda data: [f"data.train={data['reviews']}",
                                                    f"model.checkpoint={data['bert']}", "text.max_length=32"],
    "translate-multi30k": _multi30k,
    "translate-multi30k-gru": _multi30k,
    "translation-files": lambda data: [f"data.root={data['corpus']}", "data.source=de", "data.target=en",
                                       "data.val_size=4", "data.test_size=4", "text.vocab_size=300",
                                       "text.min_frequency=1", "translate.average_checkpoints=0",
                                       "translate.num_beams=2"],
}


def _real(name: str) -> Path:
    if not DATA or not (Path(DATA) / name).exists():
        pytest.skip(f"{name} absent: set ATTNLAB_DATA_DIR to a folder holding {name}/ (make test does)")
    return Path(DATA) / name


def _tiny_cifar(root: Path) -> Path:
    """The first 4 training and 2 test images of each class of the real CIFAR-10, in its layout."""
    real = _real("cifar10")
    for split, n in (("train", 4), ("test", 2)):
        for folder in sorted((real / split).iterdir()):
            (root / "cifar10" / split / folder.name).mkdir(parents=True)
            for f in sorted(folder.iterdir())[:n]:
                shutil.copy(f, root / "cifar10" / split / folder.name / f.name)
    return root


def _tiny_multi30k(root: Path) -> Path:
    """The first 64 / 8 / 8 pairs of the real Multi30k, in its layout."""
    real = _real("multi30k")
    (root / "multi30k").mkdir(parents=True)
    for prefix, n in (("train", 64), ("val", 8), ("test_2016_flickr", 8)):
        for lang in ("de", "en"):
            with gzip.open(real / f"{prefix}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            with gzip.open(root / "multi30k" / f"{prefix}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(lines))
    return root


def _tiny_mr(root: Path) -> Path:
    """The first 100 sentences of each polarity of the real MR, in its layout (its Latin-1 bytes)."""
    real = _real("mr")
    (root / "mr").mkdir(parents=True)
    for name in ("rt-polarity.pos", "rt-polarity.neg"):
        (root / "mr" / name).write_bytes(b"".join((real / name).read_bytes().splitlines(keepends=True)[:100]))
    return root


def _vit_folder(folder: Path) -> Path:
    transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (dev extra)")
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64, num_labels=3)
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    return folder


def _bert_folder(folder: Path, texts: list[str]) -> Path:
    pytest.importorskip("transformers", reason="transformers is a test-only dependency (dev extra)")
    from test_pretrained_text import make_bert_folder

    return make_bert_folder(folder, texts, layers=1)


def _llama_file(folder: Path) -> Path:
    """A tiny random llama decoder with a byte-level vocabulary, as a GGUF file."""
    transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (dev extra)")
    from gguf_files import byte_level_vocab, write_gguf

    folder.mkdir()
    vocab = byte_level_vocab()
    config = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=64)
    return write_gguf(folder / "tiny.gguf", "llama", transformers.AutoModelForCausalLM.from_config(config), vocab)


REVIEWS = [("a warm and witty film", "positive"), ("the cast is superb", "positive"),
           ("a dull and tired mess", "negative"), ("flat jokes and no heart", "negative")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Makers of each recipe's data, made when a recipe first asks (a recipe whose data is
    absent skips alone)."""
    root = tmp_path_factory.mktemp("data")

    def photos():
        return make_folder(root / "photos", 4)

    def reviews():
        path = root / "reviews.csv"
        path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in REVIEWS * 6), encoding="utf-8")
        return path

    def corpus():
        (root / "corpus").mkdir()
        (root / "corpus" / "train.de").write_text("ein Hund läuft\nzwei Katzen schlafen\n" * 20, encoding="utf-8")
        (root / "corpus" / "train.en").write_text("a dog runs\ntwo cats sleep\n" * 20, encoding="utf-8")
        return root / "corpus"

    def shakespeare():
        text = (_real("tinyshakespeare") / "input.txt").read_text(encoding="utf-8")[:20_000]  # skips when absent
        (root / "tinyshakespeare").mkdir()
        (root / "tinyshakespeare" / "input.txt").write_text(text, encoding="utf-8")
        return root

    def text():
        path = root / "story.txt"
        path.write_text("Once upon a time a cat sat on a mat. 从前有一只猫坐在垫子上。\n" * 60, encoding="utf-8")
        return path

    makers = {"mr": lambda: _tiny_mr(root / "mr"), "photos": photos, "reviews": reviews, "corpus": corpus,
              "shakespeare": shakespeare, "text": text,
              "cifar": lambda: _tiny_cifar(root / "cifar"), "multi30k": lambda: _tiny_multi30k(root / "m30k"),
              "vit": lambda: _vit_folder(root / "vit"), "llama": lambda: _llama_file(root / "llama"),
              "bert": lambda: _bert_folder(root / "bert", [t for t, _ in REVIEWS])}

    class Lazy(dict):
        def __missing__(self, key):
            self[key] = makers[key]()
            return self[key]

    return Lazy()


def test_every_shipped_recipe_has_its_tiny_run():
    assert sorted(OVERRIDES) == sorted(name for name, _, _ in list_recipes())


@pytest.mark.parametrize("recipe", [name for name, _, _ in list_recipes()])
def test_the_report_of_every_recipe_holds_no_exception_text(recipe, data, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", recipe, *QUICK, *OVERRIDES[recipe](data), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    body = re.sub(r'srcdoc="[^"]*"', "", page)  # the explorer's own page: its script names errors it may show
    notes = re.findall(r'<p class="note">(.*?)</p>', body)
    assert not EXCEPTION_TEXT.search(body), (notes, out)
    assert "warning: report.html" not in out and "could not be drawn" not in body, notes
