"""Tiny Hugging Face folders that the tests of refusals share: a one-layer Llama (safetensors) and
GPT-2 (pytorch_model.bin) of width 32 and 300 words written by hand, without ``transformers``,
to put sizes in their config.json that the weights do not have; a text to learn from; a copy
of a folder with keys merged into its config.json.

Imported by name (``from hf_folders import llama_folder``): tests/conftest.py puts tests/ on
sys.path. The tiny Llama that ``transformers`` writes is the ``llama`` fixture of conftest.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

VOCAB, WIDTH, INTER = 300, 32, 64


def llama_folder(folder: Path, **config) -> Path:
    """A one-layer Llama folder of width 32 and 300 words, with ``config`` over its config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    w = {"model.embed_tokens.weight": torch.zeros(VOCAB, WIDTH), "model.norm.weight": torch.ones(WIDTH),
         "lm_head.weight": torch.zeros(VOCAB, WIDTH)}
    p = "model.layers.0."
    w[p + "input_layernorm.weight"] = w[p + "post_attention_layernorm.weight"] = torch.ones(WIDTH)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        w[p + f"self_attn.{name}.weight"] = torch.zeros(WIDTH, WIDTH)
    w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"] = torch.zeros(INTER, WIDTH), torch.zeros(INTER, WIDTH)
    w[p + "mlp.down_proj.weight"] = torch.zeros(WIDTH, INTER)
    save_file({k: v.clone() for k, v in w.items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "llama", "vocab_size": VOCAB, "hidden_size": WIDTH, "num_hidden_layers": 1,
         "num_attention_heads": 4, "intermediate_size": INTER, "max_position_embeddings": 64, **config}))
    return folder


def gpt2_folder(folder: Path, **config) -> Path:
    """A one-layer GPT-2 folder of width 32 and 300 words in the older pytorch_model.bin."""
    folder.mkdir(parents=True, exist_ok=True)
    e = WIDTH
    w = {"wte.weight": torch.zeros(VOCAB, e), "wpe.weight": torch.zeros(64, e), "ln_f.weight": torch.ones(e),
         "ln_f.bias": torch.zeros(e), "h.0.attn.c_attn.weight": torch.zeros(e, 3 * e),
         "h.0.attn.c_attn.bias": torch.zeros(3 * e), "h.0.attn.c_proj.weight": torch.zeros(e, e),
         "h.0.attn.c_proj.bias": torch.zeros(e), "h.0.mlp.c_fc.weight": torch.zeros(e, 4 * e),
         "h.0.mlp.c_fc.bias": torch.zeros(4 * e), "h.0.mlp.c_proj.weight": torch.zeros(4 * e, e),
         "h.0.mlp.c_proj.bias": torch.zeros(e)}
    for n in ("ln_1", "ln_2"):
        w[f"h.0.{n}.weight"], w[f"h.0.{n}.bias"] = torch.ones(e), torch.zeros(e)
    torch.save(w, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "vocab_size": VOCAB, "n_positions": 64, "n_embd": e, "n_layer": 1, "n_head": 4,
         **config}))
    return folder


def text_file(folder: Path) -> Path:
    """``folder/t.txt``: one line of text to learn from."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "t.txt").write_text("a small text to learn from, one line of it\n")
    return folder / "t.txt"


def variant(llama, tmp_path, **config):
    """A copy of the tiny Llama folder with ``config`` merged into its config.json."""
    folder = tmp_path / "variant"
    shutil.copytree(llama, folder)
    c = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**c, **config}))
    return folder
