"""Starting from a Hugging Face decoder folder, as a user of such models does: fine-tuning it on
one's own text (``attnlab train lm-text model.checkpoint=FOLDER``, whole or with LoRA), where
the folder decides the model and the tokenizer and the recipe the training, and generating
from it (``attnlab generate FOLDER "prompt"``) with its tokenizer, special tokens and
``generation_config.json``, giving ``transformers``' ids and greedy tokens for the same folder."""

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

import attnlab
from attnlab.cli import main
from attnlab.data.tokenizers.lm import HFTokenizer, load_run_tokenizer
from attnlab.formats import from_hf
from attnlab.formats.hf.load import hf_model_spec
from attnlab.recipes import load_recipe
from attnlab.tasks.lm_folders import load_folder

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

LINES = ["The quick brown fox jumps over the lazy dog.", "A stitch in time saves nine.",
         "To be or not to be, that is the question.", "All that glitters is not gold."]
CORPUS = "\n".join(LINES * 6)  # the text the runs fine-tune on, and the tokenizers learn
PROMPTS = ["The quick brown", " fox, the dog", "two  spaces\nand a line", "<|endoftext|> and </s> written",
           "To be or not"]


def byte_bpe(special):
    """GPT-2's and Llama 3's kind of tokenizer: byte-level BPE."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([CORPUS], trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def metaspace_bpe():
    """Llama 2's kind: words marked by a leading "▁" (dropped before the first word when
    decoded), <s> put first by the post-processor."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator([CORPUS], trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>", "<s>", "</s>"],
                                                          show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def save_tokenizer(tok, folder, **config):
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              **config}))


def tokenizer_folder(kind, folder):
    if kind == "gpt2":  # no post-processor: no special token added
        save_tokenizer(byte_bpe(["<|endoftext|>"]), folder, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    elif kind == "llama2":  # <s> from the post-processor (add_bos_token is what older transformers read too)
        save_tokenizer(metaspace_bpe(), folder, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                       add_bos_token=True)
    else:  # llama3: <|begin_of_text|> from the post-processor; transformers 5 ignores add_bos_token beside it
        tok = byte_bpe(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", 0)])
        save_tokenizer(tok, folder, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>", add_bos_token=False)
    return folder


def model_folder(kind, folder):
    """A random tiny model of ``kind`` (gpt2: learned positions, tied head; llama: rotary,
    grouped-query, untied) with its tokenizer, saved as Hugging Face saves a checkpoint."""
    tokenizer_folder("gpt2" if kind == "gpt2" else "llama2", folder)
    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_positions=128, n_embd=32, n_layer=2, n_head=4,
                                         bos_token_id=0, eos_token_id=0)
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                          bos_token_id=1, eos_token_id=2)
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(0)
    cls(config).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {kind: model_folder(kind, tmp_path_factory.mktemp(kind)) for kind in ("gpt2", "llama")}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "my.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


def overrides(folder, text_file, *extra):
    return [f"model.checkpoint={folder}", f"data.path={text_file}", "text.context=32", "train.steps=6",
            "train.batch_size=4", "train.warmup_steps=1", "train.lr=0.003", "train.eval_every=3",
            "train.checkpoint_every=3", "train.log_every=0", "train.progress=false", "train.tensorboard=false",
            "train.precision=fp32", "generate.max_new_tokens=8", *extra]


# ----------------------------------------------------------------------------- the folder's tokenizer


@pytest.mark.parametrize("kind", ["gpt2", "llama2", "llama3"])
def test_prompt_ids_equal_transformers_tokenizer_of_the_folder(tmp_path, kind):
    folder = tokenizer_folder(kind, tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = HFTokenizer.load(folder)
    for text in PROMPTS + [""]:
        assert ours.encode_prompt(text) == theirs(text)["input_ids"], text
    assert ours.eos_id == theirs.eos_token_id
    first = ours.encode_prompt("The quick")[0]
    assert (first == theirs.bos_token_id) == (kind != "gpt2")  # the post-processor's <s>, where it has one
    # training text: no special token added, and one written in it stays text
    assert ours.encode("<|endoftext|>") == theirs("<|endoftext|>", add_special_tokens=False,
                                                  split_special_tokens=True)["input_ids"]


def test_the_run_directory_keeps_the_tokenizer_its_special_tokens_and_stop_ids(folders, tmp_path):
    ours = HFTokenizer.load(folders["llama"])
    assert ours.stop_ids == (2,) and ours.eos_id == 2  # generation_config.json's eos_token_id
    ours.save(tmp_path / "tokenizer.json")
    again = load_run_tokenizer(tmp_path)
    assert isinstance(again, HFTokenizer)
    assert again.special == ours.special and again.stop_ids == ours.stop_ids and again.eos_id == ours.eos_id
    assert all(again.encode_prompt(t) == ours.encode_prompt(t) for t in PROMPTS)


# ----------------------------------------------------------------------------- attnlab generate FOLDER


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_greedy_generate_from_a_folder_equals_transformers_generate(folders, kind, capsys):
    folder, prompt = folders[kind], "The quick brown"
    assert main(["generate", str(folder), prompt, "--max-new-tokens", "12"]) == 0  # greedy: no do_sample
    out = capsys.readouterr().out
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    expected = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)[0]
    assert len(expected) > ids.shape[1] + 3  # a continuation, not at once the end
    assert out == tokenizer.decode(expected, skip_special_tokens=True) + "\n"


def test_without_max_new_tokens_learned_positions_end_the_continuation(folders, capsys):
    folder = folders["gpt2"]  # 128 positions, no max_new_tokens in its generation_config.json: attnlab's 200, cut
    assert main(["generate", str(folder), "The quick brown"]) == 0
    out = capsys.readouterr().out
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("The quick brown", return_tensors="pt")["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    expected = model.generate(ids, max_new_tokens=128 - ids.shape[1], do_sample=False, pad_token_id=0)[0]
    assert out == tokenizer.decode(expected, skip_special_tokens=True) + "\n"
    assert main(["generate", str(folder), "The quick brown", "--max-new-tokens", "200"]) == 2  # given: checked whole
    assert "the model holds max_len=128" in capsys.readouterr().err


def test_any_eos_token_id_of_generation_config_ends_the_continuation(folders, tmp_path, capsys):
    folder = tmp_path / "llama"
    shutil.copytree(folders["llama"], folder)
    run = load_folder(folder)
    prompt = run.tokenizer.encode_prompt("The quick brown")
    greedy = from_hf(folder).generate(torch.tensor([prompt]), 8)[0, len(prompt):].tolist()
    # a later token of the greedy continuation is made an end of text, beside one that never comes
    k = next(i for i in range(2, 8) if greedy[i] not in greedy[:i])
    unused = next(i for i in range(run.tokenizer.vocab_size) if i not in greedy)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [unused, greedy[k]]}))
    assert load_folder(folder).tokenizer.stop_ids == (unused, greedy[k])
    assert main(["generate", str(folder), "The quick brown", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out == "The quick brown" + run.tokenizer.decode_after(prompt, greedy[:k]) + "\n"
    ended = transformers.AutoModelForCausalLM.from_pretrained(folder).generate(
        torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0)[0]
    assert ended[len(prompt):].tolist() == greedy[: k + 1]  # transformers stops there too (keeping the eos token)


def test_generation_config_gives_the_defaults_and_the_flags_override_them(folders, tmp_path, capsys):
    folder = tmp_path / "gpt2"
    shutil.copytree(folders["gpt2"], folder)
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "repetition_penalty": 1.3,
         "max_new_tokens": 6, "eos_token_id": 0}))
    sample = load_folder(folder).recipe.generate
    assert (sample.temperature, sample.top_k, sample.top_p, sample.repetition_penalty, sample.max_new_tokens) == \
        (0.7, 5, 0.9, 1.3, 6)
    runs = []
    for _ in range(2):  # sampled, with attnlab's seed 0 unless --seed: reproducible
        assert main(["generate", str(folder), "The quick"]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1]
    # --temperature 0: greedy, keeping the folder's repetition penalty and max_new_tokens, as transformers does
    assert main(["generate", str(folder), "The quick", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("The quick", return_tensors="pt")["input_ids"]
    expected = transformers.AutoModelForCausalLM.from_pretrained(folder).generate(ids, do_sample=False,
                                                                                  pad_token_id=0)[0]
    assert len(expected) == ids.shape[1] + 6
    assert out == tokenizer.decode(expected, skip_special_tokens=True) + "\n"
    # without do_sample (transformers' default): greedy
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.7, "eos_token_id": 0}))
    assert load_folder(folder).recipe.generate.temperature == 0.0


@pytest.mark.parametrize("config, key", [({"do_sample": True, "temperature": -1}, "temperature"),
                                         ({"top_p": 1.5}, "top_p"), ({"do_sample": "yes"}, "do_sample"),
                                         ({"eos_token_id": [0, 10 ** 6]}, "eos_token_id")])
def test_a_bad_generation_config_value_is_one_line_naming_file_and_key(folders, tmp_path, capsys, config, key):
    folder = tmp_path / "gpt2"
    shutil.copytree(folders["gpt2"], folder)
    (folder / "generation_config.json").write_text(json.dumps(config))
    assert main(["generate", str(folder), "The quick"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"generation_config.json: {key}" in err


# ----------------------------------------------------------------------------- fine-tuning: attnlab train lm-text


def test_the_folder_decides_the_model_and_tokenizer_the_recipe_the_training(folders, text_file):
    folder = folders["gpt2"]
    recipe = load_recipe("lm-text", overrides(folder, text_file, "model.options.drop_rate=0.1"))
    name, spec = hf_model_spec(folder)
    assert recipe.model.name == name == "gpt_small"
    assert recipe.model.options == {**spec, "drop_rate": 0.1}  # lm-text's own model options are gone
    assert recipe.text.tokenizer == "char" and recipe.text.vocab_size == 8192  # lm-text's BPE of 4,096: gone
    assert recipe.text.context == 32 and recipe.train.steps == 6 and recipe.train.weight_decay == 0.1  # the recipe's
    assert f"the tokens of {folder}" in attnlab.tasks.get_task(recipe.task).describe(recipe)


@pytest.mark.parametrize("extra, said", [
    (["model.name=llama_tiny"], "model.name must be empty or 'gpt_small'"),
    (["text.tokenizer=bpe"], "text.tokenizer must be left out with model.checkpoint="),
    (["text.tokenizer=char"], "text.tokenizer must be left out with model.checkpoint="),
    (["text.vocab_size=500"], "text.vocab_size must be left out"),
    (["text.tokenizer_file=TOKENIZER"], "text.tokenizer_file must be left out"),
    (["model.options.embed_dim=64"], "model.options.embed_dim must be left out with model.checkpoint="),
    (["model.options.pos_embed=rope"], "its pos_embed is 'learned'"),
    (["text.context=1000"], "text.context must be at most 128, the positions of the model"),
])
def test_a_recipe_key_that_contradicts_the_folder_is_refused_before_any_work(folders, text_file, tmp_path, capsys,
                                                                             extra, said):
    folder = folders["gpt2"]
    extra = [e.replace("TOKENIZER", str(folder / "tokenizer.json")) for e in extra]
    run_dir = tmp_path / "run"
    assert main(["train", "lm-text", *overrides(folder, text_file, *extra), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err
    assert not run_dir.exists()


def test_a_folder_that_is_no_decoder_or_has_no_tokenizer_is_refused_naming_it(folders, text_file, tmp_path, capsys):
    bert = tmp_path / "bert"
    transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=32)).save_pretrained(bert)
    capsys.readouterr()  # (transformers' progress bar)
    assert main(["train", "lm-text", *overrides(bert, text_file), "--run-dir", str(tmp_path / "r1")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.checkpoint=" in err and "model_type 'bert' (an encoder)" in err
    assert "decoder folder: model_type gpt2, llama, mistral" in err  # (and the other families from_hf reads)
    assert main(["generate", str(bert), "hello"]) == 2
    assert "model_type 'bert'" in capsys.readouterr().err
    bare = tmp_path / "bare"
    shutil.copytree(folders["gpt2"], bare)
    (bare / "tokenizer.json").unlink()
    assert main(["train", "lm-text", *overrides(bare, text_file), "--run-dir", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bare / 'tokenizer.json'} is missing" in err
    assert main(["generate", str(bare), "hello"]) == 2
    assert f"{bare / 'tokenizer.json'} is missing" in capsys.readouterr().err
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_fine_tuning_a_gpt2_folder_lowers_its_loss_resumes_and_runs_without_it(folders, text_file, tmp_path, capsys):
    folder = tmp_path / "gpt2"
    shutil.copytree(folders["gpt2"], folder)
    run_dir = tmp_path / "run"
    assert main(["train", "lm-text", *overrides(folder, text_file), "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"initial weights: {folder}\n" in out  # its tied output layer is the embedding, not a new head
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["name"] == "gpt_small" and config["model"]["options"] == hf_model_spec(folder)[1]
    ours = load_run_tokenizer(run_dir)
    assert [ours.encode(t) for t in PROMPTS] == [HFTokenizer.load(folder).encode(t) for t in PROMPTS]

    # exact resume: cut after the step-3 checkpoint, resumed with the run's own recipe
    cut = tmp_path / "cut"
    shutil.copytree(run_dir, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000000006")
    (cut / "results.json").unlink()
    assert main(["train", "--run-dir", str(cut), "--resume"]) == 0
    saved = load_file(run_dir / "checkpoints" / "step_000000006" / "model.safetensors")
    again = load_file(cut / "checkpoints" / "step_000000006" / "model.safetensors")
    assert again.keys() == saved.keys() and all(torch.equal(again[k], saved[k]) for k in saved)

    start = from_hf(folder).state_dict()
    shutil.rmtree(folder)  # eval, predict and generate need the run directory alone
    run = attnlab.load_run(run_dir)
    after = run.evaluate(data=text_file)["test_loss"]
    run.model.load_state_dict(start)
    before = run.evaluate(data=text_file)["test_loss"]
    assert after < before - 0.1
    capsys.readouterr()
    assert main(["generate", str(run_dir), "The quick", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("The quick") and len(text) > len("The quick\n")
    assert main(["eval", str(run_dir)]) == 0


def test_lora_on_a_llama_folder_trains_the_adapters_alone(folders, text_file, tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = overrides(folders["llama"], text_file, "model.lora.rank=4", "model.lora.targets=[attention, mlp]")
    assert main(["train", "lm-text", *args, "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "LoRA: " in out and "the adapters\n" in out  # no head: a language model's output layer stays the folder's
    saved = load_file(run_dir / "checkpoints" / "step_000000006" / "model.safetensors")
    assert saved and all(k.endswith(("lora_A", "lora_B")) for k in saved)
    assert any(float(v.abs().max()) > 0 for k, v in saved.items() if k.endswith("lora_B"))
    run = attnlab.load_run(run_dir)
    pretrained = from_hf(folders["llama"]).state_dict()
    state = run.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in pretrained.items())  # the frozen weights are the folder's
    assert main(["generate", str(run_dir), "The quick", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("The quick")
