"""The attention explorer's data (``attnlab explore``, :func:`attnlab.viz.explore`): weights
stored 8 bits a value within half a step of capture_attention's, per-head figures, a
language model's continuation read through its cache, every kind of target (runs of each
task, Hugging Face folders, a module), and bad input as one line with exit status 2.
The page in a real browser: tests/viz/test_explorer_browser.py."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.attention.capture import capture_attention
from attnlab.cli import main
from attnlab.errors import InputError
from attnlab.models.gpt import GPT
from attnlab.tasks.language_modeling import generation_attention
from attnlab.viz.explorer import decode_weights, encode_weights, explore
from attnlab.viz.explorer.documents import PROFILE_BINS, head_stats

from test_language_modeling import lm_run  # noqa: F401  (the task's tests' tiny run: trained once per module)
from test_visualize import image_files, image_model, make_run, sentiment_model, translation_model  # noqa: F401

STEP = 0.5 / 255 + 1e-6  # half a quantization step


def page_data(path: Path) -> dict:
    """The data an explorer page holds (its JSON element), as the browser reads it."""
    html = path.read_text(encoding="utf-8")
    match = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', html, re.S)
    assert match, "the page holds no data element"
    return json.loads(match.group(1))


def layer_weights(group: dict, index: int) -> torch.Tensor:
    layer = group["layers"][index]
    return decode_weights(layer["data"], (layer["heads"], len(group["queries"]), len(group["keys"])))


# ----------------------------------------------------------------------------- the stored weights
def test_weights_are_stored_8_bits_a_value_within_half_a_step():
    w = torch.randn(3, 7, 9).softmax(-1)
    text = encode_weights(w)
    back = decode_weights(text, (3, 7, 9))
    assert (back - w).abs().max() <= STEP
    assert torch.equal((back * 255).round(), (w * 255).round())
    zeros = torch.zeros(12, 512, 512)
    zeros[..., 0] = 1.0
    assert len(encode_weights(zeros)) < 12 * 512 * 512 / 100  # mostly zeros: compressed away


def _heads(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal maps ``(n, n)`` of a previous-token head, a sink (everything on position 0) and a
    broad head (an even spread over what each query sees)."""
    prev = torch.zeros(n, n)
    prev[0, 0] = 1
    prev[torch.arange(1, n), torch.arange(n - 1)] = 1
    sink = torch.zeros(n, n)
    sink[:, 0] = 1
    broad = torch.tril(torch.ones(n, n))
    return prev, sink, broad / broad.sum(-1, keepdim=True)


def _induction() -> tuple[list[str], torch.Tensor]:
    """An induction head on "a b c a b c": the second "a" looks at the "b" after the first, and so on."""
    ind = torch.eye(6)
    for i, j in ((3, 1), (4, 2), (5, 3)):
        ind[i] = 0
        ind[i, j] = 1
    return list("abcabc"), ind


def test_head_figures_single_out_previous_token_sink_and_broad_heads():
    n = 8
    prev, sink, broad = _heads(n)
    stats = head_stats([torch.stack([prev, sink, broad])])
    assert stats["previous"][0][:2] == [1.0, pytest.approx(1 / (n - 1), abs=1e-5)]
    assert stats["first"][0][:2] == [pytest.approx(1 / (n - 1), abs=1e-5), 1.0]
    assert stats["entropy"][0][0] == 0 and stats["entropy"][0][1] == 0 and stats["entropy"][0][2] > 1.0
    assert stats["distance"][0][0] == pytest.approx((n - 1) / n, abs=1e-4)
    assert stats["distance"][0][1] == pytest.approx(sum(range(n)) / n, abs=1e-4)
    profile = dict(zip(PROFILE_BINS, stats["profile"][0][0]))
    assert profile["1"] == pytest.approx((n - 1) / n, abs=1e-4) and profile["0"] == pytest.approx(1 / n, abs=1e-4)
    assert all(sum(p) == pytest.approx(1, abs=1e-3) for p in stats["profile"][0])
    assert stats["induction"] == [[None, None, None]]  # no tokens, no repeats to look for
    labels, ind = _induction()
    [[copying, diagonal]] = head_stats([torch.stack([ind, torch.eye(6)])], labels)["induction"]
    assert copying == 1.0 and diagonal == 0.0
    both_ways = torch.full((1, 4, 4), 0.25)  # an encoder's head looks ahead as much as back
    assert dict(zip(PROFILE_BINS, head_stats([both_ways])["profile"][0][0]))["ahead"] == pytest.approx(6 / 16)


def test_heads_are_labelled_by_the_role_whose_figure_passes_its_threshold():
    n = 8
    prev, sink, broad = _heads(n)
    half = 0.45 * prev + 0.55 * torch.eye(n)  # 0.45 on the previous token: below 0.5
    assert head_stats([torch.stack([prev, sink, broad, half])])["roles"] == [
        ["previous-token", "first-token", None, None]]
    labels, ind = _induction()
    assert head_stats([torch.stack([ind, torch.eye(6)])], labels)["roles"] == [["induction", None]]


# ----------------------------------------------------------------------------- a language model's continuation
@pytest.mark.parametrize("options", [{}, {"sliding_window": 4}, {"num_kv_heads": 1, "pos_embed": "rope"}])
def test_each_generated_token_row_is_its_cached_steps_weights_equal_to_one_pass(options):
    torch.manual_seed(0)
    model = GPT(vocab_size=40, max_len=64, embed_dim=32, depth=2, num_heads=4, **options).eval()
    view = generation_attention(model, [3, 1, 4, 1, 5], str, new_tokens=7)
    assert view.cached and view.prompt_len == 5 and len(view.tokens) == 12 and len(view.top) == 12
    ids = [int(t) for t in view.tokens]
    with capture_attention(model) as maps, torch.no_grad():
        logits = model(torch.tensor([ids]))[0]
    for (name, w), calls in zip(view.layers, maps.values()):
        assert torch.allclose(w, calls[0][0], atol=1e-6), name
    for i in range(5, 12):  # greedy: each chosen token is the argmax after the one before
        assert ids[i] == int(logits[i - 1].argmax())
    for row, lg in zip(view.top, logits):
        p = lg.softmax(-1)
        assert row[0][0] == str(int(p.argmax())) and row[0][1] == pytest.approx(float(p.max()), abs=1e-5)
        assert [q for _, q in row] == sorted((q for _, q in row), reverse=True)


def test_a_continuation_too_long_for_the_memory_is_refused_before_it_runs(monkeypatch):
    monkeypatch.setattr("attnlab.memory.available_memory", lambda: 10 * 2**20)
    model = GPT(vocab_size=40, max_len=512, embed_dim=32, depth=2, num_heads=4).eval()
    with pytest.raises(InputError, match=r"the attention of 500 positions \(400 prompt tokens and 100 new; 8 heads in "
                                         r"all\) needs .* available"):
        generation_attention(model, [1] * 400, str, new_tokens=100)


def test_a_module_shows_each_group_of_maps_and_refuses_a_model_without_attention():
    torch.manual_seed(0)
    model = GPT(vocab_size=30, max_len=32, embed_dim=16, depth=3, num_heads=2)
    ids = torch.randint(0, 30, (2, 6))
    page = explore(model, ids, tokens=[list("abcdef"), list("ghijkl")])
    assert model.training  # put back as it was
    docs = page.data["documents"]
    assert len(docs) == 2 and docs[1]["groups"][0]["queries"] == list("ghijkl")
    frame = page._repr_html_()  # a notebook shows the page in a frame of its own
    assert frame.startswith('<iframe srcdoc="&lt;!DOCTYPE html&gt;') and 'sandbox="allow-scripts"' in frame
    model.eval()
    with capture_attention(model) as maps:
        model(ids)
    for i, calls in enumerate(maps.values()):
        assert (layer_weights(docs[1]["groups"][0], i) - calls[0][1]).abs().max() <= STEP
    with pytest.raises(InputError, match="records no attention: it has no attention module"):
        explore(torch.nn.Linear(3, 3), torch.zeros(1, 3))
    with pytest.raises(InputError, match="tokens must hold one list of labels per input row"):
        explore(model, ids, tokens=[list("abcdef")])


def test_the_page_opens_in_english_or_chinese_and_refuses_another_language(capsys):
    from attnlab.viz.explorer.page import render_page

    torch.manual_seed(0)
    model = GPT(vocab_size=30, max_len=32, embed_dim=16, depth=1, num_heads=2).eval()
    ids = torch.randint(0, 30, (1, 6))
    assert explore(model, ids).data["lang"] == "en"
    page = explore(model, ids, lang="zh")
    assert page.data["lang"] == "zh" and page.data["format"] == "attnlab-explorer/1"
    with pytest.raises(InputError, match=r"^lang must be one of 'en', 'zh'; got 'fr'$"):
        explore(model, ids, lang="fr")
    assert main(["explore", "no-such-run", "--lang", "fr"]) == 2
    assert "--lang: invalid choice: 'fr' (choose from 'en', 'zh')" in capsys.readouterr().err
    # the page's own switch, shown unless a page that embeds the explorer switches the language itself
    switch = r'<button type="button" id="lang"[^>]*>'
    assert " hidden" not in re.search(switch, page.html()).group(0)
    assert " hidden" in re.search(switch, render_page(page.data, language_switch=False)).group(0)


# ----------------------------------------------------------------------------- runs of each task
def test_explore_a_language_model_run_writes_its_page_beside_the_report(lm_run, capsys):  # noqa: F811
    out = lm_run / "explore.html"
    out.unlink(missing_ok=True)
    assert main(["explore", str(lm_run), "the cat", "--new-tokens", "5"]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}" in said and out.is_file()
    data = page_data(out)
    [doc] = data["documents"]
    assert doc["kind"] == "lm" and doc["lm"]["prompt_len"] == len("the cat")
    group = doc["groups"][0]
    assert group["queries"][: len("the cat")] == list("the cat") and len(group["queries"]) == len("the cat") + 5
    assert group["causal"] and len(doc["lm"]["top"]) == len(group["queries"])
    # the page holds the model's weights within half a step
    from attnlab.tasks import load_run
    run = load_run(lm_run)
    ids = [run.tokenizer.encode_prompt(t)[0] for t in group["queries"]]
    with capture_attention(run.model) as maps:
        run.model(torch.tensor([ids]))
    for i, calls in enumerate(maps.values()):
        assert (layer_weights(group, i) - calls[0][0]).abs().max() <= STEP
    # a page that exists is refused without --force, before any work; --force replaces it
    before = out.stat().st_mtime_ns
    assert main(["explore", str(lm_run), "the dog"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists; pass --force" in err and out.stat().st_mtime_ns == before
    assert main(["explore", str(lm_run), "the dog", "--force", "--new-tokens", "0"]) == 0
    assert page_data(out)["documents"][0]["groups"][0]["queries"] == list("the dog")


def test_explore_runs_of_translation_text_and_image_tasks(tmp_path, image_files):  # noqa: F811
    tr = ["model.name=transformer_tiny", "text.joint_vocab=true", "text.max_length=32", "translate.num_beams=2",
          "model.options={embed_dim: 32, num_heads: 4, encoder_depth: 1, decoder_depth: 2, mlp_ratio: 2.0}"]
    run = make_run(tmp_path / "mt", "translate-multi30k", tr, translation_model)
    [doc] = explore(run, ["Ein Mann fährt Fahrrad."]).data["documents"]
    assert doc["kind"] == "translation"
    names = [g["name"] for g in doc["groups"]]
    assert names == ["cross-attention", "encoder self-attention", "decoder self-attention"]
    cross, enc, dec = doc["groups"]
    assert len(cross["layers"]) == 2 and len(enc["layers"]) == 1 and len(dec["layers"]) == 2
    assert cross["keys"] == enc["queries"] and cross["queries"] == dec["keys"] and dec["causal"]
    assert cross["stats"] is None and enc["stats"] is not None

    sa = ["model.name=sentiment_transformer_tiny", "model.options={depth: 2}", "text.max_length=32"]
    run = make_run(tmp_path / "mr", "sentiment-mr", sa, sentiment_model)
    docs = explore(run, ["a gorgeous , witty movie .", "a dull mess ."]).data["documents"]
    assert [d["kind"] for d in docs] == ["text", "text"] and "gorgeous" in docs[0]["groups"][0]["queries"]

    run = make_run(tmp_path / "vit", "vit-digits", ["model.options.depth=2"], image_model)
    docs = explore(run, max_inputs=1).data["documents"]
    [doc] = docs
    assert doc["kind"] == "image" and doc["image"]["src"].startswith("data:image/png;base64,")
    rows, cols = doc["image"]["grid"]
    assert len(doc["groups"][0]["queries"]) == doc["image"]["prefix"] + rows * cols
    assert doc["image"]["rollout"]

    bot = "model.options={layers: [1, 1, 1, 2], widths: [8, 8, 8, 8], stem_width: 8}"
    run = make_run(tmp_path / "bot", "botnet-cifar10", [bot], image_model)
    [doc] = explore(run, image_files[:1]).data["documents"]
    assert doc["kind"] == "image" and len(doc["groups"]) == 2 and doc["image"]["prefix"] == 0


def test_a_kind_that_forms_no_weights_is_named_in_the_page(tmp_path):
    # one layer of linear attention beside exact ones: the page says which layer is not shown
    torch.manual_seed(0)
    model = GPT(vocab_size=30, max_len=32, embed_dim=16, depth=2, num_heads=2, layer_types=["full", "linear"])
    page = explore(model, torch.randint(0, 30, (1, 5)))
    assert any("blocks.1.attn" in n and "forms no weight matrix" in n for n in page.data["notes"])
    assert len(page.data["documents"][0]["groups"][0]["layers"]) == 1


# ----------------------------------------------------------------------------- bad input
def test_bad_targets_and_inputs_are_one_line_with_exit_status_2(lm_run, tmp_path, capsys):  # noqa: F811
    def refused(*argv):
        assert main(["explore", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        return err

    assert "does not exist" in refused(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    assert "neither a run directory" in refused(str(tmp_path / "empty"), "--out", str(tmp_path / "e.html"))
    assert "empty text" in refused(str(lm_run), "   ", "--out", str(tmp_path / "a.html"))
    assert "--new-tokens" in refused(str(lm_run), "x", "--new-tokens", "-1")
    run = make_run(tmp_path / "lin", "vit-digits", ["model.options.depth=1", "model.options.attention=linear"],
                   image_model)
    assert "never forms an n x n weight matrix" in refused(str(run), "--out", str(tmp_path / "l.html"))
    vit = make_run(tmp_path / "vit", "vit-digits", ["model.options.depth=1"], image_model)
    assert "'a text' does not exist" in refused(str(vit), "a text", "--out", str(tmp_path / "v.html"))
    assert "is a folder" in refused(str(lm_run), "x", "--out", str(tmp_path))
    assert not list(tmp_path.glob("*.html"))


def test_hugging_face_vit_and_encoder_folders(tmp_path, image_files, capsys):  # noqa: F811
    transformers = pytest.importorskip("transformers", reason="transformers absent: pip install -e '.[dev]'")
    vit = tmp_path / "vit"
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64)
    torch.manual_seed(0)
    transformers.ViTModel(config).eval().save_pretrained(vit)
    [doc] = explore(vit, image_files[:1]).data["documents"]
    assert doc["kind"] == "image" and doc["image"]["grid"] == [4, 4] and doc["image"]["prefix"] == 1
    assert len(doc["groups"][0]["layers"]) == 2 and doc["groups"][0]["queries"][0] == "[CLS]"
    assert main(["explore", str(vit)]) == 2  # a folder's inputs must be given
    assert "INPUT must be given" in capsys.readouterr().err
    bert = tmp_path / "bert"
    transformers.BertModel(transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=32)).save_pretrained(bert)
    capsys.readouterr()
    assert main(["explore", str(bert), "hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no tokenizer.json" in err


def test_a_character_over_several_tokens_is_shown_on_each_of_them():
    from attnlab.data.tokenizers.lm import ByteTokenizer
    from attnlab.run.views import token_labels

    tok = ByteTokenizer()
    text = "a注意 🙂!"
    labels = token_labels(tok.decode, tok.encode(text))
    assert labels == ["a", "注 1/3", "注 2/3", "注 3/3", "意 1/3", "意 2/3", "意 3/3", " ", "🙂 1/4", "🙂 2/4", "🙂 3/4",
                      "🙂 4/4", "!"]
    assert "\ufffd" not in "".join(labels)
    # a text that ends inside a character: its parts of an unknown character
    assert token_labels(tok.decode, tok.encode("注")[:2]) == ["\ufffd 1/2", "\ufffd 2/2"]


def test_a_special_token_is_shown_as_its_vocabulary_spells_it():
    from attnlab.data.tokenizers.lm import BPETokenizer, ByteTokenizer
    from attnlab.run.views import token_labels

    tok = BPETokenizer.train(["hello world, hello there"] * 4, vocab_size=270)
    ids = [tok.eos_id, *tok.encode("hello")]
    assert token_labels(tok.decode, ids)[0] == ""  # decoding drops it
    labels = token_labels(tok.decode, ids, tok.spelling)
    assert labels[0] == "<|endoftext|>" and "".join(labels[1:]) == "hello"
    assert ByteTokenizer().spelling(65) is None  # a vocabulary without spellings
