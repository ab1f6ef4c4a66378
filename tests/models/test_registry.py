"""The registry of models: an unknown name is told the close ones, and an attention option that
counts positions must fit the model's max_len (whatever model takes the kind)."""

from __future__ import annotations

import pytest
import torch

from attnlab.models import create_model
from attnlab.models.registry import OptionError


def test_unknown_model_suggests_close_names():
    from attnlab import create_model

    with pytest.raises(ValueError, match="unknown model 'transformer_bas'; did you mean transformer_base"):
        create_model("transformer_bas")


# ---------------------------------------------------------------------------- attention options that count positions


MODELS = [("sentiment_transformer_tiny", {"vocab_size": 100}, "SentimentConfig"), ("gpt_tiny", {}, "GPTConfig"),
          ("transformer_tiny", {"src_vocab_size": 50, "tgt_vocab_size": 50}, "TransformerConfig")]


OPTIONS = [("local", "sliding_window"), ("topk", "top_k"), ("lsh", "n_buckets"), ("lsh", "bucket_size"),
           ("nystrom", "num_landmarks"), ("linformer", "seq_len"), ("sparse", "block")]


# (a language model takes no kind that cannot be causal, and sets the local window itself: model.options.sliding_window)
@pytest.mark.parametrize("name, options, config, kind, option", [
    (*m, *o) for m in MODELS for o in OPTIONS
    if not (m[0] == "gpt_tiny" and (o[0] in ("nystrom", "linformer") or o[1] == "sliding_window"))])
def test_an_option_counting_positions_must_fit_the_models_max_len(name, options, config, kind, option):
    max_len = 64
    with pytest.raises(OptionError, match=rf"^{config}.attention_options.{option} must be <= {max_len}, the "
                                          rf"model's max_len .*; got {max_len + 2}$"):
        create_model(name, max_len=max_len, attention=kind, attention_options={option: max_len + 2}, **options)
    with torch.device("meta"):  # the limit itself is fine
        create_model(name, max_len=max_len, attention=kind, attention_options={option: max_len}, **options)


def test_a_text_encoder_refuses_them_too():
    with pytest.raises(OptionError, match=r"TextEncoderConfig.attention_options.top_k must be <= 16, "):
        create_model("bert_tiny", max_len=16, attention="topk", attention_options={"top_k": 17})
