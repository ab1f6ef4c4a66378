"""Extensible without editing attnlab: a task and a model defined in a module of one's
own (tests/fixtures/my_tasks.py) register themselves; a recipe names them, and the
command trains, evaluates and predicts with them after ``--import``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.cli import main

from refusals import BUG

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def attnlab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnlab", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_a_task_and_a_model_of_ones_own_train_evaluate_and_predict(tmp_path):
    recipe = tmp_path / "circle.yaml"
    recipe.write_text("description: points inside the circle\ntask: circle\nmodel: {name: circle_mlp, "
                      "options: {hidden: 16}}\ntrain: {steps: 300, batch_size: 64, lr: 0.01, log_every: 0, "
                      "progress: false, tensorboard: false}\n")
    run = tmp_path / "run"
    # A module importable from the current folder, as `python -m` would find it ...
    r = attnlab("train", str(recipe), "--import", "my_tasks", "--run-dir", str(run), cwd=FIXTURES)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "attnlab train circle: circle_mlp on circle (circle)" in r.stdout and "| test accuracy |" in r.stdout
    results = json.loads((run / "results.json").read_text())
    assert results["test_accuracy"] > 0.9 and (run / "report.html").is_file()
    # ... or a .py file, from anywhere.
    plugin = str(FIXTURES / "my_tasks.py")
    r = attnlab("eval", str(run), "--import", plugin, cwd=tmp_path)
    assert r.returncode == 0 and f"| test accuracy | {100 * results['test_accuracy']:.2f}% |" in r.stdout, r.stderr
    r = attnlab("predict", str(run), "0.1,0.2", "0.9,0.9", "--import", plugin, cwd=tmp_path)
    assert r.returncode == 0 and [line.split("\t")[0] for line in r.stdout.splitlines()] == ["inside", "outside"]


def test_without_the_import_the_task_is_unknown_and_the_error_says_so(tmp_path):
    recipe = tmp_path / "circle.yaml"
    recipe.write_text("task: circle\nmodel: {name: circle_mlp}\n")
    r = attnlab("train", str(recipe), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2 and "unknown task 'circle'" in r.stderr and "Traceback" not in r.stderr
    r = attnlab("train", str(recipe), "--import", "no_such_module", cwd=tmp_path)
    assert r.returncode == 2 and "--import no_such_module: no module named 'no_such_module'" in r.stderr


def test_a_data_source_of_ones_own_feeds_an_existing_task(tmp_path):
    import numpy as np
    from PIL import Image

    run = tmp_path / "run"
    overrides = ["data.name=stripes", "data.count=400", "train.steps=50", "train.eval_every=0",
                 "train.progress=false", "train.tensorboard=false", "model.options.depth=1"]
    r = attnlab("train", "vit-digits", *overrides, "--import", "my_sources", "--run-dir", str(run), cwd=FIXTURES)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "on stripes (image_classification)" in r.stdout and "data: 400 stripes" in r.stdout
    results = json.loads((run / "results.json").read_text())
    assert results["classes"] == ["horizontal", "vertical"] and results["test_size"] == 100
    assert results["test_accuracy"] > 0.9
    # In Python the same module registers through import_plugins (what --import calls), and the run
    # evaluates and predicts as any other (each command above and below pays torch's import again).
    from attnlab.plugins import import_plugins
    from attnlab.tasks import load_run

    import_plugins([str(FIXTURES / "my_sources.py")])
    loaded = load_run(run)
    assert loaded.evaluate()["test_accuracy"] == results["test_accuracy"]
    picture = np.zeros((8, 8), np.uint8)
    picture[:, ::2] = 220  # vertical stripes
    Image.fromarray(picture).save(tmp_path / "v.png")
    assert loaded.predict([str(tmp_path / "v.png")])[0].label == "vertical"
    # Without the module, the source is unknown and the error says how a source registers.
    r = attnlab("train", "vit-digits", "data.name=stripes", "--run-dir", str(tmp_path / "no"), cwd=tmp_path)
    assert r.returncode == 2 and "data.name must be one of 'digits', 'cifar10', 'folder'; got 'stripes'" in r.stderr
    assert "--import" in r.stderr


# ---------------------------------------------------------------------------- a module that fails


@pytest.mark.parametrize("source, message", [
    ("def f():\n    raise ValueError('my module is wrong')\nf()\n",
     "the module raised ValueError while it was imported: my module is wrong (its traceback is above)"),
    ("def f(:\n    pass\n", "the module raised SyntaxError while it was imported: invalid syntax"),
    ("import a_package_nobody_installed\n", "the module imports 'a_package_nobody_installed', which is not installed"),
    ("import sys\nsys.exit(0)\n", "the module called sys.exit(0) while it was imported"),
])
def test_a_module_given_to_import_that_fails_is_its_own_error(tmp_path, capsys, source, message):
    module = tmp_path / "mine.py"
    module.write_text(source)
    assert main(["train", "vit-digits", "--import", str(module), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"attnlab train: error: --import {module}: {message}" in err, err
    assert BUG not in err and not (tmp_path / "run").exists()
    if "ValueError" in message:  # the module's own traceback, not attnlab's
        assert str(module) in err and "raise ValueError" in err and "plugins.py" not in err
