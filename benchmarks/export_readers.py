"""A fine-tuned language model written back out, and read by the tools people run it with:
``attnlab export RUN`` as a Hugging Face folder and as GGUF files of F32, F16 and Q8_0 weights;
each read by attnlab, ``transformers`` and (in the peers' environment) llama.cpp, which
continue the same prompts greedily. Prints the files' sizes, the time to write each, whether
the three readers' tokens agree and, where they part, after how many tokens. (llama.cpp
multiplies Q8_0 weights by activations it quantizes to 8 bits as well, so its Q8_0
continuations may part from those of the dequantized weights that attnlab and transformers
compute with.)

    python benchmarks/export_readers.py runs/shakespeare-lora --llama-cpp .venv-peers/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = ["ROMEO:\n", "The capital of France is"]
NEW = 24

LLAMA_CPP = r"""
import json, sys
import numpy as np
import llama_cpp.llama_cpp as api
from llama_cpp import Llama
defaults = api.llama_model_default_params
def params():  # without llama.cpp's repacked and AMX buffers, which crash on some CPUs (benchmarks/real_decoding.py)
    p = defaults(); p.use_extra_bufts = False; return p
api.llama_model_default_params = params
llm = Llama(model_path=sys.argv[1], n_ctx=256, n_threads=2, verbose=False)
vocab = llm.n_vocab()
out = []
for prompt in json.loads(sys.argv[2]):
    llm.reset()
    llm.eval(prompt)
    last = lambda: int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))
    tokens = [last()]
    for _ in range(int(sys.argv[3]) - 1):
        llm.eval([tokens[-1]]); tokens.append(last())
    out.append(tokens)
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--llama-cpp", default=None, metavar="PYTHON", help="the peers' interpreter, with llama-cpp-python")
    parser.add_argument("--keep", default=None, metavar="FOLDER", help="keep the written files here")
    args = parser.parse_args()
    torch.set_num_threads(2)
    import transformers

    from attnlab.formats.hf.load import from_hf
    from attnlab.tasks import load_run
    from attnlab.export.language_model import export_language_model

    run = load_run(args.run_dir)
    prompts = [run.tokenizer.encode_prompt(p) for p in PROMPTS]
    folder = Path(args.keep or tempfile.mkdtemp(prefix="attnlab-export-"))
    rows = []
    ours_run = [_greedy(run.model.eval(), p) for p in prompts]
    for fmt, kind in [("hf", None), ("gguf", "f32"), ("gguf", "f16"), ("gguf", "q8_0")]:
        out = folder / ("hf" if fmt == "hf" else f"model-{kind}.gguf")
        start = time.perf_counter()
        result = export_language_model(run, out, fmt, weight_type=kind, overwrite=True)
        seconds = time.perf_counter() - start
        size = sum(f.stat().st_size for f in out.rglob("*")) if out.is_dir() else out.stat().st_size
        ours = [_greedy(from_hf(out), p) for p in prompts]
        if fmt == "hf":
            theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        else:
            theirs = transformers.AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name,
                                                                       dtype=torch.float32).eval()
        hf = [_hf_greedy(theirs, p) for p in prompts]
        cpp = None
        if fmt == "gguf" and args.llama_cpp:
            done = subprocess.run([args.llama_cpp, "-c", LLAMA_CPP, str(out), json.dumps(prompts), str(NEW)],
                                  capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
            cpp = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else f"failed: {done.stderr[-300:]}"
        rows.append({"format": fmt if kind is None else f"gguf {kind}", "bytes": size, "write_seconds": seconds,
                     "same_first_tokens": {"attnlab vs run": _common(ours, ours_run),
                                           "transformers vs attnlab": _common(hf, ours),
                                           **({"llama.cpp vs attnlab": _common(cpp, ours)} if isinstance(cpp, list)
                                              else {})},
                     "difference": result.difference, "attnlab_equals_run": ours == ours_run,
                     "transformers_equals_attnlab": hf == ours, "llama_cpp_equals_attnlab": None if cpp is None
                     else cpp == ours, "lora_merged": result.lora_merged})
        print(json.dumps(rows[-1]), flush=True)
    print(f"sample ({PROMPTS[0]!r}): {run.tokenizer.decode(ours_run[0])!r}")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)


def _common(a: list[list[int]], b: list[list[int]]) -> list[int]:
    """Per prompt, how many first tokens two readers' continuations share."""
    return [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), min(len(p), len(q))) for p, q in zip(a, b)]


@torch.no_grad()
def _greedy(model, prompt: list[int], logits=lambda out: out) -> list[int]:
    """``NEW`` tokens, each the most probable after all before it (no stop at an end token, as
    llama.cpp's loop here has none), the whole sequence read again each step."""
    ids = list(prompt)
    for _ in range(NEW):
        ids.append(int(logits(model(torch.tensor([ids])))[0, -1].argmax()))
    return ids[len(prompt):]


def _hf_greedy(model, prompt: list[int]) -> list[int]:
    return _greedy(model, prompt, lambda out: out.logits)


if __name__ == "__main__":
    sys.exit(main())
