"""Every number that sizes an allocation is checked against what it can mean before
anything is allocated: a Hugging Face folder's config.json against its weight files'
headers and the memory available, a recipe's model against the memory training takes,
attention options that count positions against the model's max_len, LoRA ranks against
the layers they adapt, vocabularies of tokenizer files against a stated cap. Each is one
line naming the key, the value and the limit (exit 2 from the command line).

The cases whose old behaviour was an allocation of gigabytes run in a child process under
a 4 GB address-space limit: an attempted allocation fails there instead of the refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import attnlab.memory
from attnlab.memory import gib
from attnlab.attention import build_attention
from attnlab.cli import main
from attnlab.data.tokenizers.lm import BPETokenizer, load_tokenizer
from attnlab.data.tokenizers.text import MAX_VOCAB, TextTokenizer, check_vocab_size
from attnlab.engine.config import ConfigError
from attnlab.errors import InputError
from attnlab.layers.lora import apply_lora
from attnlab.formats import from_hf
from attnlab.models import create_model
from attnlab.formats.hf.load import hf_model_spec, read_hf
from attnlab.formats.hf.files import read_headers as _read_headers
from attnlab.models.registry import OptionError
from attnlab.recipes import load_recipe
from attnlab.tasks import get_task

VOCAB, WIDTH, INTER = 300, 32, 64


def llama_folder(folder: Path, **config) -> Path:
    """A one-layer Llama folder of width 32 and 300 words, with ``config`` over its config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    w = {"model.embed_tokens.weight": torch.zeros(VOCAB, WIDTH), "model.norm.weight": torch.ones(WIDTH),
         "lm_head.weight": torch.zeros(VOCAB, WIDTH)}
    p = "model.layers.0."
    w[p + "input_layernorm.weight"] = w[p + "post_attention_layernorm.weight"] = torch.ones(WIDTH)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        w[p + f"self_attn.{name}.weight"] = torch.zeros(WIDTH, WIDTH)
    w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = torch.zeros(INTER, WIDTH), torch.zeros(INTER, WIDTH)
    w[p + "mlp.down_proj.weight"] = torch.zeros(WIDTH, INTER)
    save_file({k: v.clone() for k, v in w.items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": WIDTH, "num_hidden_layers": 1,
         "num_attention_heads": 4, "intermediate_size": INTER, "max_position_embeddings": 64, **config}))
    return folder


def gpt2_folder(folder: Path, **config) -> Path:
    """A one-layer GPT-2 folder of width 32 and 300 words in the older pytorch_model.bin."""
    folder.mkdir(parents=True, exist_ok=True)
    e = WIDTH
    w = {"wte.weight": torch.zeros(VOCAB, e), "wpe.weight": torch.zeros(64, e), "ln_f.weight": torch.ones(e),
         "ln_f.bias": torch.zeros(e), "h.0.attn.c_attn.weight": torch.zeros(e, 3 * e),
         "h.0.attn.c_attn.bias": torch.zeros(3 * e), "h.0.attn.c_proj.weight": torch.zeros(e, e),
         "h.0.attn.c_proj.bias": torch.zeros(e), "h.0.mlp.c_fc.weight": torch.zeros(e, 4 * e),
         "h.0.mlp.c_fc.bias": torch.zeros(4 * e), "h.0.mlp.c_proj.weight": torch.zeros(4 * e, e),
         "h.0.mlp.c_proj.bias": torch.zeros(e)}
    for n in ("ln_1", "ln_2"):
        w[f"h.0.{n}.weight"], w[f"h.0.{n}.bias"] = torch.ones(e), torch.zeros(e)
    torch.save(w, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "vocab_size": VOCAB, "n_positions": 64, "n_embd": e, "n_layer": 1, "n_head": 4,
         **config}))
    return folder


def text_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "t.txt").write_text("a small text to learn from, one line of it\n")
    return folder / "t.txt"


# ----------------------------------------------------------------------------- under an address-space limit

CHILD = textwrap.dedent("""
    import contextlib, io, json, resource, sys
    import torch
    from attnlab.attention import build_attention
    from attnlab.cli import main
    from attnlab.formats import from_hf
    from attnlab.formats.hf.load import hf_model_spec, read_hf
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # an allocation of more fails
    cases = json.loads(sys.argv[1])
    out = {}
    for name, (call, args, kwargs) in cases.items():
        try:
            if call == "main":
                err = io.StringIO()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    rc = main(args)
                out[name] = [rc, err.getvalue()]
            else:
                {"from_hf": from_hf, "read_hf": read_hf, "hf_model_spec": hf_model_spec,
                 "build_attention": build_attention}[call](*args, **kwargs)
                out[name] = ["accepted", ""]
        except BaseException as exc:
            out[name] = [type(exc).__name__, str(exc)]
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> dict[str, list]:
    """``{case: [what happened, message]}`` of the cases that used to allocate gigabytes, run
    in one child process under a 4 GB address-space limit."""
    if sys.platform != "linux":
        pytest.skip("RLIMIT_AS is Linux's")
    tmp = tmp_path_factory.mktemp("limited")
    vocab = str(llama_folder(tmp / "vocab", vocab_size=10**10))
    width = str(gpt2_folder(tmp / "width", n_embd=10**7))
    txt = str(text_file(tmp / "text"))
    lm = ["recipes", "lm-text", f"data.path={txt}"]
    cases = {
        "from_hf vocab": ["from_hf", [vocab], {}],
        "read_hf vocab": ["read_hf", [vocab], {}],
        "hf_model_spec vocab": ["hf_model_spec", [vocab], {}],
        "from_hf width": ["from_hf", [width], {}],
        "cli vocab": ["main", [*lm, "model.name=", f"model.checkpoint={vocab}"], {}],
        "cli width": ["main", [*lm, "model.name=", f"model.checkpoint={width}"], {}],
        "cli vocab_size": ["main", [*lm, "model.options.vocab_size=10000000000"], {}],
        "cli embed_dim": ["main", [*lm, "model.options.embed_dim=10000000"], {}],
        "cli n_buckets": ["main", [*lm, "model.options.attention=lsh",
                                   "model.options.attention_options={n_buckets: 1000000000}"], {}],
        "lsh n_buckets": ["build_attention", ["lsh", 64, 4], {"n_buckets": 10**9}],
        "linformer seq_len": ["build_attention", ["linformer", 64, 4], {"seq_len": 10**9}],
        "sparse random_blocks": ["build_attention", ["sparse", 64, 4], {"random_blocks": 10**9}],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("call", ["from_hf", "read_hf", "hf_model_spec"])
def test_a_vocab_size_the_weights_do_not_have_is_refused_before_anything_is_built(limited, call):
    kind, message = limited[f"{call} vocab"]
    assert kind == "InputError", message
    assert "config.json: vocab_size 10000000000 disagrees with the weights: model.embed_tokens.weight is (300, 32)" \
        in message
    assert "(10000000000, 32) in its config" in message


def test_a_width_the_weights_do_not_have_is_refused_from_a_pytorch_bin(limited):
    kind, message = limited["from_hf width"]
    assert kind == "InputError", message
    assert "config.json: n_embd 10000000 disagrees with the weights: wte.weight is (300, 32)" in message


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


@pytest.mark.parametrize("case, said", [
    ("lsh n_buckets", "lsh: n_buckets must be at most 1048576"),
    ("linformer seq_len", "linformer: seq_len must be at most 1048576"),
    ("sparse random_blocks", "sparse: random_blocks must be at most 1048576"),
])
def test_a_kind_alone_refuses_position_counts_past_its_cap_before_its_buffers(limited, case, said):
    kind, message = limited[case]
    assert kind == "InputError" and said in message and "got" in message


# ----------------------------------------------------------------------------- Hugging Face folders


def test_the_headers_are_read_as_meta_tensors_without_the_data(tmp_path):
    for folder in (llama_folder(tmp_path / "st"), gpt2_folder(tmp_path / "bin")):
        headers = _read_headers(folder)
        assert headers and all(t.device.type == "meta" for t in headers.values())
    assert tuple(_read_headers(tmp_path / "st")["model.embed_tokens.weight"].shape) == (VOCAB, WIDTH)
    assert tuple(_read_headers(tmp_path / "bin")["h.0.attn.c_attn.weight"].shape) == (WIDTH, 3 * WIDTH)


def test_a_header_claiming_more_than_its_file_holds_is_refused(tmp_path):
    folder = llama_folder(tmp_path / "f")
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": [10**10, 32],
                                                       "data_offsets": [0, 4 * 32 * 10**10]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(64))
    with pytest.raises(InputError, match=r"could not read .*model.safetensors as safetensors"):
        from_hf(folder)


def test_a_depth_the_weights_do_not_have_is_refused_before_its_layers_are_made(tmp_path):
    with pytest.raises(InputError, match=r"config.json: num_hidden_layers 1000000000000 disagrees with the "
                                         r"weights: they hold 1 layer$"):
        hf_model_spec(llama_folder(tmp_path / "f", num_hidden_layers=10**12))


def test_a_fitting_folder_still_loads(tmp_path):
    model = from_hf(llama_folder(tmp_path / "f"))
    assert model.tok_embed.weight.shape == (VOCAB, WIDTH)


def test_a_model_larger_than_the_memory_available_is_refused_with_both_numbers(tmp_path, monkeypatch):
    folder = llama_folder(tmp_path / "f")
    stored = sum(t.numel() * 4 for t in _read_headers(folder).values())
    params = sum(p.numel() for p in from_hf(folder).parameters())
    monkeypatch.setattr(attnlab.memory, "available_memory", lambda: 1000)
    with pytest.raises(InputError, match=rf"reading its weights needs {gib(stored)}; this machine has 1000 bytes "
                                         rf"available$"):
        read_hf(folder)
    with pytest.raises(InputError) as caught:
        from_hf(folder)
    # the weights read, and the model built in float32 beside them (this Llama has no buffers)
    assert (f"building its model ({params:,} parameters, float32) needs {gib(stored + 4 * params)}; this machine "
            f"has 1000 bytes available") in str(caught.value)


# ----------------------------------------------------------------------------- a recipe's model and memory


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


# ----------------------------------------------------------------------------- attention options


MODELS = [("sentiment_transformer_tiny", {"vocab_size": 100}, "SentimentConfig"), ("gpt_tiny", {}, "GPTConfig"),
          ("transformer_tiny", {"src_vocab_size": 50, "tgt_vocab_size": 50}, "TransformerConfig")]
OPTIONS = [("local", "sliding_window"), ("topk", "top_k"), ("lsh", "n_buckets"), ("lsh", "bucket_size"),
           ("nystrom", "num_landmarks"), ("linformer", "seq_len"), ("sparse", "block")]


# (a language model takes no kind that cannot be causal, and sets the local window itself: model.options.sliding_window)
@pytest.mark.parametrize("name, options, config, kind, option", [
    (*m, *o) for m in MODELS for o in OPTIONS
    if not (m[0] == "gpt_tiny" and (o[0] in ("nystrom", "linformer") or o[1] == "sliding_window"))])
def test_an_option_counting_positions_must_fit_the_models_max_len(name, options, config, kind, option):
    max_len = 64
    with pytest.raises(OptionError, match=rf"^{config}.attention_options.{option} must be <= {max_len}, the "
                                          rf"model's max_len .*; got {max_len + 2}$"):
        create_model(name, max_len=max_len, attention=kind, attention_options={option: max_len + 2}, **options)
    with torch.device("meta"):  # the limit itself is fine
        create_model(name, max_len=max_len, attention=kind, attention_options={option: max_len}, **options)


def test_a_text_encoder_refuses_them_too():
    with pytest.raises(OptionError, match=r"TextEncoderConfig.attention_options.top_k must be <= 16, "):
        create_model("bert_tiny", max_len=16, attention="topk", attention_options={"top_k": 17})


# ----------------------------------------------------------------------------- LoRA ranks


def test_a_lora_rank_above_the_smaller_side_of_a_layer_is_refused_naming_it():
    model = create_model("sentiment_transformer_tiny", vocab_size=100, embed_dim=32, num_heads=2)
    with pytest.raises(InputError, match=r"^rank must be at most 32, the smaller side of layer "
                                         r"encoder.layers.0.self_attn.q_proj \(32 inputs, 32 outputs\); got 100000$"):
        apply_lora(model, rank=100000, targets=["q_proj"])
    cross = create_model("transformer_tiny", embed_dim=32, num_heads=2)  # cross-attention is the exact kind too
    with pytest.raises(InputError, match=r"^rank must be at most 32, the smaller side of layer "
                                         r"transformer.decoder.layers.0.cross_attn.q_proj \(32 inputs, 32 outputs\); "
                                         r"got 100000$"):
        apply_lora(cross, rank=100000, targets=["transformer.decoder.layers.*.cross_attn.q_proj"])
    assert apply_lora(model, rank=32, targets=["attention"])  # full rank is the limit, and allowed


def test_the_recipe_names_model_lora_rank(tmp_path, capsys):
    from tokenizers import Tokenizer, models

    folder, txt = llama_folder(tmp_path / "f"), text_file(tmp_path)
    words = {f"w{i}": i for i in range(VOCAB - 2)} | {"[UNK]": VOCAB - 2, "</s>": VOCAB - 1}
    Tokenizer(models.WordLevel(words, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))  # lm-text reads it
    assert main(["recipes", "lm-text", f"data.path={txt}", "model.name=", f"model.checkpoint={folder}",
                 "text.context=32", "model.lora.rank=100000"]) == 2  # the folder holds 64 positions
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert ("model.lora.rank must be at most 32, the smaller side of layer blocks.0.attn.q_proj (32 inputs, "
            "32 outputs); got 100000") in err


# ----------------------------------------------------------------------------- vocabularies


def test_the_vocabulary_cap():
    check_vocab_size(MAX_VOCAB, "vocab_size")
    with pytest.raises(InputError, match=r"^vocab_size must be at most 1,048,576 tokens .*; got 1,048,577$"):
        check_vocab_size(MAX_VOCAB + 1, "vocab_size")


@pytest.fixture(scope="module")
def huge_vocab(tmp_path_factory) -> Path:
    """A WordLevel tokenizer.json of MAX_VOCAB + 1 words (about 20 MB)."""
    path = tmp_path_factory.mktemp("vocab") / "tokenizer.json"
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(MAX_VOCAB - 1)}}
    model = {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    path.write_text(json.dumps({"version": "1.0", "model": model}))
    return path


@pytest.mark.parametrize("load", [load_tokenizer, BPETokenizer.load, TextTokenizer.load])
def test_a_tokenizer_file_with_too_many_words_is_refused_naming_it(huge_vocab, load):
    with pytest.raises(InputError, match=rf"^the vocabulary of {huge_vocab} must be at most 1,048,576 tokens "
                                         rf".*; got 1,048,577$"):
        load(huge_vocab)


def test_a_char_tokenizer_file_with_too_many_characters_is_refused(tmp_path):
    chars = [chr(c) for c in range(0x20, 0x110000) if not 0xD800 <= c < 0xE000][:MAX_VOCAB + 1]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"attnlab_tokenizer": "char", "chars": chars}))
    with pytest.raises(InputError, match=r"must be at most 1,048,576 tokens .*; got 1,048,577$"):
        load_tokenizer(path)


def test_a_vocabulary_to_learn_is_capped_too(tmp_path, capsys):
    with pytest.raises(InputError, match=r"^vocab_size must be at most 1,048,576 tokens .*; got 10,000,000,000$"):
        BPETokenizer.train("some text", vocab_size=10**10)
    with pytest.raises(InputError, match=r"^vocab_size must be at most 1,048,576 tokens .*; got 10,000,000,000$"):
        TextTokenizer.train(["some text"], "wordpiece", 10**10)
    data = tmp_path / "d.csv"
    data.write_text("text,label\n" + "".join(f"a text {i},{i % 2}\n" for i in range(20)))
    assert main(["recipes", "text-classification", f"data.train={data}", "text.vocab_size=10000000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "text.vocab_size must be <= 1048576; got 10000000000" in err
