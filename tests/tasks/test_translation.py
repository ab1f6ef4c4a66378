"""Translation end to end on a slice of Multi30k: data set, length-grouped batches,
token-level loss and accuracy, checkpoint averaging, BLEU, and the train / eval /
translate commands with their bad inputs."""

import gzip
import io
import json
import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models

from attnlab.cli import main
from attnlab.data.readers.multi30k import load_multi30k
from attnlab.data.tokenizers.text import TextTokenizer
from attnlab.data.batches.translation import TranslationDataset
from attnlab.engine.checkpoint import average_checkpoints, save_checkpoint
from attnlab.engine.trainer import EpochSampler, TrainConfig, Trainer
from attnlab.recipes import load_recipe
from attnlab.tasks import load_run
from attnlab.tasks import translation

DATA = os.environ.get("ATTNLAB_DATA_DIR")
pytestmark = pytest.mark.filterwarnings("ignore:.*were truncated")  # the tiny runs cut texts at 32 tokens on purpose
needs_data = pytest.mark.skipif(not DATA or not (Path(DATA) / "multi30k").is_dir(),
                                reason="Multi30k absent: set ATTNLAB_DATA_DIR to a folder holding multi30k/ (make test does)")

TINY = ["model.name=transformer_tiny", "model.options={}", "text.vocab_size=800", "text.max_length=32",
        "train.batch_size=16", "train.steps=24", "train.warmup_steps=2", "train.log_every=0", "train.progress=false",
        "train.tensorboard=false", "train.eval_every=12", "train.checkpoint_every=6", "train.keep_checkpoints=3",
        "translate.average_checkpoints=3", "translate.num_beams=2"]


@pytest.fixture(scope="module")
def mini_data(tmp_path_factory):
    """The first 400 / 30 / 30 pairs of Multi30k, in the data directory layout."""
    if not DATA or not (Path(DATA) / "multi30k").is_dir():
        pytest.skip("Multi30k absent: set ATTNLAB_DATA_DIR to a folder holding multi30k/ (make test does)")
    root = tmp_path_factory.mktemp("data")
    (root / "multi30k").mkdir()
    for split, prefix, n in (("train", "train", 400), ("val", "val", 30), ("test", "test_2016_flickr", 30)):
        pairs = load_multi30k(split, DATA)[:n]
        for lang, side in (("de", 0), ("en", 1)):
            with gzip.open(root / "multi30k" / f"{prefix}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(p[side] + "\n" for p in pairs))
    return root


@pytest.fixture(scope="module")
def tokenizer():
    texts = ["Ein Mann fährt Fahrrad.", "A man rides a bike.", "Zwei Hunde spielen im Schnee.", "Two dogs play."] * 5
    return TextTokenizer.train(texts, "bpe", 300, min_frequency=1)


# ----------------------------------------------------------------------------- data


def test_dataset_batches_shift_targets_and_pad_labels(tokenizer):
    pairs = [("Ein Mann fährt Fahrrad.", "A man rides a bike."), ("Hunde.", "Dogs play in the snow.")]
    ds = TranslationDataset(pairs, tokenizer, tokenizer, 64, 64)
    x, y = ds.get_batch([0, 1])
    src, tgt = x["src"], x["tgt"]
    assert src.shape[0] == tgt.shape[0] == y.shape[0] == 2 and tgt.shape == y.shape
    assert torch.all(tgt[:, 0] == tokenizer.bos_id)
    for i, (s, t) in enumerate(pairs):
        n_src, n_tgt = len(ds.src_ids[i]), len(ds.tgt_ids[i])
        assert src[i, n_src] == tokenizer.eos_id and torch.all(src[i, n_src + 1 :] == tokenizer.pad_id)
        assert y[i, n_tgt] == tokenizer.eos_id and torch.all(y[i, n_tgt + 1 :] == -100)
        assert torch.equal(y[i, :n_tgt], tgt[i, 1 : n_tgt + 1])  # the label is the next decoder input
        assert tokenizer.decode(y[i, :n_tgt]) == t and tokenizer.decode(src[i]) == s
    assert ds.lengths.tolist() == [max(len(a), len(b)) + 1 for a, b in zip(ds.src_ids, ds.tgt_ids)]


def test_dataset_truncates_with_a_warning_and_checks_its_tokenizers(tokenizer):
    with pytest.warns(UserWarning, match="1 of 2 source texts are longer than 4 tokens"):
        ds = TranslationDataset([("Ein Mann fährt Fahrrad sehr schnell.", "A man."), ("Ja", "Yes")],
                                tokenizer, tokenizer, 5, 64)
    assert ds.get_batch([0])[0]["src"].shape[1] == 5
    bare = TextTokenizer(Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1}, unk_token="[UNK]")))
    with pytest.raises(ValueError, match=r"tgt_tokenizer must have \[BOS\], \[EOS\] tokens"):
        TranslationDataset([("a", "b")], tokenizer, bare)
    with pytest.raises(ValueError, match="pairs must hold at least one"):
        TranslationDataset([], tokenizer, tokenizer)
    with pytest.raises(ValueError, match="max_source_length must be an integer >= 2"):
        TranslationDataset([("a", "b")], tokenizer, tokenizer, 1)


def test_length_grouped_batches_cover_the_epoch_with_less_padding():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 60, (5000,), generator=gen)
    grouped = EpochSampler(5000, 32, seed=1, lengths=lengths, window=20)
    plain = EpochSampler(5000, 32, seed=1)
    for sampler in (grouped, plain):
        seen = [i for b in sampler.batches(0) for i in b]
        assert len(seen) == len(set(seen)) == len(sampler) * 32
    assert list(grouped.batches(3)) == list(grouped.batches(3))  # a pure function of (seed, epoch)
    assert list(grouped.batches(3, start=5)) == list(grouped.batches(3))[5:]
    assert list(grouped.batches(0)) != list(grouped.batches(1))
    padded = lambda s: sum(len(b) * int(lengths[b].max()) for b in s.batches(0))  # noqa: E731
    assert padded(grouped) < 0.6 * padded(plain)
    # ranks of a data-parallel run split each global batch between them
    r0, r1 = (EpochSampler(5000, 16, seed=1, rank=r, world=2, lengths=lengths, window=20) for r in (0, 1))
    for a, b, whole in zip(r0.batches(0), r1.batches(0), grouped.batches(0)):
        assert sorted(a + b) == sorted(whole)


def test_trainer_loss_and_accuracy_count_real_tokens_only():
    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.logits = torch.nn.Parameter(torch.randn(4, 3, 5))

        def forward(self, x):
            return self.logits[x]

    class Data:
        labels = torch.tensor([[1, 2, -100], [0, -100, -100], [4, 4, 4], [3, 1, -100]])

        def __len__(self):
            return 4

        def get_batch(self, idx):
            return torch.tensor(idx), self.labels[idx]

    torch.manual_seed(0)
    model, data = Fixed(), Data()
    trainer = Trainer(model, data, TrainConfig(steps=1, batch_size=4, label_smoothing=0.1, progress=False,
                                               tensorboard=False, device="cpu"), log=lambda *_: None)
    out, y = model(torch.arange(4)), data.labels
    real = y != -100
    expected = F.cross_entropy(out[real], y[real], label_smoothing=0.1)
    torch.testing.assert_close(trainer.loss_fn(out, y), expected)
    res = trainer.evaluate(data)
    torch.testing.assert_close(res["loss"], F.cross_entropy(out[real], y[real]).item())
    assert res["accuracy"] == pytest.approx((out.argmax(-1)[real] == y[real]).float().mean().item())


def test_average_checkpoints(tmp_path):
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    one = save_checkpoint(tmp_path, 1, a, {}, keep=3)
    two = save_checkpoint(tmp_path, 2, b, {}, keep=3)
    avg = average_checkpoints([one, two])
    assert torch.equal(avg["w"], torch.tensor([2.0, 4.0])) and int(avg["n"]) == 5
    three = save_checkpoint(tmp_path, 3, {"other": torch.zeros(1)}, {}, keep=3)
    with pytest.raises(ValueError, match="holds other weights"):
        average_checkpoints([one, three])


def test_bleu_scores():
    refs = ["A man rides a bike.", "Two dogs play in the snow."]
    assert translation.bleu_scores(refs, refs)["bleu"] == pytest.approx(100.0)
    lower = translation.bleu_scores([r.lower() for r in refs], refs)
    assert lower["bleu"] < 90 and lower["bleu_lowercase"] == pytest.approx(100.0)
    assert "case:lc" in lower["bleu_lowercase_signature"] and "case:mixed" in lower["bleu_signature"]
    with pytest.raises(ValueError, match="must pair up"):
        translation.bleu_scores(refs[:1], refs)


def test_recipe_validation():
    assert load_recipe("translate-multi30k").task == "translation"
    with pytest.raises(ValueError, match="data.source and data.target must differ"):
        load_recipe("translate-multi30k", ["data.target=de"])
    with pytest.raises(ValueError, match="translate.average_checkpoints must not exceed train.keep_checkpoints"):
        load_recipe("translate-multi30k", ["translate.average_checkpoints=9", "train.keep_checkpoints=2"])
    with pytest.raises(ValueError, match="data.name must be one of 'multi30k'"):
        load_recipe("translate-multi30k", ["data.name=mr"])


# ----------------------------------------------------------------------------- a run


@pytest.fixture(scope="module")
def tiny_run(mini_data, tmp_path_factory):
    run = tmp_path_factory.mktemp("tr") / "run"
    # options after the recipe and before the overrides: the command line takes any order
    assert main(["train", "translate-multi30k", "--run-dir", str(run), *TINY, f"data.data_dir={mini_data}"]) == 0
    return run


def test_run_directory(tiny_run):
    results = json.loads((tiny_run / "results.json").read_text())
    assert (results["train_size"], results["dev_size"], results["test_size"]) == (400, 30, 30)
    assert results["steps"] == 24 and not results["joint_vocab"]
    assert 0 <= results["bleu"] <= 100 and 0 <= results["bleu_lowercase"] <= 100
    assert results["test_checkpoint"] == "averaged" and results["num_beams"] == 2
    assert (tiny_run / "tokenizer.src.json").is_file() and (tiny_run / "tokenizer.tgt.json").is_file()
    lines = (tiny_run / "translations.test.txt").read_text().split("\n")
    assert len(lines) == 31 and lines[-1] == ""
    state = json.loads((tiny_run / "checkpoints" / "averaged" / "manifest.json").read_text())
    assert state["step"] == 24


def test_eval_reproduces_results_json_exactly(tiny_run, capsys):
    results = json.loads((tiny_run / "results.json").read_text())
    run = load_run(tiny_run)
    assert run.checkpoint.name == "averaged"  # the weights results.json names: BLEU and token accuracy alike
    res = run.evaluate(batch_size=7)  # other decoding batches: the same translations
    for key in ("bleu", "bleu_lowercase", "test_accuracy", "test_loss"):
        assert res[key] == results[key], key
    assert main(["eval", str(tiny_run)]) == 0
    assert f"| test BLEU (sacreBLEU, cased) | {results['bleu']:.2f} |" in capsys.readouterr().out


def test_lora_from_a_run_averages_its_adapters_over_the_same_base(tiny_run, mini_data, tmp_path):
    """LoRA on the Transformer: the averaged checkpoint holds averaged adapters and names the
    same base weights as the step checkpoints it averages; evaluation reproduces the run's."""
    from attnlab.engine.checkpoint import checkpoint_base

    run_dir = tmp_path / "lora"
    assert main(["train", "translate-multi30k", "--run-dir", str(run_dir), *TINY, f"data.data_dir={mini_data}",
                 f"model.checkpoint={tiny_run}", "model.lora.rank=2", "train.steps=12"]) == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["test_checkpoint"] == "averaged" and results["trainable_params"] < results["params"] // 10
    averaged = run_dir / "checkpoints" / "averaged"
    assert checkpoint_base(averaged) == checkpoint_base(run_dir / "checkpoints" / "step_000000012")
    assert checkpoint_base(averaged)["source"] == str(tiny_run.resolve())
    res = load_run(run_dir).evaluate()
    assert (res["bleu"], res["test_accuracy"]) == (results["bleu"], results["test_accuracy"])


def test_the_recurrent_baseline_trains_translates_and_draws_its_alignments(mini_data, tmp_path):
    """The GRU recipe, at gru_attention_tiny: the same task, data, beam search, BLEU and pictures."""
    run_dir = tmp_path / "gru"
    assert main(["train", "translate-multi30k-gru", "--run-dir", str(run_dir), *TINY, f"data.data_dir={mini_data}",
                 "model.name=gru_attention_tiny", "model.options={score: multiplicative}", "train.steps=12"]) == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["model"] == "gru_attention_tiny" and 0 <= results["bleu"] <= 100
    run = load_run(run_dir)
    assert run.model.config.score == "multiplicative"
    assert run.evaluate()["bleu"] == results["bleu"]
    [view] = run.task.attention_views(run, ["ein hund rennt ."])
    [layer] = view.layers  # the decoder's one attention: one row per target token
    assert layer.shape[-2:] == (len(view.target_tokens), len(view.source_tokens))


def test_translate_command(tiny_run, capsys, monkeypatch):
    assert main(["translate", str(tiny_run), "Ein Mann fährt Fahrrad.", "", "   ", "Zwei ☃ Hunde ♞."]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 5 and lines[1] == lines[2] == "" and lines[0] and lines[3]
    # thousands of lines from standard input, in batches; blank lines stay blank
    text = "\n".join(["Ein Hund läuft.", ""] * 1100) + "\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["translate", str(tiny_run), "--beam-size", "1", "--max-length", "3", "--batch-size", "128"]) == 0
    out = capsys.readouterr().out.split("\n")[:-1]
    assert len(out) == 2200 and all(o == "" for o in out[1::2]) and len(set(out[0::2])) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # the module's marker hides truncation; here it is what is checked
        assert main(["translate", str(tiny_run), "Hund " * 100, "--max-length", "4"]) == 0
    err = capsys.readouterr().err.splitlines()  # one line each, without Python's source line
    assert [e for e in err if "truncated" in e] == [e for e in err if e.startswith(
        "attnlab translate: warning: 1 of 1 texts are longer than 31 tokens and were truncated")] != []


def test_translate_reports_a_line_that_is_not_utf8_and_translates_the_others(tiny_run, capsys, monkeypatch):
    stdin = io.TextIOWrapper(io.BytesIO("Ein Hund.\n".encode() + b"caf\xe9 latin-1\n" + "Zwei Hunde.\n".encode()))
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["translate", str(tiny_run), "--beam-size", "1", "--max-length", "3"]) == 2
    out, err = capsys.readouterr()
    lines = out.split("\n")[:-1]
    assert len(lines) == 3 and lines[0] and lines[1] == "" and lines[2]  # aligned: the bad line gives an empty one
    assert err.strip() == "attnlab: error: line 2 of standard input is not valid UTF-8 (at position 3); it was skipped"
    bad_argument = b"caf\xe9".decode("utf-8", "surrogateescape")  # what Python makes of such bytes in argv
    assert main(["translate", str(tiny_run), "Ein Hund.", bad_argument, "--beam-size", "1"]) == 2
    out, err = capsys.readouterr()
    assert len(out.split("\n")[:-1]) == 2 and "argument 2 is not valid UTF-8" in err and "Traceback" not in err


def test_translate_bad_input(tiny_run, tmp_path, capsys, monkeypatch):
    assert main(["translate", str(tiny_run), "x", "--beam-size", "0"]) == 2
    assert "expected a positive integer, got 0" in capsys.readouterr().err
    assert main(["translate", str(tmp_path), "x"]) == 2
    assert "run_dir must be an attnlab run directory" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["translate", str(tiny_run)]) == 2
    assert "give texts to translate" in capsys.readouterr().err
    with pytest.raises(ValueError, match="num_beams must be a positive integer"):
        load_run(tiny_run).predict(["x"], num_beams=0)
    run = load_run(tiny_run)  # more beams than target tokens: refused before a batch of that size is made
    vocab = run.model.config.tgt_vocab_size
    with pytest.raises(ValueError, match=f"num_beams must be at most the target vocabulary's {vocab:,} tokens"):
        run.predict(["x"], num_beams=10**9)
    assert main(["translate", str(tiny_run), "x", "--beam-size", str(10**9)]) == 2
    assert "num_beams must be at most" in capsys.readouterr().err
    assert main(["predict", str(tiny_run), "Ein Hund."]) == 0  # predict on a translation run: its translations
    assert capsys.readouterr().out.strip()


@needs_data
def test_joint_vocabulary_and_resume(mini_data, tmp_path):
    run = tmp_path / "joint"
    args = ["train", "translate-multi30k", *TINY, "text.joint_vocab=true", "train.steps=12",
            "translate.average_checkpoints=0", f"data.data_dir={mini_data}", "--run-dir", str(run)]
    assert main(args) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["joint_vocab"] and results["test_checkpoint"] == "best" and (run / "tokenizer.json").is_file()
    assert main(args) == 2  # the folder holds a run: refused without --resume
    assert main(args + ["--resume"]) == 0
    assert json.loads((run / "results.json").read_text())["bleu"] == results["bleu"]


def test_a_misencoded_multi30k_file_names_the_file_and_line(tmp_path):
    (tmp_path / "multi30k").mkdir()
    for lang, lines in (("de", b"Ein Hund.\nEin \xfcbler Hund.\n"), ("en", b"A dog.\nA bad dog.\n")):
        with gzip.open(tmp_path / "multi30k" / f"train.{lang}.gz", "wb") as f:
            f.write(lines)
    with pytest.raises(ValueError, match=r"train\.de\.gz.*line 2"):
        load_multi30k("train", tmp_path)


# ---------------------------------------------------------------------------- settings out of range


def test_an_unknown_translate_checkpoint_is_refused_before_training(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "translate-multi30k", "translate.checkpoint=nope", "--run-dir", str(run)]) == 2
    assert "translate.checkpoint must be one of 'auto', 'best', 'last', 'averaged'; got 'nope'" in \
        capsys.readouterr().err
    assert main(["train", "translate-multi30k", "translate.checkpoint=averaged", "translate.average_checkpoints=0",
                 "--run-dir", str(run)]) == 2
    assert "translate.checkpoint=averaged needs translate.average_checkpoints >= 2" in capsys.readouterr().err
    assert not run.exists()


def test_a_translation_setting_out_of_range_is_refused():
    with pytest.raises(ValueError, match="translate.length_penalty must be a finite number; got inf"):
        load_recipe("translate-multi30k", ["translate.length_penalty=inf"])
