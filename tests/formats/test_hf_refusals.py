"""A Hugging Face folder's sizes are checked before anything is allocated: its config.json against
its weight files' headers (read as meta tensors, without the data) and against the memory
available; its JSON's nesting; a size that would imply huge memory (a sliding window of 10^12
positions) bounded by what the generation can take. Each refusal is one line naming the key, the
value and the limit (exit 2 from the command line). The cases whose old behaviour was an
allocation of gigabytes run in a child process under a 4 GB address-space limit."""

from __future__ import annotations

import json

import pytest
import torch

import attnlab.memory
from attnlab.cli import main
from attnlab.errors import InputError
from attnlab.formats import from_hf
from attnlab.formats.hf.files import read_headers as _read_headers
from attnlab.formats.hf.load import hf_model_spec, read_hf
from attnlab.memory import gib

from hf_folders import VOCAB, WIDTH, gpt2_folder, llama_folder, variant
from refusals import one_line_refusal, under_an_address_space_limit


@pytest.fixture(scope="module")
def limited(tmp_path_factory) -> dict[str, list]:
    """``{case: [what happened, message]}`` of the readings of a folder that used to allocate
    gigabytes, run in one child process under a 4 GB address-space limit."""
    tmp = tmp_path_factory.mktemp("limited")
    vocab = str(llama_folder(tmp / "vocab", vocab_size=10**10))
    width = str(gpt2_folder(tmp / "width", n_embd=10**7))
    return under_an_address_space_limit({
        "from_hf vocab": ["from_hf", [vocab], {}],
        "read_hf vocab": ["read_hf", [vocab], {}],
        "hf_model_spec vocab": ["hf_model_spec", [vocab], {}],
        "from_hf width": ["from_hf", [width], {}],
    })


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


# ---------------------------------------------------------------------------- the headers and the memory


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


# ---------------------------------------------------------------------------- config.json's JSON and sizes


def test_a_config_json_nested_a_million_deep_exits_2_in_one_line(llama, tmp_path, capsys):
    folder = variant(llama, tmp_path)
    (folder / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 10**6 + "]" * 10**6 + "}")
    one_line_refusal(capsys, ["generate", str(folder), "hi"], "config.json nests its JSON 1000001 levels deep")


def test_a_sliding_window_of_ten_to_the_twelve_generates_in_the_memory_of_its_tokens(llama, tmp_path, capsys):
    from attnlab.formats import from_hf

    folder = variant(llama, tmp_path, model_type="mistral", architectures=["MistralForCausalLM"],
                     sliding_window=10**12, max_position_embeddings=10**12)
    model = from_hf(folder)
    assert model.config.sliding_window == 10**12
    ids = torch.tensor([[1, 5, 9, 13]])
    cache = model.new_cache(1, 4 + 6)
    model(ids, cache=cache)
    # the buffers hold the positions the generation can take, not the window's 10^12
    assert all(c.nbytes() <= 2 * 10 * 32 * 4 for c in cache)
    # a window wider than everything is full attention: the tokens of the model without one
    full = from_hf(variant(llama, tmp_path / "full", model_type="mistral", architectures=["MistralForCausalLM"],
                           sliding_window=None))
    assert torch.equal(model.generate(ids, 6), full.generate(ids, 6))
    assert main(["generate", str(folder), "hi", "--max-new-tokens", "3"]) == 0


@pytest.mark.parametrize("config, said", [
    ({"hidden_size": 10**9}, "hidden_size"),
    ({"num_hidden_layers": 10**6}, "num_hidden_layers 1000000 disagrees with the weights: they hold 2 layers"),
    ({"vocab_size": 10**10}, "10000000000"),
    ({"head_dim": 10**9}, "in its config"),
])
def test_a_config_size_beyond_the_weights_exits_2_in_one_line_before_any_allocation(llama, tmp_path, capsys, config,
                                                                                       said):
    one_line_refusal(capsys, ["generate", str(variant(llama, tmp_path, **config)), "hi"], said)
