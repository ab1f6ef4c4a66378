"""What the tests of the attention kinds of 2024-2026 share: a whole model read through ``from_hf``
gives the logits and the greedy tokens of ``transformers`` (its reference, built from the same tiny
random configuration) on padded batches.

Imported by name (``from transformers_parity import logits_equal_theirs``): tests/conftest.py puts
each folder of tests/ on sys.path."""

import torch

from attnlab.formats import from_hf

VOCAB = 97


def logits_equal_theirs(theirs, folder, length=20, pad_from=13):
    """attnlab's logits of a batch whose second row is right-padded equal transformers' to 1e-5."""
    ours = from_hf(folder)
    ids = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, pad_from:] = 0
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        got = ours(ids, padding_mask=mask == 0)
    real = mask.bool()
    assert (got[real] - expected[real]).abs().max().item() < 1e-5
    return ours


def greedy_equals_theirs(theirs, folder, new=12):
    """Greedy generation over a left-padded prompt gives transformers' tokens."""
    ours = from_hf(folder)
    ids = torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :3] = 0
    ids = ids.masked_fill(mask == 0, 0)
    expected = theirs.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, new, padding_mask=mask == 0), expected)
