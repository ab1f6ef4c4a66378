"""Token ids outside a model's vocabulary are refused by the argument's name (input_ids, src, tgt,
token_type_ids) with the vocabulary's size, in evaluation and in training, at the cost of one
reduction."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.errors import InputError


@pytest.mark.parametrize("name, options, call, message", [
    ("llama_tiny", {}, lambda m: m(torch.tensor([[1, 2, 256]])),
     r"input_ids must be token ids in \[0, 256\) \(vocab_size=256, the model's vocabulary\); got 256"),
    ("gpt_tiny", {"vocab_size": 100}, lambda m: m(torch.tensor([[1, -3, 2]])),
     r"input_ids must be token ids in \[0, 100\) \(vocab_size=100, the model's vocabulary\); got -3"),
    ("bert_tiny", {"num_classes": 2, "vocab_size": 1000}, lambda m: m(torch.tensor([[1, 5000, 3]])),
     r"input_ids must be token ids in \[0, 1000\) \(vocab_size=1000, .*got 5000"),
    ("bert_tiny", {"num_classes": 2, "vocab_size": 1000},
     lambda m: m(torch.tensor([[1, 2, 3]]), token_type_ids=torch.tensor([[0, 1, 2]])),
     r"token_type_ids must be token ids in \[0, 2\) \(type_vocab_size=2, .*got 2"),
    ("sentiment_transformer_small", {"vocab_size": 100}, lambda m: m(torch.tensor([[1, 2, 100]])),
     r"input_ids must be token ids in \[0, 100\) \(vocab_size=100, .*got 100"),
    ("transformer_tiny", {"src_vocab_size": 50, "tgt_vocab_size": 60, "share_embeddings": False},
     lambda m: m(torch.tensor([[5, 50]]), torch.tensor([[1, 2]])),
     r"src must be token ids in \[0, 50\) \(src_vocab_size=50, .*got 50"),
    ("transformer_tiny", {"src_vocab_size": 50, "tgt_vocab_size": 60, "share_embeddings": False},
     lambda m: m(torch.tensor([[5, 7]]), torch.tensor([[1, 60]])),
     r"tgt must be token ids in \[0, 60\) \(tgt_vocab_size=60, .*got 60"),
    ("gru_attention_tiny", {}, lambda m: m.generate(torch.tensor([[5, 1000]])),
     r"src must be token ids in \[0, 1000\) \(src_vocab_size=1000, .*got 1000"),
])
@pytest.mark.parametrize("grad", [False, True])
def test_token_ids_outside_the_vocabulary_are_named_with_the_vocabulary_size(name, options, call, message, grad):
    model = attnlab.create_model(name, **options).train(grad)
    with torch.set_grad_enabled(grad), pytest.raises(InputError, match=message):  # on CPU, training steps too
        call(model)


def test_the_token_id_check_costs_one_reduction_not_a_copy():
    from attnlab.models.token_ids import check_token_ids

    check_token_ids(torch.randint(0, 10, (4, 7)), 10)  # in range: nothing
    check_token_ids(torch.zeros(0, 3, dtype=torch.long), 1)  # empty: nothing to check
    check_token_ids(torch.full((2, 2), 99, device="meta"), 10)  # no values to read: not checked
    with pytest.raises(InputError, match=r"ids must be token ids in \[0, 10\) .*got 10"):
        check_token_ids(torch.tensor([[0, 10]]), 10, "ids")
