"""The metadata keys of a GGUF file that attnlab reads, one schema each: the value's type, its
range, and what attnlab does with it.

:func:`check_metadata` holds every key of a file against this table once, when the file is
opened, before anything reads a value: a value of the wrong type (a count written as text, a
name as a list) or out of range (no heads) is one line naming the file, the key, what was
given and what is expected, whichever command opened the file. Keys are named as llama.cpp
writes them; ``{arch}.`` stands for the file's ``general.architecture``, and ``NAME.*`` for
every key under ``NAME.``. A key of no entry here is not read, and is refused by the tables
that turn the metadata into a model (:mod:`attnlab.formats.gguf.tables`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError

__all__ = ["MetaKey", "METADATA", "check_metadata", "schema_of"]

U32 = 2**32 - 1  # llama.cpp stores counts and sizes as uint32


@dataclass(frozen=True)
class MetaKey:
    """One key's schema. ``kind``: ``"int"`` (a whole number), ``"float"`` (a number), ``"bool"``,
    ``"str"``, ``"ints"``, ``"floats"``, ``"strs"`` (arrays of those), ``"any"`` (read as a
    description, never as a value); ``low`` and ``high`` bound a number (or each number of an
    array), ``positive`` asks a number above 0; ``per_layer``: a number, or an array of them, one
    per layer; ``config``: the ``config.json`` key the value becomes (None: read by a rule of its
    own, or not at all); ``only``: the architectures that read it (empty: every one); ``why``:
    what attnlab does with it."""

    kind: str
    why: str
    low: int | None = None
    high: int | None = None
    positive: bool = False
    per_layer: bool = False
    config: str | None = None
    only: tuple[str, ...] = ()


def _count(why: str, config: str | None = None, low: int = 1, per_layer: bool = False) -> MetaKey:
    return MetaKey("int", why, low=low, high=U32, per_layer=per_layer, config=config)


def _token_id(why: str) -> MetaKey:
    return MetaKey("int", why, low=0, high=U32)


_FIM = "irrelevant: fill-in-the-middle tokens, for code completion"
METADATA: dict[str, MetaKey] = {
    # ---------------------------------------------------------------- the file
    "general.architecture": MetaKey("str", "the architecture, which names the table the model is read by"),
    "general.type": MetaKey("str", "model, adapter, mmproj or vocab: models are read"),
    "general.alignment": _count("the alignment of the tensors' data (a power of two)"),
    "general.*": MetaKey("any", "a description of the file (name, license, authors, sources, tags, the "
                                "quantization it used)"),
    "quantize.imatrix.*": MetaKey("any", "how the quantization was calibrated"),
    "split.count": _count("the files of a split model, which attnlab reads merged", low=0),
    "split.no": _count("which file of a split model this is", low=0),
    "split.tensors.count": _count("the tensors of a split model in all", low=0),
    # ---------------------------------------------------------------- the architecture
    "{arch}.context_length": _count("the positions the model was trained for", "max_position_embeddings"),
    "{arch}.embedding_length": _count("the width", "hidden_size"),
    "{arch}.block_count": _count("the layers", "num_hidden_layers"),
    "{arch}.feed_forward_length": _count("the MLP's hidden width", "intermediate_size"),
    "{arch}.attention.head_count": _count("the query heads", "num_attention_heads"),
    "{arch}.attention.head_count_kv": _count("the key/value heads (one number, or one per layer)",
                                             "num_key_value_heads", per_layer=True),
    "{arch}.attention.layer_norm_rms_epsilon": MetaKey("float", "the RMS norms' epsilon", positive=True,
                                                       config="rms_norm_eps"),
    "{arch}.rope.freq_base": MetaKey("float", "the rotary base (theta)", positive=True, config="rope_theta"),
    "{arch}.vocab_size": _count("the vocabulary's size", "vocab_size"),
    "{arch}.attention.key_length": _count("the heads' size", "head_dim"),
    "{arch}.attention.value_length": _count("the heads' size of values (equal to key_length)"),
    "{arch}.attention.sliding_window": _count("the sliding layers' window", "sliding_window", low=0),
    "{arch}.rope.dimension_count": _count("the rotated part of each head"),
    "{arch}.rope.scaling.type": MetaKey("str", "the rotary scaling: none, linear or yarn"),
    "{arch}.rope.scaling.factor": MetaKey("float", "the rotary scaling's factor", positive=True),
    "{arch}.rope.scaling.original_context_length": _count("the positions before the rotary scaling"),
    "{arch}.rope.scaling.finetuned": MetaKey("any", "whether the model was fine-tuned with its rotary scaling: a "
                                                    "description"),
    "{arch}.expert_count": _count("the experts of a mixture, which attnlab refuses", low=0),
    "{arch}.expert_used_count": _count("the experts a token uses", low=0),
    "{arch}.tensor_data_layout": MetaKey("any", "the layout of the weights that llama.cpp's converter read"),
    "{arch}.attn_logit_softcapping": MetaKey("float", "Gemma 2's soft cap of the attention logits", positive=True,
                                             config="attn_logit_softcapping", only=("gemma2",)),
    "{arch}.final_logit_softcapping": MetaKey("float", "Gemma's soft cap of the output logits", positive=True,
                                              config="final_logit_softcapping", only=("gemma2", "gemma3")),
    "{arch}.attention.sliding_window_pattern": MetaKey("int", "Gemma 3's period of sliding and full layers", low=1,
                                                       high=U32, config="sliding_window_pattern",
                                                       only=("gemma3",)),
    # ---------------------------------------------------------------- the tokenizer
    "tokenizer.ggml.model": MetaKey("str", "the kind of vocabulary (gpt2: byte-level BPE; llama: SentencePiece-style)"),
    "tokenizer.ggml.pre": MetaKey("str", "how text is split before merging"),
    "tokenizer.ggml.tokens": MetaKey("strs", "the vocabulary"),
    "tokenizer.ggml.scores": MetaKey("floats", "the pieces' scores: the merges' ranks of a llama vocabulary"),
    "tokenizer.ggml.token_type": MetaKey("ints", "control tokens become special, user-defined ones added tokens",
                                         low=-(2**31), high=2**31 - 1),
    "tokenizer.ggml.merges": MetaKey("strs", "the merges of a gpt2 vocabulary"),
    "tokenizer.ggml.bos_token_id": _token_id("the first token a prompt gets, with add_bos_token"),
    "tokenizer.ggml.eos_token_id": _token_id("ends a generation and the documents a run trains on"),
    "tokenizer.ggml.eot_token_id": _token_id("ends a generation (end of turn)"),
    "tokenizer.ggml.eom_token_id": _token_id("ends a generation (end of message)"),
    "tokenizer.ggml.unknown_token_id": _token_id("the unknown token"),
    "tokenizer.ggml.padding_token_id": _token_id("the padding token"),
    "tokenizer.ggml.add_bos_token": MetaKey("bool", "whether a prompt starts with the bos token"),
    "tokenizer.ggml.add_eos_token": MetaKey("bool", "whether a prompt ends with the eos token"),
    "tokenizer.ggml.add_space_prefix": MetaKey("bool", "whether a llama vocabulary's text starts with ▁"),
    "tokenizer.ggml.remove_extra_whitespaces": MetaKey("bool", "true is refused (a normalizer attnlab does not "
                                                               "build)"),
    "tokenizer.chat_template": MetaKey("str", "the chat template"),
    "tokenizer.chat_template.*": MetaKey("str", "a chat template of that name, besides the default"),
    "tokenizer.chat_templates": MetaKey("strs", "the names of the templates besides the default"),
    "tokenizer.ggml.add_sep_token": MetaKey("any", "irrelevant: a separator is for pairs of texts, which a decoder "
                                                   "does not take"),
    "tokenizer.ggml.seperator_token_id": MetaKey("any", "irrelevant: as add_sep_token (llama.cpp's spelling)"),
    "tokenizer.ggml.cls_token_id": MetaKey("any", "irrelevant: an encoder's classification token"),
    "tokenizer.ggml.mask_token_id": MetaKey("any", "irrelevant: an encoder's mask token"),
    **{f"tokenizer.ggml.{name}_token_id": MetaKey("any", _FIM)
       for name in ("prefix", "suffix", "middle", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")},
}


def schema_of(key: str, architecture: str) -> tuple[str, MetaKey] | None:
    """The entry of :data:`METADATA` that ``key`` falls under in a file of ``architecture``, as
    ``(its name in the table, its schema)``, or ``None`` (a key attnlab does not read)."""
    prefix = architecture + "."
    name = "{arch}." + key[len(prefix):] if key.startswith(prefix) else key
    if name in METADATA:
        return name, METADATA[name]
    head = name
    while "." in head:
        head = head.rpartition(".")[0]
        if head + ".*" in METADATA:
            return head + ".*", METADATA[head + ".*"]
    return None


def _given(value: Any) -> str:
    """``value`` as a message says what was given."""
    if isinstance(value, bool):
        return f"the truth value {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "..."
        return f"the text {shown!r}"
    if isinstance(value, np.ndarray):
        what = "truth value" if value.dtype == np.bool_ else "whole number" if value.dtype.kind in "iu" else "number"
        return f"a list of {value.size:,} {what}{'' if value.size == 1 else 's'}"
    if isinstance(value, list):
        return f"a list of {len(value):,} text{'' if len(value) == 1 else 's'}"
    return type(value).__name__


def _expected(spec: MetaKey) -> str:
    what = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a text",
            "ints": "a list of whole numbers", "floats": "a list of numbers", "strs": "a list of texts"}[spec.kind]
    if spec.positive:
        what += " > 0"
    elif spec.low is not None and spec.high is not None:
        what += f" from {spec.low:,} to {spec.high:,}"
    if spec.per_layer:
        what += ", or a list of them (one per layer)"
    return what


def _number_fits(value: Any, spec: MetaKey, whole: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)):
        return False
    if not math.isfinite(value) or (spec.positive and value <= 0):
        return False
    return (spec.low is None or value >= spec.low) and (spec.high is None or value <= spec.high)


def _array_fits(value: Any, spec: MetaKey, whole: bool) -> bool:
    if not isinstance(value, np.ndarray) or value.dtype == np.bool_ or (whole and value.dtype.kind not in "iu"):
        return False
    if value.size == 0:
        return True
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        return False
    low, high = value.min(), value.max()
    if spec.positive and low <= 0:
        return False
    return (spec.low is None or low >= spec.low) and (spec.high is None or high <= spec.high)


def _fits(value: Any, spec: MetaKey) -> bool:
    kind = spec.kind
    if kind == "any":
        return True
    if kind in ("int", "float"):
        whole = kind == "int"
        return _number_fits(value, spec, whole) or (spec.per_layer and _array_fits(value, spec, whole))
    if kind in ("ints", "floats"):
        return _array_fits(value, spec, kind == "ints")
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return isinstance(value, list) and all(isinstance(v, str) for v in value)  # strs


def check_metadata(meta: dict[str, Any], path: str | Path) -> None:
    """Refuse, in one line naming ``path`` and the key, the first value of ``meta`` (a GGUF
    file's metadata as :class:`~attnlab.formats.gguf.reader.GGUFFile` reads it) whose type or
    range its schema does not take. Keys of no schema are left to the tables that read them."""
    architecture = meta.get("general.architecture")
    if not isinstance(architecture, str):
        given = "nothing" if architecture is None else _given(architecture)
        raise InputError(f"{path}: metadata general.architecture must be a text (the model's architecture); got "
                         f"{given}")
    for key, value in meta.items():
        found = schema_of(key, architecture)
        if found is not None and not _fits(value, found[1]):
            raise InputError(f"{path}: metadata {key} must be {_expected(found[1])} ({found[1].why}); got "
                             f"{_given(value)}")
