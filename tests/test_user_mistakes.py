"""The user's mistakes are the user's: a full disk, a damaged log, a module of one's own
that fails, options out of range, a resume to fewer steps, an export over another, an
unfinished run, each gets one message that says what happened and what to do; never
"a bug in attnlab", never a traceback of attnlab's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.engine.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint
from attnlab.tasks import load_run
from attnlab.tasks.runs import UnfinishedRunWarning

from conftest import TINY_DIGITS, train_digits

BUG = "this is a bug in attnlab"


def _cli(*args: str, fsize: int | None = None) -> subprocess.CompletedProcess:
    """``attnlab ARGS`` in a child process, its files capped at ``fsize`` bytes (``ulimit -f``)."""
    limit = f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))\n" if fsize else ""
    code = f"{limit}import sys\nfrom attnlab.cli import main\nsys.exit(main({list(args)!r}))\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


# ---------------------------------------------------------------------------- a full disk


def test_a_full_disk_during_a_checkpoint_names_the_file_and_its_size_and_keeps_the_last_one(digits_run):
    state = latest_checkpoint(digits_run / "checkpoints") / "state.pt"
    weights = state.with_name("model.safetensors")
    cap = (weights.stat().st_size + state.stat().st_size) // 2  # room for the weights, not for the state
    assert weights.stat().st_size < cap < state.stat().st_size
    before = [p.name for p in list_checkpoints(digits_run / "checkpoints")]
    done = _cli("train", "--run-dir", str(digits_run), "--resume", "--allow-changes", "train.steps=6", fsize=cap)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("attnlab train: error: could not write ") and "state.pt (" in last and "KB)" in last
    assert "File too large" in last and "continue with --resume" in last
    assert "Traceback" not in done.stderr and BUG not in done.stderr
    assert [p.name for p in list_checkpoints(digits_run / "checkpoints")] == before  # the last one kept, valid
    load_checkpoint(latest_checkpoint(digits_run / "checkpoints"))
    assert not [p for p in (digits_run / "checkpoints").iterdir() if p.name.startswith(".")]  # no half-written save


# ---------------------------------------------------------------------------- damaged files of a run


def test_binary_garbage_in_metrics_jsonl_is_named_on_resume_before_anything_is_written(digits_run, capsys):
    lines = (digits_run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (digits_run / "metrics.jsonl").write_bytes(lines[0] + b"\xff\xfe\x00garbage\n" + b"".join(lines[1:]))
    assert train_digits(digits_run, "train.steps=6", "--resume", "--allow-changes") == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl: line 2 is not a JSON record" in err and "move it aside" in err
    assert "Traceback" not in err and not (digits_run / "config.changes.yaml").exists()


# ---------------------------------------------------------------------------- --import


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


# ---------------------------------------------------------------------------- settings


@pytest.mark.parametrize("override, message", [
    ("model.options.drop_rate=2", "model.options.drop_rate must be >= 0.0 and < 1.0; got 2"),
    ("model.options.attn_drop_rate=-0.1", "model.options.attn_drop_rate must be >= 0.0 and < 1.0; got -0.1"),
    ("model.options.mlp_ratio=-1", "model.options.mlp_ratio must be > 0.0; got -1"),
    ("model.options.mlp_ratio=0", "model.options.mlp_ratio must be > 0.0; got 0"),
    ("model.options.norm_eps=-1e-6", "model.options.norm_eps must be > 0.0; got -1e-06"),
    ("model.options.embed_dim=0", "model.options.embed_dim must be >= 1; got 0"),
])
def test_a_model_option_out_of_range_is_refused_with_its_recipe_key(tmp_path, capsys, override, message):
    assert train_digits(tmp_path / "run", override) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and BUG not in err
    assert not (tmp_path / "run").exists()


def test_a_model_option_out_of_range_in_python_names_the_config_field():
    from attnlab import create_model

    with pytest.raises(ValueError, match=r"ViTConfig.drop_rate must be >= 0.0 and < 1.0; got 2"):
        create_model("vit_digits_patch2", drop_rate=2)


def test_an_unknown_translate_checkpoint_is_refused_before_training(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "translate-multi30k", "translate.checkpoint=nope", "--run-dir", str(run)]) == 2
    assert "translate.checkpoint must be one of 'auto', 'best', 'last', 'averaged'; got 'nope'" in \
        capsys.readouterr().err
    assert main(["train", "translate-multi30k", "translate.checkpoint=averaged", "translate.average_checkpoints=0",
                 "--run-dir", str(run)]) == 2
    assert "translate.checkpoint=averaged needs translate.average_checkpoints >= 2" in capsys.readouterr().err
    assert not run.exists()


def test_a_resume_to_fewer_steps_than_done_is_refused(digits_run, capsys):
    assert train_digits(digits_run, "train.steps=3", "--resume", "--allow-changes") == 2
    err = capsys.readouterr().err
    assert "train.steps=3 is fewer than the 4 steps" in err and "give train.steps=4 or more" in err
    assert not (digits_run / "config.changes.yaml").exists()


def test_a_damaged_checkpoint_warning_says_the_resume_will_replace_it(digits_run, capsys):
    (digits_run / "checkpoints" / "step_000000004" / "model.safetensors").write_bytes(b"broken")
    (digits_run / "results.json").unlink()
    assert train_digits(digits_run, "--resume") == 0
    out = capsys.readouterr().out
    assert ("warning: skipping damaged checkpoint step_000000004: " in out and "resuming from step 2, and the "
            "resumed run will replace it when it saves step 4 (move it away first to keep it)" in out)
    load_checkpoint(digits_run / "checkpoints" / "step_000000004")  # replaced, whole


# ---------------------------------------------------------------------------- export, load_run


def test_export_over_an_existing_file_needs_force(digits_run, tmp_path, capsys):
    out = tmp_path / "digits.pt"
    assert main(["export", str(digits_run), "--format", "torchscript", "--out", str(out)]) == 0
    first = out.read_bytes()
    capsys.readouterr()
    assert main(["export", str(digits_run), "--format", "torchscript", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}, {tmp_path / 'digits.preprocessing.json'} exist already; pass --force" in err
    assert out.read_bytes() == first
    assert main(["export", str(digits_run), "--format", "torchscript", "--out", str(out), "--force"]) == 0


def test_load_run_says_when_the_run_has_not_finished(digits_run):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_run(digits_run)  # finished: no word
    (digits_run / "results.json").unlink()
    with pytest.warns(UnfinishedRunWarning, match=r"has not finished \(no results.json\): loaded checkpoint .* of "
                                                  r"train.steps=4; continue it with: attnlab train"):
        load_run(digits_run)


# ---------------------------------------------------------------------------- too little text for a batch


@pytest.mark.parametrize("overrides, said", [
    (["train.batch_size=32"], "train.batch_size=32: the training data has 3 samples (windows of text.context=64 "
                              "tokens), fewer than one batch; give train.batch_size=3 or less, or more data"),
    (["text.context=100000"], "the training data has 1 samples (windows of text.context=100000 tokens), fewer than "
                              "one batch; give train.batch_size=1 or less"),
])
def test_too_few_samples_for_a_batch_are_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, overrides,
                                                                         said):
    """One's own text on a pretrained model: the refusal comes before its weights are read."""
    transformers = pytest.importorskip("transformers", reason="transformers writes the tiny pretrained model")
    import torch

    import attnlab.tasks.runs as runs
    from gguf_files import byte_level_vocab, write_gguf

    torch.manual_seed(0)
    vocab = byte_level_vocab()
    config = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=200_000)
    source = write_gguf(tmp_path / "m.gguf", "llama", transformers.LlamaForCausalLM(config), vocab)
    monkeypatch.setattr(runs, "init_weights", lambda *a, **k: pytest.fail("the pretrained weights were read"))
    (tmp_path / "mine.txt").write_text("the cat sat on the mat and looked at the moon.\n" * 8, encoding="utf-8")
    assert main(["train", "lm-text", f"data.path={tmp_path / 'mine.txt'}", f"model.checkpoint={source}",
                 "text.context=64", "train.progress=false", *overrides, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err
    assert not (tmp_path / "run").exists(), list((tmp_path / "run").rglob("*"))  # nothing left of the refused run
