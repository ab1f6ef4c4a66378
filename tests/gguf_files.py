"""Writing GGUF files for the tests, as llama.cpp's converter writes them (its conventions,
independently of attnlab's reader): tiny random ``transformers`` models of each architecture,
their tensors renamed to llama.cpp's names, the query and key rows of ``llama`` files
reordered for the interleaved rotary layout, Gemma's norms stored as ``1 + weight``, and each
matrix stored in a chosen tensor type (quantized with the ``gguf`` package where it can; the
K-quant types, which it only reads, as random blocks with small scales)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

gguf = __import__("pytest").importorskip("gguf", reason="the gguf package (pip install gguf) writes the test files")
from gguf import GGMLQuantizationType as Q  # noqa: E402

MIXED_TEXT = ("The cat sat on the mat, 2024 times. 注意力机制是什么？ def f(x): return x**2  # code\n"
              "Emoji 🙂🚀 and <|im_start|>user\nhi<|im_end|> done")

TRAIN_TEXT = ["The cat sat on the mat and the dog sat on the log. " * 4,
              "注意力机制 是 一种 让 模型 关注 重要 部分 的 方法。" * 3,
              "def f(x):\n    return x ** 2 + 1  # a function\nfor i in range(10): print(i)\n" * 3,
              "Emoji 🙂 🚀 numbers 0123456789 2024 100 ok.\n"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_vocab(size: int = 320) -> dict[str, Any]:
    """A byte-level BPE vocabulary (tokens, merges, token types) as a gpt2 GGUF tokenizer holds it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAIN_TEXT, trainer)
    import json

    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    return {"model": "gpt2", "pre": "gpt-2", "tokens": tokens, "merges": merges, "types": types,
            "bos": None, "eos": tokens.index("<|endoftext|>")}


def sentencepiece_vocab(size: int = 320) -> dict[str, Any]:
    """A SentencePiece-style vocabulary (pieces with ▁, the 256 byte tokens, scores) as a llama
    GGUF tokenizer holds it: the pieces of a BPE trained on ▁-spelled text, each scored by the
    rank of the merge that makes it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    import json

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=size, show_progress=False)
    tok.train_from_iterator(TRAIN_TEXT, trainer)
    model = json.loads(tok.to_str())["model"]
    merged = ["".join(m) if isinstance(m, list) else m.replace(" ", "") for m in model["merges"]]
    alphabet = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]) if len(t) == 1]
    head = ["<unk>", "<s>", "</s>", "<pad>", "<start_of_turn>", "<end_of_turn>"]
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    pieces = [*dict.fromkeys(p for p in [*alphabet, *merged] if p not in head)]
    tokens = head + bytes_ + pieces
    scores = [0.0] * (len(head) + 256) + [-float(i) for i in range(len(pieces))]
    types = [2, 3, 3, 3, 3, 3] + [6] * 256 + [1] * len(pieces)
    return {"model": "llama", "pre": "default", "tokens": tokens, "scores": scores, "types": types,
            "bos": 1, "eos": 2, "unk": 0, "pad": 3}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's reordering of a query or key projection's rows (convert_hf_to_gguf.py)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.qkv_proj": "attn_qkv",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
          "post_feedforward_layernorm": "post_ffw_norm", "pre_feedforward_layernorm": "ffn_norm"}


def gguf_name(hf: str, gemma: bool) -> str:
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    stem, kind = hf.rsplit(".", 1)
    if stem in top:
        return f"{top[stem]}.{kind}"
    _, _, layer, rest = stem.split(".", 3)
    if rest == "post_attention_layernorm":
        what = "post_attention_norm" if gemma else "ffn_norm"
    else:
        what = _LAYER[rest]
    return f"blk.{layer}.{what}.{kind}"


def random_blocks(qtype: Q, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random bytes of a K-quant tensor with its scales set small and finite."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    g = np.random.default_rng(seed)
    data = g.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    where = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}[qtype]
    for at in where:
        data[:, at:at + 2] = scale
    return data.reshape(rows, cols // block * size)


def write_gguf(path: Path, arch: str, model: Any, vocab: dict[str, Any], qtype: Q = Q.F32,
               extra: dict[str, Any] | None = None) -> Path:
    """``model`` (a transformers causal LM) written as a GGUF file of ``arch`` with tokenizer
    ``vocab``; its matrices in ``qtype``, the norms and biases in F32, as llama.cpp keeps them.
    ``extra``: metadata added or replaced, a text or uint32 by its Python type, or ``(value,
    GGUFValueType[, item type])``."""
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    heads, kv = c.num_attention_heads, c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    w.add_name(f"tiny {arch}")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta") or getattr(c, "rope_theta", 10000.0)
    if isinstance(getattr(c, "rope_parameters", None), dict) and "full_attention" in c.rope_parameters:
        theta = c.rope_parameters["full_attention"]["rope_theta"]
    w.add_rope_freq_base(float(theta))
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(c.vocab_size)
    if getattr(c, "sliding_window", None) and arch in ("gemma2", "gemma3", "mistral"):
        w.add_sliding_window(c.sliding_window)
    if arch == "gemma2":
        w.add_float32(f"{arch}.attn_logit_softcapping", float(c.attn_logit_softcapping))
        w.add_float32(f"{arch}.final_logit_softcapping", float(c.final_logit_softcapping))
    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    if "merges" in vocab:
        w.add_token_merges(vocab["merges"])
    if "scores" in vocab:
        w.add_token_scores(vocab["scores"])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id),
                     ("pad", w.add_pad_token_id)):
        if vocab.get(key) is not None:
            add(vocab[key])
    if vocab["model"] == "gpt2":
        w.add_add_bos_token(False)
    gemma = arch.startswith("gemma")
    for i, (name, t) in enumerate(model.state_dict().items()):
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        data = t.detach().float().numpy().copy()
        if arch in ("llama", "mistral") and (".q_proj." in name or ".k_proj." in name):
            data = _permute(data, heads if ".q_proj." in name else kv)
        if gemma and name.endswith("norm.weight"):
            data = data + 1.0
        out = gguf_name(name, gemma)
        if data.ndim == 1 or qtype == Q.F32:
            w.add_tensor(out, data.astype(np.float32))
        elif qtype in (Q.F16,):
            w.add_tensor(out, data.astype(np.float16))
        elif qtype in (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):
            q = random_blocks(qtype, data.shape, i)
            w.add_tensor(out, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            q = gguf.quants.quantize(data, qtype)
            w.add_tensor(out, q, raw_shape=q.shape, raw_dtype=qtype)
    for key, value in (extra or {}).items():  # last: a key written above is replaced (gguf warns of it)
        if isinstance(value, tuple):  # (value, GGUFValueType[, the array's item type]): any type, wrong ones too
            w.add_key_value(key, *value)
        else:
            (w.add_string if isinstance(value, str) else w.add_uint32)(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
