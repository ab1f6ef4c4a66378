"""A decoder back out as a Hugging Face folder: ``config.json``, ``model.safetensors``, the
tokenizer (``tokenizer.json``, ``tokenizer_config.json`` with the chat template,
``generation_config.json``), as ``transformers`` and attnlab's own :func:`~attnlab.formats.from_hf`
read it.

The weights go out through the family's table of :mod:`attnlab.formats.hf.tables` read
backwards (:func:`~attnlab.weight_rules.invert_map`): one table for both directions. The
families written are those whose layers attnlab's decoder and the family share exactly:
``llama`` (and ``mistral`` where every layer slides), ``qwen2`` (biases on the query, key and
value projections alone) and ``qwen3`` (norms of the queries and keys). A model with anything
else (learned positions, another attention kind, Gemma's extra norms) is refused by name
before a file is written. What is written is read back and its logits compared with the
model's before the folder is put in place (:func:`save_hf`).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...errors import InputError, WriteError
from ...io import atomic_write_bytes, check_output, put_in_place, staging_for
from ...weight_rules import expand, invert_map
from ...models.gpt import GPT, GPTConfig
from .tables import HF_FAMILIES

__all__ = ["EXPORTED_FAMILIES", "hf_config", "hf_weights", "save_hf", "exported_family"]

# model_type -> the transformers class its folder names
EXPORTED_FAMILIES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                     "qwen3": "Qwen3ForCausalLM"}
_KINDS = ("exact",)  # the attention kinds a Hugging Face decoder computes as attnlab does


def _layer_types(cfg: GPTConfig) -> list[str]:
    """Each layer's type, ``full`` or ``sliding``; another kind in a layer is refused. (Options
    of a kind that change what it computes, sinks or soft-capping, are caught when the written
    folder is read back and its logits differ.)"""
    types = []
    for i, layer in enumerate(cfg.layer_plan()):
        if layer.attention not in _KINDS or layer.heads != cfg.num_heads:
            raise InputError(f"layer {i} computes attention {layer.attention!r} with {layer.heads} heads; a Hugging "
                             f"Face decoder's layers compute softmax attention ({' or '.join(_KINDS)}) with "
                             f"num_heads={cfg.num_heads} each")
        if not layer.positions:
            raise InputError(f"layer {i} has no rotary positions; the families written ({', '.join(EXPORTED_FAMILIES)}) "
                             f"rotate every layer's queries and keys")
        types.append(layer.type)
    return types


def exported_family(cfg: GPTConfig) -> str:
    """The Hugging Face family a model of ``cfg`` is written as, or an error naming the first
    setting no written family has."""
    fixed = [("pos_embed", "rope"), ("norm", "rmsnorm"), ("mlp", "swiglu"), ("post_norms", False),
             ("embed_scale", None), ("attn_softcap", None), ("logit_softcap", None), ("query_pre_attn_scalar", None),
             ("attention_output_gate", False), ("partial_rotary", 1.0), ("rope_local_theta", None)]
    for name, value in fixed:
        if getattr(cfg, name) != value:
            raise InputError(f"the model's {name} is {getattr(cfg, name)!r}; the Hugging Face families attnlab writes "
                             f"({', '.join(EXPORTED_FAMILIES)}) have {name}={value!r}")
    types = _layer_types(cfg)
    qkv, out, mlp = _biases(cfg)
    if cfg.qk_norm:
        family = "qwen3"
    elif qkv and not out:
        family = "qwen2"
    else:
        family = "mistral" if "sliding" in types else "llama"
    if "sliding" in types and (family != "mistral" or "full" in types):
        raise InputError("the model has sliding and full layers (or sliding layers with qk_norm or query biases); "
                         "of the families attnlab writes only mistral slides, in every layer")
    if family in ("llama", "mistral", "qwen3") and qkv != out:
        raise InputError(f"the model has biases on the query, key and value projections ({qkv}) but not on the "
                         f"output projection ({out}); {family} has them on all four or none")
    if family != "llama" and mlp:
        raise InputError(f"the model's MLP has biases; {family} has none (llama's mlp_bias does)")
    return family


def _biases(cfg: GPTConfig) -> tuple[bool, bool, bool]:
    qkv = cfg.bias if cfg.attention_bias is None else cfg.attention_bias
    out = qkv if cfg.attention_out_bias is None else cfg.attention_out_bias
    mlp = cfg.bias if cfg.mlp_bias is None else cfg.mlp_bias
    return bool(qkv), bool(out), bool(mlp)


def hf_config(model: GPT, tokenizer: Any = None) -> dict[str, Any]:
    """The ``config.json`` of ``model`` in its family (:func:`exported_family`), with the
    special tokens' ids of ``tokenizer`` where given."""
    cfg = model.config
    family = exported_family(cfg)
    sd = model.state_dict()
    qkv, _, mlp = _biases(cfg)
    head_dim = sd["blocks.0.attn.q_proj.weight"].shape[0] // cfg.num_heads
    rope = {"rope_type": "default", "rope_theta": float(cfg.rope_theta), **(cfg.rope_scaling or {})}
    config: dict[str, Any] = {
        "architectures": [EXPORTED_FAMILIES[family]], "model_type": family, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.embed_dim, "intermediate_size": sd["blocks.0.mlp.up_proj.weight"].shape[0],
        "num_hidden_layers": cfg.depth, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads or cfg.num_heads, "head_dim": head_dim,
        "max_position_embeddings": cfg.max_len, "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu",
        "rope_parameters": rope, "tie_word_embeddings": bool(cfg.tie_embeddings), "attention_dropout": 0.0,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
    }
    if family in ("llama", "mistral", "qwen3"):
        config["attention_bias"] = qkv
    if family == "llama":
        config["mlp_bias"] = mlp
    if family == "mistral":
        config["sliding_window"] = cfg.sliding_window
    if family in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.depth)
    if tokenizer is not None:
        special = getattr(tokenizer, "special", {})
        for key in ("bos", "eos", "pad"):
            token = special.get(f"{key}_token")
            if token is not None and tokenizer.tokenizer.token_to_id(token) is not None:
                config[f"{key}_token_id"] = tokenizer.tokenizer.token_to_id(token)
    return config


def hf_weights(model: GPT, family: str) -> dict[str, Tensor]:
    """``model``'s weights in ``family``'s names (a tied output layer left out, as the family
    stores it)."""
    cfg = model.config
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        state.pop("head.weight", None)
    spec = HF_FAMILIES[family]
    out, left = invert_map(state, expand(spec.weights(cfg), cfg.depth))
    left = {k for k in left if not k.endswith("rotary.inv_freq")}
    if left:
        raise AssertionError(f"weights of the model that {family}'s table does not name: {sorted(left)[:5]}")
    return {spec.prefix + k if spec.prefix else k: v for k, v in out.items()}


def save_hf(model: GPT, tokenizer: Any, folder: str | Path, *, dtype: torch.dtype | None = None,
            overwrite: bool = False, atol: float = 1e-4) -> tuple[Path, float]:
    """Write ``model`` (a :class:`~attnlab.models.gpt.GPT` without LoRA layers: merge them
    first) and ``tokenizer`` (an :class:`~attnlab.data.tokenizers.lm.HFTokenizer`) as the
    Hugging Face folder ``folder``, weights in ``dtype`` (default: the model's). The folder is
    written aside, read back with :func:`~attnlab.formats.from_hf` and its logits compared with
    the model's on random tokens (largest difference at most ``atol`` in float32) before it
    is renamed into place; an existing ``folder`` is replaced only when ``overwrite``, and only
    when it is an export's (:func:`~attnlab.io.check_output`). A write that fails names the file
    and the cause, and leaves nothing behind. Returns the folder and that difference."""
    from safetensors.torch import save

    from .load import from_hf

    folder = check_output(folder, folder=True, overwrite=overwrite)  # replaces only an export's own folder
    if not hasattr(tokenizer, "special") or not hasattr(tokenizer, "save"):
        raise InputError(f"a Hugging Face folder needs the model's own tokenizer (a run started from a pretrained "
                         f"model's folder or GGUF file has it); got {type(tokenizer).__name__}")
    config = hf_config(model, tokenizer)  # refuses, by name, a model no written family has
    family = config["model_type"]
    weights = hf_weights(model, family)
    if dtype is not None:
        weights = {k: v.to(dtype) for k, v in weights.items()}
        config["dtype"] = str(dtype).removeprefix("torch.")
    staging = staging_for(folder, folder=True)
    try:
        try:
            tokenizer.save(staging)
            settings = json.loads((staging / "tokenizer_config.json").read_text(encoding="utf-8"))
            # transformers then reads tokenizer.json as it is, not through its family's own tokenizer class
            # (LlamaTokenizerFast would add a first token that a byte-level vocabulary like SmolLM2's has none of)
            settings["tokenizer_class"] = "PreTrainedTokenizerFast"
            atomic_write_bytes(staging / "tokenizer_config.json",
                               (json.dumps(settings, indent=1, ensure_ascii=False) + "\n").encode())
            atomic_write_bytes(staging / "config.json", (json.dumps(config, indent=1) + "\n").encode())
            # serialized first: safetensors' own writer reports a full disk as its error, without the errno
            atomic_write_bytes(staging / "model.safetensors",
                               save({k: v.contiguous() for k, v in weights.items()}, metadata={"format": "pt"}))
        except WriteError as exc:  # named as the file it was for, not the hidden folder it was written in
            exc.filename = str(folder / Path(exc.filename).relative_to(staging))
            raise
        # against the model with its weights rounded to the folder's type, as from_hf reads them back in float32
        expected = model if dtype is None else copy.deepcopy(model).to(dtype).to(torch.float32)
        difference = check_logits(expected, from_hf(staging), atol, str(folder))
        put_in_place(staging, folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return folder, difference


@torch.no_grad()
def check_logits(model: GPT, written: GPT, atol: float, what: str, length: int = 24) -> float:
    """The largest difference between the logits of ``model`` and of ``written`` (the model read
    back from what was written) on two rows of random tokens; an :class:`AssertionError` (a
    bug of the writer, not of the user's input) above ``atol``."""
    gen = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (2, min(length, model.config.max_len)), generator=gen).to(device)
    training = model.training
    model.eval()
    try:
        ours = model(ids).float()
    finally:
        model.train(training)
    theirs = written.to(device)(ids).float()
    difference = (ours - theirs).abs().max().item()
    if not difference <= atol:
        raise AssertionError(f"{what}: the written model's logits differ from the model's by {difference:.3g} "
                             f"(at most {atol:g} expected): the export is wrong")
    return difference
