"""model.convert_attention: a pretrained decoder's layers changed before fine-tuning.

Sliding windows: its weights load as they are, the chosen layers see their window alone (the
logits equal the original model's up to the window, and differ past it). Latent attention: the
keys and values factored; at full rank the model equals transformers' Llama whose dropped
rotary pairs no longer turn (MHA2MLA's partial RoPE, the one change a factorisation cannot
undo), below it the error grows as the rank falls. Either way the run loads and decodes without
the file; refusals name the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from gguf_files import byte_level_vocab, write_gguf

transformers = pytest.importorskip("transformers", reason="transformers writes the tiny pretrained model")

from attnlab.cli import main  # noqa: E402
from attnlab.models.convert import ConvertAttention, cache_bytes_per_token, convert_options  # noqa: E402
from attnlab.models.gpt_config import GPTConfig  # noqa: E402
from attnlab.formats.hf.load import from_hf, hf_model_spec  # noqa: E402


def _llama_and_its_file(tmp: Path) -> tuple[object, Path]:
    torch.manual_seed(0)
    vocab = byte_level_vocab()
    config = transformers.LlamaConfig(vocab_size=len(vocab["tokens"]), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # sharper attention than the initial weights give, so that positions matter
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    return model.eval(), write_gguf(tmp / "tiny.gguf", "llama", model, vocab)


def _llama(tmp: Path) -> Path:
    return _llama_and_its_file(tmp)[1]


def _converted_run(tmp: Path, source: Path, convert: str):
    """A run of one step that changes nothing (lr 1e-12) from ``source`` converted by
    ``convert``, loaded back after ``source`` is gone."""
    from attnlab.tasks import load_run

    text = tmp / "text.txt"
    text.write_text(("The cat sat on the mat. The dog sat on the log. " * 40 + "\n") * 10)
    assert main(["train", "lm-text", f"model.checkpoint={source}", f"data.path={text}", "train.steps=1",
                 "train.lr=1e-12", "text.context=32", f"model.convert_attention={convert}", "train.progress=false",
                 "--run-dir", str(tmp / "run")]) == 0
    source.rename(tmp / "gone.gguf")
    return load_run(tmp / "run")


def test_the_chosen_layers_slide_and_the_model_is_the_same_within_the_window(tmp_path: Path) -> None:
    source = _llama(tmp_path)
    run = _converted_run(tmp_path, source, "{window: 8, layers: [1]}")
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
        ([f"model.checkpoint={source}", "model.convert_attention={to: mla}"], "model.convert_attention.to"),
        ([f"model.checkpoint={source}", "model.convert_attention={to: latent, window: 8}"],
         "model.convert_attention.window is an option of to: sliding"),
        ([f"model.checkpoint={source}", "model.convert_attention={kv_rank: 8}"],
         "model.convert_attention.kv_rank is an option of to: latent"),
        ([f"model.checkpoint={source}", "model.convert_attention={to: latent, rope_dim: 4, kv_rank: 25}"],
         "model.convert_attention.kv_rank must be from 1 to 24"),
        ([f"model.checkpoint={source}", "model.convert_attention={to: latent, calibrate: 100000000}"],
         "model.convert_attention.calibrate"),
        ([f"model.checkpoint={source}", "model.convert_attention={to: latent, rope_dim: 3}"],
         "model.convert_attention.rope_dim must be an even number from 2 to 6"),
        ([f"model.checkpoint={source}", "model.convert_attention={to: latent}", "model.lora={rank: 4}",
          "text.context=32"],
         "model.lora cannot adapt model.convert_attention={to: latent}"),
        ([f"model.checkpoint={source}", "model.convert_attention={windw: 8}"], "did you mean"),
    ]:
        assert main(["train", "lm-text", f"data.path={text}", *argv, "--run-dir", str(tmp_path / "r")]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err


def test_a_model_whose_every_layer_slides_exports_as_mistral_and_transformers_reads_it(tmp_path: Path) -> None:
    from attnlab.models.gpt import GPT
    from attnlab.formats.hf.export import save_hf
    from attnlab.formats.hf.files import open_checkpoint

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


def _partial_rope(model, pairs: int):
    """transformers' model with only the first ``pairs`` rotary pairs of each head turning."""
    rotary = model.model.rotary_emb
    rotary.inv_freq[pairs:] = 0.0
    rotary.original_inv_freq[pairs:] = 0.0
    return model


def test_latent_at_full_rank_is_the_model_with_partial_rope_and_the_run_decodes(tmp_path: Path) -> None:
    theirs, source = _llama_and_its_file(tmp_path)
    run = _converted_run(tmp_path, source, "{to: latent, rope_dim: 4, kv_rank: 24}")
    model = run.model.float().eval()
    assert [p.attention for p in model.config.layer_plan()] == ["latent", "latent"]
    ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, original = model(ids), theirs(ids).logits.clone()
        reference = _partial_rope(theirs, 2)(ids).logits  # 2 of each head's 4 rotary pairs still turn
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-4)
    assert (ours - original).abs().max() > 1e-2  # the pairs that stopped turning change the model
    with torch.no_grad():  # the latent cache (a rotary key per key/value group) decodes as the model reads
        generated = model.generate(ids[:1, :5], max_new_tokens=12, temperature=0.0)
        for n in range(5, generated.shape[1]):
            assert model(generated[:, :n])[0, -1].argmax() == generated[0, n]
    assert len(run.predict(["The cat"], max_new_tokens=12)) == 1


def test_below_full_rank_the_error_grows_as_the_rank_falls(tmp_path: Path) -> None:
    from attnlab.models.convert import convert_weights
    from attnlab.models.gpt import GPT

    theirs, source = _llama_and_its_file(tmp_path)
    _, spec = hf_model_spec(source)
    original = from_hf(source)
    reference = None
    ids = torch.randint(0, original.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(2))
    errors = []
    for rank in (24, 16, 8, 2):
        convert = ConvertAttention(to="latent", rope_dim=4, kv_rank=rank)
        model = GPT(GPTConfig(**convert_options(spec, convert))).eval()
        model.load_state_dict(convert_weights(original.state_dict(), spec, convert))
        with torch.no_grad():
            logits = model(ids)
            reference = logits if reference is None else reference
            errors.append(float((logits - reference).abs().max()))
    assert errors[0] == 0 and errors[1] < errors[2] < errors[3], errors
    cfg = GPTConfig(**convert_options(spec, ConvertAttention(to="latent", rope_dim=4, kv_rank=8)))
    # latent of 8 and a rotary key of 4 for each of the 2 groups, against keys and values of 2 heads of 8
    assert cache_bytes_per_token(cfg, 64) == 2 * (8 + 2 * 4) * 2
    assert cache_bytes_per_token(GPTConfig(**spec), 64) == 2 * (2 * 2 * 8) * 2


@pytest.mark.parametrize("family, words", [("qwen2", "biases (attention_bias)"), ("qwen3", "QK-norm")])
def test_latent_refuses_what_it_cannot_factor(tmp_path: Path, family: str, words: str) -> None:
    config_class = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[family]
    config = config_class(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    folder = tmp_path / family
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    _, spec = hf_model_spec(folder)
    with pytest.raises(Exception, match=re.escape(words)):
        convert_options(spec, ConvertAttention(to="latent"))


def test_weighing_the_activations_keeps_what_the_layer_computes_closer(tmp_path: Path) -> None:
    """Below full rank, the factors found with inputs reconstruct the first layer's keys and
    values on those inputs better than the weights' own SVD does (the PCA is the optimum of
    that measure), and at full rank both are exact."""
    from attnlab.models.convert import convert_weights

    _, source = _llama_and_its_file(tmp_path)
    _, spec = hf_model_spec(source)
    original = from_hf(source)
    weights = original.state_dict()
    inputs = [torch.randint(0, original.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(s))
              for s in range(4)]
    seen = []
    hook = original.blocks[0].attn.register_forward_pre_hook(lambda m, a: seen.append(a[0].reshape(-1, 32).double()))
    with torch.no_grad():
        for ids in inputs:
            original(ids)
    hook.remove()
    x = torch.cat(seen)  # what layer 0's attention reads
    nope = [1, 2, 3, 5, 6, 7]  # a head of 8 keeps its first rotary pair (features 0 and 4) with rope_dim 2
    wk = weights["blocks.0.attn.k_proj.weight"].double().view(2, 8, 32)[:, nope].reshape(-1, 32)
    wv = weights["blocks.0.attn.v_proj.weight"].double()
    balance = float((x @ wv.T).norm() / (x @ wk.T).norm())

    def error(rank: int, given: list) -> float:
        out = convert_weights(weights, spec, ConvertAttention(to="latent", rope_dim=2, kv_rank=rank), given)
        down = out["blocks.0.attn.kv_a_proj_with_mqa.weight"].double()[:rank]
        up = out["blocks.0.attn.kv_b_proj.weight"].double().view(4, 6 + 8, rank)[[0, 2]]  # heads 0 and 2: groups 0, 1
        k_up, v_up = up[:, :6].reshape(-1, rank), up[:, 6:].reshape(-1, rank)
        keys, values = x @ (k_up @ down).T - x @ wk.T, x @ (v_up @ down).T - x @ wv.T
        return float((balance * keys).square().sum() + values.square().sum())

    assert error(28, inputs) < 1e-8 and error(28, []) < 1e-8  # full rank: 2 x (2 x 8 - 2) = 28
    alone = ConvertAttention(to="latent", rope_dim=2, kv_rank=4, calibrate=0)  # the inputs are not read
    given, none = convert_weights(weights, spec, alone, inputs), convert_weights(weights, spec, alone)
    assert all(torch.equal(given[k], none[k]) for k in none)
    for rank in (4, 12):
        assert error(rank, inputs) < 0.9 * error(rank, []), rank
