"""GGUF files as Hugging Face checkpoints: each architecture one table that turns the
file's metadata into the ``config.json`` its Hugging Face family reads and its tensor names
into that family's, so that a GGUF file then loads through the same tables as a folder
(:mod:`attnlab.formats.hf.tables`: one conversion to attnlab's names, one set of checks).

What llama.cpp's converter changed is undone here, as ``transformers`` undoes it: the query
and key rows of ``llama`` files were reordered for llama.cpp's interleaved rotary layout,
and Gemma's norms are stored as ``1 + weight``. Every metadata key is read, declared
irrelevant with its reason, both in its schema (:data:`~attnlab.formats.gguf.metadata.METADATA`,
which also types it), or refused by name, as every tensor name is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from ...errors import InputError
from .metadata import METADATA, check_metadata, schema_of
from .reader import GGUFFile

__all__ = ["GGUF_ARCHITECTURES", "GGUFArchitecture", "GGUFCheckpoint"]

# {arch}.KEY -> config.json key: the keys every architecture's metadata holds alike, copied.
_COMMON: dict[str, str] = {name[len("{arch}."):]: spec.config for name, spec in METADATA.items()
                           if name.startswith("{arch}.") and spec.config and not spec.only}
_ROPE_TYPES = {"none": None, "linear": "linear", "yarn": "yarn"}


def _query_scale(layers_27b: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Gemma's query scale, which the files do not hold: llama.cpp scales the 27B models'
    queries (46 layers in Gemma 2, 62 in Gemma 3) by ``hidden_size / num_attention_heads``
    and every other's by the head size, as their config.json's ``query_pre_attn_scalar`` says."""
    def derive(c: dict[str, Any]) -> dict[str, Any]:
        head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        wide = c.get("num_hidden_layers") == layers_27b
        return {"query_pre_attn_scalar": c["hidden_size"] // c["num_attention_heads"] if wide else head}
    return derive


@dataclass(frozen=True)
class GGUFArchitecture:
    """One ``general.architecture``: the Hugging Face ``model_type`` its config becomes (the
    metadata it reads besides :data:`_COMMON` is the schema's, ``MetaKey.only``), the config
    values it always has, and the
    tensors llama.cpp changed: ``permute_qk`` (rows reordered for the interleaved rotary
    layout), ``norms_plus_one`` (Gemma's norms stored as ``1 + weight``), ``ffn_norm`` (the
    Hugging Face name of ``ffn_norm``), ``packed`` (Phi-3's joined projections)."""

    model_type: str
    fixed: dict[str, Any] = field(default_factory=dict)
    derived: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    permute_qk: bool = False
    norms_plus_one: bool = False
    ffn_norm: str = "post_attention_layernorm"
    packed: bool = False


_GEMMA_FIXED = {"hidden_activation": "gelu_pytorch_tanh"}
GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {
    # Mistral's files are llama files too (llama.cpp writes them so, and reads no sliding window in them).
    "llama": GGUFArchitecture("llama", permute_qk=True),
    "qwen2": GGUFArchitecture("qwen2"),
    "qwen3": GGUFArchitecture("qwen3"),
    "phi3": GGUFArchitecture("phi3", packed=True),
    "gemma2": GGUFArchitecture("gemma2", fixed=_GEMMA_FIXED, derived=_query_scale(46), norms_plus_one=True,
                               ffn_norm="pre_feedforward_layernorm"),
    "gemma3": GGUFArchitecture("gemma3_text", fixed=_GEMMA_FIXED, derived=_query_scale(62), norms_plus_one=True,
                               ffn_norm="pre_feedforward_layernorm"),
}

# GGUF tensor names -> Hugging Face's, for the decoders above (blk.N. -> model.layers.N.).
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_qkv": "self_attn.qkv_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
          "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "post_attention_norm": "post_attention_layernorm",
          "post_ffw_norm": "post_feedforward_layernorm"}
_NOT_READ = {"rope_freqs": "Llama 3.1's scaled rotary frequencies",
             "rope_factors_long": "Phi-3's long-context rotary factors", "rope_factors_short":
             "Phi-3's long-context rotary factors"}


def _hf_name(name: str, arch: GGUFArchitecture) -> str | None:
    """The Hugging Face name of GGUF tensor ``name`` in ``arch``'s files, or ``None``."""
    stem, dot, kind = name.rpartition(".")
    if kind not in ("weight", "bias") or not dot:
        return None
    if stem in _TOP:
        return f"{_TOP[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    layer, what = parts[1], parts[2]
    if what == "ffn_norm":
        hf = arch.ffn_norm
    elif what == "ffn_up" and arch.packed:
        hf = "mlp.gate_up_proj"
    elif what in _LAYER:
        hf = _LAYER[what]
    else:
        return None
    return f"model.layers.{int(layer)}.{hf}.{kind}"


def _unpermute(w: Tensor, heads: int) -> Tensor:
    """Undo llama.cpp's reordering of a query or key projection's rows (its interleaved
    rotary layout: within each head, the two halves' rows alternate)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class GGUFCheckpoint:
    """A GGUF file read as a Hugging Face checkpoint: :meth:`config` (the ``config.json`` its
    metadata makes), :meth:`headers` (its tensors in Hugging Face's names and shapes, as meta
    tensors), :meth:`weights` (dequantized to float32), :meth:`tokenizer`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.file = GGUFFile(self.path)
        meta = self.file.metadata
        check_metadata(meta, self.path)  # every value typed before any is read
        self.config_file = self.path  # what messages name
        arch_name = meta["general.architecture"]
        kind = meta.get("general.type", "model")
        if kind != "model":
            what = {"adapter": "a LoRA adapter", "mmproj": "a vision projector", "vocab": "a vocabulary alone"}
            raise InputError(f"{self.path}: metadata general.type {kind!r} ({what.get(kind, 'not a model')}) is not a "
                             f"model file; attnlab reads the models of {', '.join(GGUF_ARCHITECTURES)}")
        if arch_name not in GGUF_ARCHITECTURES:
            raise InputError(f"{self.path}: metadata general.architecture {arch_name!r} is not supported; attnlab reads "
                             f"GGUF files of {', '.join(GGUF_ARCHITECTURES)}")
        self.architecture = arch_name
        self.arch = GGUF_ARCHITECTURES[arch_name]
        self._config = self._make_config()
        self._names: dict[str, str] = {}
        for name in self.file.tensors:
            hf = _hf_name(name, self.arch)
            if hf is None:
                stem = name.rpartition(".")[0]
                why = f" ({_NOT_READ[stem]}, which attnlab does not implement)" if stem in _NOT_READ else ""
                raise InputError(f"{self.path}: tensor {name}{why} is not one a {arch_name} model has; attnlab reads "
                                 f"token_embd, output_norm, output and blk.N.{{{', '.join([*_LAYER, 'ffn_norm'])}}}")
            self._names[name] = hf

    # ------------------------------------------------------------------ metadata -> config.json
    def _make_config(self) -> dict[str, Any]:
        meta, arch, path = self.file.metadata, self.architecture, self.path
        prefix = arch + "."
        config: dict[str, Any] = {"model_type": self.arch.model_type, **self.arch.fixed}
        for key, value in meta.items():
            found = schema_of(key, arch)
            if found is None or (found[1].only and arch not in found[1].only):
                readable = [prefix + name[len("{arch}."):] for name, spec in METADATA.items()
                            if name.startswith("{arch}.") and (not spec.only or arch in spec.only)]
                raise InputError(f"{path}: metadata key {key} is not one attnlab reads for a {arch} model"
                                 + (f"; it reads {', '.join(readable)}" if key.startswith(prefix) else ""))
            if key.startswith(prefix) and found[1].config:
                config[found[1].config] = _plain(value)
        if meta.get("split.count", 1) > 1:
            raise InputError(f"{path}: is part {meta.get('split.no', 0) + 1} of {meta['split.count']} of a split file; "
                             f"merge them first (llama-gguf-split --merge FIRST OUT)")
        experts = meta.get(prefix + "expert_count", 0)
        if experts:
            raise InputError(f"{path}: metadata {prefix}expert_count {experts}: a mixture of experts, which attnlab "
                             f"does not implement")
        heads = config.get("num_attention_heads")
        kv = meta.get(prefix + "attention.head_count_kv")
        if isinstance(kv, np.ndarray):  # one per layer: every layer the same, as attnlab builds them
            if kv.size == 0 or not (kv == kv[0]).all():
                raise InputError(f"{path}: metadata {prefix}attention.head_count_kv differs between layers; attnlab's "
                                 f"layers share one number of key/value heads")
            config["num_key_value_heads"] = int(kv[0])
        key_len, value_len = meta.get(prefix + "attention.key_length"), meta.get(prefix + "attention.value_length")
        if value_len is not None and key_len is not None and value_len != key_len:
            raise InputError(f"{path}: metadata {prefix}attention.value_length {value_len} differs from key_length "
                             f"{key_len}; attnlab's heads have one size")
        rot = meta.get(prefix + "rope.dimension_count")
        head_dim = key_len or (config["hidden_size"] // heads if isinstance(heads, int) and heads > 0 and
                               isinstance(config.get("hidden_size"), int) else None)
        if rot is not None and head_dim and rot != head_dim:
            config["partial_rotary_factor"] = rot / head_dim
        rope_type = meta.get(prefix + "rope.scaling.type", "none")
        if rope_type not in _ROPE_TYPES:
            raise InputError(f"{path}: metadata {prefix}rope.scaling.type {rope_type!r} is not supported; attnlab "
                             f"reads {', '.join(_ROPE_TYPES)}")
        if _ROPE_TYPES[rope_type] is not None:
            scaling = {"rope_type": _ROPE_TYPES[rope_type], "factor": float(meta.get(prefix + "rope.scaling.factor",
                                                                                   1.0))}
            if prefix + "rope.scaling.original_context_length" in meta:
                scaling["original_max_position_embeddings"] = int(meta[prefix + "rope.scaling.original_context_length"])
            config["rope_scaling"] = scaling
        if "vocab_size" not in config:
            tokens = meta.get("tokenizer.ggml.tokens")
            embed = self.file.tensors.get("token_embd.weight")
            config["vocab_size"] = len(tokens) if tokens else embed.shape[0] if embed is not None else None
        config["tie_word_embeddings"] = "output.weight" not in self.file.tensors
        if any(n.endswith(".attn_q.bias") for n in self.file.tensors):
            config["attention_bias"] = True
        if self.arch.derived is not None:
            try:
                config.update(self.arch.derived(config))
            except (KeyError, TypeError, ZeroDivisionError):
                pass  # the missing or wrong value is named when the config is read
        return config

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    # ------------------------------------------------------------------ tensors
    def headers(self) -> dict[str, Tensor]:
        return {self._names[n]: torch.empty(t.shape, dtype=torch.float32, device="meta")
                for n, t in self.file.tensors.items()}

    def weights(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        heads, kv = self._config.get("num_attention_heads"), self._config.get("num_key_value_heads")
        # One tensor at a time: two threads gained nothing, since gguf's dequantization holds the interpreter
        # between its numpy operations.
        for name in self.file.tensors:
            w = self.file.read(name)
            stem = name.rpartition(".")[0]
            if self.arch.permute_qk and stem.endswith((".attn_q", ".attn_k")):
                w = _unpermute(w, heads if stem.endswith(".attn_q") else (kv or heads))
            if self.arch.norms_plus_one and name.endswith("norm.weight"):
                w -= 1.0  # Hugging Face's Gemma stores the norms' weight less one, as transformers reads it
            out[self._names[name]] = w
        return out

    def tokenizer(self) -> Any:
        from .tokenizer import gguf_tokenizer

        return gguf_tokenizer(self.file.metadata, self.path, self.architecture)


def _plain(value: Any) -> Any:
    """A metadata value as config.json would hold it (a number, not numpy's)."""
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return value.item()
        return value.tolist()
    return value
