"""GGUF files: tiny random models of each architecture written as llama.cpp writes them
(``tests/gguf_files.py``), read by attnlab and by ``transformers``
(``from_pretrained(folder, gguf_file=...)``): the same dequantized weights bitwise, the same
logits and greedy tokens, the same tokens of a mixed text; each tensor type; and the files a
hostile or careless hand makes, refused in one line."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import gguf_files
from gguf_files import MIXED_TEXT, Q, byte_level_vocab, sentencepiece_vocab, write_gguf

transformers = pytest.importorskip("transformers", reason="transformers reads the same files as the reference")

from attnlab.errors import InputError  # noqa: E402
from attnlab.formats.gguf.reader import GGUFFile  # noqa: E402
from attnlab.formats.hf.load import from_hf  # noqa: E402
from attnlab.formats.hf.files import open_checkpoint  # noqa: E402

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"]


def _config(arch: str, vocab_size: int, hidden: int = 64) -> object:
    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, sliding_window=None,
                  tie_word_embeddings=arch.startswith("gemma"))
    extra: dict = {
        "qwen3": {"head_dim": 128},  # transformers reads no head size from a qwen3 file: its default, 128
        "phi3": {"num_key_value_heads": 4, "pad_token_id": 3},  # Phi-3 packs q, k, v: one count of heads
        # llama.cpp scales Gemma's queries by the head size; transformers by query_pre_attn_scalar (256 unless
        # given): equal where the head size is 256, as in the real models but the 27B ones
        "gemma2": {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 8,
                   "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
        "gemma3": {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 8},
    }.get(arch, {})
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config, "phi3": transformers.Phi3Config,
           "gemma2": transformers.Gemma2Config, "gemma3": transformers.Gemma3TextConfig}[arch]
    return cls(**{**common, **extra})


def _write(tmp: Path, arch: str, qtype: Q = Q.F32, spm: bool | None = None, hidden: int = 64) -> tuple[Path, object]:
    """A tiny random ``arch`` model written as ``tmp/m.gguf``; returns the file and the model."""
    torch.manual_seed(0)
    spm = arch.startswith("gemma") or arch == "phi3" if spm is None else spm
    vocab = sentencepiece_vocab() if spm else byte_level_vocab()
    model = transformers.AutoModelForCausalLM.from_config(_config(arch, len(vocab["tokens"]), hidden)).eval()
    # llama.cpp writes Mistral's models as llama files
    return write_gguf(tmp / "m.gguf", "llama" if arch == "mistral" else arch, model, vocab, qtype), model


def _theirs(path: Path, original: object, arch: str) -> object:
    if arch == "mistral":  # transformers 5.25 reads no Mistral GGUF (gguf-py has no such architecture): the original
        return original
    return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_each_architecture_reads_as_transformers_reads_it(tmp_path: Path, arch: str) -> None:
    path, original = _write(tmp_path, arch)
    theirs = _theirs(path, original, arch)
    checkpoint = open_checkpoint(path)
    ours_weights, their_weights = checkpoint.weights(), theirs.state_dict()
    assert set(ours_weights) <= set(their_weights)
    for name, w in ours_weights.items():
        assert torch.equal(w, their_weights[name]), name  # llama's q/k rows and Gemma's norms undone alike
    model = from_hf(path)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), theirs(ids).logits, rtol=0, atol=1e-5)
        ours_greedy = model.generate(ids[:1, :8], max_new_tokens=16)
        their_greedy = theirs.generate(ids[:1, :8], max_new_tokens=16, do_sample=False, min_new_tokens=16)
    assert ours_greedy.tolist() == their_greedy.tolist()


@pytest.mark.parametrize("arch, spm", [("llama", False), ("llama", True), ("qwen2", False), ("phi3", True),
                                       ("gemma3", True)])
def test_the_tokenizer_encodes_a_mixed_text_as_transformers_does(tmp_path: Path, arch: str, spm: bool) -> None:
    path, _ = _write(tmp_path, arch, spm=spm)
    ours = open_checkpoint(path).tokenizer()
    theirs = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ids = ours.encode_prompt(MIXED_TEXT)
    assert ids == theirs(MIXED_TEXT)["input_ids"]
    special = "<|im_start|>" if not spm else "<end_of_turn>"
    assert ours.tokenizer.token_to_id(special) in ours.encode_prompt(f"a {special} b")  # a special token stays whole
    assert ours.decode(ours.encode_prompt("def f(x): return 2024", special_tokens=False)).strip() == \
        "def f(x): return 2024"


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
                                   "Q5_K", "Q6_K"])
def test_each_tensor_type_dequantizes_bitwise_as_gguf_does(tmp_path: Path, qtype: str) -> None:
    import gguf

    hidden = 256 if qtype.endswith("_K") else 64  # a K-quant block is 256 values of a row
    path, original = _write(tmp_path, "llama", getattr(Q, qtype), hidden=hidden)
    file = GGUFFile(path)
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(file.tensors[t.name].shape)
        assert np.array_equal(file.read(t.name).numpy(), want), (qtype, t.name)
    assert {file.tensors[n].type_name for n in file.tensors if n.endswith("attn_q.weight")} == {qtype}
    theirs = _theirs(path, original, "llama")
    ids = torch.randint(0, 300, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(from_hf(path)(ids), theirs(ids).logits, rtol=0, atol=1e-5)


def test_a_large_tensor_is_dequantized_in_chunks_equal_to_one_piece(tmp_path: Path, monkeypatch) -> None:
    import attnlab.formats.gguf.reader as reader

    path, _ = _write(tmp_path, "llama", Q.Q4_1)
    whole = {n: GGUFFile(path).read(n) for n in GGUFFile(path).tensors}
    monkeypatch.setattr(reader, "_CHUNK_ELEMENTS", 64)  # one row a chunk
    chunked = GGUFFile(path)
    for name, w in whole.items():
        assert torch.equal(chunked.read(name), w), name


# --------------------------------------------------------------------------- files that must be refused
def _header(meta: list[tuple[str, int, bytes]], tensors: list[tuple[str, list[int], int, int]], version: int = 3,
            counts: tuple[int, int] | None = None) -> bytes:
    def s(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", version, *(counts or (len(tensors), len(meta))))
    for key, type_id, value in meta:
        out += s(key) + struct.pack("<I", type_id) + value
    for name, dims, type_id, offset in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
            struct.pack("<IQ", type_id, offset)
    return out


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def _refused(path: Path, *words: str) -> str:
    with pytest.raises(InputError) as caught:
        from_hf(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    for word in words:
        assert word in message, message
    return message


def test_hostile_and_careless_files_are_refused_in_one_line(tmp_path: Path) -> None:
    arch = [("general.architecture", 8, _string("llama"))]
    cases = {
        "not_gguf.gguf": (b"GGUX" + bytes(20), ("not a GGUF file",)),
        "version.gguf": (_header(arch, [], version=7), ("version 7",)),
        # a count of 2^60 metadata entries in a file of a few bytes: refused before a loop or an allocation
        "kv_count.gguf": (_header(arch, [], counts=(0, 2**60)), ("truncated", "metadata entries")),
        "tensor_count.gguf": (_header(arch, [], counts=(2**62, 1)), ("truncated", "tensor entries")),
        "string.gguf": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**40) + b"general",
                        ("truncated",)),
        "array.gguf": (_header([("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 2**50))], []),
                       ("truncated", "tokenizer.ggml.scores")),
        "dims.gguf": (_header(arch, [("token_embd.weight", [64, 2**40], 0, 0)]), ("truncated", "token_embd.weight")),
        "ndims.gguf": (_header(arch, [("token_embd.weight", [1] * 9, 0, 0)]), ("9 dimensions",)),
        "qtype.gguf": (_header(arch, [("token_embd.weight", [32, 2], 99, 0)]), ("type", "does not dequantize")),
        "block.gguf": (_header(arch, [("token_embd.weight", [33, 2], 2, 0)]), ("not whole blocks",)),
        "value_type.gguf": (_header([("general.architecture", 77, b"")], []), ("value type 77",)),
    }
    for name, (data, words) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        _refused(path, *words)


T = gguf_files.gguf.GGUFValueType
WRONG_METADATA = {  # key: (a value of the wrong type or range, words of the refusal)
    "llama.rope.scaling.factor": (("2", T.STRING), "must be a number > 0", "got the text '2'"),
    "llama.rope.dimension_count": (("16", T.STRING), "must be a whole number", "got the text '16'"),
    "llama.rope.scaling.type": ((["linear"], T.ARRAY, T.STRING), "must be a text", "got a list of 1 text"),
    "llama.expert_count": (([1, 2], T.ARRAY, T.UINT32), "must be a whole number", "a list of 2 whole numbers"),
    "llama.attention.key_length": (([16, 16], T.ARRAY, T.UINT32), "must be a whole number", "a list of 2"),
    "llama.attention.layer_norm_rms_epsilon": (("1e-5", T.STRING), "must be a number > 0", "the text '1e-5'"),
    "split.count": (("2", T.STRING), "must be a whole number", "the text '2'"),
    "llama.attention.head_count": ((0, T.UINT32), "from 1 to", "got the number 0"),
    "llama.block_count": ((0, T.UINT32), "from 1 to", "got the number 0"),
    "llama.context_length": (("128", T.STRING), "must be a whole number", "the text '128'"),
    "llama.rope.freq_base": ((float("nan"), T.FLOAT32), "must be a number > 0", "got the number nan"),
    "general.architecture": ((["llama", "qwen2"], T.ARRAY, T.STRING), "must be a text", "a list of 2 texts"),
    "general.type": ((["model"], T.ARRAY, T.STRING), "must be a text", "a list of 1 text"),
    "tokenizer.ggml.tokens": ((list(range(320)), T.ARRAY, T.INT32), "must be a list of texts", "320 whole numbers"),
    "tokenizer.ggml.merges": (([1, 2, 3], T.ARRAY, T.INT32), "must be a list of texts", "3 whole numbers"),
    "tokenizer.ggml.pre": ((["gpt2"], T.ARRAY, T.STRING), "must be a text", "a list of 1 text"),
    "tokenizer.ggml.eos_token_id": (("2", T.STRING), "must be a whole number", "the text '2'"),
    "tokenizer.ggml.add_bos_token": (("yes", T.STRING), "must be true or false", "the text 'yes'"),
    "tokenizer.chat_template": ((5, T.UINT32), "must be a text", "got the number 5"),
    "tokenizer.ggml.token_type": ((["a"] * 320, T.ARRAY, T.STRING), "must be a list of whole numbers", "320 texts"),
}


@pytest.fixture(scope="module")
def llama_model() -> object:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(_config("llama", len(byte_level_vocab()["tokens"]))).eval()


@pytest.mark.parametrize("key", WRONG_METADATA)
def test_metadata_of_the_wrong_type_or_range_is_refused_in_one_line_naming_the_key(tmp_path: Path, key: str,
                                                                                   llama_model: object) -> None:
    value, *words = WRONG_METADATA[key]
    path = write_gguf(tmp_path / "m.gguf", "llama", llama_model, byte_level_vocab(), extra={key: value})
    _refused(path, f"metadata {key} must be", *words)


def test_every_command_refuses_metadata_of_the_wrong_type_in_one_line(tmp_path: Path, llama_model: object,
                                                                      capsys) -> None:
    """A text where a number is read reached generate, chat and explore unchecked (a traceback in
    chat and explore): now each refuses the file when it opens it, before any work."""
    from attnlab.cli import main

    path = write_gguf(tmp_path / "m.gguf", "llama", llama_model, byte_level_vocab(),
                      extra={"llama.context_length": ("128", T.STRING)})
    for argv in (["generate", str(path), "hi"], ["chat", str(path)], ["explore", str(path), "hi", "--out",
                                                                       str(tmp_path / "x.html")],
                 ["train", "lm-text", f"model.checkpoint={path}", "data.path=x.txt"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "llama.context_length must be a whole number" in err, (argv, err)


def test_a_tensor_whose_dimensions_are_not_sizes_is_refused(tmp_path: Path) -> None:
    arch = [("general.architecture", 8, _string("llama"))]
    path = tmp_path / "dims.gguf"
    path.write_bytes(_header(arch, [("token_embd.weight", [0, 2**64 - 1], 0, 0)]) + bytes(64))
    _refused(path, "token_embd.weight", "not sizes of a tensor")


def test_other_kinds_of_gguf_files_are_named(tmp_path: Path) -> None:
    path, _ = _write(tmp_path, "llama")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])
    _refused(cut, "truncated", "the file ends at")
    for kind, words in (("adapter", ("LoRA adapter",)), ("mmproj", ("vision projector",))):
        adapter = tmp_path / f"{kind}.gguf"
        adapter.write_bytes(_header([("general.architecture", 8, _string("llama")),
                                     ("general.type", 8, _string(kind))], []))
        _refused(adapter, "general.type", *words)
    clip = tmp_path / "clip.gguf"
    clip.write_bytes(_header([("general.architecture", 8, _string("clip"))], []))
    _refused(clip, "general.architecture 'clip' is not supported")
    unknown = tmp_path / "unknown_key.gguf"
    unknown.write_bytes(_header([("general.architecture", 8, _string("llama")),
                                 ("llama.attention.magic_scale", 6, struct.pack("<f", 2.0))], []))
    _refused(unknown, "llama.attention.magic_scale")
    tensor = tmp_path / "unknown_tensor.gguf"
    tensor.write_bytes(_header([("general.architecture", 8, _string("llama"))],
                               [("rope_freqs.weight", [32], 0, 0)]) + bytes(256))
    _refused(tensor, "rope_freqs.weight", "Llama 3.1")


def test_a_tokenizer_without_a_vocabulary_or_with_a_broken_template_is_named(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "novocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InputError, match="tokenizer.ggml.tokens is missing"):
        open_checkpoint(path).tokenizer()
    vocab = byte_level_vocab()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config("llama", len(vocab["tokens"]))).eval()
    broken = write_gguf(tmp_path / "broken.gguf", "llama", model, vocab,
                        extra={"tokenizer.chat_template": "{% for m in messages %}{{ m.content | nosuchfilter }}"})
    with pytest.raises(InputError) as caught:
        open_checkpoint(broken).tokenizer().chat_prompt([{"role": "user", "content": "hi"}])
    assert "\n" not in str(caught.value) and "tokenizer.chat_template" in str(caught.value)


def test_the_command_line_takes_a_gguf_file_where_it_takes_a_folder(tmp_path: Path, capsys) -> None:
    from attnlab.cli import main

    path, _ = _write(tmp_path, "llama")
    assert main(["generate", str(path), "The cat", "--max-new-tokens", "5", "--seed", "0"]) == 0
    assert "The cat" in capsys.readouterr().out
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2**60))
    assert main(["generate", str(bad), "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "truncated" in err


def test_a_recipe_fine_tunes_from_a_gguf_file_and_the_run_reads_alone(tmp_path: Path) -> None:
    """model.checkpoint=FILE.gguf: the file's model and tokenizer become the run's; the finished run
    loads and generates without the file."""
    from attnlab.cli import main
    from attnlab.tasks import load_run

    path, _ = _write(tmp_path, "llama")
    text = tmp_path / "text.txt"
    text.write_text(("The cat sat on the mat. The dog sat on the log. " * 40 + "\n") * 30)
    run_dir = tmp_path / "run"
    assert main(["train", "lm-text", f"model.checkpoint={path}", f"data.path={text}", "train.steps=3",
                 "text.context=64", "train.progress=false", "--run-dir", str(run_dir)]) == 0
    path.rename(tmp_path / "gone.gguf")
    run = load_run(run_dir)
    assert run.tokenizer.vocab_size == len(byte_level_vocab()["tokens"])
    assert run.tokenizer.encode_prompt("The cat") == open_checkpoint(tmp_path / "gone.gguf").tokenizer().encode_prompt(
        "The cat")
    assert len(run.predict(["The cat"], max_new_tokens=4)) == 1


def test_an_empty_or_symlinked_gguf_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _refused(empty, "truncated")
    path, _ = _write(tmp_path, "llama")
    link = tmp_path / "link.gguf"
    link.symlink_to(path)
    assert from_hf(link).config.vocab_size == from_hf(path).config.vocab_size


def _merges_tried_at_every_place(tokens: list[str], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges of a SentencePiece vocabulary, every split of every piece tried (as transformers)."""
    ids = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece in scores:
        local = sorted(((piece[:k], piece[k:]) for k in range(1, len(piece))
                        if piece[:k] in ids and piece[k:] in ids), key=lambda lr: (ids[lr[0]], ids[lr[1]]))
        merges += [(scores[piece], len(left), len(right), left, right) for left, right in local]
    merges.sort(key=lambda m: m[:3], reverse=True)
    return [m[3:] for m in merges]


def test_the_merges_of_a_sentencepiece_vocabulary_are_those_of_every_split() -> None:
    from attnlab.formats.gguf.tokenizer import _merges_from_scores

    gen = np.random.default_rng(0)
    tokens = ["".join(gen.choice(list("ab▁c"), size=gen.integers(1, 14))) for _ in range(3000)]
    tokens += ["a" * k for k in range(1, 40)] + ["▁" * k for k in range(1, 20)] + ["ab" * 20 + "c" * 9]
    tokens = list(dict.fromkeys(tokens))
    scores = {t: -float(i % 50) for i, t in enumerate(tokens)}  # many equal scores: the order of ties matters
    assert _merges_from_scores(tokens, scores) == _merges_tried_at_every_place(tokens, scores)


def test_a_vocabulary_of_a_few_huge_pieces_builds_its_tokenizer(tmp_path: Path) -> None:
    """Three pieces of 1,000,000 characters (a 3 MB file): every split of each tried was 10^12
    character comparisons (still running after 150 s); now each piece costs a few set lookups."""
    vocab = sentencepiece_vocab()
    huge = [chr(ord("a") + i) * 1_000_000 + str(i) for i in range(3)]
    vocab.update(tokens=vocab["tokens"] + huge, scores=vocab["scores"] + [-1000.0, -1001.0, -1002.0],
                 types=vocab["types"] + [1, 1, 1])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config("llama", len(vocab["tokens"]))).eval()
    path = write_gguf(tmp_path / "huge.gguf", "llama", model, vocab)
    tok = open_checkpoint(path).tokenizer()
    assert tok.decode(tok.encode("hello a" + "a" * 10)) == "hello a" + "a" * 10


def test_the_explorer_names_a_gguf_file_as_what_it_is(tmp_path: Path) -> None:
    from attnlab.viz.explorer import explore

    path, _ = _write(tmp_path, "llama")
    page = explore(path, ["The cat sat on the mat. The cat sat"], new_tokens=2)
    assert page.data["subtitle"] == f"GGUF file (llama) {path}"
