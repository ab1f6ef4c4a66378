"""A checkpoint whose embedding is padded past its tokenizer (Qwen's: 151,669 tokens, 151,936
rows) never generates a row the tokenizer lacks: sampled or greedy, through ``run.predict``,
``attnlab generate FOLDER``, the explorer's greedy continuation and a run fine-tuned from the
folder, whose preflight says which ids are never generated instead of failing. The folder
here is a tiny random Qwen2 whose padded rows have output weights large enough that an
unmasked sampler would pick them nearly every time; the special tokens added past the base
vocabulary (``<|im_start|>`` and the like) are tokens, and stay allowed."""

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from attnlab.cli import main
from attnlab.data.tokenizers.lm import HFTokenizer
from attnlab.errors import InputError
from attnlab.models.gpt import GPT
from attnlab.generation.sampling import choose_next
from attnlab.recipes import load_recipe
from attnlab.tasks import get_task, load_run
from attnlab.run.task import Prepared
from attnlab.tasks.language_modeling import generation_attention
from attnlab.tasks.lm_folders import load_folder

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

LINES = ["The quick brown fox jumps over the lazy dog.", "A stitch in time saves nine.",
         "To be or not to be, that is the question.", "All that glitters is not gold."]
CORPUS = "\n".join(LINES * 6)
BASE = 300  # the byte-level BPE's own tokens
ADDED = ["<|im_start|>", "<|im_end|>", "<|extra_0|>"]  # added tokens past it, as Qwen's special tokens are
KNOWN = BASE + len(ADDED)  # the ids the tokenizer decodes
ROWS = 336  # the embedding's rows, padded as a checkpoint pads them (to a multiple of 16)
SETTINGS = [{}, {"top_k": 50}, {"top_p": 0.9}, {"min_p": 0.05}, {"repetition_penalty": 1.3},
            {"top_k": 100, "top_p": 0.95, "min_p": 0.02, "repetition_penalty": 1.2}]


def padded_folder(folder):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([CORPUS], trainers.BpeTrainer(vocab_size=BASE, show_progress=False,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert tok.get_vocab_size() == BASE
    tok.add_special_tokens(ADDED)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))  # no eos token anywhere: no stop id ends a continuation early
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    config = transformers.Qwen2Config(vocab_size=ROWS, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        head = model.lm_head.weight
        head[BASE:KNOWN] *= 20  # the added tokens: likelier than the others, so that a draw shows them allowed
        head[KNOWN:] = torch.randn(ROWS - KNOWN, head.shape[1])  # the padding: logits far above every token's
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return padded_folder(tmp_path_factory.mktemp("qwen_padded"))


@pytest.fixture
def chosen(monkeypatch):
    """Every id :meth:`GPT.stream` yields, whoever calls it (the task, the command)."""
    ids = []
    original = GPT.stream

    def recording(self, *args, **kwargs):
        for token in original(self, *args, **kwargs):
            ids.extend(token.tolist())
            yield token

    monkeypatch.setattr(GPT, "stream", recording)
    return ids


def test_the_folder_pads_its_embedding_and_unmasked_its_padding_wins(folder):
    run = load_folder(folder)
    assert run.tokenizer.vocab_size == KNOWN and run.model.config.vocab_size == ROWS
    assert run.tokenizer.tokenizer.get_vocab_size(with_added_tokens=False) == BASE
    assert [run.tokenizer.tokenizer.token_to_id(t) for t in ADDED] == list(range(BASE, KNOWN))
    assert run.tokenizer.stop_ids == ()
    ids = torch.tensor([run.tokenizer.encode_prompt("The quick brown")])
    probs = run.model(ids)[0].float().softmax(-1)  # (L, V)
    assert bool((probs[:, KNOWN:].sum(-1) > 0.9).all())  # an unmasked draw picks a padded row at every position
    assert bool((probs.argmax(-1) >= KNOWN).all())  # and so does the unmasked arg-max
    with pytest.raises(InputError, match=r"ids must lie in \[0, 303\)"):
        run.tokenizer.decode([int(probs[-1].argmax())])  # what `attnlab generate` printed before


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(s) or "plain")
def test_sampling_1000_tokens_at_temperature_1_picks_only_decodable_ids(folder, chosen, settings):
    run = load_folder(folder)
    out = run.predict(["The quick brown", "A stitch"] * 4, max_new_tokens=125, temperature=1.0, seed=0, **settings)
    assert len(chosen) == 1000
    assert max(chosen) < KNOWN
    assert len({t for t in chosen}) > 50  # a draw over the vocabulary, not one token
    if not settings:
        assert any(BASE <= t < KNOWN for t in chosen)  # the added special tokens are tokens: allowed
    assert all(isinstance(p.output, str) for p in out)
    ids = torch.tensor([run.tokenizer.encode_prompt("The quick brown")] * 8)  # the model's own API, given the size
    new = run.model.generate(ids, 125, temperature=1.0, seed=1, decodable=KNOWN, **settings)[:, ids.shape[1]:]
    assert new.shape == (8, 125) and int(new.max()) < KNOWN
    assert all(isinstance(run.tokenizer.decode(row), str) for row in new)


@pytest.mark.parametrize("flags", [[], ["--top-k", "40", "--top-p", "0.9", "--min-p", "0.05",
                                        "--repetition-penalty", "1.2"]], ids=["plain", "limited"])
def test_generate_command_samples_only_decodable_ids(folder, chosen, capsys, flags):
    assert main(["generate", str(folder), "The quick", "--temperature", "1", "--max-new-tokens", "200", *flags]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("The quick") and len(out) > len("The quick\n")
    assert len(chosen) == 200 and max(chosen) < KNOWN
    assert out == "The quick" + load_folder(folder).tokenizer.decode_after(
        load_folder(folder).tokenizer.encode_prompt("The quick"), chosen) + "\n"


def test_greedy_never_picks_a_padded_row_even_when_its_logit_is_the_largest(folder, chosen):
    logits = torch.zeros(2, ROWS)
    logits[:, ROWS - 1] = 100.0  # padding: the largest
    logits[0, 7], logits[1, KNOWN - 1] = 5.0, 6.0  # the best of the tokens (the second an added one)
    assert choose_next(logits, decodable=KNOWN).tolist() == [7, KNOWN - 1]
    assert choose_next(logits).tolist() == [ROWS - 1] * 2  # without the size: every row is a candidate
    assert set(choose_next(logits, temperature=1.0, decodable=KNOWN, generator=torch.Generator().manual_seed(0),
                           top_k=3).tolist()) <= set(range(KNOWN))

    run = load_folder(folder)
    run.predict(["The quick brown"], max_new_tokens=20, temperature=0)
    assert len(chosen) == 20 and max(chosen) < KNOWN
    ids = torch.tensor([run.tokenizer.encode_prompt("The quick brown")])
    greedy = run.model.generate(ids, 20, decodable=KNOWN)[0, ids.shape[1]:]
    assert greedy.tolist() == chosen  # the task passes the tokenizer's size, as given here


def test_the_explorer_greedy_continuation_and_its_next_tokens_skip_the_padding(folder):
    run = load_folder(folder)
    [view] = run.task.explore_views(run, ["The quick brown"], new_tokens=8)
    assert not any(t.startswith("<id ") for t in view.tokens)
    assert not any(label.startswith("<id ") for row in view.top for label, _ in row)
    prompt = run.tokenizer.encode_prompt("The quick brown")
    plain = generation_attention(run.model, prompt, str, new_tokens=4)  # without the size: the padding wins
    assert all(int(t) >= KNOWN for t in plain.tokens[len(prompt):])


def test_a_decodable_size_past_the_embedding_is_refused_by_name(folder):
    run = load_folder(folder)
    with pytest.raises(InputError, match=r"decodable must be an integer in \[1, 336\]"):
        run.model.generate(torch.tensor([[1, 2]]), 2, decodable=ROWS + 1)


def test_training_from_the_padded_folder_passes_its_preflight_and_says_which_ids(folder, tmp_path, capsys, chosen):
    text = tmp_path / "my.txt"
    text.write_text(CORPUS, encoding="utf-8")
    run_dir = tmp_path / "run"
    assert main(["train", "lm-text", f"model.checkpoint={folder}", f"data.path={text}", "text.context=32",
                 "train.steps=2", "train.batch_size=4", "train.warmup_steps=1", "train.eval_every=2",
                 "train.checkpoint_every=2", "train.log_every=0", "train.progress=false", "train.tensorboard=false",
                 "train.precision=fp32", "generate.max_new_tokens=8", "generate.temperature=0.8",
                 "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    note = [line for line in out.splitlines() if "never generated" in line]
    assert len(note) == 1
    assert f"the model embeds {ROWS} ids, the tokenizer decodes {KNOWN}: ids {KNOWN}-{ROWS - 1} are never " \
           f"generated" in note[0]
    assert "preflight: " in out
    assert chosen and max(chosen) < KNOWN  # the preflight's samples and the run's, at temperature 0.8
    run = load_run(run_dir)  # the run keeps the folder's embedding and masks its padding as the folder did
    assert run.model.config.vocab_size == ROWS and run.tokenizer.vocab_size == KNOWN
    chosen.clear()
    run.predict(["The quick"] * 4, max_new_tokens=50, temperature=1.0)
    assert len(chosen) == 200 and max(chosen) < KNOWN


def test_a_tokenizer_with_more_ids_than_the_model_embeds_is_refused_in_one_line(folder, tmp_path):
    task = get_task("language_modeling")
    recipe = load_recipe("lm-text", [f"model.checkpoint={folder}"])
    small = GPT(vocab_size=KNOWN - 3, max_len=16, embed_dim=16, depth=1, num_heads=2)
    with pytest.raises(InputError) as err:
        task.check_prepared(recipe, tmp_path, small, Prepared(None, None, None, info=HFTokenizer.load(folder)),
                            print)
    message = str(err.value)
    assert "\n" not in message and f"{folder / 'tokenizer.json'} has {KNOWN} tokens" in message
    assert f"{folder / 'config.json'} embeds {KNOWN - 3} ids" in message
    notes = []
    task.check_prepared(recipe, tmp_path, GPT(vocab_size=KNOWN, max_len=16, embed_dim=16, depth=1, num_heads=2),
                        Prepared(None, None, None, info=HFTokenizer.load(folder)), notes.append)
    assert notes == []  # the same size: nothing to say


@pytest.mark.parametrize("rows", [8, 300])
def test_a_run_of_its_own_whose_model_disagrees_with_its_tokenizer_is_said_or_refused(tmp_path, capsys, rows):
    text = tmp_path / "my.txt"
    text.write_text(CORPUS, encoding="utf-8")
    chars = len(set(CORPUS)) + 1  # the characters and the end of a document
    code = main(["train", "lm-text", f"data.path={text}", "text.tokenizer=char", "model.name=gpt_tiny",
                 f"model.options.vocab_size={rows}", "model.options.depth=1", "model.options.embed_dim=32",
                 "model.options.num_heads=2", "text.context=16", "train.steps=1", "train.batch_size=2",
                 "train.warmup_steps=0", "train.log_every=0", "train.progress=false", "train.tensorboard=false",
                 "generate.max_new_tokens=4", "--run-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    if rows < chars:  # ids past the embedding: the run cannot encode its text
        assert code == 2 and err.count("\n") == 1
        assert f"the run's tokenizer (text.tokenizer=char) has {chars} tokens but model gpt_tiny " \
               f"(model.options.vocab_size={rows}) embeds {rows} ids (vocab_size): ids {rows}-{chars - 1} of the " \
               f"tokenizer have no embedding" in err
    else:
        assert code == 0
        assert f"the model embeds {rows} ids, the tokenizer decodes {chars}: ids {chars}-{rows - 1} are never " \
               f"generated" in out
