"""Hugging Face checkpoint folders as attnlab models: ``from_hf(folder)``.

A folder in the Hugging Face layout (``config.json`` and ``model.safetensors``, or an older
``pytorch_model.bin`` read with ``weights_only=True``; from a local disk: nothing is
downloaded) becomes an attnlab model in eval mode:

* decoders of the GPT-2, Llama and Mistral families: a :class:`~attnlab.models.gpt.GPT`;
* encoders of the BERT, RoBERTa and DistilBERT families: a
  :class:`~attnlab.models.encoder.TextEncoder`, with the classification head of a
  ``*ForSequenceClassification`` folder (its class count read off the head's weights), or
  without one (``num_classes=0``: the pooled features) for a bare ``BertModel`` and the like;
* Hugging Face's ViT (``ViTModel``, ``ViTForImageClassification``): a
  :class:`~attnlab.models.vit.VisionTransformer` (timm's layout loads through
  ``model.checkpoint`` as before).

Each family is one configuration map and one readable list of key renames (GPT-2 stores
its projections as ``Conv1D``, the transpose of a linear layer, and packs query, key and
value in ``c_attn``; BERT keeps them apart where attnlab packs them in ``in_proj``).
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..errors import InputError, shape_str
from ..io import read_json_mapping, read_state_dict, torch_load_safely
from ..memory import gib, require_memory
from .encoder import TextEncoder, TextEncoderConfig
from .gpt import GPT, GPTConfig
from .vit import VisionTransformer, ViTConfig

__all__ = ["from_hf", "read_hf", "hf_model_spec", "is_hf_folder", "weight_files", "HF_FAMILIES"]


def _gpt2_config(c: dict[str, Any]) -> GPTConfig:
    activation = c.get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
        raise InputError(f"config.json: activation_function {activation!r} is not supported for GPT-2")
    return GPTConfig(vocab_size=c["vocab_size"], max_len=c["n_positions"], embed_dim=c["n_embd"], depth=c["n_layer"],
                     num_heads=c["n_head"], mlp_hidden_dim=c.get("n_inner") or 4 * c["n_embd"],
                     mlp="gelu" if activation == "gelu" else "gelu_tanh", norm="layernorm",
                     norm_eps=c.get("layer_norm_epsilon", 1e-5), pos_embed="learned", bias=True,
                     tie_embeddings=c.get("tie_word_embeddings", True))


def _gpt2_weights(sd: dict[str, Tensor], cfg: GPTConfig) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"tok_embed.weight": sd.pop("wte.weight"), "pos_embed.weight": sd.pop("wpe.weight"),
           "norm.weight": sd.pop("ln_f.weight"), "norm.bias": sd.pop("ln_f.bias")}
    for i in range(cfg.depth):
        p, q = f"h.{i}.", f"blocks.{i}."
        for theirs, ours in (("ln_1", "norm1"), ("ln_2", "norm2")):
            out[q + ours + ".weight"], out[q + ours + ".bias"] = sd.pop(p + theirs + ".weight"), sd.pop(p + theirs + ".bias")
        w, b = sd.pop(p + "attn.c_attn.weight").t(), sd.pop(p + "attn.c_attn.bias")  # Conv1D: (in, out)
        for name, wi, bi in zip(("q_proj", "k_proj", "v_proj"), w.chunk(3, 0), b.chunk(3, 0)):
            out[q + f"attn.{name}.weight"], out[q + f"attn.{name}.bias"] = wi, bi
        out[q + "attn.o_proj.weight"], out[q + "attn.o_proj.bias"] = sd.pop(p + "attn.c_proj.weight").t(), \
            sd.pop(p + "attn.c_proj.bias")
        for name in ("c_fc", "c_proj"):
            out[q + f"mlp.{name}.weight"] = sd.pop(p + f"mlp.{name}.weight").t()
            out[q + f"mlp.{name}.bias"] = sd.pop(p + f"mlp.{name}.bias")
        sd.pop(p + "attn.bias", None), sd.pop(p + "attn.masked_bias", None)  # causal-mask buffers
    if "lm_head.weight" in sd:
        out["head.weight"] = sd.pop("lm_head.weight")
    return out, sd


def _rope_theta(c: dict[str, Any]) -> float:
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
        raise InputError(f"config.json: rope scaling {kind!r} is not supported (plain rotary positions only)")
    return float(c.get("rope_theta") or rope.get("rope_theta") or 10000.0)


def _llama_config(c: dict[str, Any]) -> GPTConfig:
    if c.get("hidden_act", "silu") != "silu":
        raise InputError(f"config.json: hidden_act {c['hidden_act']!r} is not supported (SwiGLU uses silu)")
    heads = c["num_attention_heads"]
    if c.get("head_dim") not in (None, c["hidden_size"] // heads):
        raise InputError(f"config.json: head_dim {c['head_dim']} differs from hidden_size / num_attention_heads")
    bias = bool(c.get("attention_bias", False))
    if bool(c.get("mlp_bias", False)) != bias:
        raise InputError("config.json: attention_bias and mlp_bias must agree (one bias setting for the block)")
    return GPTConfig(vocab_size=c["vocab_size"], max_len=c.get("max_position_embeddings", 2048),
                     embed_dim=c["hidden_size"], depth=c["num_hidden_layers"], num_heads=heads,
                     num_kv_heads=c.get("num_key_value_heads") or heads, mlp_hidden_dim=c["intermediate_size"],
                     mlp="swiglu", norm="rmsnorm", norm_eps=c.get("rms_norm_eps", 1e-6), pos_embed="rope",
                     rope_theta=_rope_theta(c), window=c.get("sliding_window") if c.get("use_sliding_window", True)
                     else None, bias=bias, tie_embeddings=bool(c.get("tie_word_embeddings", False)))


def _llama_weights(sd: dict[str, Tensor], cfg: GPTConfig) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    out = {"tok_embed.weight": sd.pop("model.embed_tokens.weight"), "norm.weight": sd.pop("model.norm.weight")}
    for i in range(cfg.depth):
        p, q = f"model.layers.{i}.", f"blocks.{i}."
        renames = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}
        renames.update({f"self_attn.{n}": f"attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj")})
        renames.update({f"mlp.{n}": f"mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")})
        for theirs, ours in renames.items():
            for suffix in (".weight", ".bias"):
                if p + theirs + suffix in sd:
                    out[q + ours + suffix] = sd.pop(p + theirs + suffix)
        sd.pop(p + "self_attn.rotary_emb.inv_freq", None)
    if "lm_head.weight" in sd:
        out["head.weight"] = sd.pop("lm_head.weight")
    return out, sd


# --------------------------------------------------------------------------- encoders
ENCODER_ARCHITECTURES = {"bert": ("BertModel", "BertForSequenceClassification"),
                         "roberta": ("RobertaModel", "RobertaForSequenceClassification"),
                         "distilbert": ("DistilBertModel", "DistilBertForSequenceClassification")}


def _architecture(c: dict[str, Any], family: str) -> str:
    """The one architecture of ``config.json`` that from_hf reads for ``family``."""
    known = ENCODER_ARCHITECTURES[family]
    named = c.get("architectures") or [known[0]]
    unread = [a for a in named if a not in known]
    if unread:
        raise InputError(f"config.json: architecture {unread[0]!r} is not supported; from_hf reads "
                         f"{' and '.join(known)} of the {family} family (the encoder, and it with a sequence "
                         f"classification head)")
    return named[0]


def _take(sd: dict[str, Tensor], out: dict[str, Tensor], renames: dict[str, str]) -> None:
    """Move ``theirs.weight`` / ``theirs.bias`` of ``sd`` to ``ours.weight`` / ``ours.bias`` of ``out``."""
    for theirs, ours in renames.items():
        for suffix in (".weight", ".bias"):
            if theirs + suffix in sd:
                out[ours + suffix] = sd.pop(theirs + suffix)


def _packed_attention(sd: dict[str, Tensor], out: dict[str, Tensor], prefix: str, names: tuple[str, str, str],
                      ours: str) -> None:
    """Query, key and value projections stored apart (``prefix + names``) as attnlab's packed ``in_proj``."""
    for suffix in (".weight", ".bias"):
        out[ours + "in_proj" + suffix] = torch.cat([sd.pop(prefix + n + suffix) for n in names])


def _bert_like_config(c: dict[str, Any], sd: dict[str, Tensor], family: str) -> TextEncoderConfig:
    arch = _architecture(c, family)
    classify = arch.endswith("ForSequenceClassification")
    act = c.get("hidden_act", c.get("activation", "gelu"))
    if act != "gelu":
        raise InputError(f"config.json: activation {act!r} is not supported (attnlab's encoder layers take gelu)")
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise InputError(f"config.json: position_embedding_type {c['position_embedding_type']!r} is not supported "
                         f"(absolute positions only)")
    head = {"bert": "classifier.weight", "roberta": "classifier.out_proj.weight", "distilbert": "classifier.weight"}
    num_classes = int(sd[head[family]].shape[0]) if classify and head[family] in sd else 0
    if family == "distilbert":
        return TextEncoderConfig(vocab_size=c["vocab_size"], num_classes=num_classes, embed_dim=c["dim"],
                                 depth=c["n_layers"], num_heads=c["n_heads"], mlp_ratio=c["hidden_dim"] / c["dim"],
                                 max_len=c.get("max_position_embeddings", 512), type_vocab_size=0,
                                 pad_token_id=c.get("pad_token_id", 0), norm_eps=1e-12,  # DistilBERT's, fixed
                                 drop_rate=c.get("dropout", 0.1), attn_drop_rate=c.get("attention_dropout", 0.1),
                                 pooler="relu" if classify else "none")
    pooled = classify or any(k.endswith("pooler.dense.weight") for k in sd)
    return TextEncoderConfig(vocab_size=c["vocab_size"], num_classes=num_classes, embed_dim=c["hidden_size"],
                             depth=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                             mlp_ratio=c["intermediate_size"] / c["hidden_size"],
                             max_len=c.get("max_position_embeddings", 512), type_vocab_size=c.get("type_vocab_size", 2),
                             pad_token_id=c.get("pad_token_id", 0) if c.get("pad_token_id") is not None else 0,
                             positions_from_ids=family == "roberta", norm_eps=c.get("layer_norm_eps", 1e-12),
                             drop_rate=c.get("hidden_dropout_prob", 0.1),
                             attn_drop_rate=c.get("attention_probs_dropout_prob", 0.1),
                             pooler="tanh" if pooled else "none")


def _bert_like_weights(sd: dict[str, Tensor], cfg: TextEncoderConfig,
                       family: str) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    base = {"bert": "bert.", "roberta": "roberta.", "distilbert": "distilbert."}[family]
    sd = {k.removeprefix(base): v for k, v in sd.items()}
    out: dict[str, Tensor] = {}
    _take(sd, out, {"embeddings.word_embeddings": "embed", "embeddings.position_embeddings": "pos_embed",
                    "embeddings.token_type_embeddings": "type_embed", "embeddings.LayerNorm": "embed_norm"})
    sd.pop("embeddings.position_ids", None), sd.pop("embeddings.token_type_ids", None)  # buffers of index ranges
    for i in range(cfg.depth):
        q = f"encoder.layers.{i}."
        if family == "distilbert":
            p = f"transformer.layer.{i}."
            _packed_attention(sd, out, p + "attention.", ("q_lin", "k_lin", "v_lin"), q + "self_attn.")
            _take(sd, out, {p + "attention.out_lin": q + "self_attn.out_proj", p + "sa_layer_norm": q + "norm1",
                            p + "ffn.lin1": q + "ff.fc1", p + "ffn.lin2": q + "ff.fc2",
                            p + "output_layer_norm": q + "norm2"})
        else:
            p = f"encoder.layer.{i}."
            _packed_attention(sd, out, p + "attention.self.", ("query", "key", "value"), q + "self_attn.")
            _take(sd, out, {p + "attention.output.dense": q + "self_attn.out_proj",
                            p + "attention.output.LayerNorm": q + "norm1", p + "intermediate.dense": q + "ff.fc1",
                            p + "output.dense": q + "ff.fc2", p + "output.LayerNorm": q + "norm2"})
    if family == "roberta" and cfg.num_classes:
        _take(sd, out, {"classifier.dense": "pooler", "classifier.out_proj": "head"})
        sd = {k: v for k, v in sd.items() if not k.startswith("pooler.")}  # RobertaModel's pooler, unused then
    else:
        _take(sd, out, {"pooler.dense": "pooler", "pre_classifier": "pooler", "classifier": "head"})
    return out, sd


def _vit_config(c: dict[str, Any], sd: dict[str, Tensor]) -> ViTConfig:
    arch = (c.get("architectures") or ["ViTModel"])[0]
    if arch not in ("ViTModel", "ViTForImageClassification"):
        raise InputError(f"config.json: architecture {arch!r} is not supported; from_hf reads ViTModel and "
                         f"ViTForImageClassification of the vit family")
    if c.get("hidden_act", "gelu") != "gelu":
        raise InputError(f"config.json: hidden_act {c['hidden_act']!r} is not supported (attnlab's ViT takes gelu)")
    size = c.get("image_size", 224)
    return ViTConfig(img_size=tuple(size) if isinstance(size, (list, tuple)) else (size, size),
                     patch_size=c.get("patch_size", 16), in_chans=c.get("num_channels", 3),
                     num_classes=int(sd["classifier.weight"].shape[0]) if "classifier.weight" in sd else 0,
                     embed_dim=c["hidden_size"], depth=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                     mlp_ratio=c["intermediate_size"] / c["hidden_size"], qkv_bias=c.get("qkv_bias", True),
                     pre_logits="pooler.dense.weight" in sd or "vit.pooler.dense.weight" in sd,
                     norm_eps=c.get("layer_norm_eps", 1e-12), drop_rate=c.get("hidden_dropout_prob", 0.0),
                     attn_drop_rate=c.get("attention_probs_dropout_prob", 0.0))


def _vit_weights(sd: dict[str, Tensor], cfg: ViTConfig) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    sd = {k.removeprefix("vit."): v for k, v in sd.items()}
    out = {"cls_token": sd.pop("embeddings.cls_token"), "pos_embed": sd.pop("embeddings.position_embeddings")}
    _take(sd, out, {"embeddings.patch_embeddings.projection": "patch_embed.proj", "layernorm": "norm",
                    "pooler.dense": "pre_logits.fc", "classifier": "head"})
    for i in range(cfg.depth):
        p, q = f"encoder.layer.{i}.", f"blocks.{i}."
        _packed_attention(sd, out, p + "attention.attention.", ("query", "key", "value"), q + "attn.")
        _take(sd, out, {p + "attention.output.dense": q + "attn.out_proj", p + "layernorm_before": q + "norm1",
                        p + "layernorm_after": q + "norm2", p + "intermediate.dense": q + "mlp.fc1",
                        p + "output.dense": q + "mlp.fc2"})
    return out, sd


def _family(name: str) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    return (lambda c, sd: _bert_like_config(c, sd, name), TextEncoder,
            lambda sd, cfg: _bert_like_weights(sd, cfg, name))


# model_type -> (config from config.json and the weights, the model class, the weights in attnlab's names)
HF_FAMILIES: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]] = {
    "gpt2": (lambda c, sd: _gpt2_config(c), GPT, _gpt2_weights),
    "llama": (lambda c, sd: _llama_config(c), GPT, _llama_weights),
    "mistral": (lambda c, sd: _llama_config(c), GPT, _llama_weights),
    "bert": _family("bert"),
    "roberta": _family("roberta"),
    "distilbert": _family("distilbert"),
    "vit": (_vit_config, VisionTransformer, _vit_weights),
}


def weight_files(folder: str | Path) -> list[Path]:
    """The weight files of a Hugging Face folder: ``model*.safetensors``, else
    ``pytorch_model*.bin`` (older folders)."""
    folder = Path(folder).expanduser()
    files = sorted(folder.glob("model*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise InputError(f"{folder} must hold model.safetensors or pytorch_model.bin (the weights in Hugging Face's "
                         f"layout); found neither")
    return files


# safetensors' names of dtypes -> torch's (the meta tensors of a header)
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                       "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
                       "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _read_headers(folder: Path) -> dict[str, Tensor]:
    """The tensors of :func:`weight_files` as meta tensors of their stored shapes and dtypes,
    from the files' headers alone (safetensors' JSON header, whose offsets the library checks
    against the file's size; a pickle's records, loaded onto the meta device): no weight is
    read, whatever sizes the files claim."""
    from safetensors import safe_open

    headers: dict[str, Tensor] = {}
    for path in weight_files(folder):
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="pt") as f:
                    for key in f.keys():
                        part = f.get_slice(key)
                        dtype = getattr(torch, _SAFETENSORS_DTYPES.get(part.get_dtype(), ""), None)
                        if not isinstance(dtype, torch.dtype):
                            raise InputError(f"{path}: {key} has dtype {part.get_dtype()}, which attnlab does not read")
                        headers[key] = torch.empty(part.get_shape(), dtype=dtype, device="meta")
            except InputError:
                raise
            except Exception as exc:  # SafetensorError: a header that is not JSON, or offsets past the file's end
                raise InputError(f"could not read {path} as safetensors: {exc}") from None
            continue
        state = torch_load_safely(path, "meta")
        for key in ("state_dict", "model"):  # the wrappers read_state_dict takes off
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise InputError(f"{path} does not hold a state dict (a mapping of names to tensors)")
        headers.update(state)
    return headers


def _read_weights(folder: Path) -> dict[str, Tensor]:
    """The tensors of :func:`weight_files`, read with ``weights_only=True``: a pickle that
    names anything but tensors and plain values is refused, since unpickling it could run
    code."""
    weights: dict[str, Tensor] = {}
    for path in weight_files(folder):
        weights.update(read_state_dict(path))
    return weights


# the registered model each family's folders build on (fine-tuning records it in config.yaml)
REGISTERED = {"bert": "bert_base", "roberta": "roberta_base", "distilbert": "distilbert_base",
              "vit": "vit_base_patch16_224", "gpt2": "gpt_small", "llama": "llama_tiny", "mistral": "llama_tiny"}


def is_hf_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder in Hugging Face's layout (it holds ``config.json``)."""
    path = Path(path).expanduser()
    return path.is_dir() and (path / "config.json").is_file()


def _convert(folder: Path, family: str, cfg: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` (the checkpoint's tensors, real or meta) in attnlab's names, by the family's
    one conversion; a tensor the conversion misses or leaves over is an error."""
    try:
        weights, left = HF_FAMILIES[family][2](dict(state), cfg)
    except KeyError as exc:
        raise InputError(f"{folder}: the checkpoint lacks {exc.args[0]}, which a {family} model of this config "
                         f"has") from None
    except RuntimeError as exc:  # query, key and value projections of different shapes, packed together
        raise InputError(f"{folder}: the checkpoint's weights do not fit together: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if left:
        raise InputError(f"{folder}: weights that a {family} model of this config does not have: "
                         f"{', '.join(sorted(left)[:5])}{' ...' if len(left) > 5 else ''}")
    return weights


# A layer's index in a checkpoint's names: gpt2's h.3., llama's layers.3., BERT's and ViT's layer.3.
_LAYER = re.compile(r"(?:^|\.)(?:h|layers?)\.(\d+)\.")


def _config_key(config: dict[str, Any], value: int, fallback: str) -> str:
    """The ``config.json`` key of ``value`` (the keys, when several have it), else ``fallback``."""
    keys = [k for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool) and v == value]
    return " / ".join(keys) or fallback


def _disagreement(config_file: Path, config: dict[str, Any], ours: str, theirs: str | None, stored: Tensor,
                  wanted: Tensor) -> str:
    """Weight ``ours`` (``theirs`` in the checkpoint, when only renamed) of a stored shape
    that is not the model's, said first as the ``config.json`` key whose value is the size
    the model expects where they differ (when one is)."""
    said = f"{ours} has shape {shape_str(stored)} in the checkpoint but {shape_str(wanted)} in its config"
    if stored.dim() == wanted.dim():
        size = next(w for s, w in zip(stored.shape, wanted.shape) if s != w)
        key = _config_key(config, size, "")
        if key:
            return (f"{config_file}: {key} {size} disagrees with the weights: {theirs or ours} is "
                    f"{shape_str(stored)} ({said})")
    return f"{config_file.parent}: {said}"


def _inspect_hf(folder: Path) -> tuple[str, Any, nn.Module, dict[str, Tensor]]:
    """``(model_type, attnlab config, its model on the meta device, the checkpoint's tensors
    as meta tensors)`` of a Hugging Face folder: ``config.json`` checked against the weight
    files' headers, each converted weight's shape against the model's, before a weight is read
    or anything of the model's size allocated (a ``vocab_size`` of 10^10 beside a 300-row
    embedding is one line naming both)."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise InputError(f"folder must be a Hugging Face checkpoint folder with config.json; {folder} has none")
    config = read_json_mapping(config_file)
    family = config.get("model_type")
    if family not in HF_FAMILIES:
        raise InputError(f"{config_file}: model_type {family!r} is not supported; from_hf reads "
                         f"{', '.join(HF_FAMILIES)}")
    make_config, model_class, _ = HF_FAMILIES[family]
    headers = _read_headers(folder)
    try:
        cfg = make_config(config, headers)
    except KeyError as exc:
        raise InputError(f"{config_file} lacks the key {exc.args[0]!r} of a {family} config") from None
    except (TypeError, ValueError) as exc:  # a size that is not a number
        raise InputError(f"{config_file}: a {family} config's value is of the wrong type: {exc}") from None
    # The layers first: a depth of 10^6 is refused here, not a million layers converted and built below.
    depth, stored = getattr(cfg, "depth", 0), len({m.group(1) for k in headers if (m := _LAYER.search(k))})
    if isinstance(depth, int) and depth > stored:
        raise InputError(f"{config_file}: {_config_key(config, depth, 'depth')} {depth} disagrees with the weights: "
                         f"they hold {stored} layer{'s' * (stored != 1)}")
    weights = _convert(folder, family, cfg, headers)
    try:
        with torch.device("meta"):  # the shapes alone: no memory, whatever config.json says
            model = model_class(cfg)
    except InputError as exc:
        raise InputError(f"{config_file}: {exc}") from None
    except (TypeError, ValueError) as exc:  # a size that is not a number
        raise InputError(f"{config_file}: a {family} config's value is of the wrong type: {exc}") from None
    tied = bool(getattr(cfg, "tie_embeddings", False))
    if tied:
        weights.pop("head.weight", None)
    expected = {k: v for k, v in model.state_dict().items() if not (tied and k == "head.weight")}
    missing = [k for k in expected if k not in weights]
    if missing:
        raise InputError(f"{folder}: the checkpoint lacks {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    extra = sorted(k for k in weights if k not in expected)
    if extra:
        raise InputError(f"{folder}: weights that a {family} model of this config does not have: "
                         f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    theirs = {id(t): k for k, t in headers.items()}  # a weight only renamed is the header's own tensor
    for k, wanted in expected.items():  # the model's order: the embeddings first
        stored = weights[k]
        if tuple(stored.shape) != tuple(wanted.shape):
            raise InputError(_disagreement(config_file, config, k, theirs.get(id(stored)), stored, wanted))
    return family, cfg, model, headers


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def read_hf(folder: str | Path) -> tuple[str, Any, dict[str, Tensor]]:
    """``(model_type, attnlab config, weights in attnlab's names)`` of a Hugging Face folder,
    checked as :func:`from_hf` checks it, without building the model: ``config.json``
    against the weight files' headers first, and their size against the memory available,
    before a weight is read."""
    folder = Path(folder).expanduser()
    family, cfg, _, headers = _inspect_hf(folder)
    require_memory(_nbytes(headers.values()), f"{folder}: reading its weights")
    return family, cfg, _convert(folder, family, cfg, _read_weights(folder))


def hf_model_spec(folder: str | Path) -> tuple[str, dict[str, Any]]:
    """``(model.name, model.options)`` that build the model of a Hugging Face folder through
    :func:`~attnlab.models.create_model`, without what the task decides (its classifier's
    size; an image model's input size and channels, the data's): what a fine-tuning recipe
    records, so that its run rebuilds the model without the folder."""
    family, cfg, _, _ = _inspect_hf(Path(folder).expanduser())  # no weight read: the run loads them
    # The task's: the classes, and an image model's input (the data's size and channels; a learned position
    # grid of another size is resampled when the weights load).
    task_owned = ("num_classes", "attention", "attention_options", "img_size", "in_chans")
    return REGISTERED[family], {k: v for k, v in asdict(cfg).items() if k not in task_owned}


def from_hf(folder: str | Path, *, dtype: torch.dtype = torch.float32) -> GPT | TextEncoder | VisionTransformer:
    """The model of a Hugging Face checkpoint folder, in eval mode, with its weights in ``dtype``.

    * GPT-2, Llama, Mistral: a :class:`~attnlab.models.gpt.GPT`; ``model(ids)`` gives
      ``(B, L, vocab)`` logits and ``model.generate(ids, max_new_tokens=...)`` ``(B, L + new)`` ids.
    * BERT, RoBERTa, DistilBERT: a :class:`~attnlab.models.encoder.TextEncoder`;
      ``model(ids, attention_mask)`` gives ``(B, num_labels)`` logits for a
      ``*ForSequenceClassification`` folder, the pooled features ``(B, hidden)`` for the
      encoder alone; ``model.forward_features(ids, attention_mask)`` the last hidden states.
    * ViT: a :class:`~attnlab.models.vit.VisionTransformer`; ``model(images)`` gives
      ``(B, num_labels)`` logits (``ViTForImageClassification``) or the pooled features
      (``ViTModel``: its pooler's ``tanh(dense(cls))``); ``model.forward_features(images)``
      the last hidden states, after the final norm."""
    folder = Path(folder).expanduser()
    family, cfg, meta, headers = _inspect_hf(folder)  # every shape checked: what follows only reads and copies
    stored, built = _nbytes(headers.values()), _nbytes([*meta.parameters(), *meta.buffers()])
    require_memory(stored + built, f"{folder}: reading its weights ({gib(stored)}) and building its model "
                                   f"({sum(p.numel() for p in meta.parameters()):,} parameters, float32)")
    weights = _convert(folder, family, cfg, _read_weights(folder))
    model = HF_FAMILIES[family][1](cfg)
    tied = bool(getattr(cfg, "tie_embeddings", False))
    if tied:
        weights.pop("head.weight", None)
    model.load_state_dict(weights, strict=not tied)
    return model.to(dtype).eval()
