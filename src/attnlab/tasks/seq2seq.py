"""What the sequence-to-sequence tasks (translation, the reversal demo) share: generated
rows without their padding, and the decoder's cross-attention along a hypothesis."""

from __future__ import annotations

import torch
from torch import nn

from ..attention.capture import capture_attention
from .views import AlignmentAttention

__all__ = ["strip_padding", "seq2seq_alignment"]


def strip_padding(hyp: list[int], pad_id: int) -> list[int]:
    """A generated row without its right padding (a batch pads its shorter rows)."""
    while len(hyp) > 1 and hyp[-1] == pad_id:
        hyp = hyp[:-1]
    return hyp


def seq2seq_alignment(model: nn.Module, src_ids: list[int], src_tokens: list[str], hyp: list[int],
                      tgt_tokens: list[str], title: str) -> AlignmentAttention:
    """The decoder's cross-attention for the hypothesis ``hyp`` of source ``src_ids``.

    The chosen hypothesis is teacher-forced: row t is the step that produced ``hyp[t]``.
    (Beam search reorders and drops rows between steps, so its per-step weights follow no
    single hypothesis; this pass gives the weights that the cached steps computed.)"""
    cfg, device = model.config, next(model.parameters()).device
    src = torch.tensor([src_ids], device=device)
    tgt_in = torch.tensor([[cfg.bos_id] + hyp[:-1]], device=device)
    # the modules the model family names; a recurrent decoder's attention records one call per step
    with capture_attention(model, include=type(model).alignment_modules, cpu=True) as maps:
        memory, memory_pad = model.encode(src)
        model.decode(tgt_in, memory, memory_pad)
    return AlignmentAttention(title, src_tokens, tgt_tokens,
                              [torch.cat(calls, dim=2)[0] for calls in maps.values() if calls])
