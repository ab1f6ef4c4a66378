"""Transformer encoder and decoder layers and their stacks (post-norm or pre-norm)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..attention.cache import DecodingCache, ModelCache
from ..attention.capture import is_recording
from ..attention.exact import GroupedQueryAttention
from ..attention.registry import build_attention, attention_entry
from ..moved import former_names
from ..dropout import Dropout
from ..errors import InputError
from .checkpointing import checkpointed
from .drop_path import DropPath
from .mlp import Mlp
from .norms import TokenBatchNorm, build_norm

__all__ = [
    "EncoderBlock",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "check_decoder_attention",
]


def _token_padding(mask: Tensor | None) -> Tensor | None:
    """The padding mask the norms need: only a boolean key padding mask marks tokens."""
    return mask if mask is not None and mask.dtype == torch.bool else None


class EncoderBlock(nn.Module):
    """The Transformer encoder block: self-attention, then an MLP, each a residual branch
    with dropout and stochastic depth, pre-norm or post-norm.

    Pre-norm (``norm_first=True``): ``x = x + drop_path(drop(f(norm(x))))``; trains deep
    stacks without warm-up tricks. Post-norm (``norm_first=False``, the 2017 paper):
    ``x = norm(x + drop_path(drop(f(x))))``. ``f`` is the attention, then the MLP.

    This is the forward of :class:`TransformerEncoderLayer` and of the ViT's
    :class:`~attnlab.models.vit.Block`. Each builds its parts itself, under its own names
    (its ``state_dict`` keys: torch's for the one, timm's for the other, so that both
    load what they always loaded) and in its own order (the order of its seeded
    initialisation and of its parameters): ``norm1`` and ``norm2`` (norms that take a
    padding mask, :func:`~attnlab.layers.norms.build_norm`), ``drop`` (a
    :class:`~attnlab.dropout.Dropout`), ``drop_path`` (a
    :class:`~attnlab.layers.drop_path.DropPath`), and the two branches, which it calls in
    :meth:`attend` and :meth:`feed_forward`.

    Shapes: ``x`` ``(B, L, E)`` -> ``(B, L, E)``; ``key_padding_mask`` ``(B, L)``.
    """

    norm1: nn.Module
    norm2: nn.Module
    drop: Dropout
    drop_path: DropPath

    def __init__(self, *, norm_first: bool) -> None:
        super().__init__()
        self.norm_first = norm_first

    def attend(self, x: Tensor, *, key_padding_mask: Tensor | None, attn_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        """The attention branch: ``(B, L, E) -> (B, L, E)``."""
        raise NotImplementedError

    def feed_forward(self, x: Tensor) -> Tensor:
        """The MLP branch: ``(B, L, E) -> (B, L, E)``."""
        raise NotImplementedError

    def forward(
        self, x: Tensor, *, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        pad = _token_padding(key_padding_mask)
        masks = dict(key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=is_causal)
        if self.norm_first:
            x = x + self.drop_path(self.drop(self.attend(self.norm1(x, pad), **masks)))
            return x + self.drop_path(self.drop(self.feed_forward(self.norm2(x, pad))))
        x = self.norm1(x + self.drop_path(self.drop(self.attend(x, **masks))), pad)
        return self.norm2(x + self.drop_path(self.drop(self.feed_forward(x))), pad)


class TransformerEncoderLayer(EncoderBlock):
    """Self-attention and feed-forward, each wrapped in dropout + residual + norm
    (:class:`EncoderBlock`), with the module names of ``torch.nn.TransformerEncoderLayer``
    (``self_attn``; ``ff`` holds its ``linear1`` and ``linear2``).

    ``norm`` is ``"layernorm"`` or ``"batchnorm"`` (token BatchNorm, see
    :class:`attnlab.layers.norms.TokenBatchNorm`). The feed-forward width is
    ``round(embed_dim * mlp_ratio)``, as in the models' configurations; ``drop_rate`` drops
    on the residual branches and the feed-forward hidden layer, ``attn_drop_rate`` (default
    ``drop_rate``) on the attention weights, ``drop_path_rate`` whole residual branches
    (stochastic depth; off by default); ``bias`` is that of every projection.

    The self-attention is a ``"tokens"`` kind of the attention registry, built here from
    ``attention`` and ``attention_options`` (``"exact"``: multi-head attention with the
    fused kernel; ``"local"``, ``"linear"``, ...: see :func:`~attnlab.attention.list_attention`).

    Shapes: ``x`` ``(B, L, E)`` -> ``(B, L, E)``; ``key_padding_mask`` ``(B, L)``.
    """

    def __init__(
        self, embed_dim: int, num_heads: int, *, mlp_ratio: float = 4.0, drop_rate: float = 0.1,
        attn_drop_rate: float | None = None, drop_path_rate: float = 0.0, activation: str = "relu",
        norm_first: bool = False, norm: str = "layernorm", norm_eps: float = 1e-5, bias: bool = True,
        attention: str = "exact", attention_options: dict | None = None,
    ) -> None:
        super().__init__(norm_first=norm_first)
        attn_drop = drop_rate if attn_drop_rate is None else attn_drop_rate
        if attention_entry(attention).family != "tokens":  # unknown names fail here, with suggestions
            raise InputError(f"attention must be a 'tokens' kind of the registry; {attention!r} is a grid kind")
        if "dropout" in (attention_options or {}):
            raise InputError("attention_options must not set 'dropout'; use attn_drop_rate")
        self.self_attn = build_attention(attention, embed_dim, num_heads, dropout=attn_drop, bias=bias,
                                         **(attention_options or {}))
        self.ff = Mlp(embed_dim, round(embed_dim * mlp_ratio), activation=activation, dropout=drop_rate, bias=bias)
        self.norm1 = build_norm(norm, embed_dim, norm_eps)
        self.norm2 = build_norm(norm, embed_dim, norm_eps)
        self.drop = Dropout(drop_rate)
        self.drop_path = DropPath(drop_path_rate)

    def attend(self, x: Tensor, *, key_padding_mask: Tensor | None, attn_mask: Tensor | None,
               is_causal: bool) -> Tensor:
        return self.self_attn(x, key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=is_causal)[0]

    def feed_forward(self, x: Tensor) -> Tensor:
        return self.ff(x)



def check_decoder_attention(attention: str, name: str = "attention") -> None:
    """Refuse, in one line, a kind that cannot be a decoder's self-attention: a grid kind, or one
    that does not honour a causal mask."""
    if attention_entry(attention).family != "tokens":  # unknown names fail here, with suggestions
        raise InputError(f"{name} must be a 'tokens' kind of the registry; {attention!r} is a grid kind")
    if attention_entry(attention).capabilities.causal is False:
        raise InputError(f"{name} must be a kind that honours a causal mask for a decoder's self-attention; "
                         f"{attention!r} does not")


class TransformerDecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder memory, feed-forward;
    post-norm or pre-norm, with the arguments of :class:`TransformerEncoderLayer`.

    The self-attention is any ``"tokens"`` kind that honours a causal mask (``attention`` and
    ``attention_options``; default the exact kind), with ``position_options`` (``{"rope": True,
    "rope_theta": ...}`` or ``{"alibi": True}``) giving it positions; it keeps its own cache when
    its kind does. The cross-attention is exact attention over the memory, without positions.

    Shapes: ``x`` ``(B, Lt, E)``, ``memory`` ``(B, Ls, E)`` -> ``(B, Lt, E)``.
    """

    def __init__(
        self, embed_dim: int, num_heads: int, *, mlp_ratio: float = 4.0, drop_rate: float = 0.1,
        attn_drop_rate: float | None = None, activation: str = "relu", norm_first: bool = False,
        norm: str = "layernorm", norm_eps: float = 1e-5, bias: bool = True, position_options: dict | None = None,
        attention: str = "exact", attention_options: dict | None = None,
    ) -> None:
        super().__init__()
        attn_drop = drop_rate if attn_drop_rate is None else attn_drop_rate
        check_decoder_attention(attention)
        if "dropout" in (attention_options or {}):
            raise InputError("attention_options must not set 'dropout'; use attn_drop_rate")
        self.norm_first, self.attention = norm_first, attention
        self.self_attn = build_attention(attention, embed_dim, num_heads, dropout=attn_drop, bias=bias,
                                         **(attention_options or {}), **(position_options or {}))
        self.cross_attn = GroupedQueryAttention(embed_dim, num_heads, dropout=attn_drop, bias=bias)
        self.ff = Mlp(embed_dim, round(embed_dim * mlp_ratio), activation=activation, dropout=drop_rate, bias=bias)
        self.norm1 = build_norm(norm, embed_dim, norm_eps)
        self.norm2 = build_norm(norm, embed_dim, norm_eps)
        self.norm3 = build_norm(norm, embed_dim, norm_eps)
        self.drop = Dropout(drop_rate)

    def forward(
        self, x: Tensor, memory: Tensor | None, *, tgt_key_padding_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None, tgt_is_causal: bool = True,
        memory_key_padding_mask: Tensor | None = None, memory_mask: Tensor | None = None,
        self_cache=None, cross_cache: DecodingCache | None = None,
    ) -> Tensor:
        pad = _token_padding(tgt_key_padding_mask)

        def sa(h: Tensor) -> Tensor:
            cache = {} if self_cache is None else {"cache": self_cache}  # a kind without a cache takes none
            out, _ = self.self_attn(h, key_padding_mask=tgt_key_padding_mask, attn_mask=tgt_mask,
                                    is_causal=tgt_is_causal, **cache)
            return self.drop(out)

        def ca(h: Tensor) -> Tensor:
            out, _ = self.cross_attn(h, memory, key_padding_mask=memory_key_padding_mask, attn_mask=memory_mask,
                                     cache=cross_cache)  # memory is None only with a filled cache
            return self.drop(out)

        if self.norm_first:
            x = x + sa(self.norm1(x, pad))
            x = x + ca(self.norm2(x, pad))
            return x + self.drop(self.ff(self.norm3(x, pad)))
        x = self.norm1(x + sa(x), pad)
        x = self.norm2(x + ca(x), pad)
        return self.norm3(x + self.drop(self.ff(x)), pad)

    @property
    def has_step(self) -> bool:
        """Whether :meth:`step` serves this layer: its self-attention kind has the lean decoding
        step, and its norms normalize each token on its own (BatchNorm's ``(B, L, E)`` form aside)."""
        return attention_entry(self.attention).capabilities.decode_step and all(
            not isinstance(n, TokenBatchNorm) for n in (self.norm1, self.norm2, self.norm3)) \
            and not (is_recording(self.self_attn) or is_recording(self.cross_attn))  # forward records weights

    def step(self, x: Tensor, memory: Tensor | None, memory_key_padding_mask: Tensor | None,
             self_cache: DecodingCache, cross_cache: DecodingCache) -> Tensor:
        """One token per row while generating, in eval mode: ``x`` ``(B, E)`` -> ``(B, E)``, what
        :meth:`forward` gives for ``x[:, None]`` with these caches, through the self-attention's
        lean ``decode_step`` (no masks for one query, the joined projections) and no dropout."""
        def ca(h: Tensor) -> Tensor:
            return self.cross_attn(h[:, None], memory, key_padding_mask=memory_key_padding_mask,
                                   cache=cross_cache)[0][:, 0]

        sa = self.self_attn.decode_step
        if self.norm_first:
            x = x + sa(self.norm1(x), self_cache)
            x = x + ca(self.norm2(x))
            return x + self.ff(self.norm3(x))
        x = self.norm1(x + sa(x, self_cache))
        x = self.norm2(x + ca(x))
        return self.norm3(x + self.ff(x))


class _Stack(nn.Module):
    def __init__(self, layers: list[nn.Module], final_norm: nn.Module | None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = final_norm
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each layer's activations in backward instead of storing them."""
        self.grad_checkpointing = enable

    def shard_blocks(self) -> list[nn.Module]:
        """Its layers: the units sharded training gathers one at a time (:mod:`attnlab.engine.sharding`)."""
        return list(self.layers)

    def _run(self, layer: nn.Module, *args, **kwargs) -> Tensor:
        if self.grad_checkpointing and self.training and torch.is_grad_enabled():
            return checkpointed(layer, *args, **kwargs)
        return layer(*args, **kwargs)

    def _finish(self, x: Tensor, pad: Tensor | None) -> Tensor:
        return x if self.norm is None else self.norm(x, pad)


class TransformerEncoder(_Stack):
    """``num_layers`` encoder layers and an optional final norm (pre-norm needs one).

    Shapes: ``src`` ``(B, Ls, E)`` -> ``(B, Ls, E)``; ``key_padding_mask`` ``(B, Ls)``.
    """

    def forward(
        self, src: Tensor, *, key_padding_mask: Tensor | None = None, attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        x = src
        for layer in self.layers:
            x = self._run(layer, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=is_causal)
        return self._finish(x, _token_padding(key_padding_mask))


class TransformerDecoder(_Stack):
    """``num_layers`` decoder layers and an optional final norm.

    Shapes: ``tgt`` ``(B, Lt, E)``, ``memory`` ``(B, Ls, E)`` -> ``(B, Lt, E)``. With a
    :class:`~attnlab.attention.cache.ModelCache`, ``tgt`` holds only the new positions and ``memory`` may be
    ``None`` once the cache is filled.
    """

    @property
    def keeps_cache(self) -> bool:
        """Whether every layer's self-attention decodes with a cache of its own (its kind declares it)."""
        return all(attention_entry(layer.attention).capabilities.cache for layer in self.layers)

    def new_cache(self, batch: int | None = None, capacity: int | None = None) -> ModelCache:
        """Each layer's caches, made by its attention modules (``new_cache``): its
        self-attention's own and its cross-attention's static one."""
        if not self.keeps_cache:
            raise InputError("the decoder's self-attention keeps no cache: decode with use_cache=False")
        p = next(self.parameters(), None)
        where = {} if p is None else {"dtype": p.dtype, "device": p.device}
        return ModelCache([layer.self_attn.new_cache(batch, capacity, **where) for layer in self.layers],
                            [layer.cross_attn.new_cache(batch, capacity, static=True) for layer in self.layers])

    @property
    def has_step(self) -> bool:
        """Whether every layer has the lean one-token step (:meth:`TransformerDecoderLayer.step`)."""
        return self.keeps_cache and all(layer.has_step for layer in self.layers) and \
            not isinstance(self.norm, TokenBatchNorm)

    def step(self, x: Tensor, memory: Tensor | None, memory_key_padding_mask: Tensor | None,
             cache: ModelCache) -> Tensor:
        """One token per row while generating (eval mode, no gradient): ``x`` ``(B, E)`` ->
        ``(B, E)``, :meth:`forward`'s result for ``x[:, None]`` with ``cache``, each layer through
        its lean step (``tests/generation/test_search.py`` keeps the two equal; the translator's decoding
        speed: results page "Decoding and caches")."""
        for layer, self_cache, cross_cache in zip(self.layers, cache.self_attn, cache.cross_attn):
            x = layer.step(x, memory, memory_key_padding_mask, self_cache, cross_cache)
        return x if self.norm is None else self.norm(x)

    def forward(
        self, tgt: Tensor, memory: Tensor | None, *, tgt_key_padding_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None, tgt_is_causal: bool = True,
        memory_key_padding_mask: Tensor | None = None, memory_mask: Tensor | None = None,
        cache: ModelCache | None = None,
    ) -> Tensor:
        if cache is not None and len(cache.self_attn) != len(self.layers):
            raise InputError(
                f"cache has {len(cache.self_attn)} layers but the decoder has {len(self.layers)}; "
                "make it with the decoder's new_cache()"
            )
        x = tgt
        for i, layer in enumerate(self.layers):
            x = self._run(
                layer, x, memory, tgt_key_padding_mask=tgt_key_padding_mask, tgt_mask=tgt_mask,
                tgt_is_causal=tgt_is_causal, memory_key_padding_mask=memory_key_padding_mask,
                memory_mask=memory_mask,
                self_cache=None if cache is None else cache.self_attn[i],
                cross_cache=None if cache is None else cache.cross_attn[i],
            )
        return self._finish(x, _token_padding(tgt_key_padding_mask))


__getattr__ = former_names(__name__)  # DecoderCache, now attnlab.attention.cache.ModelCache
