"""The tutorials' other advice, measured: heads, position encodings, attention dropout,
gradient checkpointing.

* ``heads``: the MR recipe at width 256 with 1, 2, 4, 8 and 16 heads (head size 256 to
  16): training time per step and test accuracy.
* ``pos_encoding``: the MR recipe with no positions, sinusoidal, learned, relative (T5
  bias), rotary and ALiBi positions (``model.options.pos_embed``).
* ``attn_dropout``: the MR recipe with dropout 0, 0.1 and 0.3 on the attention weights.
* ``checkpointing``: one training step (forward, backward) of ``vit_base_patch16_224`` on a
  batch of 32 images of 224 x 224, with and without gradient checkpointing, each in a
  fresh process: peak memory (as :mod:`attnlab.bench.scaling` measures it) and the
  median step time.

Every MR run is the shipped ``sentiment-mr`` recipe (fixed split, 600 steps) with one
setting changed; the test set has 1,066 sentences, so one run's accuracy has a standard
error of about 1.3 points: differences smaller than that are noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..models import create_model
from ..recipes import load_recipe
from .quality import mr_accuracy
from .scaling import first_call_peak, repeat_times, run_module

__all__ = ["run_studies", "STUDIES", "checkpointing_point", "run_checkpointing_point"]

# study -> (values, recipe overrides for a value)
STUDIES: dict[str, tuple[tuple[Any, ...], Callable[[Any], list[str]]]] = {
    "heads": ((1, 2, 4, 8, 16), lambda h: ["model.options.embed_dim=256", f"model.options.num_heads={h}"]),
    "pos_encoding": (("none", "sinusoidal", "learned", "relative", "rope", "alibi"),
                     lambda p: [f"model.options.pos_embed={p}"]),
    "attn_dropout": ((0.0, 0.1, 0.3), lambda p: [f"model.options.attn_drop_rate={p}"]),
}
RECIPE_DEFAULTS = {"pos_encoding": "sinusoidal", "attn_dropout": 0.1}  # sentiment-mr as shipped
CKPT_MODEL, CKPT_BATCH, CKPT_SIZE = "vit_base_patch16_224", 32, 224


def checkpointing_point(model_name: str, batch: int, image_size: int, checkpointing: bool, *,
                        device: str = "cpu", min_time: float = 1.0, max_repeats: int = 3) -> dict[str, Any]:
    """One training step of ``model_name`` with or without gradient checkpointing, in this process."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dev = torch.device(device)
    model = create_model(model_name, num_classes=1000).to(dev).train()
    model.set_grad_checkpointing(checkpointing)
    x = torch.randn(batch, 3, image_size, image_size, device=dev)
    y = torch.randint(0, 1000, (batch,), device=dev)

    def step() -> None:
        F.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            p.grad = None
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    first, peak = first_call_peak(step, dev)
    times = repeat_times(step, first, min_time, max_repeats)
    return {"model": model_name, "batch": batch, "image_size": image_size, "checkpointing": checkpointing,
            "ms": 1e3 * statistics.median(times), "first_ms": 1e3 * first, "repeats": len(times),
            "peak_mb": peak / 2**20, "device": device, "threads": torch.get_num_threads()}


def run_checkpointing_point(model_name: str, batch: int, image_size: int, checkpointing: bool, *,
                            device: str = "cpu", timeout: float = 1800.0) -> dict[str, Any]:
    """:func:`checkpointing_point` in a fresh interpreter (its peak memory is its own)."""
    base = {"model": model_name, "batch": batch, "image_size": image_size, "checkpointing": checkpointing,
            "ms": None, "peak_mb": None}
    return run_module(["attnlab.bench.studies", "--checkpointing", model_name, str(batch), str(image_size),
                       "on" if checkpointing else "off", "--device", device], base, timeout)


def run_studies(store: Any, out: Path, *, quick: bool = False, device: str = "cpu", data_dir: str | None = None,
                log: Callable[[str], None] = print) -> None:
    """Run every study not yet in ``store`` (a results store of :mod:`attnlab.bench.attention`)."""
    extra = ["train.steps=4", "train.warmup_steps=1", "train.eval_every=2", "train.checkpoint_every=0"] if quick else []
    if data_dir:
        extra.append(f"data.data_dir={data_dir}")
    if device != "cpu":
        extra.append(f"train.device={device}")
    for study, (values, overrides) in STUDIES.items():
        for value in values[:2] if quick else values:
            if store.find("studies", study=study, value=value):
                continue
            t0 = time.perf_counter()
            same = store.find("quality", task="mr", kind="exact") if RECIPE_DEFAULTS.get(study) == value else None
            if same is not None:  # the recipe as shipped: already trained by the quality part
                rec = dict(same)
            else:
                rec = mr_accuracy("exact", {}, out / "runs" / f"{study}-{value}", overrides=overrides(value) + extra,
                                  log=lambda s: None)
            rec |= {"study": study, "value": value, "ms_per_step": 1e3 * _batch(rec) / rec["samples_per_s"]}
            store.add("studies", rec)
            log(f"study {study}={value}: MR accuracy {100 * rec['accuracy']:.2f}%, {rec['ms_per_step']:.0f} ms/step "
                f"({time.perf_counter() - t0:.0f} s)")
    model, batch, size = ("vit_tiny_patch16_224", 2, 64) if quick else (CKPT_MODEL, CKPT_BATCH, CKPT_SIZE)
    for ckpt in (False, True):
        if store.find("studies", study="checkpointing", value=ckpt):
            continue
        rec = run_checkpointing_point(model, batch, size, ckpt, device=device)
        store.add("studies", rec | {"study": "checkpointing", "value": ckpt})
        log(f"study checkpointing={ckpt}: {rec.get('ms') or 0:.0f} ms/step, peak {rec.get('peak_mb') or 0:.0f} MB"
            + (f" ({rec['skipped']})" if rec.get("skipped") else ""))


def _batch(rec: dict[str, Any]) -> int:
    return load_recipe("sentiment-mr", [o for o in rec["overrides"] if o.startswith("train.")]).train.batch_size


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one gradient-checkpointing point (used by run_checkpointing_point)")
    p.add_argument("--checkpointing", nargs=4, metavar=("MODEL", "BATCH", "SIZE", "ON_OFF"), required=True)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    model, batch, size, on = a.checkpointing
    print(json.dumps(checkpointing_point(model, int(batch), int(size), on == "on", device=a.device)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
