"""Every key of a config.json is read by its family's conversion, declared irrelevant with a
reason, or accepted only where it switches off what attnlab does not implement: an unknown key
is refused by name, never ignored. Checked on each family's full default configuration as
transformers writes it (every key transformers knows for that model type)."""

import pytest

from attnlab.formats.hf.load import HF_FAMILIES
from attnlab.formats.hf.keys import FAMILY_IRRELEVANT, IRRELEVANT, ONLY_AT, Reading, check_keys, check_switched_off

transformers = pytest.importorskip("transformers")  # a peer, for its default configurations


def _default(family: str) -> dict:
    config = transformers.AutoConfig.for_model(family).to_dict()
    if family.startswith("deepseek"):  # the default is a mixture of experts past layer 3, which is refused:
        config["first_k_dense_replace"] = config["num_hidden_layers"]  # every layer dense, every key kept
    return config


def _convert(family: str, config: dict) -> Reading:
    reading = Reading(config)
    reading.read.add("model_type")
    check_switched_off(reading)
    HF_FAMILIES[family].config(reading, {})
    check_keys(reading, family)
    return reading


@pytest.mark.parametrize("family", list(HF_FAMILIES))
def test_every_key_of_a_familys_full_default_config_is_accounted_for(family):
    reading = _convert(family, _default(family))
    irrelevant = {**IRRELEVANT, **FAMILY_IRRELEVANT.get(family, {})}
    for key in reading:
        assert key in reading.read or key in irrelevant or key in ONLY_AT, key
    assert reading.read & {"vocab_size", "hidden_size", "n_embd", "dim"}  # the conversion read the sizes


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "bert", "vit"])
def test_a_key_nobody_listed_is_refused_by_name(family):
    config = {**_default(family), "attention_temperature_schedule": "cosine"}
    with pytest.raises(ValueError, match=f"config.json: key 'attention_temperature_schedule' of a {family} config "
                                         f"is not known to attnlab"):
        _convert(family, config)


@pytest.mark.parametrize("key, value, what", [("num_local_experts", 8, "a mixture-of-experts MLP"),
                                              ("use_bidirectional_attention", True, "bidirectional attention"),
                                              ("quantization_config", {"quant_method": "gptq"}, "quantized weights")])
def test_a_key_that_asks_for_what_attnlab_lacks_is_refused_and_switched_off_it_passes(key, value, what):
    with pytest.raises(ValueError, match=f"config.json: {key} .* is not supported \\({what}"):
        _convert("llama", {**_default("llama"), key: value})
    _convert("llama", {**_default("llama"), key: ONLY_AT[key][0][0]})


def test_every_declared_reason_is_a_sentence_and_no_key_is_both_read_and_irrelevant():
    for family, table in [("*", IRRELEVANT), *FAMILY_IRRELEVANT.items()]:
        for key, reason in table.items():
            assert isinstance(reason, str) and len(reason) > 15, (family, key)
    read = _convert("llama", _default("llama")).read
    assert not read & set(IRRELEVANT), read & set(IRRELEVANT)  # a key read matters: not "irrelevant"
