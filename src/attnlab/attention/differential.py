"""Differential attention (Ye et al., 2024, "Differential Transformer"), the ``"differential"``
kind, built on the exact module (:class:`~attnlab.attention.exact.GroupedQueryAttention`): it
keeps its projections, positions, windows and cache and changes only the step from queries,
keys and values to the heads' outputs.

Differential attention, as Hugging Face's DiffLlama lays it out: the ``H`` query heads form
``H / 2`` pairs (head ``j`` and head ``j + H/2``); each pair's value is ``2D`` wide, the
key/value head of the first half of the key/value heads beside the matching one of the
second half. A pair's output is

    (softmax(q_j k^T) - lambda * softmax(q_{j+H/2} k^T)) [v_a, v_b]

normalized by an RMSNorm over its ``2D`` values without a weight and scaled by
``1 - lambda_init``. ``lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) +
lambda_init`` is learned (four vectors of ``D`` per layer, shared by the heads) and
``lambda_init = 0.8 - 0.6 exp(-0.3 layer)`` depends on the layer's depth. The difference of
two maps cancels what both give to irrelevant keys (the paper's attention noise). The weights
it forms are the difference itself, ``(B, H/2, Lq, Lk)``: rows sum to ``1 - lambda``, and
entries may be negative.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError
from ..moved import former_names
from .functional import scaled_dot_product_attention
from .contract import Option
from .exact import EXACT_OPTIONS, GroupedQueryAttention
from .registry import check_attention_options, register_attention

__all__ = ["DifferentialAttention", "DIFFERENTIAL_OPTIONS", "default_lambda_init"]


def default_lambda_init(layer_index: int) -> float:
    """The paper's ``lambda_init`` of layer ``layer_index`` (0 for the first)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


DIFFERENTIAL_OPTIONS = EXACT_OPTIONS.extend(
    Option("layer_index", int, 0, "the layer's depth, 0 first, which sets lambda_init (the decoder gives it)", low=0,
           from_model="layer_index"),
    Option("lambda_init", float, None, "lambda's constant part (None: 0.8 - 0.6 exp(-0.3 layer_index))"),
    Option("lambda_std", float, 0.1, "the spread of the lambda vectors' initialisation", low=0),
    Option("norm_eps", float, 1e-5, "the eps of the heads' RMSNorm (the decoder gives its own)", low=0, low_open=True,
           from_model="norm_eps"),
    drop=("softcap", "sinks", "output_gate", "kernel"))  # kernel: its own _attend pairs the heads, never flex


@register_attention("differential", options=DIFFERENTIAL_OPTIONS, forms_weights=True, keeps_cache=True, streams=True,
                    decode_step=True, takes_positions=True, causal=True, padding=True, lora_roles=("attention",),
                    summary="differential attention: the difference of two softmax maps cancels common-mode noise")
class DifferentialAttention(GroupedQueryAttention):
    """Differential attention (see the module docstring), with the exact kind's options and
    ``layer_index`` (the layer's depth, 0 first, which sets ``lambda_init``; the decoder passes
    it), ``lambda_init`` (instead of the depth's), ``lambda_std`` (the spread of the lambda
    vectors' initialisation, 0.1) and ``norm_eps`` (of the heads' RMSNorm). ``H`` and ``Hkv``
    must be even. ``dropout`` drops each head's map before the difference, one mask for both
    halves of its value (as DiffLlama's one-call form did; transformers 5 refuses dropout, as
    its two calls cannot share a mask; the paper says nothing of it)."""

    def __init__(self, embed_dim: int, num_heads: int, *, layer_index: int = 0, lambda_init: float | None = None,
                 lambda_std: float = 0.1, norm_eps: float = 1e-5, **options: object) -> None:
        check_attention_options("differential", options)
        num_kv_heads = options.get("num_kv_heads")
        kv = num_heads if num_kv_heads is None else num_kv_heads
        if not isinstance(num_heads, int) or num_heads % 2 or not isinstance(kv, int) or kv % 2:
            raise InputError(f"differential attention pairs its heads: num_heads and num_kv_heads must be even; "
                             f"got {num_heads} and {kv}")
        if isinstance(layer_index, bool) or not isinstance(layer_index, int) or layer_index < 0:
            raise InputError(f"layer_index must be a layer's index, 0 or more; got {layer_index!r}")
        if lambda_init is not None and not (isinstance(lambda_init, (int, float)) and math.isfinite(lambda_init)):
            raise InputError(f"lambda_init must be a number; got {lambda_init!r}")
        if not (isinstance(lambda_std, (int, float)) and lambda_std >= 0):
            raise InputError(f"lambda_std must be 0 or more; got {lambda_std!r}")
        super().__init__(embed_dim, num_heads, **options)
        d = self.head_dim
        self.lambda_init = default_lambda_init(layer_index) if lambda_init is None else float(lambda_init)
        self.norm_eps = float(norm_eps)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(d) * lambda_std) for _ in range(4))

    def lambda_full(self) -> Tensor:
        """``lambda`` of this layer (a scalar tensor)."""
        first = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dtype=torch.float32))
        second = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dtype=torch.float32))
        return first - second + self.lambda_init

    def _paired_values(self, v: Tensor) -> Tensor:
        """``(B, G, L, D)`` values of ``G`` heads (``Hkv``, or ``H`` when repeated per query head)
        -> ``(B, G, L, 2D)``: head ``g`` carries the value heads ``a`` of the first half and ``b``
        of the second half that its place in its half names."""
        g = v.shape[1]
        first, second = v.chunk(2, dim=1)
        if g == self.num_kv_heads:
            return torch.cat([first.repeat(1, 2, 1, 1), second.repeat(1, 2, 1, 1)], dim=-1)
        # repeated per query head: head i holds key/value head i // group; halves of the key/value heads
        group = self.num_heads // self.num_kv_heads
        kv = torch.arange(g, device=v.device) // group
        half = self.num_kv_heads // 2
        a, b = kv % half, kv % half + half
        return torch.cat([v[:, a * group], v[:, b * group]], dim=-1)

    def _difference(self, out: Tensor, lam: Tensor) -> Tensor:
        """``(B, H, L, 2D)`` -> ``(B, H/2, L, 2D)``: each pair's difference, normalized and scaled."""
        first, second = out.chunk(2, dim=1)
        mixed = first - lam.to(out.dtype) * second
        normed = F.rms_norm(mixed, (mixed.shape[-1],), None, self.norm_eps) if hasattr(F, "rms_norm") else \
            mixed * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        return normed * (1 - self.lambda_init)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, key_padding_mask: Tensor | None,
                is_causal: bool, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        out, weights = scaled_dot_product_attention(
            q, k, self._paired_values(v), attn_mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal,
            scale=self.scale, dropout_p=self.dropout if self.training else 0.0, need_weights=need_weights)
        lam = self.lambda_full()
        out = self._difference(out, lam)  # (B, H/2, L, 2D)
        if weights is not None:
            first, second = weights.chunk(2, dim=1)
            weights = first - lam.to(weights.dtype) * second
        return out, weights

    def _attend_step(self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None) -> Tensor:
        batch = q.shape[0]
        out = F.scaled_dot_product_attention(q, k, self._paired_values(v), attn_mask=keep, scale=self.scale)
        out = out.reshape(batch, self.num_heads, 1, -1)  # (B, Hkv, group, 2D) -> (B, H, 1, 2D)
        return self._difference(out, self.lambda_full()).reshape(batch, -1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lambda_init={self.lambda_init:.4g}"


__getattr__ = former_names(__name__)  # SinkAttention, now in attnlab.attention.sinks
