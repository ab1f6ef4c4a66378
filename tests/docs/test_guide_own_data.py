"""The user guide's "Your own data" Python example runs as written, on runs the test trains first
(the site does not run it: it needs those runs and the reader's files)."""

import re
from pathlib import Path

import numpy as np
from PIL import Image

from attnlab.cli import main

from conftest import make_folder

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "en" / "guide" / "runs.md"
TINY = ["train.steps=2", "train.batch_size=8", "train.log_every=0", "train.progress=false", "train.eval_every=0",
        "train.checkpoint_every=0", "train.tensorboard=false"]


def example() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    section = text[text.index("## A finished run"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_own_data_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_folder(tmp_path / "photos", 6)
    Image.fromarray(np.zeros((40, 30, 3), np.uint8)).save("cat.jpg")
    Image.fromarray(np.full((30, 50, 4), 200, np.uint8)).save("dog.png")
    (tmp_path / "reviews.csv").write_text("text,label\n" + "".join(
        f"{w} film,{lab}\n" for w, lab in [("a witty", "pos"), ("a dull", "neg")] * 20))
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "train.de").write_text("ein Hund\nzwei Katzen\n" * 20)
    (tmp_path / "corpus" / "train.en").write_text("a dog\ntwo cats\n" * 20)
    assert main(["train", "image-folder", "data.root=photos", "data.img_size=16", "model.options.widths=[8,16,16]",
                 "model.options.stem_width=8", *TINY, "--run-dir", "runs/photos"]) == 0
    assert main(["train", "text-classification", "data.train=reviews.csv", "text.vocab_size=300",
                 "model.options.depth=1", "model.options.embed_dim=32", "model.options.num_heads=2", *TINY,
                 "--run-dir", "runs/reviews"]) == 0
    assert main(["train", "translation-files", "data.root=corpus", "data.source=de", "data.target=en",
                 "data.val_size=4", "data.test_size=4", "model.name=transformer_tiny", "model.options={}",
                 "text.vocab_size=300", "text.min_frequency=1", "translate.average_checkpoints=0", *TINY,
                 "--run-dir", "runs/de-en"]) == 0
    exec(compile(example(), str(GUIDE), "exec"), {})
