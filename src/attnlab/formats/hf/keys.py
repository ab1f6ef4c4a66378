"""Every key of a Hugging Face ``config.json`` is accounted for: read by the family's
conversion, declared here as not changing what the model computes (with the reason), or
accepted only at the value that leaves the computation as attnlab makes it. Any other key is
refused by name, in one line, before a weight is read: an option nobody listed is never
ignored silently.

``IRRELEVANT``: keys of every family, ``FAMILY_IRRELEVANT``: a family's own, both ``{key:
reason}``. ``ONLY_AT``: ``{key: (values, what another value would ask for)}``: keys that attnlab
does not implement, accepted at the values that switch them off (``None`` and absent too).
:class:`Reading` is the config as a conversion reads it: it records the keys read.
"""

from __future__ import annotations

from typing import Any

from ...errors import InputError

__all__ = ["IRRELEVANT", "FAMILY_IRRELEVANT", "ONLY_AT", "Reading", "check_switched_off", "check_keys"]

_DROPOUT = "a dropout rate: off when a model predicts, and a fine-tuning run takes attnlab's own (model.options)"
_OUTPUTS = "what transformers returns from a call, not what the model computes"
_MOE = "the mixture-of-experts MLP of the layers from first_k_dense_replace on, which are refused there"

IRRELEVANT: dict[str, str] = {
    "_name_or_path": "where the folder came from",
    "architectures": "the transformers class that wrote the folder: its weights say which head it has (a weight "
                     "attnlab's model lacks is refused by name)",
    "transformers_version": "the version of transformers that wrote the folder",
    "dtype": "the stored weights' type, read from the weight files (from_hf's dtype says attnlab's)",
    "torch_dtype": "the stored weights' type, read from the weight files (from_hf's dtype says attnlab's)",
    "initializer_range": "how new weights are drawn; a folder's weights are loaded",
    "output_attentions": _OUTPUTS,
    "output_hidden_states": _OUTPUTS,
    "return_dict": _OUTPUTS,
    "use_cache": "whether transformers' generate keeps a cache; attnlab's generate says its own",
    "chunk_size_feed_forward": "transformers' feed-forward in chunks to save memory: the same numbers",
    "pretraining_tp": "the tensor-parallel slices Llama was trained with: the same products, summed in parts",
    "bos_token_id": "the tokenizer's id (the tokenizer and generation_config.json give the ids attnlab uses)",
    "eos_token_id": "the tokenizer's id (the tokenizer and generation_config.json give the ids attnlab uses)",
    "pad_token_id": "the tokenizer's id (the tokenizer and generation_config.json give the ids attnlab uses)",
    "sep_token_id": "the tokenizer's id",
    "decoder_start_token_id": "the tokenizer's id",
    "id2label": "a classification head's label names; a task sets its own",
    "label2id": "a classification head's label names; a task sets its own",
    "problem_type": "a classification head's loss; a task sets its own",
    "finetuning_task": "what the checkpoint was fine-tuned on",
    "tokenizer_class": "the tokenizer's class; attnlab reads tokenizer.json",
    "attention_dropout": _DROPOUT,
    "attn_pdrop": _DROPOUT,
    "embd_pdrop": _DROPOUT,
    "resid_pdrop": _DROPOUT,
    "hidden_dropout_prob": _DROPOUT,
    "attention_probs_dropout_prob": _DROPOUT,
    "classifier_dropout": _DROPOUT,
    "dropout": _DROPOUT,
    "qa_dropout": _DROPOUT,
    "seq_classif_dropout": _DROPOUT,
    "summary_first_dropout": _DROPOUT,
    "gradient_checkpointing": "a training setting (attnlab's is train.grad_checkpointing)",
    "max_length": "a generation default of old folders (generation_config.json has today's)",
    "auto_map": "code of the folder's own that transformers may run; attnlab runs none",
}

FAMILY_IRRELEVANT: dict[str, dict[str, str]] = {
    "gpt2": {f"summary_{k}": "the sequence-summary head of GPT2DoubleHeadsModel, which is not loaded"
             for k in ("activation", "proj_to_labels", "type", "use_proj")} | {
        "n_ctx": "the context of old GPT-2 folders, equal to n_positions (which is read)"},
    "gemma3_text": {"_sliding_window_pattern": "written beside layer_types (which is read) by transformers 5",
                    "sliding_window_pattern": "written beside layer_types (which is read) by transformers 5"},
    "qwen2": {"max_window_layers": "read where the folder has no layer_types (which transformers 5 derives from "
                                   "it and writes beside it)",
              "use_sliding_window": "read where the folder has no layer_types (which transformers 5 derives from "
                                    "it and writes beside it)"},
    "smollm3": {"no_rope_layer_interval": "derived into no_rope_layers, which is read",
                "use_sliding_window": "read where the folder has no layer_types (which transformers 5 derives from "
                                      "it and writes beside it)"},
    "phi3": {"original_max_position_embeddings": "the context longrope scaling refers to, read when "
                                                 "rope_parameters ask for that scaling"},
    "bert": {"tie_word_embeddings": "ties the masked-LM head, which an encoder does not load"},
    "diffllama": {"lambda_std_dev": "how the lambda parameters are drawn; a folder's are loaded"},
    "vit": {"encoder_stride": "the stride of SimMIM's decoder, not part of the encoder",
            "pooler_act": "ViTModel's pooler, which an image classifier does not use",
            "pooler_output_size": "ViTModel's pooler, which an image classifier does not use"},
    "deepseek_v3": {k: _MOE for k in ("moe_intermediate_size", "n_group", "n_routed_experts", "n_shared_experts",
                                      "norm_topk_prob", "num_experts_per_tok", "output_router_logits",
                                      "routed_scaling_factor", "topk_group", "topk_method", "scoring_func",
                                      "aux_loss_alpha", "seq_aux", "moe_layer_freq", "ep_size")} | {
        "head_dim": "set by transformers to qk_rope_head_dim (the rotary part of a head), which is read",
        "qk_head_dim": "the sum of qk_nope_head_dim and qk_rope_head_dim, which are read",
        "num_nextn_predict_layers": "the multi-token prediction module, outside the main model (transformers "
                                    "skips it too)"},
}
FAMILY_IRRELEVANT["qwen3"] = FAMILY_IRRELEVANT["qwen2"]
FAMILY_IRRELEVANT["smollm3"] |= FAMILY_IRRELEVANT["qwen2"]
FAMILY_IRRELEVANT["roberta"] = FAMILY_IRRELEVANT["distilbert"] = FAMILY_IRRELEVANT["bert"]
FAMILY_IRRELEVANT["deepseek_v32"] = {**FAMILY_IRRELEVANT["deepseek_v3"],
                                     "mlp_layer_types": "which layers are dense or mixtures of experts: the same "
                                                        "as first_k_dense_replace, which is read"}

ONLY_AT: dict[str, tuple[tuple[Any, ...], str]] = {
    "is_encoder_decoder": ((False,), "an encoder-decoder"),
    "is_decoder": ((False,), "BERT as a decoder"),
    "add_cross_attention": ((False,), "cross-attention layers in an encoder"),
    "use_bidirectional_attention": ((False,), "bidirectional attention in a decoder"),
    "quantization_config": (({},), "quantized weights"),
    "num_experts": ((0,), "a mixture-of-experts MLP"),
    "num_local_experts": ((0,), "a mixture-of-experts MLP"),
    "attention_chunk_size": ((0,), "chunked attention"),
    "use_mrope": ((False,), "multimodal rotary positions"),
    "tie_encoder_decoder": ((False,), "an encoder-decoder"),
    "pruned_heads": (({},), "pruned attention heads"),
    "torchscript": ((False,), "TorchScript export settings"),
    "sinusoidal_pos_embds": ((False,), "DistilBERT's fixed sinusoidal positions"),
}


class Reading(dict):
    """A ``config.json`` mapping that records the keys a conversion reads (``c[k]``,
    ``c.get(k)``, ``k in c``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


def check_switched_off(config: dict[str, Any]) -> None:
    """Refuse, in one line naming it, a key of :data:`ONLY_AT` at a value that asks for what
    attnlab does not implement (absent, ``None``, false, 0 and ``{}`` switch it off)."""
    for key, (values, what) in ONLY_AT.items():
        value = dict.get(config, key)
        if value is None or value is False or value == {} or value in values:
            continue
        raise InputError(f"config.json: {key} {value!r} is not supported ({what}; attnlab does not implement it, "
                         f"and loading without it would compute something else)")


def check_keys(config: Reading, family: str) -> None:
    """Refuse, in one line naming it, the first key of ``config`` that its conversion did not
    read, that is not declared irrelevant, and that is not one of :data:`ONLY_AT` (checked by
    :func:`check_switched_off`)."""
    irrelevant = {**IRRELEVANT, **FAMILY_IRRELEVANT.get(family, {})}
    for key in dict.keys(config):
        if key in config.read or key in irrelevant or key in ONLY_AT:
            continue
        raise InputError(f"config.json: key {key!r} of a {family} config is not known to attnlab (neither read by "
                         f"its conversion nor known not to change the model): refused rather than ignored")
