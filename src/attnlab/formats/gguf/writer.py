"""A decoder out as a GGUF file for llama.cpp (and ``transformers``, and attnlab's own reader):
F32, F16 or Q8_0 weights, the tokenizer and chat template in the file's metadata.

Every name and layout is the reading tables' backwards, so one table serves both ways: the
Hugging Face folder a model becomes (:mod:`attnlab.formats.hf.export`: its ``config.json``
and names) goes through :mod:`attnlab.formats.gguf.tables` inverted: config keys to
``{arch}.*`` metadata, Hugging Face's tensor names to llama.cpp's, ``llama`` files' query and
key rows reordered for llama.cpp's interleaved rotary layout. The block layouts are the
``gguf`` package's (``gguf.quants.quantize``), as llama.cpp's own converter writes them:
two-dimensional weights in the chosen type (Q8_0 where a row is a whole number of its
32-value blocks), norms and biases in F32.

Before the file is put in place it is read back with attnlab's reader and its logits are
compared with those of the model whose weights were rounded exactly as the file stores them
(:func:`save_gguf`): a wrong name, order or metadata key fails there, not in llama.cpp.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...errors import InputError
from ...io import check_output, put_in_place, staging_for, write_error
from .tables import _COMMON, _LAYER, _TOP, GGUF_ARCHITECTURES, _unpermute
from .tokenizer import PRE_SPLITS, _GPT2
from ...models.gpt import GPT
from ..hf.export import check_logits, hf_config, hf_weights
from ..hf.tables import HF_FAMILIES

__all__ = ["GGUF_TYPES", "save_gguf", "gguf_tensor_name", "tokenizer_metadata"]

GGUF_TYPES = ("f32", "f16", "q8_0")
_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}  # model_type -> architecture
_CONFIG_KEY = {v: k for k, v in _COMMON.items()}  # config.json key -> {arch}.KEY
_BLOCK = 32  # values per Q8_0 block
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5


def gguf_tensor_name(hf_name: str, architecture: str) -> str:
    """llama.cpp's name of the Hugging Face tensor ``hf_name`` in ``architecture``'s files."""
    arch = GGUF_ARCHITECTURES[architecture]
    stem, _, kind = hf_name.rpartition(".")
    top = {v: k for k, v in _TOP.items()}
    if stem in top:
        return f"{top[stem]}.{kind}"
    layer = {v: k for k, v in _LAYER.items()}
    layer[arch.ffn_norm] = "ffn_norm"
    parts = stem.split(".", 3)
    if len(parts) != 4 or parts[:2] != ["model", "layers"] or parts[3] not in layer:
        raise AssertionError(f"{hf_name} has no GGUF name in a {architecture} file")
    return f"blk.{parts[2]}.{layer[parts[3]]}.{kind}"


def _permute(w: Tensor, heads: int) -> Tensor:
    """llama.cpp's order of a query or key projection's rows (the inverse of the reader's
    ``_unpermute``): within each head, the rows of the two halves interleaved."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _pre_name(spec: dict[str, Any]) -> str:
    """The ``tokenizer.ggml.pre`` under which llama.cpp splits text as the tokenizer's
    pre-tokenizer does (``spec``: tokenizer.json's ``pre_tokenizer``)."""
    steps = spec.get("pretokenizers", [spec]) if spec else []
    splits: list[str] = []
    for step in steps:
        kind = step.get("type")
        if kind == "Split" and step.get("behavior") == "Isolated" and not step.get("invert"):
            splits.append(step.get("pattern", {}).get("Regex", ""))
        elif kind == "Digits" and step.get("individual_digits"):
            splits.append(r"\p{N}")
        elif kind == "ByteLevel":
            if step.get("use_regex", True):
                splits.append(_GPT2)
        else:
            splits.append(f"<{kind}>")
    names = [name for name, expressions in PRE_SPLITS.items() if expressions == tuple(splits)]
    for usual in ("gpt-2", "smollm", "llama-bpe", "qwen2"):  # the names llama.cpp's converter gives these
        if usual in names:
            return usual
    if names:
        return names[0]
    raise InputError(f"the tokenizer splits text with {json.dumps(spec)[:200]}, which none of llama.cpp's "
                     f"pre-tokenizers that attnlab knows does ({', '.join(PRE_SPLITS)})")


def tokenizer_metadata(tokenizer: Any, vocab_size: int) -> dict[str, Any]:
    """The ``tokenizer.*`` metadata of ``tokenizer`` (an HFTokenizer of a byte-level BPE
    vocabulary) for a model of ``vocab_size`` embedding rows (rows beyond the vocabulary get
    unused tokens, as llama.cpp's converter pads them)."""
    data = json.loads(tokenizer.tokenizer.to_str())
    model = data.get("model", {})
    if model.get("type") != "BPE" or not _byte_level(data):
        raise InputError("a GGUF file is written for byte-level BPE vocabularies (GPT-2's, Llama 3's, Qwen's, SmolLM's); "
                         f"this tokenizer is a {model.get('type')} model")
    tokens: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    types = {i: _NORMAL for i in tokens}
    for added in data.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = _CONTROL if added.get("special") else _USER_DEFINED
    if max(tokens) >= vocab_size:
        raise InputError(f"the tokenizer has token id {max(tokens)}, beyond the model's {vocab_size} embedding rows")
    listed = [tokens.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    kinds = [types.get(i, _UNUSED) for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    special = tokenizer.special
    ids = {key: tokenizer.tokenizer.token_to_id(special[f"{key}_token"]) for key in ("bos", "eos", "unk", "pad")
           if special.get(f"{key}_token") is not None}
    post = json.dumps(data.get("post_processor") or {})
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": _pre_name(data.get("pre_tokenizer") or {}),
        "tokenizer.ggml.tokens": listed, "tokenizer.ggml.token_type": kinds, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": "bos" in ids and f'"{special["bos_token"]}"' in post,
    }
    for key, value in ids.items():
        if value is not None:
            meta[f"tokenizer.ggml.{'unknown' if key == 'unk' else 'padding' if key == 'pad' else key}_token_id"] = value
    if tokenizer.chat_template is not None:
        meta["tokenizer.chat_template"] = tokenizer.chat_template
    return meta


def _byte_level(data: dict[str, Any]) -> bool:
    decoder = data.get("decoder") or {}
    return decoder.get("type") == "ByteLevel" or any(d.get("type") == "ByteLevel" for d in decoder.get("decoders", []))


def _architecture_metadata(config: dict[str, Any], architecture: str) -> dict[str, Any]:
    """``{arch}.*`` of a ``config.json`` (:func:`~attnlab.formats.hf.export.hf_config`)."""
    head_dim = config["head_dim"]
    rope = dict(config["rope_parameters"])
    meta = {f"{architecture}.{_CONFIG_KEY[k]}": config[k] for k in (
        "max_position_embeddings", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
        "num_key_value_heads", "rms_norm_eps", "vocab_size")}
    meta[f"{architecture}.rope.freq_base"] = float(rope.pop("rope_theta"))
    meta[f"{architecture}.rope.dimension_count"] = head_dim
    if head_dim != config["hidden_size"] // config["num_attention_heads"]:
        meta[f"{architecture}.attention.key_length"] = meta[f"{architecture}.attention.value_length"] = head_dim
    kind = rope.pop("rope_type", "default")
    if kind in ("linear", "yarn"):
        meta[f"{architecture}.rope.scaling.type"] = kind
        meta[f"{architecture}.rope.scaling.factor"] = float(rope["factor"])
        if "original_max_position_embeddings" in rope:
            meta[f"{architecture}.rope.scaling.original_context_length"] = rope["original_max_position_embeddings"]
    elif kind != "default":
        raise InputError(f"the model's rotary scaling {kind!r} has no GGUF metadata attnlab writes (linear, yarn)")
    if config.get("sliding_window") and config["model_type"] == "mistral":
        raise InputError("a model whose layers slide cannot be written as GGUF: llama.cpp reads no window in llama "
                         "files (write a Hugging Face folder instead)")
    return meta


def _stored(w: Tensor, kind: str) -> tuple[np.ndarray, Any, Tensor]:
    """``(the bytes or values the file stores, their type, the float32 tensor they read back as)``."""
    import gguf

    w32 = w.detach().to(torch.float32).cpu().contiguous()
    if w32.dim() == 1 or kind == "f32":
        return w32.numpy(), gguf.GGMLQuantizationType.F32, w32
    if kind == "q8_0" and w32.shape[-1] % _BLOCK == 0:
        data = gguf.quants.quantize(w32.numpy(), gguf.GGMLQuantizationType.Q8_0)
        back = torch.from_numpy(gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q8_0).reshape(w32.shape))
        return data, gguf.GGMLQuantizationType.Q8_0, back.to(torch.float32)
    half = w32.to(torch.float16)
    return half.numpy(), gguf.GGMLQuantizationType.F16, half.to(torch.float32)


def save_gguf(model: GPT, tokenizer: Any, path: str | Path, weight_type: str = "f16", *, overwrite: bool = False,
              name: str = "attnlab model") -> tuple[Path, float]:
    """Write ``model`` (no LoRA layers: merge them first) and ``tokenizer`` as the GGUF file
    ``path`` with 2-D weights of ``weight_type`` (``f32``, ``f16``, ``q8_0``); returns the path and
    the largest difference of the file's logits, read back by attnlab, from those of the model
    with its weights rounded as the file stores them (at most 1e-4, else an AssertionError:
    a bug of the writer). Written aside and renamed into place; an existing file is replaced
    only when ``overwrite``."""
    import gguf

    if weight_type not in GGUF_TYPES:
        raise InputError(f"weight_type must be one of {', '.join(GGUF_TYPES)}; got {weight_type!r}")
    path = Path(path).expanduser()
    if path.suffix != ".gguf":
        raise InputError(f"out must be a .gguf file; got {path}")
    check_output(path, folder=False, overwrite=overwrite)
    if not hasattr(tokenizer, "special"):
        raise InputError(f"a GGUF file needs the model's own tokenizer (a run started from a pretrained model's folder "
                         f"or GGUF file has it); got {type(tokenizer).__name__}")
    config = hf_config(model, tokenizer)  # refuses, by name, a model no written family has
    family = config["model_type"]
    architecture = _ARCH[family]
    meta = {**_architecture_metadata(config, architecture), **tokenizer_metadata(tokenizer, config["vocab_size"])}
    weights = hf_weights(model, family)
    rounded: dict[str, Tensor] = {}
    staging = staging_for(path, folder=False)
    try:
        writer = gguf.GGUFWriter(str(staging), architecture)
        writer.add_name(name)
        writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[weight_type])
        if weight_type == "q8_0":
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for key, value in meta.items():
            _add(writer, key, value)
        heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
        for hf_name, w in weights.items():
            stored = w
            if architecture == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias",
                                                            "k_proj.bias")):
                stored = _permute(w, heads if ".q_proj." in hf_name else kv)
            data, raw, back = _stored(stored, weight_type)
            writer.add_tensor(gguf_tensor_name(hf_name, architecture), data, raw_dtype=raw)
            rounded[hf_name] = back if stored is w else _unpermute(back, heads if ".q_proj." in hf_name else kv)
        try:
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
        except OSError as exc:  # a full disk: numpy's short write says only how much it wrote
            raise write_error(exc, path) from None
        difference = _check(model, family, rounded, staging, path)
        put_in_place(staging, path)
    finally:
        staging.unlink(missing_ok=True)
    return path, difference


def _add(writer: Any, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value) if 0 <= value < 2**32 else writer.add_int64(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, list):
        writer.add_array(key, value)
    else:
        raise AssertionError(f"metadata {key}: {value!r} of no GGUF type")


def _check(model: GPT, family: str, rounded: dict[str, Tensor], staging: Path, path: Path) -> float:
    """The written file read back against the model with the file's rounding of its weights."""
    from ..hf.load import from_hf

    spec = HF_FAMILIES[family]
    expected = copy.deepcopy(model).float().eval()
    ours = spec.convert(rounded, model.config, {k: v for k, v in expected.state_dict().items()})[0]
    if model.config.tie_embeddings:
        ours.pop("head.weight", None)
    expected.load_state_dict(ours, strict=False)
    return check_logits(expected, from_hf(staging), 1e-4, str(path))
