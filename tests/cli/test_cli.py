"""The attnlab command: help, version, models, and one-line errors with exit status 2."""

import subprocess
import sys

import pytest

import attnlab
from attnlab.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True, timeout=120)


def test_help_and_version():
    r = run("--help")
    assert r.returncode == 0 and "models" in r.stdout and "demo" in r.stdout
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"attnlab {attnlab.__version__}"


def test_models_lists_name_family_and_parameters(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("transformer_base "))
    assert "transformer" in line and "63.1 M" in line and "63,082,496" in line
    assert main(["models", "transformer_t*"]) == 0
    out = capsys.readouterr().out
    assert "transformer_tiny" in out and "transformer_base" not in out


@pytest.mark.parametrize("args,message", [
    (["models", "nothing*"], "no model matches 'nothing*'"),
    (["demo", "--steps", "0"], "expected a positive integer, got 0"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_exits_2_with_one_message(args, message):
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 3  # argparse prints usage + the message


@pytest.mark.long  # trains until the demo has learned: `make test-long` and CI
def test_demo_learns_to_reverse(capsys):
    # A short run of the main demo: the model must actually learn (not a smoke test).
    assert main(["demo", "--steps", "250"]) == 0
    out = capsys.readouterr().out
    greedy = float(next(l for l in out.splitlines() if "exact match, greedy" in l).split("|")[2].strip(" %"))
    assert greedy >= 50.0


def test_data_list_and_unknown_download(tmp_path, capsys):
    assert main(["data", "list", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"data directory: {tmp_path}" in out and "mr" in out and "missing" in out
    r = run("data", "download", "imagenet", "--data-dir", str(tmp_path))
    assert r.returncode == 2 and "unknown data set 'imagenet'" in r.stderr and "Traceback" not in r.stderr


def test_an_internal_error_is_not_a_usage_error_it_shows_the_traceback_and_says_it_is_a_bug(monkeypatch, capsys):
    import attnlab.cli as cli
    from attnlab.cli import catalog_cmds  # the module that registers `attnlab recipes`

    def broken(args):
        return {}["no such key"]  # a bug in a command, not the user's input

    def plain_value_error(args):
        raise ValueError("math domain error")  # e.g. from numpy deep inside: still ours, not the user's

    for fn in (broken, plain_value_error):
        monkeypatch.setattr(catalog_cmds, "cmd_recipes", fn)
        assert cli.main(["recipes"]) == 1
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err
        assert err.rstrip().endswith("please report it with the command line and the traceback above")
        assert "attnlab recipes: internal error: this is a bug in attnlab" in err


def test_every_command_works_on_a_run_of_the_demo_task(tmp_path, capsys):
    """The demo task goes through the same interface as the others: predict, eval,
    visualize and report need nothing named for it."""
    run = tmp_path / "rev"
    assert main(["train", "demo-reverse", "train.steps=40", "train.log_every=0", "train.progress=false",
                 "train.tensorboard=false", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["predict", str(run), "5 9 3"]) == 0 and len(capsys.readouterr().out.split()) >= 1
    assert main(["translate", str(run), "5 9 3", "--beam-size", "2"]) == 0  # generated text: translate takes it too
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0 and "exact match, greedy" in capsys.readouterr().out
    assert main(["visualize", str(run), "--input", "5 9 3"]) == 0
    assert capsys.readouterr().out.split() == [str(run / "visualize" / "00_alignment.png")]
    assert main(["predict", str(run), "five nine"]) == 2
    assert "token ids separated by spaces" in capsys.readouterr().err


@pytest.mark.parametrize("value, kept", [(None, True), ("1", True), ("0", False)])
def test_the_command_keeps_freed_memory_unless_told_not_to(monkeypatch, capsys, value, kept):
    import attnlab.cli as cli
    from attnlab.cli import app  # where console() looks keep_freed_memory up

    calls = []
    monkeypatch.setattr(app, "keep_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(sys, "argv", ["attnlab", "--version"])
    if value is None:
        monkeypatch.delenv("ATTNLAB_KEEP_FREED_MEMORY", raising=False)
    else:
        monkeypatch.setenv("ATTNLAB_KEEP_FREED_MEMORY", value)
    with pytest.raises(SystemExit) as exit_:
        cli.console()
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("attnlab ")
    assert bool(calls) == kept


def test_a_bad_keep_freed_memory_setting_exits_2_in_one_line():
    import os

    r = subprocess.run([sys.executable, "-m", "attnlab", "--version"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ATTNLAB_KEEP_FREED_MEMORY": "yes"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "attnlab: error: ATTNLAB_KEEP_FREED_MEMORY must be 0 or 1; got 'yes'"


# ---------------------------------------------------------------------------- options by other names


@pytest.mark.parametrize("typed, meant", [("--max_tokens", "--max-new-tokens"), ("--tempreature", "--temperature"),
                                          ("--top_n", "--top-p")])
def test_a_near_miss_of_an_option_is_told_the_right_name(typed, meant, capsys, tmp_path):
    assert main(["generate", str(tmp_path), "hi", typed, "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"attnlab generate: error: unrecognized option {typed}; did you mean ") and meant in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("command, typed, meant", [("train", "--out", "--run-dir"), ("train", "--output-dir", "--run-dir"),
                                                    ("export", "--output", "--out")])
def test_another_tools_name_for_an_option_is_told_ours(command, typed, meant, capsys):
    assert main([command, "x", typed, "y"]) == 2
    assert capsys.readouterr().err.strip() == f"attnlab {command}: error: unrecognized option {typed}; did you mean {meant}?"


def test_an_unknown_option_far_from_any_points_to_help(capsys):
    assert main(["train", "vit-digits", "--zzzz"]) == 2
    assert capsys.readouterr().err.strip() == ("attnlab train: error: unrecognized option --zzzz; see attnlab train "
                                               "--help")


# ---------------------------------------------------------------------------- command-line text that is not UTF-8


@pytest.mark.parametrize("args, said", [
    ([b"train", b"vit-digits", b"train.lr=\xff"], "override 'train.lr' is not valid UTF-8 (byte 0xff at character 9)"),
    ([b"train", b"vit-digits", b"--run-dir", b"runs/caf\xe9"], "--run-dir is not valid UTF-8 (byte 0xe9 at character 8)"),
    ([b"recipes", b"vit\xff"], "NAME is not valid UTF-8"),
    ([b"predict", b"run\xff", b"text"], "RUN_DIR is not valid UTF-8"),
])
def test_command_line_text_that_is_not_utf8_exits_2_in_one_line(args, said, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, cwd=tmp_path, timeout=120)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert said in err and "attnlab reads its command line as UTF-8 text" in err
    assert not (tmp_path / "runs").exists()  # refused before any work


# ---------------------------------------------------------------------------- commands that need no torch


@pytest.mark.parametrize("argv", [["--version"], ["recipes"], ["--help"], ["train", "--help"]])
def test_commands_that_need_no_torch_do_not_import_it(argv):
    code = ("import sys\nfrom attnlab.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'numpy', 'tokenizers', 'matplotlib', 'transformers') if m in sys.modules)\n"
            "print('imported:', heavy)\n" % argv)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "imported: []"
