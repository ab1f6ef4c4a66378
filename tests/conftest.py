import csv
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

# Test modules import helpers and one another by their file's name, from whichever folder of tests/ they lie in
# (``from conftest import train_digits``, ``from gguf_files import write_gguf``, ``from test_lm_from_folder import
# model_folder``): tests/ and every folder of test modules below it are on sys.path, whichever file pytest starts
# from (its default import mode, "prepend", puts a module's own folder there only when it imports that module).
# So the name of every module under tests/ is unique, and no folder holds an __init__.py.
TESTS = Path(__file__).resolve().parent
for _folder in sorted({TESTS, *(p.parent for p in TESTS.rglob("test_*.py"))}, reverse=True):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

# The digits as the tests read them: a validation part (runs keep checkpoints/best, evaluations are logged) and
# no random shifts (the shipped vit-digits trains on every image, shifted, for its accuracy).
DIGITS_WITH_VALIDATION = ["data.val_size=0.1", "data.augment=false"]
# A digits ViT small enough to train in a second: for tests of run directories.
TINY_DIGITS = [*DIGITS_WITH_VALIDATION, "model.options.depth=1", "model.options.embed_dim=32", "model.options.num_heads=2", "train.steps=4",
               "train.warmup_steps=1", "train.batch_size=32", "train.checkpoint_every=2", "train.eval_every=2",
               "train.log_every=1", "train.progress=false", "train.tensorboard=false"]


def tiny_story_recipe(folder: Path, *extra: str) -> list[str]:
    """``lm-text`` keys for a tiny character model on a short story written into ``folder``,
    4 steps of float32 on the CPU; ``extra`` keys after them (the later key wins)."""
    text = "".join(f"the {w} sat on the mat and looked at the {v}.\n" for w in ("cat", "dog", "owl") * 30
                   for v in ("moon", "sun"))
    (folder / "story.txt").write_text(text, encoding="utf-8")
    return [f"data.path={folder / 'story.txt'}", "model.options.depth=1", "model.options.embed_dim=32",
            "model.options.num_heads=2", "model.options.mlp_hidden_dim=64", "text.context=32", "train.steps=4",
            "train.warmup_steps=1", "train.eval_every=0", "train.checkpoint_every=4", "train.log_every=1",
            "train.progress=false", "train.tensorboard=false", "train.precision=fp32", "train.device=cpu",
            "generate.max_new_tokens=5", "model.options.drop_rate=0", "text.tokenizer=char", *extra]


def train_digits(run_dir, *extra: str) -> int:
    """``attnlab train vit-digits`` with :data:`TINY_DIGITS`, ``extra`` and ``--run-dir``; its exit status."""
    from attnlab.cli import main

    return main(["train", "vit-digits", *TINY_DIGITS, *extra, "--run-dir", str(run_dir)])


@pytest.fixture(scope="session")
def _finished_digits_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("finished") / "run"
    assert train_digits(run) == 0
    return run


@pytest.fixture
def digits_run(_finished_digits_run, tmp_path):
    """A finished tiny digits run (4 steps, checkpoints at 2 and 4, best/), a fresh copy for each test."""
    return shutil.copytree(_finished_digits_run, tmp_path / "run")


@pytest.fixture
def tiny_cifar(tmp_path):
    """CIFAR-10 in the image-folder layout under ``tmp_path/cifar10``: 4 train and 2 test
    random JPEGs per class; returns ``tmp_path`` (a ``data.data_dir``)."""
    from attnlab.data.readers.images import CIFAR10_CLASSES

    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("test", 2)):
        for c in CIFAR10_CLASSES:
            folder = tmp_path / "cifar10" / split / c
            folder.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i:04d}.jpg")
    return tmp_path


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def reference_attention(q, k, v, blocked=None, additive=None, scale=None):
    """Plain softmax attention in float64, written independently of attnlab.

    ``blocked``: bool, True = may not attend. Rows with no allowed key give zeros.
    """
    q, k, v = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = q @ k.transpose(-2, -1) * scale
    allowed = torch.ones_like(logits, dtype=torch.bool)
    if blocked is not None:
        allowed = allowed & ~blocked
    if additive is not None:
        logits = logits + additive.double()
        allowed = allowed & (additive != float("-inf"))
    logits = logits.masked_fill(~allowed, float("-inf"))
    m = logits.amax(-1, keepdim=True).clamp_min(-1e300)
    e = torch.exp(logits - m) * allowed
    s = e.sum(-1, keepdim=True)
    w = torch.where(s > 0, e / s.clamp_min(1e-300), torch.zeros_like(e))
    return w @ v, w


# ----------------------------------------------------------------------------- image folders of one's own

COLOURS = {"blue": (30, 30, 200), "green": (30, 200, 30), "red": (200, 30, 30)}


def photo(colour, h, w, seed):
    gen = np.random.default_rng(seed)
    return np.clip(gen.normal(colour, 25, (h, w, 3)), 0, 255).astype(np.uint8)


def make_folder(root: Path, per_class: int = 12, classes=COLOURS) -> Path:
    """Images of every kind a user's folder holds: sizes vary, modes vary."""
    for c, colour in classes.items():
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            im = Image.fromarray(photo(colour, 20 + 7 * (i % 5), 30 + 5 * (i % 3), i))
            kind = i % 4
            if kind == 0:
                im.save(root / c / f"{i}.png")
            elif kind == 1:
                im.convert("RGBA").save(root / c / f"{i}.png")
            elif kind == 2:
                im.convert("P").save(root / c / f"{i}.gif")
            else:
                im.save(root / c / f"{i}.jpg", quality=95)
    return root


# ----------------------------------------------------------------------------- a headless browser
CHROMIUM, CHROMEDRIVER = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or \
    "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser():
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.skip("headless Chromium absent: apt-get install chromium chromium-driver (make test tries, as root)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium absent: pip install -e '.[dev]'")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)  # a given driver: no download
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


# ----------------------------------------------------------------------------- runs and folders the refusals share


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A text classifier of two classes trained for two steps on a CSV of one's own (the text_run of
    export/test_classifier.py, which exports classifiers, is another)."""
    from attnlab.cli import main

    tmp = tmp_path_factory.mktemp("texts")
    rng = random.Random(0)
    with open(tmp / "t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for label, words in {"sports": "goal match team score win", "weather": "rain sun cloud storm wind"}.items():
            for _ in range(20):
                w.writerow([" ".join(rng.choice(words.split()) for _ in range(5)), label])
    run = tmp / "run"
    assert main(["train", "text-classification", f"data.train={tmp / 't.csv'}", "text.vocab_size=300",
                 "model.options.embed_dim=32", "model.options.depth=1", "model.options.num_heads=2", "train.steps=2",
                 "train.warmup_steps=1", "train.batch_size=8", "train.progress=false", "train.tensorboard=false",
                 "--run-dir", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny random Llama folder with its tokenizer, written by ``transformers`` (tasks/test_lm_from_folder.py's
    model_folder); skips where ``transformers`` is absent."""
    pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")
    from test_lm_from_folder import model_folder

    return model_folder("llama", tmp_path_factory.mktemp("llama"))
