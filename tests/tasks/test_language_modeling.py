"""The language-modelling task: a decoder-only model trained on text (one's own here,
Tiny Shakespeare in the recipe), its loss in nats per token, perplexity and bits per
character, evaluation that reproduces them, generation and causal attention maps."""

import json
import math

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.errors import InputError
from attnlab.recipes import load_recipe
from attnlab.tasks import get_task

TINY = ["model.options.depth=1", "model.options.embed_dim=32", "model.options.num_heads=2",
        "model.options.mlp_hidden_dim=64", "text.context=32", "train.steps=20", "train.batch_size=8",
        "train.warmup_steps=2", "train.eval_every=10", "train.checkpoint_every=10", "train.log_every=0",
        "train.progress=false", "train.tensorboard=false", "train.precision=fp32", "generate.max_new_tokens=20",
        "text.tokenizer=char"]
TEXT = "".join(f"the {w} sat on the mat and looked at the {v}.\n" for w in ("cat", "dog", "owl", "fox") * 40
               for v in ("moon", "sun"))


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    (tmp / "story.txt").write_text(TEXT, encoding="utf-8")
    run_dir = tmp / "run"
    assert main(["train", "lm-text", f"data.path={tmp / 'story.txt'}", *TINY, "--run-dir", str(run_dir)]) == 0
    return run_dir


def test_a_run_reports_loss_perplexity_and_bits_per_character(lm_run):
    results = json.loads((lm_run / "results.json").read_text())
    assert results["test_perplexity"] == pytest.approx(math.exp(results["test_loss"]))
    chars, tokens = results["test_chars"], results["test_tokens"]
    assert chars == tokens  # characters: one token each
    # one label per token but the first: bits/char = loss * (tokens - 1) / chars / ln 2
    assert results["test_bits_per_char"] == pytest.approx(results["test_loss"] * (tokens - 1) / chars / math.log(2))
    assert {"val_loss", "val_bits_per_char", "samples"} <= set(results) and (lm_run / "samples.txt").is_file()
    assert results["test_loss"] < math.log(results["vocab_size"])  # it learnt something in 20 steps


def test_eval_reproduces_the_test_figures(lm_run):
    results = json.loads((lm_run / "results.json").read_text())
    again = attnlab.load_run(lm_run).evaluate()
    assert again["test_loss"] == results["test_loss"] and again["test_bits_per_char"] == results["test_bits_per_char"]


def test_eval_on_text_of_ones_own(lm_run, tmp_path, capsys):
    run = attnlab.load_run(lm_run)
    results = json.loads((lm_run / "results.json").read_text())
    test_part = TEXT[len(TEXT) - round(0.05 * len(TEXT)):]  # lm-text's test part: the last 5% of one document
    (tmp_path / "test.txt").write_text(test_part, encoding="utf-8")
    assert run.evaluate(data=tmp_path / "test.txt")["test_loss"] == results["test_loss"]
    docs = ["the cat sat on the mat.\n", "the owl looked at the sun.\n"]
    (tmp_path / "folder").mkdir()
    for i, doc in enumerate(docs):
        (tmp_path / "folder" / f"{i}.txt").write_text(doc, encoding="utf-8")
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    from_folder = run.evaluate(data=tmp_path / "folder")
    assert from_folder == run.evaluate(data=tmp_path / "docs.jsonl")
    assert from_folder["test_samples"] > 0 and from_folder != run.evaluate()
    assert main(["eval", str(lm_run), "--data", str(tmp_path / "docs.jsonl")]) == 0
    assert f"data: {tmp_path / 'docs.jsonl'}" in capsys.readouterr().out
    (tmp_path / "latin1.txt").write_bytes("the caf\xe9".encode("latin-1"))
    (tmp_path / "unknown.txt").write_text("the cat sat in Zürich", encoding="utf-8")
    for bad, message in (("latin1.txt", "is not valid utf-8: byte 0xe9"), ("unknown.txt", "outside this char tokenizer"),
                         ("missing.txt", "does not exist")):
        assert main(["eval", str(lm_run), "--data", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_predict_continues_prompts_reproducibly_and_greedily_at_temperature_0(lm_run):
    run = attnlab.load_run(lm_run)
    a = run.predict(["the cat "], max_new_tokens=15, temperature=1.0, top_k=5, seed=3)
    assert a == run.predict(["the cat "], max_new_tokens=15, temperature=1.0, top_k=5, seed=3)
    [greedy] = run.predict(["the cat "], max_new_tokens=15, temperature=0.0)
    tokenizer = attnlab.data.load_tokenizer(lm_run / "tokenizer.json")
    ids = torch.tensor([tokenizer.encode("the cat ")])
    for _ in range(15):
        ids = torch.cat([ids, run.model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    assert greedy.output == tokenizer.decode(ids[0, 8:].tolist()).split("<eos>")[0]
    with pytest.raises(InputError, match=r"prompt 'ÿ': text holds 1 character outside this char tokenizer"):
        run.predict(["ÿ"])


def test_the_attention_maps_are_causal(lm_run):
    run = attnlab.load_run(lm_run)
    [view] = run.task.attention_views(run, ["the dog sat"])
    assert view.tokens == list("the dog sat")
    name, weights = view.layers[0]
    assert torch.all(torch.triu(weights.mean(0) if weights.dim() == 3 else weights, diagonal=1) == 0)


def test_the_shakespeare_recipe_is_checked_before_anything_runs():
    recipe = load_recipe("lm-shakespeare-char")
    assert (recipe.task, recipe.data.name, recipe.text.tokenizer, recipe.model.name) == \
        ("language_modeling", "tinyshakespeare", "char", "gpt_tiny")
    with pytest.raises(InputError, match="data.path applies to data.name=text"):
        load_recipe("lm-shakespeare-char", ["data.path=x.txt"])
    with pytest.raises(InputError, match="generate.prompts must be a list of non-empty texts"):
        load_recipe("lm-shakespeare-char", ["generate.prompts=[]"])


def test_generate_streams_what_predict_gives(lm_run, capsys):
    run = attnlab.load_run(lm_run)
    [expected] = run.generate(["the owl "], max_new_tokens=25, temperature=0.9, top_k=10, seed=5)
    assert "".join(run.task.stream(run, "the owl ", max_new_tokens=25, temperature=0.9, top_k=10, seed=5)) == expected
    assert main(["generate", str(lm_run), "the owl ", "--max-new-tokens", "25", "--temperature", "0.9", "--top-k",
                 "10", "--seed", "5"]) == 0
    assert capsys.readouterr().out == "the owl " + expected + "\n"
    assert main(["generate", str(lm_run), "the owl ", "--top-p", "1.5"]) == 2
    assert "--top-p must be a number in (0, 1]; got 1.5" in capsys.readouterr().err


def test_prompts_of_different_lengths_in_one_batch_continue_as_they_would_alone(lm_run):
    run = attnlab.load_run(lm_run)
    prompts = ["the cat ", "t", "the dog sat on the "]
    together = run.predict(prompts, max_new_tokens=12, temperature=0.0)  # one left-padded batch
    assert [p.input for p in together] == prompts
    assert [p.output for p in together] == [run.predict([p], max_new_tokens=12, temperature=0.0)[0].output
                                            for p in prompts]
    assert [p.output for p in run.predict(prompts, max_new_tokens=12, temperature=0.0, batch_size=2)] == \
        [p.output for p in together]
    with pytest.raises(InputError, match="batch_size must be a positive integer; got 0"):
        run.predict(prompts, batch_size=0)


def test_a_stop_string_ends_the_continuation_and_is_left_out(lm_run, capsys):
    run = attnlab.load_run(lm_run)
    [free] = run.generate(["the cat "], max_new_tokens=20, temperature=0.0)
    stop = free[3:5]  # two characters the greedy continuation reaches
    cut = free[: free.find(stop)]
    assert run.generate(["the cat "], max_new_tokens=20, temperature=0.0, stop=stop) == [cut]
    assert run.generate(["the cat "], max_new_tokens=20, temperature=0.0, stop=["never there", stop]) == [cut]
    # streamed, the text that could begin the stop string waits: no piece of it is ever shown
    pieces = list(run.task.stream(run, "the cat ", max_new_tokens=20, temperature=0.0, stop=stop))
    assert "".join(pieces) == cut
    assert main(["generate", str(lm_run), "the cat ", "--max-new-tokens", "20", "--temperature", "0",
                 "--stop", stop]) == 0
    assert capsys.readouterr().out == "the cat " + cut + "\n"
    with pytest.raises(InputError, match="^stop must be a non-empty text or a list of non-empty texts"):
        run.generate(["the cat "], stop=[""])
    with pytest.raises(InputError, match="generate.stop must be a non-empty text or a list of non-empty texts"):
        load_recipe("lm-text", ["data.path=x.txt", "generate.stop=[1]"])


def test_held_back_text_is_the_longest_end_that_begins_a_stop_string():
    from attnlab.generation.processors import cut_at_stop, held_back

    assert held_back("and the en", ["the end"]) == 6 and held_back("and then", ["xyz"]) == 0
    assert held_back("ab", ["abc", "b!"]) == 2 and held_back("", ["ab"]) == 0
    assert cut_at_stop("one. two. three", [". t", "e"]) == ("on", True)
    assert cut_at_stop("one", ["x"]) == ("one", False)


def test_lora_on_a_language_model_trains_the_adapters_alone_and_generates(lm_run, tmp_path, capsys):
    """model.lora on a language model: its output layer (the embedding's own weights) stays
    frozen; the checkpoint holds the adapters alone, and generation (cached decoding, which
    joins the projections' weights) uses them."""
    from safetensors.torch import load_file

    (tmp_path / "story.txt").write_text(TEXT, encoding="utf-8")
    run_dir = tmp_path / "lora"
    assert main(["train", "lm-text", f"data.path={tmp_path / 'story.txt'}", *TINY, f"model.checkpoint={lm_run}",
                 "model.lora.rank=2", "model.lora.targets=[attention, mlp]", "--run-dir", str(run_dir)]) == 0
    assert "parameters train" in capsys.readouterr().out
    saved = load_file(run_dir / "checkpoints" / "step_000000020" / "model.safetensors")
    assert saved and all(k.endswith(("lora_A", "lora_B")) for k in saved)
    run = attnlab.load_run(run_dir)
    source = attnlab.load_run(lm_run).model.state_dict()
    assert all(torch.equal(v, source[k]) for k, v in run.model.state_dict().items() if k in source)
    assert any(float(v.abs().max()) > 0 for k, v in saved.items() if k.endswith("lora_B"))  # the update is on
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(run.model.generate(ids, 12), run.model.generate(ids, 12, use_cache=False))
    [text] = run.generate(["the cat"], max_new_tokens=8)
    assert isinstance(text, str)


def test_samples_that_cannot_fit_a_model_with_absolute_positions_are_refused_before_training(tmp_path, capsys):
    """Learned positions hold text.context positions: 300 new characters after "ROMEO:" cannot
    fit in 128, which was found only after training (the run ended without results.json)."""
    run = tmp_path / "lm"
    assert main(["train", "lm-shakespeare-char", "model.options.pos_embed=learned", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "generate.max_new_tokens" in err and "text.context=128" in err and "takes 6" in err and "at most 122" in err
    assert "\n" not in err and not run.exists()
    recipe = load_recipe("lm-shakespeare-char", ["model.options.pos_embed=learned", "generate.max_new_tokens=122"])
    get_task("language_modeling").check(recipe)  # fits exactly
    get_task("language_modeling").check(load_recipe("lm-shakespeare-char"))  # rotary positions: no such limit
