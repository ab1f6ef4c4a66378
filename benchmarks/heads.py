"""What a trained model's heads do: SmolLM2-135M-Instruct and all-MiniLM-L6-v2 (the packaged
models, ``make models``) on natural text (the start of Tiny Shakespeare's test part) and on a
sequence of random tokens repeated once (the usual test for induction heads).

Per head, from the explorer's own figures (:func:`attnlab.viz.explorer.documents.head_stats`):
``previous`` (mean weight on the token before), ``first`` (on position 0: the first token, or
an encoder's [CLS]) and ``induction`` (on the token that followed the earlier occurrence of
the query's token). A head is counted as

* previous-token: ``previous`` >= 0.4 on the natural text;
* first-token (a sink): ``first`` >= 0.5 on the natural text;
* induction: ``induction`` >= 0.4 on the repeated half of the random sequence.

For SmolLM2, each head's removal (:func:`attnlab.viz.ablation.head_ablation`) on the repeated
half: the loss it adds, whether the heads that most raise it are the induction heads, and the
loss with every induction head removed at once against as many other heads of the same layers
chosen at random.

    python benchmarks/heads.py --out /tmp/heads            # JSON and the page's tables
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from attnlab.attention.capture import capture_attention
from attnlab.data import data_dir
from attnlab.formats.hf.load import from_hf
from attnlab.formats.hf.files import open_checkpoint
from attnlab.formats.packaged import packaged_model
from attnlab.viz.ablation import head_ablation, next_token_loss
from attnlab.viz.explorer.documents import head_stats

PREVIOUS, FIRST, INDUCTION = 0.4, 0.5, 0.4
REPEAT = 100  # random tokens, then the same again


def _natural(tokenizer, n: int) -> list[int]:
    """The first ``n`` tokens of Tiny Shakespeare's test part (its last 5%)."""
    text = (data_dir() / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    return tokenizer.encode(text[int(len(text) * 0.95):][:4 * n])[:n]


def _repeated(vocab: int, low: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    half = rng.sample(range(low, vocab), REPEAT)
    return half + half


def _maps(model, ids: list[int], encoder: bool) -> tuple[list[str], list[torch.Tensor]]:
    x = torch.tensor([ids])
    with torch.no_grad(), capture_attention(model, cpu=True) as maps:
        model.forward_features(x, torch.ones_like(x)) if encoder else model(x)
    names = [n for n, calls in maps.items() if calls]
    return names, [maps[n][0][0].float() for n in names]


def _classify(natural: dict, repeated: dict) -> dict:
    """Per layer, the heads of each kind."""
    layers = []
    for l, (prev, first) in enumerate(zip(natural["previous"], natural["first"])):
        induction = repeated["induction"][l]
        layers.append({
            "previous": [h for h, v in enumerate(prev) if v >= PREVIOUS],
            "first": [h for h, v in enumerate(first) if v >= FIRST],
            "induction": [h for h, v in enumerate(induction) if v is not None and v >= INDUCTION],
            "scores": {"previous": prev, "first": first, "induction": induction},
        })
    return {"layers": layers, "heads": sum(len(s) for s in natural["previous"]),
            "counts": {k: sum(len(l[k]) for l in layers) for k in ("previous", "first", "induction")}}


def analyse(name: str, model, tokenizer, *, encoder: bool, low: int, special: tuple[list[int], list[int]]) -> dict:
    first, last = special
    natural_ids = first + _natural(tokenizer, 256 - len(first) - len(last)) + last
    repeat_ids = first + _repeated(model.config.vocab_size, low) + last
    label = lambda ids: [f"{i}" for i in ids]  # noqa: E731  # ids as labels: equal ids, equal tokens
    _, natural_maps = _maps(model, natural_ids, encoder)
    names, repeat_maps = _maps(model, repeat_ids, encoder)
    natural = head_stats(natural_maps, label(natural_ids))
    repeated = head_stats(repeat_maps, label(repeat_ids))
    out = {"model": name, "natural_tokens": len(natural_ids), "repeated_tokens": len(repeat_ids),
           **_classify(natural, repeated), "modules": names}
    if encoder:
        return out
    start = len(first) + REPEAT  # the first token of the repeat
    x = torch.tensor([repeat_ids])
    t0 = time.perf_counter()
    changes = head_ablation(model, x, names, start=start)
    out["ablation_seconds"] = time.perf_counter() - t0
    with torch.no_grad():
        out["loss_repeated_half"] = float(next_token_loss(model(x), x, start)[0])
        out["loss_first_half"] = float(next_token_loss(model(x)[:, :start], x[:, :start])[0])
    out["ablation"] = changes
    flat = sorted(((v, l, h) for l, row in enumerate(changes) for h, v in enumerate(row)), reverse=True)
    induction = {(l, h) for l, layer in enumerate(out["layers"]) for h in layer["induction"]}
    out["top_by_ablation"] = [{"layer": l, "head": h, "change": v, "induction": (l, h) in induction,
                               "induction_score": out["layers"][l]["scores"]["induction"][h]} for v, l, h in flat[:10]]
    out["induction_changes"] = {f"{l}.{h}": changes[l][h] for l, h in sorted(induction)}
    out["removed_together"] = {"induction": _removed(model, x, names, sorted(induction), start)}
    # the control: as many other heads of the same layers, drawn at random (five draws)
    rng = random.Random(1)
    span = {l for l, _ in induction}
    others = [(l, h) for l in sorted(span) for h in range(len(changes[l])) if (l, h) not in induction]
    out["removed_together"]["others_same_layers"] = [
        _removed(model, x, names, rng.sample(others, len(induction)), start) for _ in range(5)]
    return out


@torch.no_grad()
def _removed(model, x, names, heads, start) -> float:
    """The loss on the repeated half with every head of ``heads`` removed at once."""
    saved = []
    for l, h in heads:
        w = model.get_submodule(names[l]).o_proj.weight
        size = w.shape[1] // model.get_submodule(names[l]).num_heads
        saved.append((w, h * size, size, w[:, h * size:(h + 1) * size].clone()))
        w[:, h * size:(h + 1) * size] = 0
    try:
        return float(next_token_loss(model(x), x, start)[0])
    finally:
        for w, at, size, kept in saved:
            w[:, at:at + size] = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/heads", help="a folder for heads.json")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("ATTNLAB_THREADS", "2")))
    results = []
    path = packaged_model("smollm2-135m-instruct")
    model, tokenizer = from_hf(path).eval(), open_checkpoint(path).tokenizer()
    results.append(analyse("SmolLM2-135M-Instruct", model, tokenizer, encoder=False, low=1000, special=([], [])))
    from attnlab.formats.sentence import SentenceEncoder

    folder = packaged_model("all-minilm-l6-v2")
    encoder = SentenceEncoder.load(folder)
    tok = encoder.tokenizer
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    results.append(analyse("all-MiniLM-L6-v2", encoder.encoder, _Plain(tok), encoder=True, low=2000,
                           special=([cls], [sep])))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "heads.json").write_text(json.dumps(results, indent=1))
    for r in results:
        print(f"\n## {r['model']}: {r['heads']} heads; {r['counts']}")
        for l, layer in enumerate(r["layers"]):
            print(f"layer {l:2d}: previous {layer['previous']}, first {layer['first']}, induction {layer['induction']}")
        if "ablation" in r:
            print(f"loss on the repeated half {r['loss_repeated_half']:.3f}, first half {r['loss_first_half']:.3f}; "
                  f"removal of every head took {r['ablation_seconds']:.1f} s")
            for t in r["top_by_ablation"]:
                print(f"  layer {t['layer']} head {t['head']}: +{t['change']:.3f} nats (induction score "
                      f"{t['induction_score']:.2f}{', induction' if t['induction'] else ''})")
            print(f"each induction head removed: {r['induction_changes']}")
            print(f"induction heads removed together: {r['removed_together']['induction']:.3f}; as many others of "
                  f"the same layers at random: {[round(v, 3) for v in r['removed_together']['others_same_layers']]}")
    print(f"\nwritten: {out / 'heads.json'}")


class _Plain:
    """A ``tokenizers.Tokenizer`` giving a text's ids without the special tokens."""

    def __init__(self, tok) -> None:
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids


if __name__ == "__main__":
    main()
