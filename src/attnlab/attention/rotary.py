"""Rotary position embedding (RoPE; Su et al., 2021, "RoFormer").

Each pair of query/key features ``(x_i, x_{i + D/2})`` is rotated by the angle
``position · theta^(-2i/D)``, so that ``q_m · k_n`` depends on the positions only through
``m - n``: attention sees relative positions while each token carries an absolute one.
The pairs are the two halves of the head (GPT-NeoX's and Llama's layout, so Hugging Face
Llama and Mistral weights load as they are), not interleaved neighbours.

Partial rotary (GPT-NeoX, Phi): only the first ``rotary_dim = int(D · fraction)`` features
of a head are rotated, their two halves paired as above, and the rest pass through.
Scaled frequencies for long contexts (``linear``, ``dynamic``, ``yarn``, ``llama3``,
``longrope``) come from :mod:`~attnlab.attention.rope_scaling`; ``cos`` and ``sin`` carry
the attention factor of the scaling, as in Hugging Face transformers.

Angles are computed in float32 and kept in a table that grows with the longest position
seen, so a decoding step looks its row up instead of computing sines. ``dynamic`` and
``longrope`` pick their frequencies from the longest position of each call (``seq_len =
max(positions) + 1``, a decoding step's one position included), as transformers does:
``longrope`` has two tables (short and long factors); ``dynamic`` past ``max_len`` has new
frequencies at every length and computes the angles of the call alone. One difference:
transformers' module keeps ``dynamic``'s grown frequencies until a call is shorter than
``max_len``, so there a call of ``max_len <= seq_len <`` (the longest seen before) reuses the
longer call's frequencies; here each call's frequencies depend on that call alone, the same
in every layer whatever came before.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import InputError
from .rope_scaling import _frequencies, check_rope_scaling

__all__ = ["RotaryEmbedding", "rotate_half", "apply_rotary"]


def rotate_half(x: Tensor) -> Tensor:
    """``(x1, x2) -> (-x2, x1)`` over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` ``(B, H, L, D)`` rotated by the angles whose ``cos``/``sin`` are ``(B or 1, 1, L, R)``.

    ``R == D`` rotates the whole head; ``R < D`` (partial rotary) rotates the first ``R``
    features and passes the other ``D - R`` through unchanged.
    """
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    x_rot = x[..., :r]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x[..., r:]), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by their positions.

    Args:
        head_dim: ``D``, the feature size of one head.
        theta: the base of the wavelengths (``rope_theta``; 10,000 in the paper and Llama 2,
            500,000 in Llama 3).
        fraction: the share of each head that is rotated (transformers' ``partial_rotary_factor``),
            in (0, 1]; ``rotary_dim = int(D · fraction)`` must be even.
        scaling: the rope scaling, a dict ``{"rope_type": ..., ...}`` as transformers writes it
            (:func:`~attnlab.attention.rope_scaling.check_rope_scaling`); ``None``: plain.
        max_len: the longest context of the model (transformers' ``max_position_embeddings``);
            required with ``scaling``.

    ``forward(q, k, positions)``: ``q`` ``(B, H, Lq, D)``, ``k`` ``(B, Hkv, Lk, D)`` and
    ``positions`` ``(Lq,)`` or ``(B, Lq)`` (the same positions for ``k``, which must then
    have ``Lk == Lq``: the new keys of this step) -> the rotated ``(q, k)``, in their dtype.
    ``cos_sin`` and ``cos_sin_from`` give ``cos``/``sin`` of last dimension ``rotary_dim``,
    already multiplied by ``attention_factor``.
    """

    def __init__(self, head_dim: int, theta: float = 10000.0, *, fraction: float = 1.0,
                 scaling: dict | None = None, max_len: int | None = None) -> None:
        super().__init__()
        if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 < fraction <= 1:
            raise InputError(f"partial_rotary (fraction) must be a number in (0, 1]; got {fraction!r}")
        rotary_dim = int(head_dim * fraction)
        if fraction == 1 and head_dim % 2:
            raise InputError(f"head_dim must be even for rotary embeddings; got {head_dim}")
        if rotary_dim % 2 or rotary_dim < 2:
            raise InputError(f"partial_rotary: rotary_dim = int(head_dim {head_dim} * fraction {fraction:g}) = "
                             f"{rotary_dim} must be even and > 0")
        if not theta > 0:
            raise InputError(f"theta (rope_theta) must be positive; got {theta}")
        self.head_dim, self.theta, self.fraction, self.rotary_dim = head_dim, float(theta), float(fraction), rotary_dim
        if isinstance(scaling, dict):
            self._check_carried(scaling)
        checked = check_rope_scaling(scaling, rotary_dim=rotary_dim)
        if checked is not None:
            if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
                raise InputError(f"max_len must be a positive integer with rope_scaling {checked['rope_type']!r} "
                                 f"(the model's max_position_embeddings); got {max_len!r}")
            if checked["rope_type"] in ("yarn", "llama3", "longrope"):
                checked.setdefault("original_max_position_embeddings", max_len)  # as transformers fills it in
        self.scaling, self.max_len = checked, max_len
        kind = "default" if checked is None else checked["rope_type"]
        inv_freq, self.attention_factor = _frequencies(rotary_dim, self.theta, checked, max_len or 1, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._long_after: int | None = None  # longrope: the long factors once seq_len passes this
        self._dynamic_after: int | None = None  # dynamic: new frequencies once seq_len passes this
        if kind == "longrope":
            assert checked is not None
            self._long_after = checked["original_max_position_embeddings"]
            long = _frequencies(rotary_dim, self.theta, checked, max_len or 1, self._long_after + 1)[0]
            self.register_buffer("long_inv_freq", long, persistent=False)
        elif kind == "dynamic":
            self._dynamic_after = max_len
        self._tables: dict[str, tuple[Tensor, Tensor]] = {}
        self._dynamic: tuple[int, Tensor] | None = None  # the last frequencies past max_len, for the next layer

    def _check_carried(self, scaling: dict) -> None:
        """``rope_theta`` and ``partial_rotary_factor`` in the dict (transformers writes them
        there) must agree with ``theta`` and ``fraction``, which are the ones used."""
        given = scaling.get("rope_theta")
        if given is not None and (not isinstance(given, (int, float)) or float(given) != self.theta):
            raise InputError(f"rope_scaling.rope_theta {given!r} differs from theta {self.theta:g}: give the "
                             "same base, or leave it out of the dict")
        given = scaling.get("partial_rotary_factor")
        if given is not None and (not isinstance(given, (int, float)) or int(self.head_dim * given) != self.rotary_dim):
            raise InputError(f"rope_scaling.partial_rotary_factor {given!r} differs from fraction {self.fraction:g}: "
                             "give the same share, or leave it out of the dict")

    def _angles(self, inv_freq: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        freqs = t.float()[..., None] * inv_freq.to(t.device, torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def _table(self, length: int, device: torch.device) -> tuple[Tensor, Tensor] | None:
        """The table of the frequencies that a call whose longest position is ``length - 1``
        uses, at least ``length`` rows long; ``None`` where those frequencies are ``dynamic``
        ones past ``max_len``, which have no table."""
        name = "base"
        if self._long_after is not None and length > self._long_after:
            name = "long"
        elif self._dynamic_after is not None and length > self._dynamic_after:
            return None
        table = self._tables.get(name)
        if table is None or table[0].shape[0] < length or table[0].device != device:
            size = max(length, 2 * (0 if table is None else table[0].shape[0]), 256)
            inv_freq = self.long_inv_freq if name == "long" else self.inv_freq
            table = self._tables[name] = self._angles(inv_freq, torch.arange(size, device=device, dtype=torch.float32))
        return table

    def _dynamic_freq(self, length: int, device: torch.device) -> Tensor:
        if self._dynamic is None or self._dynamic[0] != length or self._dynamic[1].device != device:
            inv_freq = _frequencies(self.rotary_dim, self.theta, self.scaling, self.max_len or 1, length)[0]
            self._dynamic = (length, inv_freq.to(device))
        return self._dynamic[1]

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``cos``/``sin`` ``(B or 1, 1, L, R)`` of ``positions`` ``(L,)`` or ``(B, L)``."""
        if positions.dim() not in (1, 2):
            raise InputError(f"positions must be (L,) or (B, L); got shape {tuple(positions.shape)}")
        length = int(positions.max()) + 1 if positions.numel() else 1
        pos = positions if positions.dim() == 2 else positions[None]
        table = self._table(length, positions.device)
        if table is None:
            cos, sin = self._angles(self._dynamic_freq(length, positions.device), pos)
            return cos[:, None].to(dtype), sin[:, None].to(dtype)
        cos, sin = table
        return cos[pos][:, None].to(dtype), sin[pos][:, None].to(dtype)

    def cos_sin_from(self, start: int, length: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
        """``cos``/``sin`` ``(1, length, R)`` of the consecutive positions ``start ..
        start + length - 1``: slices of the table, without indexing by a tensor (a decoding
        step's one new position)."""
        table = self._table(start + length, device)
        if table is None:
            t = torch.arange(start, start + length, device=device, dtype=torch.float32)
            cos, sin = self._angles(self._dynamic_freq(start + length, device), t)
            return cos[None].to(dtype), sin[None].to(dtype)
        cos, sin = table
        return cos[start : start + length][None].to(dtype), sin[start : start + length][None].to(dtype)

    def forward(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(positions, q.dtype)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def extra_repr(self) -> str:
        text = f"head_dim={self.head_dim}, theta={self.theta:g}"
        if self.rotary_dim != self.head_dim:
            text += f", fraction={self.fraction:g} (rotary_dim={self.rotary_dim})"
        if self.scaling is not None:
            text += f", rope_type={self.scaling['rope_type']}"
            if "factor" in self.scaling:
                text += f", factor={self.scaling['factor']:g}"
        return text
