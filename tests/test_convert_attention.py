"""model.convert_attention: a pretrained decoder's layers changed to sliding-window attention
before fine-tuning; its weights load as they are, the chosen layers see their window alone (the
logits equal the original model's up to the window, and differ past it), the run loads and
decodes without the file; refusals name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gguf_files import byte_level_vocab, write_gguf

transformers = pytest.importorskip("transformers", reason="transformers writes the tiny pretrained model")

from attnlab.cli import main  # noqa: E402
from attnlab.models.convert import ConvertAttention, cache_bytes_per_token, convert_options  # noqa: E402
from attnlab.models.gpt_config import GPTConfig  # noqa: E402
from attnlab.models.hf import from_hf, hf_model_spec  # noqa: E402


def _llama(tmp: Path) -> Path:
    torch.manual_seed(0)
    vocab = byte_level_vocab()
    config = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)
    return write_gguf(tmp / "tiny.gguf", "llama", transformers.AutoModelForCausalLM.from_config(config), vocab)


def test_the_chosen_layers_slide_and_the_model_is_the_same_within_the_window(tmp_path: Path) -> None:
    source = _llama(tmp_path)
    text = tmp_path / "text.txt"
    text.write_text(("The cat sat on the mat. The dog sat on the log. " * 40 + "\n") * 10)
    run_dir = tmp_path / "run"
    assert main(["train", "lm-text", f"model.checkpoint={source}", f"data.path={text}", "train.steps=1",
                 "train.lr=1e-12", "text.context=32", "model.convert_attention={window: 8, layers: [1]}",
                 "train.progress=false", "--run-dir", str(run_dir)]) == 0
    from attnlab.tasks import load_run

    source.rename(tmp_path / "gone.gguf")
    run = load_run(run_dir)
    plan = run.model.config.layer_plan()
    assert [p.sliding for p in plan] == [False, True] and run.model.config.sliding_window == 8
    original = from_hf(tmp_path / "gone.gguf")
    ids = torch.randint(0, original.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = run.model.float()(ids), original(ids)
    torch.testing.assert_close(ours[:, :8], theirs[:, :8], rtol=0, atol=1e-4)  # within the window: the same model
    assert (ours[:, 8:] - theirs[:, 8:]).abs().max() > 1e-3  # past it, layer 1 sees 8 positions alone
    assert len(run.predict(["The cat"], max_new_tokens=12)) == 1  # the windowed cache decodes past the window


def test_every_layer_by_default_and_the_cache_it_saves() -> None:
    options = {"vocab_size": 64, "embed_dim": 32, "depth": 3, "num_heads": 4, "num_kv_heads": 2, "max_len": 128,
               "pos_embed": "rope", "norm": "rmsnorm", "mlp": "swiglu", "bias": False}
    converted = convert_options(options, ConvertAttention(window=16))
    cfg = GPTConfig(**converted)
    assert [p.sliding for p in cfg.layer_plan()] == [True, True, True]
    full = cache_bytes_per_token(GPTConfig(**options), 64)
    assert full == 3 * 2 * 2 * 8 * 2  # layers x (keys, values) x kv heads x head size x bytes
    assert cache_bytes_per_token(cfg, 64) == pytest.approx(full * 16 / 64)


def test_refusals_name_the_key(tmp_path: Path, capsys) -> None:
    source = _llama(tmp_path)
    _, spec = hf_model_spec(source)
    for convert, words in [(ConvertAttention(layers=[2]), r"layers\[0\] must be a layer index in \[0, 2\)"),
                           (ConvertAttention(layers=[]), "must be a non-empty list"),
                           (ConvertAttention(window=64), "window must be below the model's 64 positions")]:
        with pytest.raises(Exception, match=words):
            convert_options(spec, convert)
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n" * 100)
    for argv, words in [
        (["model.name=gpt_tiny", "model.convert_attention={window: 8}"], "needs model.checkpoint"),
        ([f"model.checkpoint={source}", "model.convert_attention={to: latent}"], "model.convert_attention.to"),
        ([f"model.checkpoint={source}", "model.convert_attention={windw: 8}"], "did you mean"),
    ]:
        assert main(["train", "lm-text", f"data.path={text}", *argv, "--run-dir", str(tmp_path / "r")]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err


def test_a_model_whose_every_layer_slides_exports_as_mistral_and_transformers_reads_it(tmp_path: Path) -> None:
    from attnlab.models.gpt import GPT
    from attnlab.models.hf_export import save_hf
    from attnlab.models.hf_files import open_checkpoint

    source = _llama(tmp_path)
    original = from_hf(source)
    _, spec = hf_model_spec(source)
    model = GPT(GPTConfig(**convert_options(spec, ConvertAttention(window=8)))).eval()
    model.load_state_dict(original.state_dict())
    folder, difference = save_hf(model, open_checkpoint(source).tokenizer(), tmp_path / "hf")
    assert difference <= 1e-4
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(theirs).__name__ == "MistralForCausalLM" and theirs.config.sliding_window == 8
    ids = torch.randint(0, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, model(ids), rtol=0, atol=1e-4)
