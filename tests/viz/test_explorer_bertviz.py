"""The explorer shows what BertViz shows: for a BERT folder and a GPT-2 folder (tiny, random,
built with transformers) and the same text, the weights in the explorer's page equal, to
its quantization step, the weights BertViz's head view is given and writes into its page
(transformers' ``output_attentions``, eager attention). bertviz and transformers are
test-only dependencies."""

import json
import re

import pytest
import torch

from attnlab.viz.explorer import decode_weights, explore

bertviz = pytest.importorskip("bertviz", reason="bertviz absent: pip install -e '.[dev]'")
transformers = pytest.importorskip("transformers", reason="transformers absent: pip install -e '.[dev]'")
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from test_lm_from_folder import model_folder  # noqa: E402  (a tiny random GPT-2 folder with its tokenizer)

STEP = 0.5 / 255 + 1e-6
TEXT = "the quick brown fox jumps over the lazy dog"
CORPUS = ["the quick brown fox jumps over the lazy dog", "a dog sleeps in the sun", "foxes are quick and brown"] * 20


def bertviz_weights(attentions, tokens) -> torch.Tensor:
    """The weights BertViz's head view writes into its page, ``(layers, heads, L, L)``."""
    html = bertviz.head_view(attentions, tokens, html_action="return").data
    params = json.loads(re.search(r"const params = (\{.*?\}); // HACK", html, re.S).group(1))
    [data] = params["attention"]
    return torch.tensor(data["attn"], dtype=torch.float32)


def explorer_weights(group) -> torch.Tensor:
    n, m = len(group["queries"]), len(group["keys"])
    return torch.stack([decode_weights(layer["data"], (layer["heads"], n, m)) for layer in group["layers"]])


def bert_folder(folder):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=80, special_tokens=[
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=3,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(config).eval().save_pretrained(folder)
    return folder, tok


def test_a_bert_folder_shows_the_weights_bertviz_shows(tmp_path):
    folder, tok = bert_folder(tmp_path / "bert")
    [doc] = explore(folder, [TEXT]).data["documents"]
    [group] = doc["groups"]
    enc = tok.encode(TEXT)
    assert group["queries"] == enc.tokens and group["queries"][0] == "[CLS]"
    model = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(torch.tensor([enc.ids]), output_attentions=True)
    theirs = bertviz_weights(out.attentions, enc.tokens)
    ours = explorer_weights(group)
    assert ours.shape == theirs.shape == (3, 4, len(enc.ids), len(enc.ids))
    assert (ours - theirs).abs().max() <= STEP


def test_a_gpt2_folder_shows_the_weights_bertviz_shows(tmp_path):
    folder = model_folder("gpt2", tmp_path / "gpt2")
    [doc] = explore(folder, [TEXT], new_tokens=0).data["documents"]
    [group] = doc["groups"]
    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(TEXT).ids
    model = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    theirs = bertviz_weights(out.attentions, [str(i) for i in ids])
    ours = explorer_weights(group)
    assert ours.shape == theirs.shape == (2, 4, len(ids), len(ids))
    assert (ours - theirs).abs().max() <= STEP
