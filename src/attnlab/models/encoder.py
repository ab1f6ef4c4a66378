"""Text encoders in BERT's shape, the form of the pretrained checkpoints one fine-tunes:
BERT, RoBERTa and DistilBERT (their Hugging Face folders load through
:func:`attnlab.formats.from_hf`).

Token, learned position and (BERT, RoBERTa) token-type embeddings are summed and normalized,
then a stack of post-norm encoder layers (:class:`~attnlab.layers.TransformerEncoderLayer`:
self-attention, then a GELU MLP, each ``x = norm(x + drop(f(x)))``) reads them. The first
token's features (``[CLS]``, ``<s>``) go through a dense layer with ``tanh`` (BERT's pooler,
RoBERTa's classification head) or ``relu`` (DistilBERT's ``pre_classifier``), or straight
to the head (``pooler="none"``), and the head gives the class logits.

``forward(input_ids, attention_mask=None, token_type_ids=None)``: ``(B, L)`` ids, the Hugging
Face mask ``(B, L)`` (``1`` = real token, what a tokenizer returns; when omitted, tokens
equal to ``pad_token_id`` are padding) -> logits ``(B, num_classes)``, or the pooled
features ``(B, embed_dim)`` when ``num_classes=0`` (timm's convention for a model without
a head). :meth:`TextEncoder.forward_features` gives the last layer's token features
``(B, L, embed_dim)``.

Positions count from 0 at the first token (BERT, DistilBERT); with ``positions_from_ids``
(RoBERTa) they count real tokens from ``pad_token_id + 1`` and padding sits at
``pad_token_id``, as fairseq numbers them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attention.registry import attention_entry
from ..dropout import Dropout
from ..errors import InputError, shape_str
from ..layers.init import normal_init_
from ..layers.norms import LayerNorm
from ..layers.transformer_layers import TransformerEncoder, TransformerEncoderLayer
from .registry import build_config, refuse_options_the_model_sets, check_attention_values, register_model
from .token_ids import check_token_ids

__all__ = ["TextEncoderConfig", "TextEncoder", "POOLERS"]

POOLERS = ("tanh", "relu", "none", "mean")


@dataclass
class TextEncoderConfig:
    """Configuration of :class:`TextEncoder`; the defaults are BERT-base's."""

    vocab_size: int = 30522
    num_classes: int = 2  # 0: no head, the pooled features are the output
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0  # the MLP width is round(embed_dim * mlp_ratio) (BERT's intermediate_size)
    activation: str = "gelu"
    max_len: int = 512  # rows of the position table (RoBERTa's count the offset of pad_token_id + 1)
    type_vocab_size: int = 2  # token types (sentence A / B); 0: none (DistilBERT)
    pad_token_id: int = 0
    positions_from_ids: bool = False  # RoBERTa's positions: real tokens from pad_token_id + 1
    norm_eps: float = 1e-12
    drop_rate: float = 0.1  # embeddings, residual branches, MLP hidden layer, before the head
    attn_drop_rate: float = 0.1
    # the first token through dense + tanh (BERT, RoBERTa), dense + relu (DistilBERT), or none; mean: the mean of
    # the real tokens' features (sentence-transformers' models, all-MiniLM-L6-v2: trained to be read so)
    pooler: str = "tanh"
    attention: str = "exact"
    attention_options: dict = field(default_factory=dict)

    renamed: ClassVar[dict[str, str]] = {"hidden_size": "embed_dim", "num_hidden_layers": "depth",
                                         "num_attention_heads": "num_heads", "num_labels": "num_classes"}

    def __post_init__(self) -> None:
        if self.pooler not in POOLERS:
            raise InputError(f"pooler must be one of {', '.join(POOLERS)}; got {self.pooler!r}")
        if self.embed_dim % self.num_heads:
            raise InputError(f"embed_dim must be divisible by num_heads; got embed_dim={self.embed_dim}, "
                             f"num_heads={self.num_heads}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise InputError(f"pad_token_id must be in [0, vocab_size={self.vocab_size}); got {self.pad_token_id}")
        if self.positions_from_ids and self.max_len <= self.pad_token_id + 1:
            raise InputError(f"max_len must exceed pad_token_id + 1 = {self.pad_token_id + 1} with positions_from_ids; "
                             f"got {self.max_len}")
        if attention_entry(self.attention).family != "tokens":
            raise InputError(f"attention must be a 'tokens' kind; {self.attention!r} is a grid kind")
        refuse_options_the_model_sets(self.attention_options, {"dropout": "attn_drop_rate"})
        check_attention_values(TextEncoderConfig, self.attention, self.attention_options,
                               self.max_len if isinstance(self.max_len, int) else None)

    @property
    def longest(self) -> int:
        """The longest sequence the position table holds."""
        return self.max_len - (self.pad_token_id + 1 if self.positions_from_ids else 0)


class TextEncoder(nn.Module):
    """A BERT-shaped text encoder and classifier; see the module docstring."""

    def __init__(self, config: TextEncoderConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = build_config(TextEncoderConfig, asdict(config or TextEncoderConfig()), overrides)
        self.config = cfg
        e = cfg.embed_dim
        self.embed = nn.Embedding(cfg.vocab_size, e, padding_idx=cfg.pad_token_id)
        self.pos_embed = nn.Embedding(cfg.max_len, e)
        self.type_embed = nn.Embedding(cfg.type_vocab_size, e) if cfg.type_vocab_size else None
        self.embed_norm = LayerNorm(e, eps=cfg.norm_eps)
        self.embed_drop = Dropout(cfg.drop_rate)
        self.encoder = TransformerEncoder([
            TransformerEncoderLayer(e, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, drop_rate=cfg.drop_rate,
                                    attn_drop_rate=cfg.attn_drop_rate, activation=cfg.activation, norm_first=False,
                                    norm_eps=cfg.norm_eps, attention=cfg.attention,
                                    attention_options=cfg.attention_options)
            for _ in range(cfg.depth)], None)
        self.pooler = nn.Linear(e, e) if cfg.pooler in ("tanh", "relu") else None
        self.head_drop = Dropout(cfg.drop_rate)
        self.head = nn.Linear(e, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.apply(normal_init_)  # BERT's initialisation

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.encoder.set_grad_checkpointing(enable)

    def shard_blocks(self) -> list[nn.Module]:
        """The encoder's layers (:mod:`attnlab.engine.sharding`)."""
        return self.encoder.shard_blocks()

    def padding_mask(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """attnlab's ``key_padding_mask`` ``(B, L)``, ``True`` = padding."""
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise InputError(f"input_ids must be integer token ids of shape (B, L); got {input_ids.dtype} "
                             f"{shape_str(input_ids)}")
        check_token_ids(input_ids, self.config.vocab_size)
        if attention_mask is None:
            return input_ids == self.config.pad_token_id
        if attention_mask.shape != input_ids.shape:
            raise InputError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}; got "
                             f"{shape_str(attention_mask)}")
        return attention_mask == 0

    def _positions(self, input_ids: Tensor) -> Tensor:
        cfg = self.config
        if cfg.positions_from_ids:
            real = (input_ids != cfg.pad_token_id).long()
            return real.cumsum(dim=1) * real + cfg.pad_token_id
        return torch.arange(input_ids.shape[1], device=input_ids.device)[None]

    def forward_features(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                         token_type_ids: Tensor | None = None) -> Tensor:
        """The last layer's token features ``(B, L, embed_dim)``."""
        cfg = self.config
        pad = self.padding_mask(input_ids, attention_mask)
        if input_ids.shape[1] > cfg.longest:
            raise InputError(f"input_ids hold {input_ids.shape[1]} tokens; the model's positions hold {cfg.longest}")
        x = self.embed(input_ids) + self.pos_embed(self._positions(input_ids))
        if self.type_embed is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
            if token_type_ids is not None:
                check_token_ids(token_type_ids, cfg.type_vocab_size, "token_type_ids", "type_vocab_size")
            x = x + self.type_embed(types)
        elif token_type_ids is not None:
            raise InputError("token_type_ids: this model has no token types (type_vocab_size=0)")
        x = self.embed_drop(self.embed_norm(x))
        return self.encoder(x, key_padding_mask=pad)

    def pool(self, features: Tensor, padding: Tensor | None = None) -> Tensor:
        """``(B, L, E)`` -> ``(B, E)``: the first token, through the pooler; or (``pooler="mean"``)
        the mean over the tokens that ``padding`` (``(B, L)``, ``True`` = padding) leaves."""
        if self.config.pooler == "mean":
            keep = torch.ones(features.shape[:2], dtype=features.dtype, device=features.device) if padding is None \
                else (~padding).to(features.dtype)
            return (features * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1.0)
        first = features[:, 0]
        if self.pooler is None:
            return first
        pooled = self.pooler(first)
        return torch.tanh(pooled) if self.config.pooler == "tanh" else torch.relu(pooled)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        features = self.forward_features(input_ids, attention_mask, token_type_ids)
        pad = self.padding_mask(input_ids, attention_mask) if self.config.pooler == "mean" else None
        return self.head(self.head_drop(self.pool(features, pad)))


def _encoder(defaults: dict[str, Any], overrides: dict[str, Any]) -> TextEncoder:
    return TextEncoder(build_config(TextEncoderConfig, defaults, overrides))


@register_model("text")
def bert_tiny(**overrides: Any) -> TextEncoder:
    """BERT's shape at 2 layers of width 128, 2 heads (the size of Google's BERT-Tiny)."""
    return _encoder(dict(embed_dim=128, depth=2, num_heads=2), overrides)


@register_model("text")
def bert_base(**overrides: Any) -> TextEncoder:
    """BERT-base: 12 layers of width 768, 12 heads, 30,522 word pieces (110 M parameters)."""
    return _encoder({}, overrides)


@register_model("text")
def roberta_base(**overrides: Any) -> TextEncoder:
    """RoBERTa-base: BERT-base's shape with a byte-level BPE of 50,265 tokens, fairseq's positions
    (514 rows from pad id 1 + 1) and one token type; layer norms at 1e-5."""
    return _encoder(dict(vocab_size=50265, max_len=514, type_vocab_size=1, pad_token_id=1, positions_from_ids=True,
                         norm_eps=1e-5), overrides)


@register_model("text")
def distilbert_base(**overrides: Any) -> TextEncoder:
    """DistilBERT-base: 6 layers of width 768, no token types, a relu pre-classifier."""
    return _encoder(dict(depth=6, type_vocab_size=0, pooler="relu"), overrides)
