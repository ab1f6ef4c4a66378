"""A finished run read back (``load_run``, ``attnlab eval``, ``predict``, ``translate``) refuses in one
line what it cannot do: a file given as a run, a checkpoint that is neither a name nor a folder,
top_k out of range, a tensor given as a text, weights that are not finite or of another model, a
test loss that is not finite, a translation asked of a classifier; a run that has not finished
is said to be one."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.engine import checkpoint as checkpoint_module
from attnlab.engine.checkpoint import latest_checkpoint, load_checkpoint
from attnlab.errors import InputError
from attnlab.tasks import load_run
from attnlab.run.skeleton import UnfinishedRunWarning

from conftest import train_digits
from refusals import one_line


# ---------------------------------------------------------------------------- load_run


def test_load_run_says_when_the_run_has_not_finished(digits_run):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_run(digits_run)  # finished: no word
    (digits_run / "results.json").unlink()
    with pytest.warns(UnfinishedRunWarning, match=r"has not finished \(no results.json\): loaded checkpoint .* of "
                                                  r"train.steps=4; continue it with: attnlab train"):
        load_run(digits_run)


def test_load_run_of_a_file_says_it_is_a_file(tmp_path, capsys):
    table = tmp_path / "scores.csv"
    table.write_text("text,label\ngood,1\n")
    with pytest.raises(InputError, match=r"run_dir must be a run directory; .*scores\.csv is a file, not a run "
                                         r"directory"):
        attnlab.load_run(table)
    assert main(["eval", str(table)]) == 2
    assert "scores.csv is a file, not a run directory" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("checkpoint, shown", [(None, "None"), (123, "123"), (2.5, "2.5"), ([], "list"), ("", "''")])
def test_load_run_refuses_a_checkpoint_that_is_neither_a_name_nor_a_folder(digits_run, checkpoint, shown):
    with pytest.raises(InputError, match=r"^checkpoint must be one of 'auto', 'best', 'last', 'averaged' or a "
                                         r"checkpoint folder \(a str or a path\); got " + shown) as info:
        attnlab.load_run(digits_run, checkpoint=checkpoint)
    if checkpoint == 123:
        assert "give its name: 'step_000000123'" in str(info.value)
    assert attnlab.load_run(digits_run, checkpoint="step_000000004").checkpoint.name == "step_000000004"
    assert attnlab.load_run(digits_run, checkpoint=digits_run / "checkpoints" / "best").checkpoint.name == "best"


# ---------------------------------------------------------------------------- predict


@pytest.mark.parametrize("top_k", [-1, 0, True, 1.5, "3"])
def test_top_k_must_be_a_positive_integer(digits_run, text_run, top_k):
    image = torch.zeros(1, 8, 8, dtype=torch.uint8)
    for run, inputs in ((attnlab.load_run(digits_run), [image]), (attnlab.load_run(text_run), ["goal match"])):
        with pytest.raises(InputError, match=rf"^top_k must be a positive integer .*; got {top_k!r}$"):
            run.predict(inputs, top_k=top_k)
        with pytest.raises(InputError, match=r"^batch_size must be a positive integer"):
            run.predict(inputs, batch_size=0)
        assert len(run.predict(inputs, top_k=50)[0].labels) == len(run.classes)  # more than there are: all


def test_a_tensor_given_to_a_text_run_is_named_by_its_index_and_type_not_printed(text_run):
    run = attnlab.load_run(text_run)
    with pytest.raises(InputError) as info:
        run.predict(["goal match", torch.zeros(1000)])
    message = str(info.value)
    assert message.startswith("inputs[1] must be a text (str) for a text_classification run; got Tensor")
    assert "tensor(" not in message and "0., 0." not in message and len(message) < 200


# ---------------------------------------------------------------------------- eval and predict of weights that are not finite or not the model's


def test_eval_fails_when_finite_weights_give_a_loss_that_is_not(digits_run, capsys):
    weights, state = load_checkpoint(latest_checkpoint(digits_run / "checkpoints"))
    huge = {k: v * 1e30 if v.is_floating_point() else v for k, v in weights.items()}  # finite, but they overflow
    checkpoint_module.save_checkpoint(digits_run / "checkpoints", 5, huge, state)
    assert main(["eval", str(digits_run), "--checkpoint", "last"]) == 1
    out, err = capsys.readouterr()
    assert "test loss | nan" in out and "test_loss not finite" in err and "Traceback" not in err


def test_eval_and_predict_refuse_a_checkpoint_whose_weights_are_not_finite(digits_run, capsys):
    weights, state = load_checkpoint(latest_checkpoint(digits_run / "checkpoints"))
    weights = {k: v.clone() for k, v in weights.items()}
    first = next(k for k, v in weights.items() if v.is_floating_point())
    weights[first][...] = math.nan
    checkpoint_module.save_checkpoint(digits_run / "checkpoints", 5, weights, state)  # the engine would refuse
    for command in (["eval", str(digits_run), "--checkpoint", "last"],
                    ["predict", str(digits_run), "--checkpoint", "last", "x.png"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "are not finite (1 of" in err and first in err and "Traceback" not in err, err


def test_weights_of_another_model_name_the_mismatched_keys(digits_run, tmp_path, capsys):
    other = tmp_path / "other"
    assert train_digits(other, "model.options.depth=2") == 0
    capsys.readouterr()
    assert main(["eval", str(digits_run), "--checkpoint", str(other / "checkpoints" / "best")]) == 2
    err = capsys.readouterr().err
    assert f"the weights in {other / 'checkpoints' / 'best'} do not fit this model" in err
    assert "unexpected blocks.1." in err and "Traceback" not in err


# ---------------------------------------------------------------------------- translate


def test_translate_on_a_classifier_run_says_to_predict(digits_run, capsys):
    assert main(["translate", str(digits_run), "x"]) == 2
    err = capsys.readouterr().err
    assert "is a run of the image_classification task: its predictions are labels; 'attnlab predict" in err
    assert "Traceback" not in err
