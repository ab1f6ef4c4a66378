"""A decoder back out to the ecosystem (attnlab.formats.hf.export, attnlab.formats.gguf.writer,
``attnlab export RUN --format hf|gguf``): tiny random models of llama, qwen2 and qwen3 written
as llama.cpp writes them (tests/gguf_files.py), read by attnlab, written back as a Hugging Face
folder and as GGUF files of F32, F16 and Q8_0 weights; ``transformers`` (and llama.cpp where the
peers' environment has it) read what was written with the same tokens, logits and greedy
continuations as attnlab; a fine-tuned run with LoRA exports merged; refusals in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gguf_files import MIXED_TEXT, byte_level_vocab, write_gguf

transformers = pytest.importorskip("transformers", reason="transformers reads what attnlab writes")

from attnlab.cli import main  # noqa: E402
from attnlab.errors import InputError  # noqa: E402
from attnlab.formats.gguf.writer import save_gguf  # noqa: E402
from attnlab.formats.hf.load import from_hf  # noqa: E402
from attnlab.formats.hf.export import save_hf  # noqa: E402
from attnlab.formats.hf.files import open_checkpoint  # noqa: E402

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PEERS = Path(__file__).resolve().parents[2] / ".venv-peers" / "bin" / "python"


def _source(tmp: Path, arch: str) -> Path:
    """A tiny random ``arch`` model with a byte-level vocabulary and a chat template, as a GGUF file."""
    torch.manual_seed(0)
    # transformers 5 reads a qwen folder's tokenizer.json through Qwen2Tokenizer, which splits text its own way
    # (as Qwen's vocabularies do) whatever the file says: the Qwen models here split as Qwen's do
    vocab = {**byte_level_vocab(), **({"pre": "qwen2"} if arch.startswith("qwen") else {})}
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[arch]
    config = cls(vocab_size=len(vocab["tokens"]), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                 tie_word_embeddings=arch == "qwen3", **({"head_dim": 128} if arch == "qwen3" else {}))  # transformers reads no head size from a qwen3 GGUF file: 128
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return write_gguf(tmp / "source.gguf", arch, model, vocab, extra={"tokenizer.chat_template": TEMPLATE})


def _greedy(model, ids: torch.Tensor, new: int = 12) -> list[int]:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new)[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_a_folder_and_three_gguf_files_read_alike_by_transformers_and_attnlab(tmp_path: Path, arch: str) -> None:
    source = _source(tmp_path, arch)
    model, tokenizer = from_hf(source), open_checkpoint(source).tokenizer()
    ids = torch.tensor([tokenizer.encode_prompt("The cat sat on the mat")])
    ours = _greedy(model, ids)

    folder, difference = save_hf(model, tokenizer, tmp_path / "hf")
    assert difference <= 1e-4
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == arch and config["architectures"] == [f"{arch.capitalize()}ForCausalLM"]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    their_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert their_tokenizer(MIXED_TEXT)["input_ids"] == tokenizer.encode_prompt(MIXED_TEXT)
    messages = [{"role": "user", "content": "hi"}]
    assert their_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tokenizer.chat_prompt(messages)
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, model(ids), rtol=0, atol=1e-5)
        assert theirs.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)[0, ids.shape[1]:].tolist() \
            == ours
    assert _greedy(from_hf(folder), ids) == ours

    for weight_type in ("f32", "f16", "q8_0"):
        path, difference = save_gguf(model, tokenizer, tmp_path / f"m-{weight_type}.gguf", weight_type)
        assert difference <= 1e-4
        back = from_hf(path)
        if weight_type == "f32":
            assert _greedy(back, ids) == ours
        assert open_checkpoint(path).tokenizer().encode_prompt(MIXED_TEXT) == tokenizer.encode_prompt(MIXED_TEXT)
        assert open_checkpoint(path).tokenizer().chat_template == TEMPLATE
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()
        with torch.no_grad():  # the same rounded weights, read by each
            torch.testing.assert_close(theirs(ids).logits, back(ids), rtol=0, atol=1e-5)
            assert theirs.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)[
                0, ids.shape[1]:].tolist() == _greedy(back, ids)


def _llama_cpp_available() -> bool:
    if not PEERS.is_file():
        return False
    return subprocess.run([str(PEERS), "-c", "import llama_cpp"], capture_output=True).returncode == 0


LLAMA_CPP = """
import json, sys
import numpy as np
import llama_cpp.llama_cpp as api
from llama_cpp import Llama
defaults = api.llama_model_default_params
def params():  # without llama.cpp's repacked and AMX buffers, which crash on some CPUs (benchmarks/real_decoding.py)
    p = defaults(); p.use_extra_bufts = False; return p
api.llama_model_default_params = params
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
ids = llm.tokenize(sys.argv[2].encode(), add_bos=True, special=True)
vocab = llm.n_vocab()
last = lambda: int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
llm.eval(ids)
out = [last()]
for _ in range(11):
    llm.eval([out[-1]]); out.append(last())
print(json.dumps({"ids": ids, "greedy": out}))
"""


@pytest.mark.skipif(not _llama_cpp_available(), reason="llama-cpp-python absent: make bench-peers builds .venv-peers "
                    "with it (15 minutes, once)")
@pytest.mark.parametrize("weight_type", ["f32", "q8_0"])
def test_llama_cpp_reads_the_gguf_file_with_attnlabs_tokens(tmp_path: Path, weight_type: str) -> None:
    source = _source(tmp_path, "llama")
    model, tokenizer = from_hf(source), open_checkpoint(source).tokenizer()
    path, _ = save_gguf(model, tokenizer, tmp_path / "m.gguf", weight_type)
    text = "The cat sat on the mat, 2024 times."
    done = subprocess.run([str(PEERS), "-c", LLAMA_CPP, str(path), text], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ids = tokenizer.encode_prompt(text)
    assert theirs["ids"] == ids
    assert theirs["greedy"] == _greedy(from_hf(path), torch.tensor([ids]))


def test_a_fine_tuned_run_with_lora_exports_merged_from_the_command_line(tmp_path: Path, capsys) -> None:
    source = _source(tmp_path, "llama")
    text = tmp_path / "text.txt"
    text.write_text(("The cat sat on the mat. The dog sat on the log. " * 40 + "\n") * 30)
    run_dir = tmp_path / "run"
    assert main(["train", "lm-text", f"model.checkpoint={source}", f"data.path={text}", "train.steps=3",
                 "train.lr=0.01", "text.context=32", "model.lora={rank: 4}", "train.progress=false",
                 "--run-dir", str(run_dir)]) == 0
    from attnlab.tasks import load_run

    run = load_run(run_dir)
    ids = torch.tensor([run.tokenizer.encode_prompt("The cat")])
    with torch.no_grad():
        expected = run.model.eval()(ids)
    capsys.readouterr()
    assert main(["export", str(run_dir), "--format", "hf"]) == 0
    out = capsys.readouterr().out
    assert "LoRA: " in out and "merged" in out
    folder = run_dir / "export" / "hf"
    assert oct(folder.stat().st_mode & 0o777) != oct(0o700)  # a folder as mkdir makes it
    with torch.no_grad():
        torch.testing.assert_close(from_hf(folder)(ids), expected, rtol=0, atol=1e-4)
    assert main(["export", str(run_dir), "--format", "gguf", "--gguf-type", "f32"]) == 0
    with torch.no_grad():
        torch.testing.assert_close(from_hf(run_dir / "export" / "model-f32.gguf")(ids), expected, rtol=0, atol=1e-4)
    assert not list((run_dir / "export").glob(".*"))  # nothing left aside
    # refusals, each one line before any work
    for argv, words in [
        (["export", str(run_dir), "--format", "gguf", "--gguf-type", "f32"], "exists already"),
        (["export", str(run_dir), "--format", "gguf", "--gguf-type", "q4_k"], "--gguf-type takes f32, f16, q8_0"),
        (["export", str(run_dir), "--format", "hf", "--gguf-type", "f16"], "with --format gguf"),
        (["export", str(run_dir), "--format", "gguf", "--out", str(tmp_path / "m.bin")], "must be a .gguf file"),
        (["export", str(run_dir), "--format", "safetensors"], "--format takes"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err


def test_a_model_no_family_has_is_refused_by_its_setting(tmp_path: Path) -> None:
    from attnlab.models.gpt import GPT, GPTConfig

    source = _source(tmp_path, "llama")
    tokenizer = open_checkpoint(source).tokenizer()
    for options, words in [({"pos_embed": "learned"}, "pos_embed is 'learned'"),
                           ({"mlp": "gelu"}, "mlp is 'gelu'"),
                           ({"attention": "local", "sliding_window": 4},
                            "computes attention 'local'")]:
        cfg = GPTConfig(vocab_size=tokenizer.vocab_size, embed_dim=32, depth=1, num_heads=2, max_len=64,
                        **{"pos_embed": "rope", "mlp": "swiglu", "norm": "rmsnorm", "bias": False, **options})
        with pytest.raises(InputError, match=words):
            save_hf(GPT(cfg), tokenizer, tmp_path / "out")
        assert not (tmp_path / "out").exists()


def test_a_run_with_a_tokenizer_of_its_own_is_refused(tmp_path: Path, capsys) -> None:
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question. " * 200)
    run_dir = tmp_path / "run"
    assert main(["train", "lm-text", f"data.path={text}", "train.steps=1", "model.name=gpt_tiny",
                 "text.context=16", "train.progress=false", "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["export", str(run_dir), "--format", "gguf"]) == 2
    err = capsys.readouterr().err.strip()
    assert "tokenizer of its own" in err and len(err.splitlines()) == 1


def test_a_folder_in_bfloat16_holds_bfloat16_weights_that_read_back_as_the_rounded_model(tmp_path: Path) -> None:
    from safetensors import safe_open

    source = _source(tmp_path, "llama")
    model, tokenizer = from_hf(source), open_checkpoint(source).tokenizer()
    folder, difference = save_hf(model, tokenizer, tmp_path / "bf16", dtype=torch.bfloat16)
    assert difference <= 1e-4
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


# ---------------------------------------------------------------------------- what --force may replace
@pytest.fixture(scope="module")
def llama_and_tokenizer(tmp_path_factory):
    source = _source(tmp_path_factory.mktemp("source"), "llama")
    return from_hf(source), open_checkpoint(source).tokenizer()


def test_force_replaces_an_export_folder_and_nothing_else(tmp_path: Path, llama_and_tokenizer) -> None:
    model, tokenizer = llama_and_tokenizer
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    with pytest.raises(InputError, match="did not write as an export") as caught:
        save_hf(model, tokenizer, project, overwrite=True)
    assert "\n" not in str(caught.value) and (project / "src" / "main.py").read_text() == "print('mine')\n"

    folder, _ = save_hf(model, tokenizer, tmp_path / "hf")
    assert (folder / ".attnlab-export.json").is_file()
    save_hf(model, tokenizer, folder, overwrite=True)  # an export's folder: replaced
    (folder / "README.md").write_text("notes of mine")
    with pytest.raises(InputError, match=r"holds what the export did not write \(README.md\)"):
        save_hf(model, tokenizer, folder, overwrite=True)
    assert (folder / "README.md").read_text() == "notes of mine"

    link = tmp_path / "link"
    link.symlink_to(project, target_is_directory=True)
    with pytest.raises(InputError, match="is a symbolic link"):
        save_hf(model, tokenizer, link, overwrite=True)
    (tmp_path / "a.gguf").write_bytes(b"not a folder")
    for out in (tmp_path / "a.gguf" / "hf", tmp_path / "a.gguf"):
        with pytest.raises(InputError, match="is a file"):
            save_hf(model, tokenizer, out, overwrite=True)
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(InputError, match="is a folder; this export is one file"):
        save_gguf(model, tokenizer, tmp_path / "dir.gguf", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # nothing left aside


def test_the_command_line_refuses_force_onto_a_folder_of_the_users_before_any_work(tmp_path: Path, capsys) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    # a run that does not exist: --out is checked first
    assert main(["export", str(tmp_path / "no-run"), "--format", "hf", "--out", str(project), "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err and "did not write as an export" in err
    assert (project / "src" / "main.py").is_file()


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_a_full_disk_names_the_file_and_leaves_nothing_behind(tmp_path: Path, kind: str) -> None:
    """Files capped at 100 KB in a child process (RLIMIT_FSIZE: the file system refuses what is past it,
    as a full disk does); the model's weights are past it."""
    source = _source(tmp_path, "llama")
    out = tmp_path / "out" / ("hf" if kind == "hf" else "m.gguf")
    code = (f"import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
            f"from attnlab.formats.hf.load import from_hf\nfrom attnlab.formats.hf.files import open_checkpoint\n"
            f"from attnlab.errors import WriteError\n"
            f"from attnlab.models.{'hf_export import save_hf as save' if kind == 'hf' else 'gguf_writer import save_gguf as save'}\n"
            f"try:\n    save(from_hf({str(source)!r}), open_checkpoint({str(source)!r}).tokenizer(), {str(out)!r})\n"
            f"except WriteError as exc:\n    print('WriteError', exc.filename, '|', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.stdout.startswith("WriteError"), done.stdout + done.stderr
    named = str(out / "model.safetensors") if kind == "hf" else str(out)
    assert f"WriteError {named} | could not write {named}" in done.stdout, done.stdout
    assert "free there" in done.stdout or "File too large" in done.stdout
    assert list((tmp_path / "out").iterdir()) == []  # nothing half-written, nothing aside


def test_the_leftovers_of_a_killed_export_are_removed_by_the_next(tmp_path: Path, llama_and_tokenizer) -> None:
    model, tokenizer = llama_and_tokenizer
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has ended
    (tmp_path / f".hf.staging-{pid}.abc").mkdir()
    (tmp_path / f".hf.staging-{pid}.abc" / "model.safetensors").write_bytes(b"half")
    (tmp_path / f".m.gguf.staging-{pid}.xyz.gguf").write_bytes(b"half")
    save_hf(model, tokenizer, tmp_path / "hf")
    save_gguf(model, tokenizer, tmp_path / "m.gguf", "f32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "m.gguf"]
