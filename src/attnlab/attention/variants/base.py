"""What every efficient ``"tokens"`` attention kind shares: the projections, the heads,
the call signature of exact attention, and the checks of what a kind can honour.

A kind subclasses :class:`TokenAttention` and writes one method,
:meth:`TokenAttention.attend`, on per-head tensors; this class does the rest::

    x (B, L, E) --q_proj, k_proj, v_proj--> q, k, v (B, H, L, D) --attend--> (B, H, L, D) --o_proj--> (B, L, E)

Parameter names (:mod:`~attnlab.attention.projections`) and initialisation are those of exact
attention (``"exact"``), so a model's checkpoint keys do not change when its attention kind
does (a kind may add its own parameters, such as Linformer's projections); checkpoints with
the packed ``in_proj`` of earlier versions load as they are.

Rotary positions (``rope=True``, base ``rope_theta``): the kinds that score queries against
keys with a softmax (local, sparse, top-k, LSH, Nyström, Linformer) take them; queries
and keys are rotated by their positions after the projection and before :meth:`attend`,
as in exact attention. The kernel kinds (linear, Performer) do not: their feature maps
would be applied to rotated vectors, and the score would no longer depend on the relative
position alone.

Masks: ``key_padding_mask`` is ``(B, L)`` bool, ``True`` = padding (the convention of
:mod:`attnlab.attention.functional`); float padding masks and general ``attn_mask``
are for exact attention, and a kind that cannot honour a mask says so with a
``ValueError`` naming itself, never by ignoring it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...errors import InputError, shape_str
from ..contract import Option, Options
from ..functional import check_heads
from ..joined import KeepsJoinedWeights, fused_linear
from ..projections import UpgradesPackedProjections, init_torch_style
from ..rotary import RotaryEmbedding, apply_rotary

__all__ = ["TokenAttention", "MAX_POSITIONS"]

# The longest sequence a kind is built for. An option that counts positions (a window, a
# chunk, buckets, landmarks) means nothing above it, and some size buffers by it (LSH's
# rotations, Linformer's projections): refused at construction, before they allocate. A model
# refuses them above its own max_len first (attnlab.models.registry.check_attention_positions).
MAX_POSITIONS = 1 << 20


# The options every efficient kind takes (TokenAttention's), which each extends with its own.
TOKEN_OPTIONS = Options(
    Option("dropout", float, 0.0, "on the attention weights, in training mode, where the kind has any", low=0, high=1,
           high_open=True),
    Option("bias", bool, True, "biases on the query, key, value and output projections"),
    Option("rope", bool, False, "rotate queries and keys by their positions"),
    Option("rope_theta", float, 10000.0, "the rotary base", low=0, low_open=True),
)
PLAIN_TOKEN_OPTIONS = TOKEN_OPTIONS.extend(drop=("rope", "rope_theta"))  # the kinds without rotary positions


class TokenAttention(KeepsJoinedWeights, UpgradesPackedProjections, nn.Module):
    """Base of the efficient ``"tokens"`` kinds; see the module docstring.

    Class attributes a kind sets: ``kind`` (its registry name, for messages),
    ``supports_causal`` and ``supports_padding`` (what :meth:`attend` honours).
    """

    kind = "tokens"
    lora_role = "attention"  # LoRA (attnlab.layers.lora): the query, key, value and output projections
    supports_causal = True
    supports_padding = True

    def __init__(self, embed_dim: int, num_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 rope: bool = False, rope_theta: float = 10000.0) -> None:
        super().__init__()
        try:
            check_heads(embed_dim, num_heads, dropout)
        except InputError as exc:
            raise InputError(f"{self.kind}: {exc}") from None
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.dropout = dropout
        try:
            self.rotary = RotaryEmbedding(self.head_dim, rope_theta) if rope else None
        except InputError as exc:
            raise InputError(f"{self.kind}: {exc}") from None
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.o_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        init_torch_style(self.q_proj, self.k_proj, self.v_proj, self.o_proj)  # as exact attention
        self.register_upgrade()  # checkpoints with in_proj/out_proj (attnlab.attention.projections)

    def check_positions(self, **options: int) -> None:
        """Refuse an option of :attr:`position_options` above :data:`MAX_POSITIONS` (a kind
        calls it with their values, after its own checks, before they size anything)."""
        for name, value in options.items():
            if value > MAX_POSITIONS:
                raise InputError(f"{self.kind}: {name} must be at most {MAX_POSITIONS} (it counts positions, and no "
                                 f"sequence an attention kind is built for is longer); got {name}={value!r}")

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, key_padding_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        """``q, k, v`` ``(B, H, L, D)`` -> ``(B, H, L, D)``. ``key_padding_mask``:
        ``(B, L)`` bool (``True`` = padding) or ``None``. Dropout: ``self.dropout``
        in training mode, where the kind has weights to drop."""
        raise NotImplementedError

    def forward(self, x: Tensor, *, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
                is_causal: bool = False, need_weights: bool = False, average_attn_weights: bool = True,
                positions: Tensor | None = None, cache: None = None) -> tuple[Tensor, None]:
        """``x`` ``(B, L, E)`` -> ``((B, L, E), None)``, the call of exact self-attention.
        ``positions``: ``(L,)`` or ``(B, L)`` (default ``0 .. L-1``), the rotary positions
        (left-padded prompts give each row its own). No key/value cache: ``cache`` must be
        ``None`` (a model decodes such kinds by running the whole prefix)."""
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise InputError(f"{self.kind}: x must have shape (B, L, {self.embed_dim}); got {shape_str(x)}")
        if attn_mask is not None:
            raise InputError(f"{self.kind} attention takes no attn_mask (use key_padding_mask or is_causal); "
                             f"got {shape_str(attn_mask)}")
        if need_weights:
            raise InputError(f"{self.kind} attention never forms the weight matrix; need_weights must be False "
                             f"(use 'exact' attention to see the weights)")
        if is_causal and not self.supports_causal:
            raise InputError(f"{self.kind} attention cannot be causal (each query mixes every position)")
        b, n, _ = x.shape
        if key_padding_mask is not None:
            if key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (b, n):
                raise InputError(f"{self.kind}: key_padding_mask must be bool of shape ({b}, {n}) (True = padding); "
                                 f"got {key_padding_mask.dtype} {shape_str(key_padding_mask)}")
            if not bool(key_padding_mask.any()):
                key_padding_mask = None  # nothing to mask: the fast path (and fine for any kind)
            elif not self.supports_padding:
                raise InputError(f"{self.kind} attention cannot mask padding; pass key_padding_mask=None")
        if cache is not None:
            raise InputError(f"{self.kind} attention keeps no key/value cache; pass cache=None")
        q, k, v = (t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
                   for t in fused_linear(self, "qkv", (self.q_proj, self.k_proj, self.v_proj), x))
        if self.rotary is not None:
            if positions is None:
                cos, sin = self.rotary.cos_sin_from(0, n, q.dtype, q.device)
                cos, sin = cos[:, None], sin[:, None]  # (1, 1, L, D)
            else:
                cos, sin = self.rotary.cos_sin(positions, q.dtype)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = self.attend(q, k, v, key_padding_mask=key_padding_mask, is_causal=is_causal)
        return fused_linear(self, "o", (self.o_proj,), out.transpose(1, 2).reshape(b, n, self.embed_dim))[0], None

    def extra_repr(self) -> str:
        rope = "" if self.rotary is None else f", rope_theta={self.rotary.theta:g}"
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}{rope}"
