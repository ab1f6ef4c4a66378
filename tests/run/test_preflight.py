"""No work lost to a late check: what a run needs after training (its sample prompts, its
tokenizer, its test evaluation, its task's scoring) is checked before its first step.

The rule these tests enforce: a run that fails after its first training step for a reason
known at its start is a defect. Each hostile case below must fail with one line (exit 2)
before the trainer has taken a step: no step checkpoint, no training record."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.errors import InputError
from attnlab.recipes import load_recipe
from attnlab.tasks import get_task
from attnlab.run.recipe import Recipe
from attnlab.run.task import register_task
from attnlab.tasks.reverse import Reverse
from attnlab.run.skeleton import PREFLIGHT_SAMPLES, _Head, preflight, train

TINY_LM = ["model.options.depth=1", "model.options.embed_dim=32", "model.options.num_heads=2",
           "model.options.mlp_hidden_dim=64", "text.context=32", "train.steps=2", "train.warmup_steps=0",
           "train.batch_size=4", "train.log_every=1", "train.eval_every=0", "train.progress=false",
           "train.tensorboard=false", "generate.max_new_tokens=4"]


@pytest.fixture(scope="module")
def one_line_text(tmp_path_factory) -> Path:
    """A text of one's own without a newline (the lm-text recipe's default prompt is ``"\\n"``)."""
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog and a cat sat on the mat".split()
    path = tmp_path_factory.mktemp("text") / "one.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(3000)))
    return path


@pytest.fixture(scope="module")
def foreign_tokenizer(tmp_path_factory) -> Path:
    """Another model's tokenizer.json: a WordPiece vocabulary of four words, [UNK] for the rest."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "[SEP]": 1, "hello": 2, "world": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _trained_steps(run_dir: Path) -> int:
    """Steps the trainer recorded in ``run_dir``: its step checkpoints and its training log."""
    ckpts = list((run_dir / "checkpoints").glob("step_*")) if (run_dir / "checkpoints").is_dir() else []
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    return len(ckpts) + sum("loss" in r for r in records)


def _refused_before_training(capsys, run_dir: Path, *args: str) -> str:
    code = main(["train", *args, *TINY_LM, "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "bug in attnlab" not in err
    assert _trained_steps(run_dir) == 0
    return err


def test_a_prompt_outside_a_char_vocabulary_is_refused_before_training_and_shown_visibly(capsys, tmp_path,
                                                                                        one_line_text):
    err = _refused_before_training(capsys, tmp_path / "run", "lm-text", f"data.path={one_line_text}",
                                   "text.tokenizer=char")
    assert "generate.prompts[0] '\\n'" in err  # the newline shown, not an empty ''
    assert "U+000A" in err


def test_a_tokenizer_made_for_other_text_is_refused_with_its_unknown_share_and_the_key_to_accept_it(
        capsys, tmp_path, one_line_text, foreign_tokenizer):
    err = _refused_before_training(capsys, tmp_path / "run", "lm-text", f"data.path={one_line_text}",
                                   f"text.tokenizer_file={foreign_tokenizer}")
    assert f"text.tokenizer_file={foreign_tokenizer}" in err
    assert "100.00% of the training text's" in err and "text.max_unknown=0.01" in err


def test_a_raised_max_unknown_trains_with_a_warning_in_the_log(capsys, tmp_path, one_line_text, foreign_tokenizer):
    run = tmp_path / "run"
    code = main(["train", "lm-text", f"data.path={one_line_text}", f"text.tokenizer_file={foreign_tokenizer}",
                 "text.max_unknown=1", "generate.prompts=[hello world]", *TINY_LM, "--run-dir", str(run)])
    out = capsys.readouterr().out
    assert code == 0
    assert "warning: the tokenizer maps 100.00% of the training text's tokens to its unknown token" in out
    assert _trained_steps(run) > 0


def test_a_prompt_that_a_foreign_tokenizer_reads_as_nothing_is_refused_before_training(
        capsys, tmp_path, one_line_text, foreign_tokenizer):
    err = _refused_before_training(capsys, tmp_path / "run", "lm-text", f"data.path={one_line_text}",
                                   f"text.tokenizer_file={foreign_tokenizer}", "text.max_unknown=1")
    assert "generate.prompts[0] must give at least one token; '\\n' gives none" in err


def test_a_tokenizer_that_reads_the_text_passes_the_unknown_share_check(tmp_path, one_line_text):
    from attnlab.data.batches.lm import LMDataset
    from attnlab.data.tokenizers.lm import BPETokenizer
    from attnlab.tasks.language_modeling import unknown_share
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set(one_line_text.read_text().split()))
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words[:-1])}}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe = BPETokenizer(tok)
    assert bpe.unk_id == 0
    text = one_line_text.read_text()
    data = LMDataset([text], bpe, 16)
    missing = text.split().count(words[-1])  # the one word the vocabulary lacks
    assert unknown_share(data, bpe) == pytest.approx(missing / data.num_tokens)


# ----------------------------------------------------------------------------- the preflight itself


def _reverse_recipe(**train) -> Recipe:
    recipe = load_recipe("demo-reverse", ["train.steps=2", "train.progress=false", "train.tensorboard=false",
                                          "train.log_every=1", *[f"train.{k}={v}" for k, v in train.items()]])
    return recipe


class _ScoreFails(Reverse):
    """The reversal demo, whose scoring (run after training) needs something the run lacks."""

    name = "test_preflight_score_fails"

    def score(self, recipe, run_dir, model, prepared, data, log):
        raise InputError("generate.num_beams needs something this run lacks")


register_task(_ScoreFails)


def test_a_task_whose_scoring_would_fail_fails_before_its_first_step(tmp_path):
    recipe = _reverse_recipe()
    recipe.task = _ScoreFails.name
    with pytest.raises(InputError, match=r"would fail after training \(checked before its first step, on "
                                         rf"{PREFLIGHT_SAMPLES} test examples\): generate.num_beams"):
        train(recipe, tmp_path / "run", log=lambda _: None)
    assert _trained_steps(tmp_path / "run") == 0


def test_the_preflight_leaves_the_random_state_and_the_model_mode_as_they_were(tmp_path):
    recipe = _reverse_recipe()
    task = get_task(recipe.task)
    (tmp_path / "run").mkdir()
    data = task.read_data(recipe, lambda _: None)
    prepared = task.prepare(recipe, tmp_path / "run", data, lambda _: None)
    model = task.build_model(recipe, prepared.info).train()
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    seconds = preflight(task, recipe, tmp_path / "run", model, prepared, data, device=torch.device("cpu"),
                        precision="fp32", log=lambda _: None)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert model.training and all(m.training for m in model.modules())
    assert seconds >= 0
    assert not any(k.startswith("_fused_") for m in model.modules() for k in m.__dict__)


def test_a_head_of_a_data_set_reads_its_first_items_as_the_data_set_does():
    class Batched:
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return i

        def get_batch(self, idx):
            return list(idx), None

        extra = "kept"

    head = _Head(Batched(), 3)
    assert len(head) == 3 and [head[i] for i in range(3)] == [0, 1, 2]
    assert head.get_batch([0, 2]) == ([0, 2], None) and head.extra == "kept"
    with pytest.raises(IndexError):
        head[3]
    assert not hasattr(_Head([1, 2, 3], 2), "get_batch")  # a plain list is read item by item


def test_an_empty_data_set_is_refused_by_evaluation_instead_of_dividing_by_zero():
    from attnlab.engine.trainer import evaluate_model
    from attnlab.models import create_model

    model = create_model("vit_digits_patch2", depth=1, embed_dim=32, num_heads=2)
    with pytest.raises(InputError, match="data must hold at least one example to evaluate; it holds none"):
        evaluate_model(model, [], device="cpu")


def test_a_source_whose_validation_part_is_empty_trains_without_validation(tmp_path):
    recipe = _reverse_recipe(eval_every=1)
    task = get_task(recipe.task)
    original = task.prepare

    def empty_validation(*args, **kwargs):
        prepared = original(*args, **kwargs)
        prepared.val = _Head(prepared.test, 0)  # a part of no example, as a source with val_size=0 may give
        return prepared

    task.prepare = empty_validation
    try:
        results = train(recipe, tmp_path / "run", log=lambda _: None)
    finally:
        del task.prepare
    assert results["steps"] == 2 and results["test_checkpoint"] == "last"


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

    import attnlab.run.skeleton as runs
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
