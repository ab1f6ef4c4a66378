"""Hugging Face encoder folders load into attnlab's own modules: with the same random
weights, attnlab's hidden states, pooled outputs and logits equal transformers' BertModel,
BertForSequenceClassification, RobertaModel, RobertaForSequenceClassification,
DistilBertModel and DistilBertForSequenceClassification to 1e-5 in float32, padding
included; an architecture it does not read, or weights that do not fit, say so in one line."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab.errors import InputError
from attnlab.formats import from_hf
from attnlab.models import TextEncoder

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency (the dev extra)")

VOCAB = 99


def config(family):
    if family == "distilbert":
        return transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=72,
                                             max_position_embeddings=40)
    cls = transformers.BertConfig if family == "bert" else transformers.RobertaConfig
    extra = {"type_vocab_size": 1, "pad_token_id": 1, "max_position_embeddings": 42} if family == "roberta" else {}
    return cls(**{"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "intermediate_size": 72, "max_position_embeddings": 40, "layer_norm_eps": 1e-7, **extra})


MODELS = {
    ("bert", "base"): "BertModel", ("bert", "classifier"): "BertForSequenceClassification",
    ("roberta", "base"): "RobertaModel", ("roberta", "classifier"): "RobertaForSequenceClassification",
    ("distilbert", "base"): "DistilBertModel", ("distilbert", "classifier"): "DistilBertForSequenceClassification",
}


def saved(tmp_path, family, kind, num_labels=3):
    cfg = config(family)
    if kind == "classifier":
        cfg.num_labels = num_labels
    torch.manual_seed(0)
    theirs = getattr(transformers, MODELS[family, kind])(cfg).eval()
    theirs.save_pretrained(tmp_path)
    return theirs


def batch(pad_id):
    """Three right-padded rows of lengths 10, 6 and 1, and the mask (1 = real)."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 10), generator=gen)
    mask = torch.ones(3, 10, dtype=torch.long)
    for row, n in ((1, 6), (2, 1)):
        ids[row, n:], mask[row, n:] = pad_id, 0
    return ids, mask


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_the_encoder_equals_transformers_hidden_states_and_pooled_output(tmp_path, family):
    theirs = saved(tmp_path, family, "base")
    ours = from_hf(tmp_path)
    assert isinstance(ours, TextEncoder) and not ours.training and ours.config.num_classes == 0
    ids, mask = batch(ours.config.pad_token_id)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask)
        hidden = ours.forward_features(ids, mask)
        pooled = ours(ids, mask)
    real = mask.bool()
    assert hidden.shape == (3, 10, 32)
    torch.testing.assert_close(hidden[real], expected.last_hidden_state[real], atol=1e-5, rtol=0)
    if family == "distilbert":  # no pooler: the first token's features
        torch.testing.assert_close(pooled, expected.last_hidden_state[:, 0], atol=1e-5, rtol=0)
    else:
        torch.testing.assert_close(pooled, expected.pooler_output, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_the_sequence_classifier_equals_transformers_logits(tmp_path, family):
    theirs = saved(tmp_path, family, "classifier", num_labels=3)
    ours = from_hf(tmp_path)
    assert ours.config.num_classes == 3
    ids, mask = batch(ours.config.pad_token_id)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask).logits
        logits = ours(ids, mask)
    assert logits.shape == (3, 3)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    padded = torch.cat([ids, torch.full((3, 5), ours.config.pad_token_id)], 1)  # more padding changes nothing
    with torch.no_grad():
        torch.testing.assert_close(ours(padded, torch.cat([mask, torch.zeros(3, 5, dtype=torch.long)], 1)), logits,
                                   atol=1e-5, rtol=0)


def test_bert_token_types_reach_the_embeddings_as_in_transformers(tmp_path):
    theirs = saved(tmp_path, "bert", "classifier")
    ours = from_hf(tmp_path)
    ids, mask = batch(0)
    types = (torch.arange(10) >= 4).long().expand(3, 10)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        torch.testing.assert_close(ours(ids, mask, types), expected, atol=1e-5, rtol=0)
        assert not torch.allclose(ours(ids, mask), expected, atol=1e-4)  # the types do count


def test_an_architecture_it_does_not_read_is_one_line_naming_those_it_does(tmp_path):
    torch.manual_seed(0)
    transformers.BertForMaskedLM(config("bert")).save_pretrained(tmp_path)
    with pytest.raises(InputError, match=r"architecture 'BertForMaskedLM' is not supported; from_hf reads BertModel "
                                         r"and BertForSequenceClassification"):
        from_hf(tmp_path)


def test_weights_that_do_not_fit_name_the_file_and_the_keys(tmp_path):
    saved(tmp_path, "bert", "classifier")
    weights = load_file(tmp_path / "model.safetensors")
    missing = dict(weights)
    missing.pop("bert.encoder.layer.1.attention.self.key.weight")
    save_file(missing, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match=r"the checkpoint lacks encoder.layer.1.attention.self.key.weight"):
        from_hf(tmp_path)
    wrong = dict(weights)
    wrong["bert.encoder.layer.0.intermediate.dense.weight"] = torch.zeros(80, 32)
    save_file(wrong, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match=r"encoder.layers.0.ff.fc1.weight has shape \(80, 32\) in the checkpoint but "
                                         r"\(72, 32\)"):
        from_hf(tmp_path)
    extra = {**weights, "bert.encoder.layer.2.output.dense.weight": torch.zeros(32, 72)}
    save_file(extra, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match=r"weights that a bert model of this config does not have: "
                                         r"encoder.layer.2.output.dense.weight"):
        from_hf(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["hidden_act"] = "relu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=r"activation 'relu' is not supported"):
        from_hf(tmp_path)


@pytest.mark.parametrize("architecture", ["ViTModel", "ViTForImageClassification"])
def test_a_hugging_face_vit_equals_transformers(tmp_path, architecture):
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=72, num_labels=4)
    torch.manual_seed(0)
    theirs = getattr(transformers, architecture)(cfg).eval()
    theirs.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(pixel_values=images)
        got = ours(images)
        features = ours.forward_features(images)
    if architecture == "ViTModel":  # its pooler: tanh(dense(cls)), attnlab's pre_logits
        torch.testing.assert_close(features, expected.last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(got, expected.pooler_output, atol=1e-5, rtol=0)
    else:
        assert got.shape == (2, 4)
        torch.testing.assert_close(got, expected.logits, atol=1e-5, rtol=0)


def test_an_older_folder_with_pytorch_model_bin_loads_safely(tmp_path):
    theirs = saved(tmp_path, "distilbert", "classifier")
    (tmp_path / "model.safetensors").unlink()
    torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
    ours = from_hf(tmp_path)
    ids, mask = batch(0)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask), theirs(input_ids=ids, attention_mask=mask).logits, atol=1e-5,
                                   rtol=0)

    class Payload:  # what a hostile pickle could hold: unpickling it would run code
        def __reduce__(self):
            return (print, ("code ran",))

    torch.save({"weight": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(InputError, match=r"pytorch_model.bin was refused: it holds an object of .*unpickling it could "
                                         r"run code"):
        from_hf(tmp_path)
