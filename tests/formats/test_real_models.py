"""Models that someone trained, from packages of the registry (``make models``;
:mod:`attnlab.formats.packaged`): SmolLM2-135M-Instruct and Gemma 3 270M as GGUF files,
all-MiniLM-L6-v2 as a Hugging Face folder, each against ``transformers``' reading of the same
files: logits over real text, greedy continuations, a chat reply through the file's template,
the loss on Tiny Shakespeare's test part; hidden states and sentence embeddings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnlab.formats.packaged import installed_models, packaged_model

transformers = pytest.importorskip("transformers", reason="transformers reads the same files as the reference")
pytest.importorskip("gguf", reason="the gguf package reads GGUF files (pip install gguf)")

PARAGRAPH = ("Attention is a way for a model to decide which parts of its input matter for each output. In a "
             "Transformer, every token forms a query, a key and a value; the weights of a token's output are the "
             "softmax of its query against all keys, scaled by the square root of the head size. Several heads "
             "look at the sequence in parallel, and their outputs are joined and projected back to the model's "
             "width. Because nothing in this computation depends on distance, positions are added to the tokens, "
             "or rotated into the queries and keys, so that order is not lost.")


def _need(name: str) -> None:
    if name not in installed_models():
        pytest.skip(f"{name} is not installed: make models (its packages, with --no-deps) installs it")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    old = os.environ.get("ATTNLAB_CACHE_DIR")
    os.environ["ATTNLAB_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("ATTNLAB_CACHE_DIR", None)
    else:
        os.environ["ATTNLAB_CACHE_DIR"] = old


def _pair(name: str) -> tuple[object, object, object, object, Path]:
    """attnlab's and transformers' model and tokenizer of the packaged GGUF model ``name``."""
    from attnlab.formats.hf.load import from_hf
    from attnlab.formats.hf.files import open_checkpoint

    torch.set_num_threads(max(torch.get_num_threads(), 1))
    path = packaged_model(name)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                               dtype=torch.float32).eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return from_hf(path), open_checkpoint(path).tokenizer(), theirs, their_tok, path


@pytest.fixture(scope="module")
def smollm2(cache):
    _need("smollm2-135m-instruct")
    return _pair("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def gemma3(cache):
    _need("gemma3-270m")
    return _pair("gemma3-270m")


def _test_text(tokens: int, tokenizer) -> list[int]:
    """The first ``tokens`` tokens of Tiny Shakespeare's test part (its last 55,770 characters)."""
    from attnlab.data.paths import data_dir

    file = data_dir() / "tinyshakespeare" / "input.txt"
    if not file.is_file():
        pytest.skip(f"Tiny Shakespeare is not under {data_dir()} (ATTNLAB_DATA_DIR)")
    text = file.read_text()
    n = len(text)
    cut = int(0.9 * n)
    test = text[cut + (n - cut) // 2:]
    return tokenizer.encode_prompt(test, special_tokens=False)[:tokens]


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> float:
    # float32, as the logits are: in float64 a 1,024-token window of Gemma's 262,144 logits takes 2 GB
    return torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()


# Both read a real file through transformers too (SmolLM2 for most of a minute on the AVX2-only CPU, Gemma 3 for
# more): `make test-long`, which CI runs after `make test`. The tiny random-weight folders of every family
# (tests/formats/test_hf_families.py) check the same code in `make test`.
@pytest.mark.parametrize("which", [pytest.param("smollm2", marks=pytest.mark.long),
                                   pytest.param("gemma3", marks=pytest.mark.long)])
def test_logits_greedy_tokens_and_loss_equal_transformers(request: pytest.FixtureRequest, which: str) -> None:
    ours, tok, theirs, their_tok, _ = request.getfixturevalue(which)
    ids = tok.encode_prompt(PARAGRAPH)
    assert ids == their_tok(PARAGRAPH)["input_ids"]
    x = torch.tensor([ids])
    with torch.no_grad():
        mine, reference = ours(x), theirs(x).logits
    assert (mine - reference).abs().max().item() <= 1e-4
    prompt = torch.tensor([tok.encode_prompt("The capital of France is")])
    with torch.no_grad():
        a = ours.generate(prompt, max_new_tokens=64)[0].tolist()
        b = theirs.generate(prompt, max_new_tokens=64, do_sample=False)[0].tolist()  # to its end-of-text token
    assert a[:len(b)] == b and len(b) > prompt.shape[1] + 8
    window = torch.tensor([_test_text(1024, tok)])
    with torch.no_grad():
        ours_loss, their_loss = _loss(ours(window), window), _loss(theirs(window).logits, window)
    assert abs(ours_loss - their_loss) < 1e-5, (ours_loss, their_loss)
    assert ours_loss < 5.0  # a trained model: far below log(vocabulary) (10.8 for SmolLM2, 12.5 for Gemma)


def test_smollm2_answers_a_chat_through_its_template_as_transformers_does(smollm2) -> None:
    ours, tok, theirs, their_tok, _ = smollm2
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
    rendered = tok.chat_prompt(messages)
    assert rendered == their_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode_prompt(rendered, special_tokens=False)
    theirs_ids = their_tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids == list(theirs_ids)
    x = torch.tensor([ids])
    with torch.no_grad():
        a = ours.generate(x, max_new_tokens=24)[0, len(ids):].tolist()
        b = theirs.generate(x, max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
    assert a[:len(b)] == b
    assert "Paris" in tok.decode(a)


@pytest.mark.long  # its fixture loads transformers' Gemma 3 too
def test_gemma3_has_sliding_and_global_layers_and_no_template_named_in_one_line(gemma3) -> None:
    from attnlab.errors import InputError

    ours, tok, _, _, path = gemma3
    cfg = ours.config
    assert cfg.sliding_window == 512 and cfg.qk_norm and cfg.rope_local_theta == 10000.0
    sliding = [block.attn.sliding_window for block in ours.blocks]
    assert sliding.count(None) == 3 and sliding.count(512) == 15  # every sixth layer global
    with pytest.raises(InputError) as caught:
        tok.chat_prompt([{"role": "user", "content": "hi"}])
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_minilm_hidden_states_and_sentence_embeddings_equal_transformers(cache) -> None:
    _need("all-minilm-l6-v2")
    from attnlab.formats.sentence import SentenceEncoder

    folder = packaged_model("all-minilm-l6-v2")
    encoder = SentenceEncoder.load(folder)
    assert encoder.modes == ("mean",) and encoder.normalize and encoder.max_length == 256
    texts = ["A man is eating food.", "Someone is eating a meal.", "注意力机制让模型关注重要的部分。",
             "The cat sleeps on the warm mat while the rain falls outside, and nobody minds."]
    bert = transformers.BertModel.from_pretrained(folder).eval()
    batch = transformers.AutoTokenizer.from_pretrained(folder)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = bert(**batch).last_hidden_state
        ours = encoder.encoder.forward_features(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    mask = batch["attention_mask"][..., None].float()
    assert ((hidden - ours) * mask).abs().max().item() < 1e-5
    reference = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    vectors = encoder.encode(texts)
    torch.testing.assert_close(vectors, reference, rtol=0, atol=1e-5)
    similar = vectors @ vectors.T
    assert similar[0, 1] > similar[0, 3] + 0.3  # the two sentences about eating are close, as trained


@pytest.mark.slow
def test_smollm2_loss_on_the_whole_test_part_equals_transformers(smollm2) -> None:
    """Opt-in (-m slow, about 3 minutes): Tiny Shakespeare's whole test part in windows of 2,048 tokens."""
    ours, tok, theirs, _, _ = smollm2
    ids = _test_text(10**9, tok)
    totals = {"ours": 0.0, "theirs": 0.0}
    count = 0
    for start in range(0, len(ids) - 1, 2048):
        window = torch.tensor([ids[start:start + 2049]])
        if window.shape[1] < 2:
            break
        with torch.no_grad():
            n = window.shape[1] - 1
            totals["ours"] += _loss(ours(window), window) * n
            totals["theirs"] += _loss(theirs(window).logits, window) * n
        count += n
    assert abs(totals["ours"] - totals["theirs"]) / count < 1e-5, totals
