"""What the sequence-to-sequence tasks (translation, the reversal demo) share: generated
rows without their padding, and the decoder's cross-attention along a hypothesis."""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from ..attention.capture import attention_modules, capture_attention
from ..run.views import AlignmentAttention

__all__ = ["strip_padding", "seq2seq_alignment", "SEQ2SEQ_KEY_HELP"]

# The keys whose ModelConfig help speaks of a classifier, as they read for an encoder-decoder
# (Task.key_help): there is no head to train apart.
SEQ2SEQ_KEY_HELP = {
    "model.freeze_backbone": "refused here: an encoder-decoder has no output layer apart from the rest to train "
                             "alone (model.lora trains adapters alone)",
    "model.backbone_lr_scale": "refused here: an encoder-decoder has no output layer apart from the rest to learn "
                               "at a rate of its own",
    "model.lora": "with checkpoint: low-rank adapters train, nothing else",
}


def strip_padding(hyp: list[int], pad_id: int) -> list[int]:
    """A generated row without its right padding (a batch pads its shorter rows)."""
    while len(hyp) > 1 and hyp[-1] == pad_id:
        hyp = hyp[:-1]
    return hyp


def seq2seq_alignment(model: nn.Module, src_ids: list[int], src_tokens: list[str], hyp: list[int],
                      tgt_tokens: list[str], title: str) -> AlignmentAttention:
    """The decoder's cross-attention for the hypothesis ``hyp`` of source ``src_ids``, and
    the encoder's and the decoder's self-attention on the same pass.

    The chosen hypothesis is teacher-forced: row t is the step that produced ``hyp[t]``.
    (Beam search reorders and drops rows between steps, so its per-step weights follow no
    single hypothesis; this pass gives the weights that the cached steps computed.)"""
    cfg, device = model.config, next(model.parameters()).device
    src = torch.tensor([src_ids], device=device)
    tgt_in = torch.tensor([[cfg.bos_id] + hyp[:-1]], device=device)
    cross = type(model).alignment_modules  # the modules the model family names
    recordable = [name for name, _ in attention_modules(model)[0]] or cross  # none: capture says so
    with capture_attention(model, include=recordable, cpu=True) as maps:
        memory, memory_pad = model.encode(src)
        encoder = {name: list(calls) for name, calls in maps.items() if calls}
        model.decode(tgt_in, memory, memory_pad)
    # a recurrent decoder's attention records one call per step: joined along the queries
    joined = {name: torch.cat(calls[len(encoder.get(name, [])):], dim=2)[0] for name, calls in maps.items()
              if len(calls) > len(encoder.get(name, []))}
    is_cross = {name: fnmatch.fnmatchcase(name, cross) for name in joined}
    return AlignmentAttention(title, src_tokens, tgt_tokens, [w for name, w in joined.items() if is_cross[name]],
                              source_layers=[(name, calls[0][0]) for name, calls in encoder.items()],
                              target_layers=[(name, w) for name, w in joined.items() if not is_cross[name]],
                              layer_names=[name for name in joined if is_cross[name]])
