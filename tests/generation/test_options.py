"""Generation options in one place: each range-checked by name, the same for the command
line (``--top-p``), recipes (``generate.top_p``) and Python (``top_p``), before any work; a
``max_new_tokens`` whose cache could not fit is refused with the limit it implies, and the
cache grows with the generation instead of being allocated for all of it."""

from __future__ import annotations

import math
import re

import pytest
import torch

from attnlab.attention.cache import DecodingCache
from attnlab.cli import main
from attnlab.engine.config import ConfigError
from attnlab.errors import InputError
from attnlab.models import create_model
from attnlab.generation.sampling import check_generation, penalize_repeats
from attnlab.recipes import load_recipe

BAD = [
    ("temperature", math.nan, "a finite number >= 0"), ("temperature", math.inf, "a finite number >= 0"),
    ("temperature", -0.5, "a finite number >= 0"), ("temperature", "hot", "a finite number >= 0"),
    ("top_k", -1, "an integer >= 0"), ("top_k", 2.5, "an integer >= 0"), ("top_k", True, "an integer >= 0"),
    ("top_p", 0.0, "a number in (0, 1]"), ("top_p", 1.5, "a number in (0, 1]"), ("top_p", math.nan, "(0, 1]"),
    ("repetition_penalty", 0.0, "a finite number > 0"), ("repetition_penalty", math.inf, "a finite number > 0"),
    ("max_new_tokens", -1, "an integer >= 0"), ("max_new_tokens", 3.0, "an integer >= 0"),
    ("seed", -1, "an integer in [0, 2**64)"), ("seed", 2**64, "an integer in [0, 2**64)"),
    ("stop", "", "a non-empty text"), ("stop", ["end", ""], "a non-empty text"), ("stop", [3], "a non-empty text"),
]


@pytest.mark.parametrize("key, value, rule", BAD)
def test_each_option_out_of_its_range_is_refused_by_its_name(key, value, rule):
    with pytest.raises(InputError, match=f"^{key} must be .*{re.escape(rule)}"):
        check_generation(**{key: value})
    flag = "--" + key.replace("_", "-")
    with pytest.raises(InputError, match=f"^{flag} must be"):
        check_generation(names=lambda k: "--" + k.replace("_", "-"), **{key: value})


def test_the_edges_of_each_range_are_accepted():
    options = check_generation(temperature=0, top_k=0, top_p=1.0, repetition_penalty=1e-3, max_new_tokens=0,
                               seed=2**64 - 1, stop="\n")
    assert options["stop"] == ["\n"] and options["top_k"] == 0


def test_an_unknown_option_is_named():
    with pytest.raises(InputError, match="generation option must be one of .*; got 'beams'"):
        check_generation(beams=4)


@pytest.mark.parametrize("args, flag", [
    (["--temperature", "nan"], "--temperature"), (["--top-k", "-1"], "--top-k"), (["--top-p", "0"], "--top-p"),
    (["--repetition-penalty", "-2"], "--repetition-penalty"), (["--stop="], "--stop"),
    (["--max-new-tokens", "-5"], "--max-new-tokens"),
])
def test_the_command_line_refuses_an_option_by_its_flag_before_reading_the_run(capsys, tmp_path, args, flag):
    code = main(["generate", str(tmp_path / "no-such-run"), "hello", *args])  # the run is not even read
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"error: {flag} must be" in err and "bug in attnlab" not in err


@pytest.mark.parametrize("override, key", [
    ("generate.temperature=nan", "generate.temperature"), ("generate.top_k=-1", "generate.top_k"),
    ("generate.top_p=0", "generate.top_p"), ("generate.repetition_penalty=0", "generate.repetition_penalty"),
    ("generate.stop=['']", "generate.stop"),
])
def test_a_recipe_refuses_an_option_by_its_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_recipe("lm-shakespeare-char", [override])


def test_python_generation_refuses_an_option_by_its_argument_name():
    model = create_model("gpt_tiny", depth=1, embed_dim=32, num_heads=2).eval()
    ids = torch.randint(0, 256, (1, 3))
    with pytest.raises(InputError, match="^temperature must be a finite number"):
        model.generate(ids, 4, temperature=float("nan"))
    with pytest.raises(InputError, match="^top_p must be a number in"):
        next(model.stream(ids, 4, top_p=0.0))


def test_a_max_new_tokens_whose_cache_cannot_fit_is_refused_with_the_limit(monkeypatch):
    import attnlab.models.gpt as gpt

    model = create_model("gpt_tiny", depth=2, embed_dim=32, num_heads=4, num_kv_heads=2, pos_embed="rope").eval()
    per_position = 2 * 2 * 2 * 8 * 4  # keys and values, 2 layers, 2 key/value heads of 8, float32: 256 bytes
    monkeypatch.setattr(gpt, "available_memory", lambda: 1000 * per_position)
    ids = torch.randint(0, 256, (1, 10))
    with pytest.raises(InputError, match=r"max_new_tokens must be at most 990 for a batch of 1 prompt\(s\) of 10 "
                                         r"tokens: the key/value cache takes 256 bytes a position and this machine has 250.0 KiB available"):
        model.generate(ids, 991)
    assert model.generate(ids, 5).shape == (1, 15)  # within the limit


def test_a_huge_max_new_tokens_is_refused_without_allocating():
    model = create_model("gpt_tiny", depth=1, embed_dim=32, num_heads=2, pos_embed="rope").eval()
    with pytest.raises(InputError, match="max_new_tokens must be at most"):
        model.generate(torch.randint(0, 256, (1, 3)), 10**12)


def test_a_cache_grows_with_the_generation_instead_of_holding_all_of_its_capacity():
    cache = DecodingCache(capacity=10**7)
    k = torch.randn(1, 2, 5, 8)
    cache.update(k, k)
    held = cache.nbytes()
    assert held == 2 * 2 * (5 + DecodingCache.grow_room) * 8 * 4  # the prompt and room to grow, not 10^7 positions
    keys = [k]
    for _ in range(DecodingCache.grow_room + 1):  # past the room: the buffers double, the keys stay
        step = torch.randn(1, 2, 1, 8)
        out, _, start = cache.update(step, step)
        keys.append(step)
    assert cache.nbytes() == 2 * held and start == 0
    assert torch.equal(out, torch.cat(keys, dim=2))
    with pytest.raises(InputError, match="the cache holds 10 positions"):
        small = DecodingCache(capacity=10)
        small.update(torch.randn(1, 1, 11, 4), torch.randn(1, 1, 11, 4))


def test_the_repetition_penalty_equals_transformers_processor():
    from transformers import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    logits, ids = torch.randn(3, 50), torch.randint(0, 50, (3, 12))
    seen = torch.zeros(3, 50, dtype=torch.bool).scatter_(1, ids, True)
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(ids, logits.clone())
    torch.testing.assert_close(penalize_repeats(logits, seen, 1.3), theirs)


def test_a_repetition_penalty_changes_greedy_decoding_and_1_leaves_it_alone():
    model = create_model("gpt_tiny", depth=1, embed_dim=32, num_heads=2, vocab_size=16).eval()
    ids = torch.randint(0, 16, (2, 4))
    plain = model.generate(ids, 12)
    assert torch.equal(model.generate(ids, 12, repetition_penalty=1.0), plain)
    penalized = model.generate(ids, 12, repetition_penalty=100.0)
    assert not torch.equal(penalized, plain)
    # a padded row is penalized for its own tokens only, as it is alone
    pad = torch.tensor([[True, False, False, False]])
    row = torch.tensor([[0, 5, 6, 7]])
    alone = model.generate(row[:, 1:], 6, repetition_penalty=5.0)
    torch.testing.assert_close(model.generate(row, 6, repetition_penalty=5.0, padding_mask=pad)[:, 1:], alone)
