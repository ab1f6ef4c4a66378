"""A pretrained checkpoint's own tokenizer (``tokenizer.json``: BERT's WordPiece with
lower-casing and accent stripping, RoBERTa's byte-level BPE) is used as it is: attnlab's
ids equal ``transformers``' tokenizer's for awkward strings (accents, Chinese, emoji, very
long words, blank text), truncated at the checkpoint's ``model_max_length``."""

import pytest
from tokenizers import processors
from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer

from attnlab.data.tokenizers.text import TextTokenizer
from attnlab.errors import InputError

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

CORPUS = ["The café served naïve résumés.", "中文分词测试一下", "emoji 😀👍🏽 time", "Hello, world!!"] * 20
AWKWARD = ["Café NAÏVE résumé", "中文分词", "emoji 😀👍🏽", "x" * 300, "supercalifragilisticexpialidocious" * 3, "",
           "  spaces\tand\nnewlines  ", "Hello,world!!", "Ünïcödé ﬁ ligature ①", "zzzz qqqq", "the café served " * 10]


def wordpiece_folder(folder):
    tok = BertWordPieceTokenizer(lowercase=True, strip_accents=True, handle_chinese_chars=True)
    tok.train_from_iterator(CORPUS, vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                            show_progress=False)
    transformers.BertTokenizerFast(tokenizer_object=tok._tokenizer, model_max_length=16).save_pretrained(folder)
    return folder


def byte_bpe_folder(folder):
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(CORPUS, vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                            show_progress=False)
    tok._tokenizer.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                                 ("<s>", tok.token_to_id("<s>")))
    transformers.RobertaTokenizerFast(tokenizer_object=tok._tokenizer, model_max_length=16).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("make", [wordpiece_folder, byte_bpe_folder], ids=["bert-wordpiece", "roberta-byte-bpe"])
def test_ids_equal_transformers_tokenizer_for_awkward_strings(tmp_path, make):
    folder = make(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = TextTokenizer.load(folder)
    assert ours.max_length == 16  # the checkpoint's model_max_length
    expected = theirs(AWKWARD, truncation=True, max_length=16, padding=True, return_tensors="pt")
    with pytest.warns(UserWarning, match="were longer than max_length=16 tokens and were truncated"):
        got = ours.encode(AWKWARD, ours.max_length)
    assert got["input_ids"].tolist() == expected["input_ids"].tolist()
    assert got["attention_mask"].tolist() == expected["attention_mask"].tolist()
    assert ours.pad_id == theirs.pad_token_id and ours.cls_id == theirs.cls_token_id


def test_a_damaged_tokenizer_config_is_one_clear_error(tmp_path):
    folder = wordpiece_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError, match=r"tokenizer_config.json is not valid JSON \(line 1, column 2"):
        TextTokenizer.load(folder)
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 1e30}', encoding="utf-8")
    assert TextTokenizer.load(folder).max_length is None  # Hugging Face's "no limit"
