"""BLEU by source-sentence length: do long sentences cost a recurrent translator more than a Transformer?

The tutorials' case against recurrent encoder-decoders is that a whole sentence must pass
through one state per step, so long-range dependencies fade, where attention reaches every
position in one step. This script reads finished translation runs (``attnlab train
translate-multi30k`` and ``translate-multi30k-gru``, or any translation run on Multi30k),
their ``translations.test.txt`` (one line per test sentence, in the test file's order, as
the run wrote it), and the test set's source and references, groups the sentences by the
source's length in words (whitespace-separated, before any tokenizer, so the groups are the
same for every run), and prints sacreBLEU (13a, cased, as the runs report) for each group
and each run, with the share of the run's own corpus BLEU, so that runs of different overall
quality can be compared on how they fall with length.

    python benchmarks/translation_by_length.py --run-dir runs/translate-multi30k --run-dir runs/translate-multi30k-gru

BLEU on a few hundred sentences moves by a point or two from one sample to another: the
sentence counts are printed so that the differences can be read against that.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import sacrebleu

from attnlab.data.readers.multi30k import load_multi30k
from attnlab.tasks import read_recipe

DEFAULT_GROUPS = "1-8,9-11,12-14,15-18,19-"


def groups_of(spec: str) -> list[tuple[int, int | None]]:
    """``"1-8,9-11,19-"`` -> ``[(1, 8), (9, 11), (19, None)]``."""
    out = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        out.append((int(lo), int(hi) if hi else None))
    return out


def bleu(hyps: list[str], refs: list[str]) -> float:
    return sacrebleu.corpus_bleu(hyps, [refs], tokenize="13a").score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, action="append", required=True, help="a finished translation run "
                        "(repeatable)")
    parser.add_argument("--groups", default=DEFAULT_GROUPS, help=f"source lengths in words (default {DEFAULT_GROUPS})")
    parser.add_argument("--data-dir", help="data directory (default: $ATTNLAB_DATA_DIR, else ~/.cache/attnlab)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args()
    groups = groups_of(args.groups)
    pairs = None
    columns = []
    for run_dir in args.run_dir:
        recipe = read_recipe(run_dir)
        src, tgt = recipe.data.source, recipe.data.target
        run_pairs = load_multi30k("test", args.data_dir, src, tgt)
        if pairs is not None and run_pairs != pairs:
            raise SystemExit(f"{run_dir} translates another test set than {args.run_dir[0]}")
        pairs = run_pairs
        hyps = (run_dir / "translations.test.txt").read_text(encoding="utf-8").split("\n")[:len(pairs)]
        if len(hyps) != len(pairs):
            raise SystemExit(f"{run_dir}/translations.test.txt has {len(hyps)} lines; the test set has {len(pairs)}")
        model = json.loads((run_dir / "results.json").read_text())["model"]
        columns.append((str(run_dir), model, hyps))
    assert pairs is not None
    lengths = [len(s.split()) for s, _ in pairs]
    refs = [t for _, t in pairs]
    rows = []
    for lo, hi in groups:
        idx = [i for i, n in enumerate(lengths) if n >= lo and (hi is None or n <= hi)]
        if not idx:
            continue
        cells = []
        for _, _, hyps in columns:
            cells.append(bleu([hyps[i] for i in idx], [refs[i] for i in idx]))
        rows.append({"words": f"{lo}-{hi}" if hi else f"{lo}+", "sentences": len(idx), "bleu": cells})
    totals = [bleu(hyps, refs) for _, _, hyps in columns]
    head = "| source words | sentences | " + " | ".join(f"{m} BLEU (share of its corpus BLEU)" for _, m, _ in columns)
    print(head + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in columns) + " |")
    for r in rows:
        print(f"| {r['words']} | {r['sentences']} | "
              + " | ".join(f"{b:.2f} ({100 * b / t:.0f}%)" for b, t in zip(r["bleu"], totals)) + " |")
    print(f"| all | {len(pairs)} | " + " | ".join(f"{t:.2f}" for t in totals) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": [c[:2] for c in columns], "groups": rows, "corpus": totals},
                                              indent=1))


if __name__ == "__main__":
    main()
