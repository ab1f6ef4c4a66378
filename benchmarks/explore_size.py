"""The attention explorer on a long input: file size and time to write, and how the page
behaves in a browser (headless Chromium), for a GPT-2-small-shaped model (12 layers, 12
heads, width 768, random weights, built with transformers' own class and saved as a
Hugging Face folder) on a 1,024-token text, through the command a user runs:

    .venv/bin/python benchmarks/explore_size.py [--tokens 1024] [--browser] [--out /tmp/explore-bench]

Prints one table: the page's bytes, the bytes a float32 copy of the same weights would take,
the seconds ``attnlab explore`` took, and with ``--browser`` the milliseconds to the first
view, to the model view's 144 maps, to a head view and to a matrix. A second row stores
random peaked weights of the same shape (each row a softmax of N(0, 3^2) logits over the
keys before it), which compress far worse than a random model's near-uniform rows: the size
a trained model's page stays under. Needs transformers (the dev extra); time it alone.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def gpt2_folder(folder: Path, tokens: int) -> str:
    """A random GPT-2-small folder with a byte-level BPE tokenizer, and a text of ``tokens`` tokens."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = ("the cat sat on a warm mat while the dog watched the birds fly over the quiet river and "
             "nobody said a word about the rain that came later in the long grey afternoon").split()
    text = " ".join(words[i % len(words)] + ("." if i % 17 == 16 else "") for i in range(4 * tokens))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast", '
                                                  '"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}')
    config = transformers.GPT2Config(n_positions=max(1024, tokens), n_embd=768, n_layer=12, n_head=12,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder)
    ids = tok.encode(text).ids[:tokens]
    return tok.decode(ids)


def peaked_page(tokens: int, out: Path) -> tuple[int, int]:
    """A page of random peaked causal weights of the shape above: its bytes and float32's."""
    from attnlab.viz.explorer import Exploration
    from attnlab.viz.explorer.documents import document
    from attnlab.viz.explorer.page import FORMAT, encode_weights

    gen = torch.Generator().manual_seed(0)
    labels = [f"t{i}" for i in range(tokens)]
    mask = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    layers = []
    for layer in range(12):
        logits = torch.randn(12, tokens, tokens, generator=gen) * 3
        w = logits.masked_fill(mask, float("-inf")).softmax(-1)
        layers.append({"name": f"layer {layer}", "heads": 12, "data": encode_weights(w)})
    group = {"name": "self-attention", "queries": labels, "keys": labels, "self": True, "causal": True,
             "layers": layers, "stats": None}
    page = Exploration({"format": FORMAT, "title": "peaked", "subtitle": "", "notes": [],
                        "documents": [document("random peaked weights", "text", [group])]})
    path = page.save(out / "peaked.html", force=True)
    return path.stat().st_size, 12 * 12 * tokens * tokens * 4


def browser_times(page: Path) -> dict[str, float]:
    """Milliseconds to the first view, to every map of the model view, to a head view and a matrix."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        start = time.perf_counter()
        driver.get(page.resolve().as_uri())
        WebDriverWait(driver, 300).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        times = {"first view": (time.perf_counter() - start) * 1e3}
        for name, view in (("model view", "{view: 'model'}"), ("head view", "{view: 'head', layer: 11, heads: [0, 5]}"),
                           ("matrix", "{view: 'matrix', layer: 6, heads: [3]}")):
            t = driver.execute_async_script(
                "const done = arguments[0]; const t0 = performance.now();"
                f"attnlabExplorer.select({view}).then(() => done(performance.now() - t0));")
            times[name] = float(t)
        return times
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--browser", action="store_true", help="also time the page in headless Chromium")
    parser.add_argument("--out", default="/tmp/explore-bench")
    args = parser.parse_args()
    out = Path(args.out)
    text = gpt2_folder(out / "gpt2-small", args.tokens)
    page = out / "gpt2-small.explore.html"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "attnlab", "explore", str(out / "gpt2-small"), text, "--new-tokens", "0",
                    "--out", str(page), "--force"], check=True)
    seconds = time.perf_counter() - start
    rows = [("GPT-2 small, random weights", page.stat().st_size, 12 * 12 * args.tokens ** 2 * 4, seconds, page)]
    size, f32 = peaked_page(args.tokens, out)
    rows.append(("random peaked weights", size, f32, None, out / "peaked.html"))
    from attnlab.bench.machine import machine_info, machine_label

    print(f"machine: {machine_label(machine_info())}; torch {torch.__version__}; {args.tokens} tokens, 12 layers x 12 heads")
    head = "| page | file | float32 weights | attnlab explore |"
    if args.browser:
        head += " first view | model view (144 maps) | head view | matrix |"
    print(head)
    print("| --- " * (head.count("|") - 1) + "|")
    for name, size, f32, secs, path in rows:
        cells = [name, f"{size / 1e6:.1f} MB", f"{f32 / 1e6:,.0f} MB", f"{secs:.1f} s" if secs else "-"]
        if args.browser:
            cells += [f"{v:,.0f} ms" for v in browser_times(path).values()]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
