"""``attnlab bench vision``: the tutorials' claims about attention in vision models, measured.

Every image variant trains on CIFAR-10 with one budget, written out in
:data:`IMAGE_BUDGET` (AdamW, lr 2e-3 after 70 warm-up steps then cosine, weight decay
0.05, label smoothing 0.1, gradient clipping at 1, random crop and flip,
``precision: auto``) for :data:`STEPS` steps
of :data:`BATCH` images (4 epochs of the 45,000 training images), the validation split
(5,000 images) evaluated half-way and at the end to pick ``best/``, and the test set
(10,000 images) once with those weights. Only the model changes from row to row; the
ViT rows start from :data:`BASE_VIT` (patch 4, width 128, 6 blocks, 4 heads, MLP ratio
2, class token, learned 1-D positions, DropPath 0.05). The
text rows are the ``sentiment-mr`` recipe (fixed split) with only its norms changed.

Parts (``parts=``), the claims they test:

* ``norm``: LayerNorm or the token BatchNorm in the ViT blocks, before the branches
  (pre-norm) or after the residual sum (post-norm; BatchNorm there is the first
  tutorial's "attention, projection, BatchNorm").
* ``text_norm``: the same four on MR sentiment.
* ``positions``: none, learned 1-D, learned 2-D (row and column halves), fixed 2-D
  sin-cos, 2-D relative bias per head.
* ``regularization``: neither, Dropout 0.1, DropPath 0.1, both.
* ``pooling``: class token, mean of the patch tokens, sequence pooling.
* ``heads``: 1, 2, 4, 8 heads at width 128.
* ``patch``: patch size 2, 4, 8 (256, 64, 16 tokens).
* ``tutorials``: the tutorials' example models (attention CNN with the SAGAN block and
  with conv-SA-BN, the one-block ViT sketch, the hybrid ViT, ResNet plain, with SE and
  with CBAM, a BoTNet with axial and one with stand-alone 2-D attention).
* ``botnet``: BoTNet's MHSA in the last block, in the whole last stage, in the last two.

Each (variant, seed) is one ``attnlab train`` run in its own process (so its peak
memory, the process's maximum resident set, is its own; the data set's ~0.6 GB is in
every row alike) under ``OUT/runs/``. The study is resumable at two levels: a finished
run is a record in ``OUT/results.json`` and is not trained again, and an interrupted run
resumes from its last checkpoint. ``OUT/table.md``, ``accuracy.png``, ``time.png`` and
``report.html`` are rewritten at the end from all records.

Each record keeps the machine it ran on (:func:`~attnlab.bench.machine.machine_info`:
the CPU with its AVX2/AVX512/bfloat16 flags, threads, torch) and its precision, so a study
resumed on another machine says which rows ran where: accuracy carries over between
machines, samples per second only within one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import __version__
from ..errors import InputError
from .parts import VISION_PARTS
from ..io import atomic_write_bytes, read_json_mapping
from ..report.markdown import markdown_to_html
from ..suggest import did_you_mean
from ..report.page import Html, Image, Note, Section, Table, render_html
from .attention import ResultStore
from .machine import machine_info, machine_label

__all__ = ["Variant", "VARIANTS", "PARTS", "SEEDS", "STEPS", "BATCH", "run_vision", "vision_markdown",
           "write_vision_report", "is_vision_dir"]

STEPS, BATCH = 704, 256  # 4 epochs of 45,000 images
# Written out here, every key the vit-cifar10 recipe sets, so that the study keeps its
# meaning when that recipe changes (a test resolves each variant against it).
IMAGE_BUDGET = (f"train.steps={STEPS}", f"train.batch_size={BATCH}", f"train.eval_every={STEPS // 2}",
                "train.warmup_steps=70", "train.log_every=50", "train.checkpoint_every=100", "train.optimizer=adamw",
                "train.lr=0.002", "train.weight_decay=0.05", "train.label_smoothing=0.1", "train.grad_clip=1.0",
                "train.precision=auto", "data.augment=true", "data.crop_padding=4", "data.val_size=5000")
BASE_VIT = ("model.name=vit_cifar_patch4",
            "model.options={embed_dim: 128, depth: 6, num_heads: 4, mlp_ratio: 2.0, drop_path_rate: 0.05}")
QUICK_IMAGE = ("train.steps=2", "train.batch_size=8", "train.eval_every=1", "train.warmup_steps=0",
               "train.log_every=1", "train.checkpoint_every=0", "data.val_size=20", "data.max_per_class=2")
QUICK_TEXT = ("train.steps=2", "train.batch_size=8", "train.eval_every=1", "train.warmup_steps=0",
              "train.log_every=1", "train.checkpoint_every=0")
SILENT = ("train.progress=false", "train.tensorboard=false")


@dataclass(frozen=True)
class Variant:
    """One row: a base recipe and the overrides that make it."""

    part: str
    name: str
    recipe: str
    overrides: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.part}/{self.name}"


def _vit(part: str, name: str, *options: str) -> Variant:
    """The study's ViT (patch 4, width 128, 6 blocks, 4 heads, class token, learned positions) with ``options``."""
    return Variant(part, name, "vit-cifar10", (*BASE_VIT, *(f"model.options.{o}" for o in options)))


def _model(part: str, name: str, model: str, options: str = "{}", *extra: str) -> Variant:
    return Variant(part, name, "vit-cifar10", (f"model.name={model}", f"model.options={options}", *extra))


BOT = "layers: [1, 1, 1, 2], widths: [32, 64, 128, 64], stem_width: 32"  # two blocks in the last stage
CNN = ("train.channels_last=true",)
VARIANTS: tuple[Variant, ...] = (
    _vit("norm", "LayerNorm, pre-norm (timm)"),
    _vit("norm", "BatchNorm, pre-norm", "norm=batchnorm"),
    _vit("norm", "LayerNorm, post-norm", "norm_first=false"),
    _vit("norm", "BatchNorm, post-norm (tutorial)", "norm=batchnorm", "norm_first=false"),
    Variant("text_norm", "LayerNorm, pre-norm", "sentiment-mr"),
    Variant("text_norm", "BatchNorm, pre-norm", "sentiment-mr", ("model.options.norm=batchnorm",)),
    Variant("text_norm", "LayerNorm, post-norm", "sentiment-mr", ("model.options.norm_first=false",)),
    Variant("text_norm", "BatchNorm, post-norm (tutorial)", "sentiment-mr",
            ("model.options.norm=batchnorm", "model.options.norm_first=false")),
    _vit("positions", "learned 1-D", "pos_embed=learned"),
    _vit("positions", "none", "pos_embed=none"),
    _vit("positions", "learned 2-D", "pos_embed=learned2d"),
    _vit("positions", "fixed 2-D sin-cos", "pos_embed=sincos2d"),
    _vit("positions", "2-D relative bias", "pos_embed=relative"),
    _vit("regularization", "DropPath 0.05 (recipe)"),
    _vit("regularization", "neither", "drop_path_rate=0"),
    _vit("regularization", "Dropout 0.1", "drop_path_rate=0", "drop_rate=0.1"),
    _vit("regularization", "DropPath 0.1", "drop_path_rate=0.1"),
    _vit("regularization", "both 0.1", "drop_path_rate=0.1", "drop_rate=0.1"),
    _vit("pooling", "class token"),
    _vit("pooling", "mean of patches", "class_token=false", "global_pool=avg"),
    _vit("pooling", "sequence pooling", "class_token=false", "global_pool=seq"),
    _vit("heads", "4 heads of 32 (recipe)"),
    _vit("heads", "1 head of 128", "num_heads=1"),
    _vit("heads", "2 heads of 64", "num_heads=2"),
    _vit("heads", "8 heads of 16", "num_heads=8"),
    _vit("patch", "patch 4, 64 tokens (recipe)"),
    _vit("patch", "patch 2, 256 tokens", "patch_size=2"),
    _vit("patch", "patch 8, 16 tokens", "patch_size=8"),
    _model("tutorials", "ViT sketch (one block)", "vit_sketch_cifar"),
    _model("tutorials", "hybrid ViT (CNN stem)", "vit_hybrid_cifar"),
    _model("tutorials", "attention CNN (SAGAN block)", "attention_cnn_cifar", "{}", *CNN),
    _model("tutorials", "attention CNN (conv-SA-BN)", "conv_sa_bn_cifar", "{}", *CNN),
    _model("tutorials", "ResNet", "resnet18_cifar", "{layers: [1, 1, 1, 1], widths: [32, 64, 128, 256], "
           "stem_width: 32}", *CNN),
    _model("tutorials", "ResNet + SE", "resnet18_cifar", "{layers: [1, 1, 1, 1], widths: [32, 64, 128, 256], "
           "stem_width: 32, channel_attention: se}", *CNN),
    _model("tutorials", "ResNet + CBAM", "resnet18_cifar", "{layers: [1, 1, 1, 1], widths: [32, 64, 128, 256], "
           "stem_width: 32, channel_attention: cbam}", *CNN),
    _model("tutorials", "BoTNet, axial attention", "botnet_cifar", f"{{{BOT}, attention: axial}}", *CNN),
    _model("tutorials", "BoTNet, stand-alone 2-D attention", "botnet_cifar", f"{{{BOT}, attention: standalone2d}}",
           *CNN),
    _model("botnet", "MHSA in the last stage (paper)", "botnet_cifar", f"{{{BOT}}}", *CNN),
    _model("botnet", "MHSA in the last block only", "botnet_cifar", f"{{{BOT}, mhsa_in: last_block}}", *CNN),
    _model("botnet", "MHSA in the last two stages", "botnet_cifar", f"{{{BOT}, mhsa_in: last_two_stages}}", *CNN),
)
PARTS = VISION_PARTS  # the command line's list (bench/parts.py): every variant's part, in the variants' order
if PARTS != tuple(dict.fromkeys(v.part for v in VARIANTS)):
    raise ImportError("attnlab.bench.parts.VISION_PARTS must list the parts of bench.vision.VARIANTS in their order")
# Seeds per part: three where the claim is "this one is better" and differences are small.
SEEDS = {"norm": 3, "text_norm": 3, "positions": 2}
CLAIMS = {
    "norm": "BatchNorm inside self-attention helps a ViT (the first tutorial)",
    "text_norm": "BatchNorm inside self-attention helps a Transformer on text (the first tutorial)",
    "positions": "1-D, 2-D and relative position embeddings differ little (ViT paper, appendix D.4)",
    "regularization": "DropPath and Dropout play different roles",
    "pooling": "a class token and mean pooling do about as well",
    "heads": "more heads at a fixed width help, up to a point",
    "patch": "smaller patches (more tokens) see more, at a quadratic cost",
    "tutorials": "the tutorials' example models, trained alike",
    "botnet": "BoTNet needs MHSA only in the last stage",
}


def _run_one(variant: Variant, seed: int, run_dir: Path, overrides: list[str], log_path: Path,
             device: str) -> dict[str, Any]:
    """Train one (variant, seed) in a child process; its results plus the child's peak memory."""
    cmd = [sys.executable, "-m", "attnlab", "train", variant.recipe, *overrides, "--run-dir", str(run_dir)]
    if device != "cpu":
        cmd.append(f"train.device={device}")
    if (run_dir / "results.json").is_file():
        peak = None  # trained before this study recorded it: memory unknown
    else:
        if (run_dir / "checkpoints").is_dir():
            cmd.append("--resume")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode == 2:  # the child's usage error (missing data, a bad option): the user's to fix
            last = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise InputError(f"training {variant.key} (seed {seed}) stopped: {last[0]}")
        if proc.returncode != 0:
            raise RuntimeError(f"training {variant.key} (seed {seed}) failed with exit code {proc.returncode}; "
                               f"see {log_path}")
        peak = usage.ru_maxrss / 1024  # kB on Linux
    results = read_json_mapping(run_dir / "results.json")
    return {"test_accuracy": results["test_accuracy"], "best_val_accuracy": results.get("best_val_accuracy"),
            "params": results["params"], "samples_per_s": results["samples_per_s"],
            "train_seconds": results["train_seconds"], "precision": results.get("precision"),
            "peak_rss_mb": peak, "model": results["model"]}


def run_vision(out: str | Path, *, parts: Sequence[str] = PARTS, seeds: dict[str, int] | None = None,
               variants: Sequence[str] | None = None, quick: bool = False, fresh: bool = False, device: str = "cpu", data_dir: str | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train every (variant, seed) of ``parts`` not yet in ``out/results.json``; write the
    tables, plots and ``report.html``; return the records.

    ``seeds``: seeds per part (default :data:`SEEDS`, 1 for the others). ``fresh``: forget
    the records and delete the study's ``runs/`` and ``logs/`` first. ``variants``: only
    these rows of ``parts``, each named ``part/name`` as in :attr:`Variant.key` (for
    example ``heads/8 heads of 16``); the others are neither trained nor forgotten. ``quick``: two
    steps on 20 images per variant, the first two variants of each part, one seed, each
    tested on the whole test set: it shows that everything runs end to end (nearly all of its
    time start-up, decoding and testing); its figures mean nothing."""
    for p in parts:
        if p not in PARTS:
            raise InputError(f"parts must be among {list(PARTS)}; got {p!r}")
    keys = [v.key for v in VARIANTS if v.part in parts]
    for k in variants or ():
        if k not in keys:
            raise InputError(f"variant must be one of the rows of the parts asked for, named part/name; got {k!r}"
                             f"{did_you_mean(k, keys, 'rows')}")
    seeds = {**SEEDS, **(seeds or {})}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if fresh:  # the study's own run folders go too, or their results would be read back
        for sub in ("runs", "logs"):
            shutil.rmtree(out / sub, ignore_errors=True)
    store = ResultStore(out, fresh)
    if store.data.get("quick", quick) != quick:
        raise InputError(f"{out} holds a {'quick' if store.data['quick'] else 'full'} study; use another --out "
                         f"or --fresh")
    machine = store.data["machine"] = machine_info(device)  # this invocation's; each record keeps its own
    store.data["quick"] = quick
    store.data["budget"] = {"steps": STEPS, "batch_size": BATCH} if not quick else {"steps": 2, "batch_size": 8}
    store.save()
    for part in parts:
        rows = [v for v in VARIANTS if v.part == part and (not variants or v.key in variants)]
        for variant in rows[:2] if quick else rows:
            for seed in range(1 if quick else seeds.get(part, 1)):
                if store.find("vision", part=part, variant=variant.name, seed=seed):
                    continue
                # Each part's first row is the same ViT: train it once, count it in every part.
                same = store.find("vision", recipe=variant.recipe, overrides=list(variant.overrides), seed=seed)
                if same:
                    store.add("vision", {**same, "part": part, "variant": variant.name})
                    log(f"{part:>14} | {variant.name:<36} seed {seed}: the run of {same['part']}/{same['variant']}")
                    continue
                image = variant.recipe != "sentiment-mr"
                overrides = [*SILENT, *variant.overrides, f"train.seed={seed}",
                             *((QUICK_IMAGE if image else QUICK_TEXT) if quick else (IMAGE_BUDGET if image else ()))]
                if data_dir:
                    overrides.append(f"data.data_dir={data_dir}")
                slug = "".join(c if c.isalnum() else "-" for c in variant.name.lower()).strip("-")
                run_dir = out / "runs" / part / f"{slug}-seed{seed}"
                t0 = time.perf_counter()
                rec = _run_one(variant, seed, run_dir, overrides, out / "logs" / f"{part}-{slug}-seed{seed}.log",
                               device)
                store.add("vision", {"part": part, "variant": variant.name, "seed": seed, "recipe": variant.recipe,
                                     "overrides": list(variant.overrides), "run_dir": str(run_dir), **rec,
                                     "machine": machine})
                log(f"{part:>14} | {variant.name:<36} seed {seed}: test {100 * rec['test_accuracy']:.2f}%, "
                    f"{rec['samples_per_s']:.0f} samples/s ({time.perf_counter() - t0:.0f} s)")
    write_vision_report(out)
    return store.data


# ----------------------------------------------------------------------------- tables, plots, page
def _ran_on(record: dict[str, Any], data: dict[str, Any]) -> str:
    """The label of the machine ``record`` ran on (a record from before records kept their
    own ran on the file's)."""
    return machine_label(record.get("machine") or data.get("machine", {}))


def _machines(data: dict[str, Any]) -> dict[str, str]:
    """The records' machines, first seen first, each with its letter: ``{label: "A", ...}``."""
    labels = [_ran_on(r, data) for r in data.get("vision", [])] or [machine_label(data.get("machine", {}))]
    return {m: chr(ord("A") + i) for i, m in enumerate(dict.fromkeys(labels))}


def _summary(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (part, variant) in :data:`VARIANTS` order: mean and spread over seeds,
    the machines and precisions its seeds ran with."""
    records = data.get("vision", [])
    order = {v.key: i for i, v in enumerate(VARIANTS)}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["part"], r["variant"]), []).append(r)
    rows = []
    for (part, name), recs in sorted(groups.items(), key=lambda kv: order.get(f"{kv[0][0]}/{kv[0][1]}", 1e9)):
        accs = [100 * r["test_accuracy"] for r in recs]
        peaks = [r["peak_rss_mb"] for r in recs if r.get("peak_rss_mb") is not None]
        rows.append({"part": part, "variant": name, "n": len(recs), "mean": statistics.fmean(accs),
                     "sd": statistics.stdev(accs) if len(accs) > 1 else None, "params": recs[0]["params"],
                     "samples_per_s": statistics.fmean(r["samples_per_s"] for r in recs),
                     "minutes": statistics.fmean(r["train_seconds"] for r in recs) / 60,
                     "peak_mb": max(peaks) if peaks else None,
                     "ran_on": list(dict.fromkeys((_ran_on(r, data), r.get("precision") or "?") for r in recs))})
    return rows


def vision_markdown(data: dict[str, Any]) -> str:
    """The study's tables, one per part, from ``results.json``'s content."""
    rows = _summary(data)
    letter = _machines(data)
    budget = data.get("budget", {})
    if len(letter) == 1:
        where = f"{next(iter(letter))}."
    else:
        where = ("Machines: " + "; ".join(f"{a}: {m}" for m, a in letter.items()) + ". Samples per second and "
                 "minutes compare only between rows of one machine and precision.")
    lines = [f"CIFAR-10 rows: {budget.get('steps')} steps of {budget.get('batch_size')} images each (AdamW, cosine "
             "decay, label smoothing 0.1, crop and flip; the best of two validation points tested once); the first "
             "row of the ViT parts is one set of runs, the study's base ViT. MR rows: the sentiment-mr recipe. "
             f"{where} Test accuracy is the mean over seeds ± their standard deviation; Δ is the difference from the part's "
             "first row.", ""]
    if data.get("quick"):
        lines += ["**A quick run: two steps on a few images. The figures mean nothing.**", ""]
    for part in PARTS:
        part_rows = [r for r in rows if r["part"] == part]
        if not part_rows:
            continue
        first = part_rows[0]["mean"]
        lines += [f"### {part}: {CLAIMS[part]}", "",
                  "| variant | test accuracy | seeds | Δ (points) | params | samples/s | train minutes | peak memory "
                  f"| {'precision' if len(letter) == 1 else 'machine, precision'} |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in part_rows:
            acc = f"{r['mean']:.2f}%" + (f" ± {r['sd']:.2f}" if r["sd"] is not None else "")
            peak = "n/a" if r["peak_mb"] is None else f"{r['peak_mb']:.0f} MB"
            ran_on = "; ".join(p if len(letter) == 1 else f"{letter[m]}, {p}" for m, p in r["ran_on"])
            lines.append(f"| {r['variant']} | {acc} | {r['n']} | {r['mean'] - first:+.2f} | {r['params'] / 1e6:.2f} M "
                         f"| {r['samples_per_s']:.0f} | {r['minutes']:.1f} | {peak} | {ran_on} |")
        lines.append("")
    return "\n".join(lines)


def _plots(data: dict[str, Any], out: Path) -> list[Path]:
    rows = _summary(data)
    if not rows:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [p for p in PARTS if any(r["part"] == p for r in rows)]
    cols = min(3, len(parts))
    fig, axes = plt.subplots(math.ceil(len(parts) / cols), cols, figsize=(5.5 * cols, 3.2 * math.ceil(len(parts) / cols)),
                             squeeze=False)
    for ax, part in zip(axes.flat, parts):
        part_rows = [r for r in rows if r["part"] == part]
        ys = range(len(part_rows))
        ax.barh(ys, [r["mean"] for r in part_rows], xerr=[r["sd"] or 0 for r in part_rows], color="#4c72b0")
        ax.set_yticks(list(ys), [r["variant"] for r in part_rows], fontsize=8)
        ax.invert_yaxis()
        lo = min(r["mean"] - (r["sd"] or 0) for r in part_rows)
        ax.set_xlim(max(0.0, lo - 5), 100 if data.get("quick") else min(100.0, max(r["mean"] for r in part_rows) + 3))
        ax.set_title(part, fontsize=10)
        ax.set_xlabel("test accuracy (%)", fontsize=8)
    for ax in list(axes.flat)[len(parts):]:
        ax.axis("off")
    fig.tight_layout()
    paths = [out / "accuracy.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    image_rows = [r for r in rows if r["part"] != "text_norm"]
    if image_rows:
        fig, ax = plt.subplots(figsize=(8, 5))
        for part in [p for p in parts if p != "text_norm"]:
            pr = [r for r in image_rows if r["part"] == part]
            ax.scatter([r["minutes"] for r in pr], [r["mean"] for r in pr], label=part, s=18)
        ax.set_xlabel("training minutes")
        ax.set_ylabel("CIFAR-10 test accuracy (%)")
        ax.set_title("accuracy against training time, every CIFAR-10 row")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out / "time.png")
        fig.savefig(paths[1], dpi=110)
        plt.close(fig)
    return paths


def is_vision_dir(folder: str | Path) -> bool:
    """Whether ``folder`` holds an ``attnlab bench vision`` study."""
    path = Path(folder) / "results.json"
    if not path.is_file():
        return False
    try:
        return "vision" in json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def write_vision_report(out_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``table.md``, the plots and ``report.html`` (or ``out``) from ``results.json``."""
    out_dir = Path(out_dir)
    if not (out_dir / "results.json").is_file():
        raise InputError(f"out_dir must be an 'attnlab bench vision' output folder with results.json; "
                         f"{out_dir} has none")
    data = read_json_mapping(out_dir / "results.json")
    text = vision_markdown(data)
    atomic_write_bytes(out_dir / "table.md", text.encode())
    plots = _plots(data, out_dir)
    letter = _machines(data)
    about: list[Any] = [Table([(k, str(v)) for k, v in data.get("machine", {}).items()],
                              ("this run's machine", "value"))]
    if len(letter) > 1:
        about.append(Table([(a, m) for m, a in letter.items()], ("records' machine", "")))
    if data.get("quick"):
        about.insert(0, Note("A quick run (two steps on a few images): it shows that the study runs; "
                             "the figures mean nothing."))
    sections = [Section("Machine", about), Section("Tables", [Html(markdown_to_html(text))]),
                Section("Plots", [Image(p, p.stem) for p in plots] or [Note("No runs yet.")])]
    subtitle = (f"{out_dir.resolve()}, report written {time.strftime('%Y-%m-%d %H:%M:%S')} "
                f"by attnlab {__version__}.")
    path = Path(out) if out is not None else out_dir / "report.html"
    atomic_write_bytes(path, render_html("attnlab bench vision", sections, subtitle).encode())
    return path
