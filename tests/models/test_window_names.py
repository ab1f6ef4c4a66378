""""Window" meant four things; now each has its name: a layer's ``sliding_window`` (the exact
kind's and the ``local`` kind's band, and the decoder's field), a streaming generation's
``cache_window``, and native sparse attention's ``branch_window``. The former names still work
in recipes, configs and saved runs, each with a one-line notice naming the new one."""

import warnings

import pytest
import torch

from attnlab.attention import build_attention
from attnlab.errors import InputError
from attnlab.models import create_model
from attnlab.models.registry import upgrade_options

TINY = dict(vocab_size=50, embed_dim=32, num_heads=4, depth=2, max_len=64, pos_embed="rope")


def test_the_decoders_former_window_field_is_its_sliding_window_with_a_notice():
    with pytest.warns(FutureWarning, match="GPTConfig field 'window' is now called 'sliding_window'"):
        old = create_model("gpt_tiny", **TINY, window=4)
    assert old.config.sliding_window == 4 and old.blocks[0].attn.sliding_window == 4
    with pytest.raises(InputError, match="'window' and 'sliding_window' are the same"):
        create_model("gpt_tiny", **TINY, window=4, sliding_window=4)


@pytest.mark.parametrize("kind, new", [("exact", "sliding_window"), ("local", "sliding_window"),
                                       ("nsa", "branch_window")])
def test_each_kinds_former_window_option_is_read_as_its_new_name(kind, new):
    with pytest.warns(FutureWarning, match=f"option 'window' of attention '{kind}' is now called '{new}'"):
        module = build_attention(kind, 32, 4, window=6)
    assert getattr(module, "branch_window" if kind == "nsa" else "sliding_window") == 6
    if kind == "nsa":  # its own option, which a decoder's recipe sets in attention_options
        with pytest.warns(FutureWarning, match="option 'window' of attention 'nsa'"):
            model = create_model("gpt_tiny", **TINY, attention=kind, attention_options={"window": 6})
        assert model.config.attention_options == {new: 6}
    else:  # the decoder's own field sets a layer's band, as it did under the former name
        with pytest.raises(InputError, match="must not set 'sliding_window': the model sets it from sliding_window"), \
                pytest.warns(FutureWarning):
            create_model("gpt_tiny", **TINY, attention=kind, attention_options={"window": 6})


def test_a_saved_runs_options_are_read_in_todays_names_without_a_notice():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert upgrade_options("gpt_tiny", {"window": 8, "depth": 2}) == {"sliding_window": 8, "depth": 2}


def test_a_streaming_generation_names_its_window_cache_window():
    torch.manual_seed(0)
    model = create_model("gpt_tiny", **TINY).eval()
    ids = torch.randint(0, 50, (1, 5))
    with torch.no_grad():
        assert model.generate(ids, 8, cache_window=100).shape == (1, 13)
    with pytest.raises(TypeError):
        model.generate(ids, 8, window=100)  # a generation never took a layer's window; the old name is gone


def test_the_command_line_gives_the_notice_once_in_one_line(tmp_path, monkeypatch, capsys):
    from attnlab.cli.app import main

    monkeypatch.setenv("ATTNLAB_DATA_DIR", str(tmp_path / "no-data"))  # stops after the recipe and model checks
    code = main(["train", "lm-shakespeare-char", "model.options.window=32", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if "now called 'sliding_window'" in line]
    assert notices == ["attnlab train: warning: GPTConfig field 'window' is now called 'sliding_window'; the old "
                       "name works until attnlab 0.4.0"], err
    assert code == 2 and "tinyshakespeare data not found" in err


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


def test_former_names_are_read_only_until_their_removal_version():
    """Fails once attnlab's version reaches FORMER_NAMES_GO_IN: then the former names (an option's
    ``was``, a config class's ``deprecated`` map) are to be removed, with this constant."""
    import attnlab
    from attnlab.suggest import FORMER_NAMES_GO_IN

    assert _version(attnlab.__version__) < _version(FORMER_NAMES_GO_IN), (
        f"attnlab {attnlab.__version__} reads former names that were to go in {FORMER_NAMES_GO_IN}: remove them")


def test_a_former_function_name_still_works_with_a_notice_naming_its_removal():
    from attnlab.models import registry

    with pytest.warns(FutureWarning, match=r"attnlab\.models\.registry\.check_attention_options is now called "
                                           r"attnlab\.models\.registry\.refuse_options_the_model_sets; the old name "
                                           r"works until attnlab 0\.4\.0"):
        with pytest.raises(InputError, match="attention_options must not set 'dropout'"):
            registry.check_attention_options({"dropout": 0.1}, {"dropout": "attn_drop_rate"})
    assert registry.check_attention_options.__name__ == "check_attention_options"
