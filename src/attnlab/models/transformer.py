"""The Transformer encoder-decoder (Vaswani et al., 2017) and its registered sizes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..attention.exact import GroupedQueryAttention
from ..attention.registry import attention_entry
from ..dropout import Dropout
from ..errors import InputError
from ..attention.cache import ModelCache
from ..layers.norms import build_norm
from ..layers.pos_encoding import ADDED, INNER, build_pos_encoding, inner_position_options
from ..layers.transformer_layers import (
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    check_decoder_attention,
)
from ..weight_rules import Rule, apply_map, expand
from ..generation.search import translate
from .registry import build_config, refuse_options_the_model_sets, check_attention_values, register_model
from .token_ids import check_token_ids

__all__ = ["Transformer", "TransformerConfig", "Seq2SeqTransformer"]


class Transformer(nn.Module):
    """Encoder-decoder stack on embedded inputs, like ``torch.nn.Transformer`` but
    batch-first and with the decoder causal by default.

    ``final_norm`` adds a norm after each stack; default: only for pre-norm, where it is
    needed. ``position_options`` (``{"rope": True, "rope_theta": ...}`` or ``{"alibi": True}``,
    see :func:`~attnlab.layers.pos_encoding.inner_position_options`) give every
    self-attention, the encoder's and the decoder's, positions of its own. ``torch.nn.Transformer`` always has one; :meth:`from_torch` keeps that.
    The arguments are those of :class:`TransformerConfig` (the feed-forward width is
    ``round(embed_dim * mlp_ratio)``), with a ``bias`` on every projection.

    Shapes: ``src`` ``(B, Ls, E)``, ``tgt`` ``(B, Lt, E)`` -> ``(B, Lt, E)``; padding
    masks ``(B, Ls)`` / ``(B, Lt)``, ``True`` = padding (see
    :mod:`attnlab.attention.functional` for the mask convention).
    """

    def __init__(
        self, embed_dim: int = 512, num_heads: int = 8, encoder_depth: int = 6, decoder_depth: int = 6, *,
        mlp_ratio: float = 4.0, drop_rate: float = 0.1, attn_drop_rate: float | None = None,
        activation: str = "relu", norm_first: bool = False, norm: str = "layernorm", norm_eps: float = 1e-5,
        final_norm: bool | None = None, bias: bool = True, attention: str = "exact",
        attention_options: dict | None = None, position_options: dict | None = None,
        decoder_attention: str = "exact", decoder_attention_options: dict | None = None,
    ) -> None:
        super().__init__()
        kw = dict(
            mlp_ratio=mlp_ratio, drop_rate=drop_rate, attn_drop_rate=attn_drop_rate, activation=activation,
            norm_first=norm_first, norm=norm, norm_eps=norm_eps, bias=bias,
        )
        final = norm_first if final_norm is None else final_norm
        self.embed_dim, self.num_heads = embed_dim, num_heads
        # Each self-attention is a "tokens" kind of the registry (the decoder's one that honours a causal mask);
        # the cross-attention is exact attention over the memory.
        self.encoder = TransformerEncoder(
            [TransformerEncoderLayer(embed_dim, num_heads, attention=attention,
                                     attention_options={**(attention_options or {}), **(position_options or {})},
                                     **kw) for _ in range(encoder_depth)],
            build_norm(norm, embed_dim, norm_eps) if final else None,
        )
        self.decoder = TransformerDecoder(
            [TransformerDecoderLayer(embed_dim, num_heads, position_options=position_options,
                                     attention=decoder_attention, attention_options=decoder_attention_options, **kw)
             for _ in range(decoder_depth)],
            build_norm(norm, embed_dim, norm_eps) if final else None,
        )
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # As torch.nn.Transformer: Xavier-uniform on every matrix, in the order of the parameters. The decoder's
        # exact attention draws its query, key and value weights as one (3E, E) matrix, as the packed in_proj of
        # torch's (and of this decoder's module before it became the exact kind) did, so that a seeded run starts
        # from the weights it always had; the encoder's have been drawn one by one since it took registry kinds.
        joined = {id(m.q_proj.weight): (m.q_proj, m.k_proj, m.v_proj) for layer in self.decoder.layers
                  for m in (layer.self_attn, layer.cross_attn) if isinstance(m, GroupedQueryAttention)}
        skip = {id(lin.weight) for parts in joined.values() for lin in parts[1:]}
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() <= 1 or id(p) in skip:
                    continue
                if id(p) in joined:
                    parts = [lin.weight for lin in joined[id(p)]]
                    packed = nn.init.xavier_uniform_(torch.empty(sum(w.shape[0] for w in parts), p.shape[1],
                                                                 dtype=p.dtype, device=p.device))
                    for w, part in zip(parts, packed.split([w.shape[0] for w in parts])):
                        w.copy_(part)
                else:
                    nn.init.xavier_uniform_(p)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.encoder.set_grad_checkpointing(enable)
        self.decoder.set_grad_checkpointing(enable)

    def shard_blocks(self) -> list[nn.Module]:
        """The encoder's and the decoder's layers (:mod:`attnlab.engine.sharding`)."""
        return self.encoder.shard_blocks() + self.decoder.shard_blocks()

    def forward(
        self, src: Tensor, tgt: Tensor, *, src_key_padding_mask: Tensor | None = None,
        tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
        src_mask: Tensor | None = None, tgt_mask: Tensor | None = None, memory_mask: Tensor | None = None,
        tgt_is_causal: bool = True,
    ) -> Tensor:
        memory = self.encoder(src, key_padding_mask=src_key_padding_mask, attn_mask=src_mask)
        return self.decoder(
            tgt, memory, tgt_key_padding_mask=tgt_key_padding_mask, tgt_mask=tgt_mask, tgt_is_causal=tgt_is_causal,
            memory_key_padding_mask=memory_key_padding_mask, memory_mask=memory_mask,
        )

    @classmethod
    def from_torch(cls, module: nn.Transformer) -> "Transformer":
        """An equal (batch-first) stack from a ``torch.nn.Transformer``, weights copied."""
        enc0 = module.encoder.layers[0]
        act = {1: "relu", 2: "gelu"}.get(getattr(enc0, "activation_relu_or_gelu", 0))
        if act is None:
            raise InputError("from_torch: only 'relu' and 'gelu' activations are supported")
        # torch's d_model, nhead, dim_feedforward and dropout are our embed_dim, num_heads,
        # mlp_ratio (the width over embed_dim, which round() gives back exactly) and drop_rate.
        new = cls(
            embed_dim=module.d_model, num_heads=module.nhead, encoder_depth=len(module.encoder.layers),
            decoder_depth=len(module.decoder.layers), mlp_ratio=enc0.linear1.out_features / module.d_model,
            drop_rate=enc0.dropout.p, attn_drop_rate=enc0.self_attn.dropout, activation=act,
            norm_first=enc0.norm_first, norm_eps=enc0.norm1.eps, final_norm=module.encoder.norm is not None,
            bias=enc0.linear1.bias is not None,
        )
        rules = expand(_TORCH_ENCODER, len(module.encoder.layers)) + expand(_TORCH_DECODER, len(module.decoder.layers))
        state, _, left = apply_map(module.state_dict(), rules)
        new.load_state_dict({**left, **state})  # left: the final norms, under the same names
        p = next(module.parameters())
        return new.to(device=p.device, dtype=p.dtype).train(module.training)


# torch.nn.Transformer's names -> ours (attnlab.weight_rules): the packed projections split, the rest renamed.
def _torch_attention(theirs: str, ours: str) -> list[Rule]:
    return [(f"{theirs}.in_proj_{p}", tuple(f"{ours}.{n}_proj.{p}" for n in "qkv"), "split") for p in ("weight", "bias")] \
        + [(f"{theirs}.out_proj", f"{ours}.o_proj", "")]


_TORCH_FF: list[Rule] = [("{L}.linear1", "{L}.ff.fc1", ""), ("{L}.linear2", "{L}.ff.fc2", "")]
_TORCH_ENCODER: list[Rule] = [(t.replace("{L}", "encoder.layers.{i}"), o.replace("{L}", "encoder.layers.{i}"), h)
                              for t, o, h in _TORCH_FF] + _torch_attention("encoder.layers.{i}.self_attn",
                                                                           "encoder.layers.{i}.self_attn")
_TORCH_DECODER: list[Rule] = [(t.replace("{L}", "decoder.layers.{i}"), o.replace("{L}", "decoder.layers.{i}"), h)
                              for t, o, h in _TORCH_FF] + _torch_attention("decoder.layers.{i}.self_attn",
                                                                           "decoder.layers.{i}.self_attn") \
    + _torch_attention("decoder.layers.{i}.multihead_attn", "decoder.layers.{i}.cross_attn")


@dataclass
class TransformerConfig:
    """Configuration of :class:`Seq2SeqTransformer`; defaults are the 2017 "base" model.
    Names follow timm's (``embed_dim``, ``num_heads``, ``mlp_ratio``, ``drop_rate``, ...)."""

    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    embed_dim: int = 512
    num_heads: int = 8
    encoder_depth: int = 6  # encoder layers
    decoder_depth: int = 6  # decoder layers
    mlp_ratio: float = 4.0  # feed-forward width = round(embed_dim * mlp_ratio) (the paper's d_ff = 2048)
    drop_rate: float = 0.1  # residual branches, feed-forward hidden layer, embeddings
    attn_drop_rate: float | None = None  # on the attention weights; None: drop_rate
    activation: str = "relu"
    norm_first: bool = False  # post-norm, as in the paper
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    final_norm: bool | None = None  # None: only with pre-norm
    pos_embed: str = "sinusoidal"  # added: sinusoidal, learned, none; inside every self-attention: rope, alibi
    rope_theta: float = 10000.0  # pos_embed="rope": the base of the rotary wavelengths
    max_len: int = 1024
    share_embeddings: bool = True  # one table for source and target (needs one vocabulary)
    tie_output: bool = True  # output projection = target embedding (transposed)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    # The encoder's self-attention kind (a "tokens" kind of attnlab.attention.list_attention()).
    attention: str = "exact"
    attention_options: dict = field(default_factory=dict)
    # The decoder's self-attention kind: a "tokens" kind that honours a causal mask (its cache is its own;
    # a kind without one decodes by recomputing). The cross-attention is exact attention.
    decoder_attention: str = "exact"
    decoder_attention_options: dict = field(default_factory=dict)

    # Names before attnlab took timm's (torch.nn.Transformer's): read in older runs, pointed to in errors.
    renamed: ClassVar[dict[str, str]] = {"d_model": "embed_dim", "nhead": "num_heads",
                                         "num_encoder_layers": "encoder_depth", "num_decoder_layers": "decoder_depth",
                                         "dim_feedforward": "mlp_ratio", "dropout": "drop_rate",
                                         "attention_dropout": "attn_drop_rate", "pos_encoding": "pos_embed"}

    @staticmethod
    def upgrade(options: dict) -> dict:
        """Options of an older run in today's names (``dim_feedforward`` becomes the ratio)."""
        options = dict(options)
        if "dim_feedforward" in options:
            width = options.get("d_model", options.get("embed_dim"))
            if width is None:
                raise InputError("an older run's model option dim_feedforward needs d_model beside it to become "
                                 "mlp_ratio; set model.options.mlp_ratio instead")
            options["mlp_ratio"] = options.pop("dim_feedforward") / width
        return {TransformerConfig.renamed.get(k, k): v for k, v in options.items()}

    @property
    def mlp_hidden_dim(self) -> int:
        """The feed-forward width (the paper's d_ff)."""
        return round(self.embed_dim * self.mlp_ratio)

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "embed_dim", "num_heads", "max_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise InputError(f"{name} must be a positive integer; got {getattr(self, name)!r}")
        for name in ("encoder_depth", "decoder_depth"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise InputError(f"{name} must be a non-negative integer; got {getattr(self, name)!r}")
        if self.embed_dim % self.num_heads != 0:
            raise InputError(f"embed_dim must be divisible by num_heads; got embed_dim={self.embed_dim}, "
                             f"num_heads={self.num_heads}")
        if not self.mlp_ratio > 0:
            raise InputError(f"mlp_ratio must be positive; got {self.mlp_ratio!r}")
        if not 0.0 <= self.drop_rate < 1.0:
            raise InputError(f"drop_rate must be in [0, 1); got {self.drop_rate}")
        if self.attn_drop_rate is not None and not 0.0 <= self.attn_drop_rate < 1.0:
            raise InputError(f"attn_drop_rate must be in [0, 1) or None; got {self.attn_drop_rate}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise InputError(
                "share_embeddings needs src_vocab_size == tgt_vocab_size; "
                f"got {self.src_vocab_size} and {self.tgt_vocab_size}"
            )
        for name in ("pad_id", "bos_id", "eos_id"):
            idx = getattr(self, name)
            if not 0 <= idx < min(self.src_vocab_size, self.tgt_vocab_size):
                raise InputError(f"{name} must index both vocabularies; got {idx}")
        if attention_entry(self.attention).family != "tokens":  # unknown names fail here, with suggestions
            raise InputError(f"attention must be a 'tokens' kind; {self.attention!r} is a grid kind")
        refuse_options_the_model_sets(self.attention_options, {"dropout": "attn_drop_rate", "rope": "pos_embed",
                                                         "alibi": "pos_embed", "rope_theta": "rope_theta"})
        check_attention_values(TransformerConfig, self.attention, self.attention_options, self.max_len)
        check_decoder_attention(self.decoder_attention, "decoder_attention")
        refuse_options_the_model_sets(self.decoder_attention_options, {"dropout": "attn_drop_rate", "rope": "pos_embed",
                                                                 "alibi": "pos_embed", "rope_theta": "rope_theta"})
        check_attention_values(TransformerConfig, self.decoder_attention, self.decoder_attention_options,
                               self.max_len, key="decoder_attention_options")
        if self.pos_embed not in ADDED + INNER:
            raise InputError(f"pos_embed must be one of {sorted(ADDED + INNER)}; got {self.pos_embed!r}")
        inner_position_options(self.pos_embed, self.rope_theta, self.attention)  # a kind that cannot take them
        inner_position_options(self.pos_embed, self.rope_theta, self.decoder_attention)
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            raise InputError(f"pad_id, bos_id and eos_id must differ; got {self.pad_id}, {self.bos_id}, {self.eos_id}")


class Seq2SeqTransformer(nn.Module):
    """Token-to-token Transformer: embeddings, positions, encoder-decoder, output layer.

    Embeddings are scaled by ``sqrt(embed_dim)`` (paper §3.4). Padding masks come from
    ``pad_id``; the decoder is causal. ``generate`` decodes greedily or by beam search
    using a key/value cache.

    Shapes: ``src`` ``(B, Ls)`` and ``tgt`` ``(B, Lt)`` token ids -> logits
    ``(B, Lt, tgt_vocab_size)``. ``tgt`` is the decoder input (BOS + target[:-1]).
    """

    alignment_modules: ClassVar[str] = "transformer.decoder.layers.*.cross_attn"  # drawn as a translation's alignments

    def __init__(self, config: TransformerConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = build_config(TransformerConfig, asdict(config or TransformerConfig()), overrides)
        self.config = cfg
        d = cfg.embed_dim
        self.transformer = Transformer(
            d, cfg.num_heads, cfg.encoder_depth, cfg.decoder_depth, mlp_ratio=cfg.mlp_ratio, drop_rate=cfg.drop_rate,
            attn_drop_rate=cfg.attn_drop_rate, activation=cfg.activation, norm_first=cfg.norm_first,
            norm=cfg.norm, norm_eps=cfg.norm_eps, final_norm=cfg.final_norm, attention=cfg.attention,
            attention_options=cfg.attention_options,
            position_options=inner_position_options(cfg.pos_embed, cfg.rope_theta, cfg.attention),
            decoder_attention=cfg.decoder_attention, decoder_attention_options=cfg.decoder_attention_options,
        )
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=cfg.pad_id)
        self.src_pos = build_pos_encoding(cfg.pos_embed, d, cfg.max_len)
        self.tgt_pos = build_pos_encoding(cfg.pos_embed, d, cfg.max_len)
        self.embed_drop = Dropout(cfg.drop_rate)
        self.embed_scale = math.sqrt(d)
        self.generator = nn.Linear(d, cfg.tgt_vocab_size, bias=not cfg.tie_output)
        for emb in {self.src_embed, self.tgt_embed}:
            # std d^-1/2, so that the scaled embedding has unit variance like the positions.
            nn.init.normal_(emb.weight, std=d**-0.5)
            with torch.no_grad():
                emb.weight[cfg.pad_id].zero_()
        if cfg.tie_output:
            self.generator.weight = self.tgt_embed.weight

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.transformer.set_grad_checkpointing(enable)

    def shard_blocks(self) -> list[nn.Module]:
        return self.transformer.shard_blocks()

    def _check_ids(self, name: str, ids: Tensor) -> None:
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise InputError(f"{name} must be integer token ids of shape (B, L); got {ids.dtype} {tuple(ids.shape)}")
        size = "src_vocab_size" if name == "src" else "tgt_vocab_size"
        check_token_ids(ids, getattr(self.config, size), name, size)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """``src`` ``(B, Ls)`` -> memory ``(B, Ls, E)`` and its padding mask ``(B, Ls)``."""
        self._check_ids("src", src)
        pad = src == self.config.pad_id
        x = self.embed_drop(self.src_pos(self.src_embed(src) * self.embed_scale))
        return self.transformer.encoder(x, key_padding_mask=pad), pad

    def decode(
        self, tgt: Tensor, memory: Tensor, memory_key_padding_mask: Tensor | None, *,
        cache: ModelCache | None = None, last_only: bool = False,
    ) -> Tensor:
        """Logits ``(B, Lt, V)`` for decoder input ``tgt`` ``(B, Lt)``.

        With a cache, ``tgt`` holds only the new positions and the cache grows by them.
        ``last_only`` returns the last position's logits ``(B, 1, V)``, which is all that
        generation reads; generation's targets are never padded before a live position,
        so no target padding mask is built then either.
        """
        self._check_ids("tgt", tgt)
        if memory.shape[0] != tgt.shape[0]:
            raise InputError(f"memory must have tgt's batch size {tgt.shape[0]}; got shape {tuple(memory.shape)}")
        offset = 0 if cache is None else cache.seq_len
        x = self.embed_drop(self.tgt_pos(self.tgt_embed(tgt) * self.embed_scale, offset))
        decoder = self.transformer.decoder
        if cache is not None and tgt.shape[1] == 1 and offset > 0 and not self.training \
                and not torch.is_grad_enabled() and decoder.has_step:  # a generation's step after the first
            return self.generator(decoder.step(x[:, 0], memory, memory_key_padding_mask, cache))[:, None]
        tgt_pad = None if cache is not None or last_only else tgt == self.config.pad_id
        h = self.transformer.decoder(
            x, memory, tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=memory_key_padding_mask, cache=cache
        )
        return self.generator(h[:, -1:] if last_only else h)

    def new_cache(self, batch: int | None = None, capacity: int | None = None) -> ModelCache:
        """The decoder's caches, each made by its attention module (the protocol of
        :mod:`attnlab.generation.search`)."""
        return self.transformer.decoder.new_cache(batch, capacity)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        memory, pad = self.encode(src)
        return self.decode(tgt, memory, pad)

    @torch.no_grad()
    def generate(
        self, src: Tensor, *, max_new_tokens: int | None = None, num_beams: int = 1, use_cache: bool = True,
        **options: Any,
    ) -> Tensor:
        """Translate ``src`` ``(B, Ls)``: token ids ``(B, T)`` without BOS, ending at EOS
        when one was produced, right-padded with ``pad_id``.

        ``num_beams=1`` is greedy search, or sampling with ``temperature`` above 0 (``top_k``,
        ``top_p``, ``min_p``, ``repetition_penalty``, ``seed``: the same tokens for the same
        seed); more is beam search, whose finished hypotheses are ranked by ``log p / length **
        length_penalty`` (:func:`attnlab.generation.search.translate`; ``observer`` sees each
        step). ``use_cache=False`` decodes without the key/value cache (same result, slower: for
        measurements). ``max_new_tokens`` defaults to ``Ls + 50`` (capped by ``max_len``).
        """
        self._check_ids("src", src)
        if max_new_tokens is None:
            max_new_tokens = min(src.shape[1] + 50, self.config.max_len)
        if not 0 < max_new_tokens <= self.config.max_len:
            raise InputError(f"max_new_tokens must be in [1, {self.config.max_len}]; got {max_new_tokens}")
        if not isinstance(num_beams, int) or num_beams < 1:
            raise InputError(f"num_beams must be a positive integer; got {num_beams!r}")
        use_cache = use_cache and self.transformer.decoder.keeps_cache  # a kind without a cache recomputes
        return translate(self, src, max_new_tokens, num_beams=num_beams, use_cache=use_cache, **options)[0]


# --------------------------------------------------------------------------- registry
def _build(defaults: dict, overrides: dict) -> Seq2SeqTransformer:
    return Seq2SeqTransformer(TransformerConfig(**defaults), **overrides)


@register_model("transformer")
def transformer_base(**overrides) -> Seq2SeqTransformer:
    """2017 "base": 6+6 layers, d=512, h=8, d_ff=2048, shared 37k vocabulary, tied."""
    return _build({}, overrides)


@register_model("transformer")
def transformer_big(**overrides) -> Seq2SeqTransformer:
    """2017 "big": 6+6 layers, d=1024, h=16, d_ff=4096, dropout 0.3."""
    return _build(dict(embed_dim=1024, num_heads=16, drop_rate=0.3), overrides)


@register_model("transformer")
def transformer_small(**overrides) -> Seq2SeqTransformer:
    """3+3 layers, d=256, h=8, d_ff=1024, 10k vocabulary: Multi30k-sized."""
    return _build(
        dict(src_vocab_size=10000, tgt_vocab_size=10000, embed_dim=256, encoder_depth=3, decoder_depth=3),
        overrides,
    )


@register_model("transformer")
def transformer_tiny(**overrides) -> Seq2SeqTransformer:
    """2+2 layers, d=128, h=4, d_ff=512, 1k vocabulary, pre-norm: tests and demos."""
    return _build(
        dict(src_vocab_size=1000, tgt_vocab_size=1000, embed_dim=128, num_heads=4, encoder_depth=2,
             decoder_depth=2, norm_first=True, max_len=512), overrides,
    )
