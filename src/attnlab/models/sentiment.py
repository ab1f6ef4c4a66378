"""Attention sentiment classifier: token ids -> Transformer encoder -> pooled vector -> logits.

The tutorials' classifier (embedding, a few encoder layers, pooling, a linear head), with
what they get wrong put right:

* Padding is masked everywhere: as keys in every self-attention layer, and in mean
  pooling, which averages real tokens only. Whatever the padded positions hold, they
  never change a real sentence's logits. With an attention kind whose pattern does not
  depend on the sequence's length, the same sentence padded to any length gives the same
  logits too: ``exact``, ``local``, ``linear``, ``lsa``, ``performer``, ``linformer`` and
  ``sparse`` with ``pattern="fixed"`` or ``"strided"`` (measured: 1e-7 at most). Two kinds
  depend on the padded length by design: ``sparse`` with ``"bigbird"`` (its random key
  blocks are drawn per block of the padded length; 1e-2 from 37 to 100 tokens) and
  ``nystrom`` (its landmarks are segment means over the padded length; 4e-3).
* The mask convention is converted once, at the input: ``attention_mask`` follows
  Hugging Face (``1``/``True`` = real token, what the tokenizer returns) and becomes
  attnlab's ``key_padding_mask`` (``True`` = padding, see
  :mod:`attnlab.attention.functional`).
* Pre-norm layers end with a final norm (without it the last residual stream is
  unnormalized); post-norm layers, already normalized, get none.
* A row with no real token (every position masked) gives finite logits: its attention
  is zero, and the masked mean divides by at least one.

Token embeddings are scaled by ``sqrt(embed_dim)`` after an ``N(0, 1/embed_dim)``
initialisation (as in :class:`~attnlab.models.transformer.Seq2SeqTransformer`), so that
they start at unit variance, the scale of the sinusoidal positions they are added to.

Positions (``pos_embed``): ``"sinusoidal"`` or ``"learned"`` absolute positions are
added to the embeddings; ``"none"`` gives none (with mean pooling the model is then blind
to word order); ``"relative"`` adds nothing to the embeddings but a T5 relative position
bias (:class:`~attnlab.layers.relative_bias.RelativePositionBias`, one table shared by all
layers) to every layer's attention logits, as a float ``attn_mask`` ``(1, H, L, L)``. It
needs ``attention="exact"``, the kind that takes an ``attn_mask``. ``"rope"`` (rotary
embeddings, base ``rope_theta``) and ``"alibi"`` (a distance penalty per head, the same
ahead as behind) are given inside every layer's self-attention; they need a kind that
takes them (``exact``, ``gqa``).

Sequences are right-padded: positions count from the first token, and ``"cls"`` pooling
reads position 0, where the tokenizer puts ``[CLS]``. Relative biases depend only on
distances between real tokens, so padding invariance holds for every ``pos_embed``.

Shapes::

    input_ids        (B, L)  token ids, L <= max_len
    attention_mask   (B, L)  1/True = real token, 0/False = padding
    embed + pos      (B, L, E)   pos: absolute positions, or nothing ("none", "relative")
    relative bias    (1, H, L, L)  "relative" only, added to every layer's attention logits
    encoder          (B, L, E)   depth layers, key padding masked
    pool             (B, E)      "cls": token 0; "mean": mean of real tokens
    head             (B, num_classes)

The attention kind is taken from the attention registry (``attention="exact"`` by
default), so any ``"tokens"`` kind can be swapped in from a recipe.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attention.capture import capture_attention
from ..attention.registry import attention_entry
from ..dropout import Dropout
from ..errors import InputError
from ..layers.norms import build_norm
from ..layers.pos_encoding import ADDED, INNER, build_pos_encoding, inner_position_options
from ..layers.relative_bias import RelativePositionBias
from ..layers.transformer_layers import TransformerEncoder, TransformerEncoderLayer
from .registry import build_config, refuse_options_the_model_sets, check_attention_values, register_model
from .token_ids import check_token_ids

__all__ = ["SentimentConfig", "AttentionSentimentClassifier"]

POOLINGS = ("cls", "mean")
POS_EMBEDS = tuple(sorted((*ADDED, *INNER, "relative")))


@dataclass
class SentimentConfig:
    """Configuration of :class:`AttentionSentimentClassifier`; defaults are ``sentiment_transformer_small``."""

    vocab_size: int = 16000
    num_classes: int = 2
    embed_dim: int = 128
    depth: int = 2  # encoder layers; 0 gives a bag-of-embeddings baseline
    num_heads: int = 4
    mlp_ratio: float = 4.0  # feed-forward width = round(embed_dim * mlp_ratio)
    activation: str = "gelu"
    drop_rate: float = 0.1  # residual branches, feed-forward hidden layer, head input
    attn_drop_rate: float = 0.1  # on the attention weights
    pos_drop_rate: float = 0.1  # on embeddings + positions
    max_len: int = 256
    pos_embed: str = "sinusoidal"  # sinusoidal, learned, none, relative (T5 bias, exact attention), rope, alibi
    rope_theta: float = 10000.0  # pos_embed="rope": the base of the rotary wavelengths
    pooling: str = "mean"  # "cls" (token 0) or "mean" (masked mean of real tokens)
    norm_first: bool = True  # pre-norm, with a final norm
    norm: str = "layernorm"  # or "batchnorm" (token BatchNorm, padding left out)
    norm_eps: float = 1e-5
    padding_idx: int | None = 0  # embedding row kept at zero; the padding mask when none is given
    attention: str = "exact"  # a "tokens" kind of attnlab.attention.list_attention()
    attention_options: dict[str, Any] = field(default_factory=dict)

    # Names before attnlab took timm's: read in older runs, pointed to in errors.
    renamed: ClassVar[dict[str, str]] = {"dropout": "drop_rate", "attn_dropout": "attn_drop_rate",
                                         "embed_dropout": "pos_drop_rate", "pos_encoding": "pos_embed"}

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_classes", "embed_dim", "num_heads", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InputError(f"{name} must be a positive integer; got {value!r}")
        if not isinstance(self.depth, int) or isinstance(self.depth, bool) or self.depth < 0:
            raise InputError(f"depth must be a non-negative integer; got {self.depth!r}")
        if self.embed_dim % self.num_heads:
            raise InputError(
                f"embed_dim must be divisible by num_heads; got embed_dim={self.embed_dim}, num_heads={self.num_heads}"
            )
        if not self.mlp_ratio > 0:
            raise InputError(f"mlp_ratio must be positive; got {self.mlp_ratio!r}")
        for name in ("drop_rate", "attn_drop_rate", "pos_drop_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise InputError(f"{name} must be in [0, 1); got {getattr(self, name)!r}")
        if self.pooling not in POOLINGS:
            raise InputError(f"pooling must be one of {list(POOLINGS)}; got {self.pooling!r}")
        if self.pos_embed not in POS_EMBEDS:
            raise InputError(f"pos_embed must be one of {list(POS_EMBEDS)}; got {self.pos_embed!r}")
        if self.padding_idx is not None and not 0 <= self.padding_idx < self.vocab_size:
            raise InputError(
                f"padding_idx must be None or in [0, vocab_size={self.vocab_size}); got {self.padding_idx}"
            )
        if attention_entry(self.attention).family != "tokens":  # unknown names fail here, with suggestions
            raise InputError(f"attention must be a 'tokens' kind; {self.attention!r} is a grid kind")
        refuse_options_the_model_sets(self.attention_options, {"dropout": "attn_drop_rate", "rope": "pos_embed",
                                                         "alibi": "pos_embed", "rope_theta": "rope_theta"})
        check_attention_values(SentimentConfig, self.attention, self.attention_options,
                               self.max_len if isinstance(self.max_len, int) else None)
        inner_position_options(self.pos_embed, self.rope_theta, self.attention)  # a kind that cannot take them
        if self.pos_embed == "relative" and self.attention != "exact":  # the other kinds take no attn_mask
            raise InputError(
                f"pos_embed='relative' needs attention='exact' (the bias is an attn_mask); "
                f"got attention={self.attention!r}"
            )


class AttentionSentimentClassifier(nn.Module):
    """Sentence classifier on a Transformer encoder; see the module docstring.

    ``forward(input_ids, attention_mask=None)``: ``(B, L)`` ids and an optional
    ``(B, L)`` mask (1/True = real token; when omitted, tokens equal to ``padding_idx``
    are padding, or nothing is when ``padding_idx`` is None) -> logits ``(B, num_classes)``.
    """

    def __init__(self, config: SentimentConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = build_config(SentimentConfig, asdict(config or SentimentConfig()), overrides)
        self.config = cfg
        e = cfg.embed_dim
        self.embed = nn.Embedding(cfg.vocab_size, e, padding_idx=cfg.padding_idx)
        self.embed_scale = math.sqrt(e)
        # "relative": no absolute positions; one bias table shared by all layers, as in T5
        # (none without layers, so that no parameter goes unused).
        relative = cfg.pos_embed == "relative"
        self.pos = build_pos_encoding("none" if relative else cfg.pos_embed, e, cfg.max_len)
        self.rel_bias = RelativePositionBias(cfg.num_heads) if relative and cfg.depth > 0 else None
        self.embed_drop = Dropout(cfg.pos_drop_rate)
        layers = []
        for _ in range(cfg.depth):
            layers.append(TransformerEncoderLayer(
                e, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, drop_rate=cfg.drop_rate, attn_drop_rate=cfg.attn_drop_rate,
                activation=cfg.activation, norm_first=cfg.norm_first, norm=cfg.norm, norm_eps=cfg.norm_eps,
                attention=cfg.attention,
                attention_options={**cfg.attention_options,
                                   **inner_position_options(cfg.pos_embed, cfg.rope_theta, cfg.attention)},
            ))
        self.encoder = TransformerEncoder(layers, build_norm(cfg.norm, e, cfg.norm_eps) if cfg.norm_first else None)
        self.head_drop = Dropout(cfg.drop_rate)
        self.head = nn.Linear(e, cfg.num_classes)
        # Encoder and head keep torch's initialisation (that of nn.TransformerEncoderLayer).
        nn.init.normal_(self.embed.weight, std=e**-0.5)
        if cfg.padding_idx is not None:
            with torch.no_grad():
                self.embed.weight[cfg.padding_idx].zero_()

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each encoder layer's activations in backward (training mode only)."""
        self.encoder.set_grad_checkpointing(enable)

    def shard_blocks(self) -> list[nn.Module]:
        """The encoder's layers (:mod:`attnlab.engine.sharding`)."""
        return self.encoder.shard_blocks()

    # ------------------------------------------------------------------ pieces
    def padding_mask(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor | None:
        """attnlab's ``key_padding_mask`` ``(B, L)``, ``True`` = padding (``None``: no padding)."""
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise InputError(
                f"input_ids must be integer token ids of shape (B, L); got {input_ids.dtype} {tuple(input_ids.shape)}"
            )
        check_token_ids(input_ids, self.config.vocab_size)
        if attention_mask is None:
            return None if self.config.padding_idx is None else input_ids == self.config.padding_idx
        if attention_mask.shape != input_ids.shape:
            raise InputError(
                f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}; "
                f"got {tuple(attention_mask.shape)}"
            )
        return attention_mask == 0

    def _embed(self, input_ids: Tensor) -> Tensor:
        return self.embed_drop(self.pos(self.embed(input_ids) * self.embed_scale))

    def _attn_bias(self, x: Tensor) -> Tensor | None:
        """The relative position bias ``(1, H, L, L)`` for ``x`` ``(B, L, E)``; ``None`` without one."""
        return None if self.rel_bias is None else self.rel_bias(x.shape[1], x.shape[1], device=x.device)

    def _final_norm(self, x: Tensor, pad: Tensor | None) -> Tensor:
        return x if self.encoder.norm is None else self.encoder.norm(x, pad)

    def pool(self, x: Tensor, pad: Tensor | None) -> Tensor:
        """``(B, L, E)`` token features -> ``(B, E)``."""
        if self.config.pooling == "cls":
            return x[:, 0]
        if pad is None:
            return x.mean(dim=1)
        count = (~pad).sum(dim=1, keepdim=True).clamp_min(1).to(x.dtype)  # no real token: 0 / 1, not 0 / 0
        return x.masked_fill(pad.unsqueeze(-1), 0.0).sum(dim=1) / count

    def forward_head(self, x: Tensor, pad: Tensor | None) -> Tensor:
        return self.head(self.head_drop(self.pool(x, pad)))

    # ------------------------------------------------------------------ forward
    def forward_features(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Token features ``(B, L, E)`` after the encoder (and its final norm)."""
        pad = self.padding_mask(input_ids, attention_mask)
        x = self._embed(input_ids)
        return self.encoder(x, key_padding_mask=pad, attn_mask=self._attn_bias(x))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        pad = self.padding_mask(input_ids, attention_mask)
        x = self._embed(input_ids)
        return self.forward_head(self.encoder(x, key_padding_mask=pad, attn_mask=self._attn_bias(x)), pad)

    def forward_with_attention(
        self, input_ids: Tensor, attention_mask: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """Logits ``(B, num_classes)`` and every layer's attention weights, as :meth:`attention_maps`:
        :func:`~attnlab.attention.capture_attention` over :meth:`forward`.

        Slower than :meth:`forward` (the weights are materialized: no fused kernel), equal
        to it otherwise. The weights are detached.
        """
        if not self.encoder.layers:  # depth 0: a bag of embeddings, no attention
            return self(input_ids, attention_mask), []
        names = [f"encoder.layers.{i}.self_attn" for i in range(len(self.encoder.layers))]
        with capture_attention(self, include=names) as maps:
            logits = self(input_ids, attention_mask)
        return logits, [maps[name][0] for name in names]

    def attention_maps(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> list[Tensor]:
        """One ``(B, heads, L, L)`` tensor per layer (query, key), before attention dropout.

        Rows sum to 1 over real keys and are 0 on padded keys; rows of padded queries
        are computed like any other (they attend to the real keys) and mean nothing.
        A sequence with no real token has all-zero maps.
        """
        return self.forward_with_attention(input_ids, attention_mask)[1]


# --------------------------------------------------------------------------- registry
def _sentiment(defaults: dict[str, Any], overrides: dict[str, Any]) -> AttentionSentimentClassifier:
    return AttentionSentimentClassifier(build_config(SentimentConfig, defaults, overrides))


@register_model("text")
def sentiment_transformer_tiny(**overrides: Any) -> AttentionSentimentClassifier:
    """Tiny attention sentiment classifier: width 64, 1 layer, 4 heads (tests, smoke runs)."""
    return _sentiment(dict(embed_dim=64, depth=1, num_heads=4, mlp_ratio=2.0, max_len=128), overrides)


@register_model("text")
def sentiment_transformer_small(**overrides: Any) -> AttentionSentimentClassifier:
    """Attention sentiment classifier for MR-sized data: width 128, 2 pre-norm layers, 4 heads, mean pooling."""
    return _sentiment({}, overrides)
