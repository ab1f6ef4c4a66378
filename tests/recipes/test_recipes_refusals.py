"""A recipe's model is checked when the recipe is loaded, before a run directory is made: an option
out of its range named by its recipe key, a Hugging Face folder whose config.json its weights do
not bear out, a model too big for the memory its training takes (weights, gradients and the
optimizer's state), attention options that count positions past max_len. One line, exit 2."""

from __future__ import annotations

import pytest
import torch

import attnlab.memory
from attnlab.engine.config import ConfigError
from attnlab.memory import gib
from attnlab.recipes import load_recipe
from attnlab.tasks import get_task

from conftest import train_digits
from hf_folders import gpt2_folder, llama_folder, text_file
from refusals import BUG, under_an_address_space_limit


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> dict[str, list]:
    """``{case: [what happened, message]}`` of the recipes whose model used to allocate gigabytes,
    run in one child process under a 4 GB address-space limit."""
    tmp = tmp_path_factory.mktemp("limited")
    vocab = str(llama_folder(tmp / "vocab", vocab_size=10**10))
    width = str(gpt2_folder(tmp / "width", n_embd=10**7))
    txt = str(text_file(tmp / "text"))
    lm = ["recipes", "lm-text", f"data.path={txt}"]
    return under_an_address_space_limit({
        "cli vocab": ["main", [*lm, "model.name=", f"model.checkpoint={vocab}"], {}],
        "cli width": ["main", [*lm, "model.name=", f"model.checkpoint={width}"], {}],
        "cli vocab_size": ["main", [*lm, "model.options.vocab_size=10000000000"], {}],
        "cli embed_dim": ["main", [*lm, "model.options.embed_dim=10000000"], {}],
        "cli n_buckets": ["main", [*lm, "model.options.attention=lsh",
                                   "model.options.attention_options={n_buckets: 1000000000}"], {}],
    })


# ---------------------------------------------------------------------------- options out of range


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


# ---------------------------------------------------------------------------- sizes that would allocate gigabytes


@pytest.mark.parametrize("case, said", [
    ("cli vocab", "config.json: vocab_size 10000000000 disagrees with the weights"),
    ("cli width", "config.json: n_embd 10000000 disagrees with the weights: wte.weight is (300, 32)"),
])
def test_a_recipe_with_such_a_folder_is_one_line_and_exit_2(limited, case, said):
    rc, err = limited[case]
    assert rc == 2 and said in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("case, largest", [("cli vocab_size", "tok_embed.weight (10000000000, 128)"),
                                           ("cli embed_dim", "(10000000, 10000000)")])
def test_a_recipe_model_too_big_to_train_is_refused_naming_model_options_and_both_sizes(limited, case, largest):
    rc, err = limited[case]
    assert rc == 2 and err.count("\n") == 1, err
    assert "model.options: model 'gpt_tiny' of " in err and largest in err
    assert "16 bytes per trained float32 parameter: weights, gradients and AdamW's two moments" in err
    assert " needs " in err and "this machine has " in err and " available" in err


def test_lsh_buckets_beyond_max_len_are_refused_by_their_recipe_key(limited):
    rc, err = limited["cli n_buckets"]
    assert rc == 2 and err.count("\n") == 1
    assert "model.options.attention_options.n_buckets must be <= 128, the model's max_len" in err
    assert "got 1000000000" in err


# ---------------------------------------------------------------------------- the memory of training


@pytest.mark.parametrize("optimizer, copies", [("adamw", 4), ("sgd", 3)])
def test_the_training_memory_counts_weights_gradients_and_the_optimizer_state(tmp_path, monkeypatch, optimizer,
                                                                             copies):
    overrides = [f"data.path={text_file(tmp_path)}", "model.options.depth=1", "model.options.embed_dim=32",
                 "model.options.num_heads=2", "model.options.mlp_hidden_dim=64", f"train.optimizer={optimizer}"]
    recipe = load_recipe("lm-text", overrides)
    with torch.device("meta"):
        model = get_task(recipe.task).build_model(recipe)
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    monkeypatch.setattr(attnlab.memory, "available_memory", lambda: 1000)
    with pytest.raises(ConfigError) as caught:
        load_recipe("lm-text", overrides)
    message = str(caught.value)
    assert f"model.options: model 'gpt_tiny' of {params:,} parameters" in message
    assert f"trained with {optimizer} ({4 * copies} bytes per trained float32 parameter" in message
    assert message.endswith(f") needs {gib(4 * copies * params + buffers)}; this machine has 1000 bytes available")
